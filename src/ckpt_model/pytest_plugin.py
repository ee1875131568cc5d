"""The pytest plugin `ckpt_model` (entry point group `pytest11`): a deployment of the embedded stack (or a real
Gym), chosen on the command line, as the session fixture `ckpt_harness`, and `ckpt_check`, the search
`ckpt-model check` runs on it.

    pytest --ckpt-topology slow --ckpt-verify-mode replay --ckpt-faults resume_deletes_records my_tests/

    def test_my_machine(ckpt_harness):            # a `ckpt_model.deployments.harness.Harness`, started once per session
        run_state_machine_as_test(machine_for(ckpt_harness))

    def test_the_contract(ckpt_check):            # the check's search on ckpt_harness: a failure fails the test
        ckpt_check(examples=20, steps=8, seed=2)   # with the report `ckpt-model check` prints

`ckpt_check` searches as `ckpt-model check` does (`ckpt_model.search.checking.search` without Hypothesis's shrink): it
stops at the first failing example, measures its reproduction rate and makes it 1-minimal with the checker's minimiser,
then fails the test with the failure report (the minimal failure first: property, rollout, expected, observed,
steps, how to replay; then the details). Under `pytest -v` (or `ckpt_check(verbose=True)`) the report also shows
the example the search found before minimising and Hypothesis's `@reproduce_failure` line. Each call keeps what it
found in a run directory of its own, as `check` does (`ckpt_model.results.runstore`, `.ckpt-model/runs/`).
`--ckpt-deployment FILE` checks a real Gym described in FILE (`ckpt-model check --deployment FILE`,
docs/real-gym.md) instead of the embedded stack; `--ckpt-keep-artifacts DIR` keeps the run's artefacts in DIR, a new
or empty directory (`ckpt-model check --keep-artifacts DIR`; under xdist, in DIR/<worker id>).

The options are `ckpt-model check`'s, prefixed `--ckpt-`: one per deployment option (`--ckpt-token-capture` turns
on the policy model's capture ledgers, P5; `--ckpt-generation-cuts` generation cuts too, P12;
`--ckpt-policy-workers N`). The deployment is the one `DeploymentSpec.for_faults` picks, as `check` does: the
one the planted faults show in (else native, verify mode wait), with what the options ask for. An unknown fault is
a usage error naming the known ones.

The plugin is inert unless used: it imports nothing heavy at load time (the stack is imported when the fixture is
first requested), starts nothing unless a test requests `ckpt_harness`, loads no Hypothesis profile (the suites do
that themselves, `ckpt_model.search.profiles`), and adds its report header line only when one of its options is given
(the header is printed before collection, so it cannot know whether a test will use the fixture).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ckpt_model.durations import duration
from ckpt_model.model.spec import OPTIONS, DeploymentSpec, Option, OptionValue, SpecError, flag_keywords
from ckpt_model.model.topologies import TOPOLOGIES, VERIFY_MODES
from ckpt_model.results.reproduction import REPLAYS

if TYPE_CHECKING:
    from ckpt_model.deployments.catalogue import PlantedFault
    from ckpt_model.deployments.gym import GymDeployment
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results.stats import SearchStats

CHOICES = ("ckpt_topology", "ckpt_verify_mode", "ckpt_faults", "ckpt_deployment", "ckpt_keep_artifacts")
# What `ckpt_check` runs: the check's search, with these keywords (None: the profile's); it returns the search's
# statistics (`ckpt_model.results.stats.SearchStats`).
Check = Callable[..., "SearchStats"]


def dest(option: Option) -> str:
    """Where pytest keeps an option's flag: `ckpt_token_capture`."""
    return "ckpt_" + option.name


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ckpt-model", "ckpt-model: the deployment behind the `ckpt_harness` fixture")
    group.addoption(
        "--ckpt-topology",
        choices=list(TOPOLOGIES),
        default=None,
        help="topology of ckpt_harness (default: the planted faults', else native)",
    )
    group.addoption(
        "--ckpt-verify-mode",
        choices=VERIFY_MODES,
        default=None,
        help="verify mode of ckpt_harness, of a topology that runs in several (slow; default: wait)",
    )
    group.addoption("--ckpt-faults", default=None, metavar="A,B", help="comma-separated planted faults of ckpt_harness")
    for option in OPTIONS:
        group.addoption(option.flag("--ckpt-"), dest=dest(option), **flag_keywords(option))
    group.addoption(
        "--ckpt-deployment",
        type=Path,
        default=None,
        metavar="FILE",
        help="ckpt_harness checks the real Gym described in FILE instead of the embedded stack (docs/real-gym.md)",
    )
    group.addoption(
        "--ckpt-max-time",
        type=duration,
        default=None,
        metavar="DURATION",
        help="bound each ckpt_check search by time (90, 90s, 2m, 1h), as `ckpt-model check --max-time`: no example "
        "begins that the median example so far would not end by DURATION, then it measures and minimises what it "
        "found; the fault searches (`pytest -m search`) take the same bound",
    )
    group.addoption(
        "--ckpt-keep-artifacts",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the run's artefacts in DIR, a new or empty directory: server logs and, on a failure, its history, "
        "checkpoint directories and regression file (under xdist, in DIR/<worker id>)",
    )


def asked_options(config: pytest.Config) -> dict[str, OptionValue]:
    """The option flags given (a count left out is None: the faults' and the default's)."""
    return {option.name: value for option in OPTIONS if (value := config.getoption(dest(option))) is not None}


def chosen(config: pytest.Config) -> DeploymentSpec:
    """The deployment the options name, with the defaults filled in (the catalogue is read only for faults); a
    real Gym's as its description file says (`gym_deployment.described`)."""
    if config.getoption("ckpt_deployment") is not None:
        gym, spec = described_gym(config)
        gym.close()  # read, never started: closing only lets go of its client
        return spec
    faults_text = config.getoption("ckpt_faults") or ""
    planted: tuple[PlantedFault, ...] = ()
    if faults_text.strip():
        from ckpt_model.deployments.catalogue import faults_named

        planted = faults_named(faults_text)
    return DeploymentSpec.for_faults(
        planted,
        topology=config.getoption("ckpt_topology"),
        verify_mode=config.getoption("ckpt_verify_mode"),
        options=asked_options(config),
    )


def used(config: pytest.Config) -> bool:
    return any(config.getoption(name) is not None for name in CHOICES) or any(
        config.getoption(dest(option)) not in (None, False) for option in OPTIONS
    )


def described_gym(config: pytest.Config) -> tuple[GymDeployment, DeploymentSpec]:
    """The real Gym `--ckpt-deployment` describes, and its spec; a bad file is a usage error."""
    from ckpt_model.deployments.gym import described

    try:
        return described(config.getoption("ckpt_deployment"))
    except ValueError as error:
        raise pytest.UsageError(f"--ckpt-deployment: {error}") from None


def kept_dir(config: pytest.Config) -> Path | None:
    """`--ckpt-keep-artifacts DIR`, absolute; under xdist a worker keeps its run in DIR/<worker id>."""
    directory = config.getoption("ckpt_keep_artifacts")
    if directory is None:
        return None
    worker = getattr(config, "workerinput", {}).get("workerid")
    path = Path(directory).expanduser().absolute()
    return path / worker if worker else path


def pytest_configure(config: pytest.Config) -> None:
    if not used(config):
        return
    from ckpt_model.deployments.artifacts import ArtifactsError, prepare
    from ckpt_model.deployments.catalogue import UnknownFaults

    if config.getoption("ckpt_deployment") is not None and (config.getoption("ckpt_faults") or "").strip():
        raise pytest.UsageError("--ckpt-faults plants faults in the embedded stack; a real Gym deployment has none")
    try:
        chosen(config)
    except UnknownFaults as error:
        raise pytest.UsageError(f"--ckpt-faults: {error}") from None
    except SpecError as error:
        raise pytest.UsageError(f"ckpt-model: {error}") from None
    kept = kept_dir(config)
    if kept is not None:
        try:
            prepare(kept)  # before any server starts; a worker's own directory once the controller made DIR
        except ArtifactsError as error:
            raise pytest.UsageError(f"--ckpt-keep-artifacts: {error}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    if not used(config):
        return None
    spec = chosen(config)
    options = f", options {'+'.join(spec.option_words)}" if spec.option_words else ""
    system = f"real Gym {config.getoption('ckpt_deployment')}, " if config.getoption("ckpt_deployment") else ""
    kept = kept_dir(config)
    return (
        f"ckpt-model: ckpt_harness {system}topology {spec.topology}, verify mode {spec.verify_mode}, "
        f"faults {','.join(spec.faults) or 'none'}{options}"
        + (f"; artifacts kept in {kept}" if kept is not None else "")
    )


@pytest.fixture(scope="session")
def ckpt_harness(pytestconfig: pytest.Config) -> Iterator[Harness]:
    """A harness over the embedded stack in the deployment the `--ckpt-*` options name, or over the real Gym
    `--ckpt-deployment` describes; closed at session end."""
    from ckpt_model.deployments.harness import Harness

    kept = kept_dir(pytestconfig)
    if pytestconfig.getoption("ckpt_deployment") is None:
        harness = Harness.embedded(chosen(pytestconfig), artifacts=kept)
    else:
        gym, spec = described_gym(pytestconfig)
        harness = Harness(gym, spec=spec, artifacts=kept)
    with harness:
        yield harness


@pytest.fixture
def ckpt_check(ckpt_harness: Harness, pytestconfig: pytest.Config) -> Check:
    """The search `ckpt-model check` runs, on `ckpt_harness`: `ckpt_check(examples=N, steps=N, seed=N, swarm=False,
    replays=10, profile="default", max_time_s=None, verbose=None)`, returning its statistics (coverage,
    `stopped_by_time`). A failure fails the test with the report the command prints (`verbose`: as `check
    --verbose`; None: when pytest runs with -v).
    `max_time_s` (default: `--ckpt-max-time`) stops the search between examples by then, as `check --max-time`
    does (`checking.another_fits`): without `examples`, examples run until then, in aimed rounds."""
    from hypothesis import settings

    from ckpt_model.deployments.gym import GymDeployment
    from ckpt_model.results import runstore
    from ckpt_model.results.stats import SearchStats
    from ckpt_model.results.verdicts import failure_report
    from ckpt_model.search import checking, profiles

    def check(
        *,
        examples: int | None = None,
        steps: int | None = None,
        seed: int | None = None,
        swarm: bool = False,
        replays: int = REPLAYS,
        profile: str = "default",
        max_time_s: float | None = None,
        verbose: bool | None = None,
    ) -> SearchStats:
        if max_time_s is None:
            max_time_s = pytestconfig.getoption("ckpt_max_time")
        overrides: dict[str, Any] = {"database": None} if seed is not None else {}
        gym = ckpt_harness.deployment
        if isinstance(gym, GymDeployment) and gym.examples_max is not None:  # docs/real-gym.md, as `check` does
            examples = min(examples or gym.examples_max, gym.examples_max)
        if examples is not None:
            overrides["max_examples"] = examples
        elif max_time_s is not None:
            overrides["max_examples"] = checking.UNTIL_THE_TIME_LIMIT
        if steps is not None:
            overrides["stateful_step_count"] = steps
        chosen_settings = settings(profiles.profile_for(profile, profiles.in_ci()), **overrides)
        stats = SearchStats()
        runstore.begin(ckpt_harness)  # each check a run: what it finds is kept in a run directory of its own
        try:
            checking.search(
                ckpt_harness,
                checking.without_shrink(chosen_settings),
                stats,
                swarm=swarm,
                seed=seed,
                replays=replays,
                max_time_s=max_time_s,
                rounds=examples is None,
            )
        except Exception as error:
            shown = pytestconfig.get_verbosity() > 0 if verbose is None else verbose
            _, report = failure_report(error, stats.seen, verbose=shown)
            runstore.keep_report(ckpt_harness.run_dir, report)
            pytest.fail(report, pytrace=False)
        return stats

    return check
