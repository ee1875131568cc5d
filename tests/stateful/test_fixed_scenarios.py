"""Fixed scenarios through the machine's own rules: the fault-free stack keeps the contract in each (and shows
Gym's facts for it), and every planted fault is caught by the property the catalogue names."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest

from ckpt_model.deployments.catalogue import planted
from ckpt_model.deployments.clocks import Clocks
from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import PropertyViolation, QuiescenceTimeout, SituationNotReached, StepNotEnabled
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties.durability import P9Violation
from ckpt_model.properties.registry import REGISTRY
from ckpt_model.results import regression, runstore
from ckpt_model.search.deployment_scenarios import (
    CAPTURE_SCENARIOS,
    COUNTER_SCENARIOS,
    CUT_SCENARIOS,
    FAULT_SCENARIOS,
    MIXED_SCENARIOS,
    NEMESIS_SCENARIOS,
    SERVER_WORKER_SCENARIOS,
    SLOW_SCENARIOS,
    STORAGE_SCENARIOS,
    TIME_SCENARIOS,
    named,
)
from ckpt_model.search.faultsearch import harness_for
from ckpt_model.search.minimise import CANDIDATE_SETTLE_TIMEOUT_S
from ckpt_model.search.protocol_scenarios import SCENARIOS
from ckpt_model.search.scenarios import Scenario, ScenarioFactMismatch, replay, run, steps
from ckpt_model.trainer.quiescence import SETTLE_TIMEOUT_S
from fakes.faults import BY_NAME, CATALOGUE
from tests.stateful.conftest import scenario_params


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_native_scenario(native_harness: Harness, name: str) -> None:
    run(native_harness, SCENARIOS[name])


@pytest.mark.parametrize("name", scenario_params((), SCENARIOS))
def test_legacy_scenario(legacy_harness: Harness, name: str) -> None:
    run(legacy_harness, SCENARIOS[name])


@pytest.mark.parametrize("name", scenario_params(COUNTER_SCENARIOS, SCENARIOS))
def test_counter_scenario(counter_harness: Harness, name: str) -> None:
    run(counter_harness, named(name))


@pytest.mark.parametrize("name", scenario_params(CAPTURE_SCENARIOS, {**SCENARIOS, **COUNTER_SCENARIOS}))
def test_counter_scenario_with_token_capture(counter_capture_harness: Harness, name: str) -> None:
    run(counter_capture_harness, named(name))


@pytest.mark.parametrize("name", scenario_params(CUT_SCENARIOS, SCENARIOS))
def test_native_scenario_with_generation_cuts(native_cuts_harness: Harness, name: str) -> None:
    run(native_cuts_harness, named(name))


@pytest.mark.parametrize("name", sorted(STORAGE_SCENARIOS))
def test_storage_scenario(native_harness: Harness, name: str) -> None:
    run(native_harness, STORAGE_SCENARIOS[name])


@pytest.mark.parametrize("name", scenario_params((), STORAGE_SCENARIOS))
def test_storage_scenario_with_token_capture(counter_capture_harness: Harness, name: str) -> None:
    run(counter_capture_harness, STORAGE_SCENARIOS[name])


@pytest.mark.parametrize("name", sorted(NEMESIS_SCENARIOS))
def test_nemesis_scenario(native_harness: Harness, name: str) -> None:
    run(native_harness, NEMESIS_SCENARIOS[name])


@pytest.mark.parametrize("name", scenario_params((), NEMESIS_SCENARIOS))
def test_nemesis_scenario_with_token_capture_and_two_workers(
    counter_capture_two_workers_harness: Harness, name: str
) -> None:
    run(counter_capture_two_workers_harness, NEMESIS_SCENARIOS[name])


# Gym runs its scenarios 1, 2, 3, 6, 7 and 8 with one policy-model worker and with two.
TWO_WORKER_SCENARIOS = (
    "crash_after_prepare__continues_from_boundary",
    "second_crash_before_replacement__still_continues",
    "checkpoint_without_crash__parks_then_resumes",
)


# Each repeats, with two workers, a scenario the default run checks with one; the default run's machine test on
# native+capture+cuts+workers2 covers two workers behind one port.
@pytest.mark.parametrize("name", scenario_params((), {*TWO_WORKER_SCENARIOS, *CAPTURE_SCENARIOS}))
def test_two_worker_scenario_with_token_capture(counter_capture_two_workers_harness: Harness, name: str) -> None:
    run(counter_capture_two_workers_harness, named(name))


@pytest.mark.parametrize("name", scenario_params((), {*TWO_WORKER_SCENARIOS, *CUT_SCENARIOS}))
def test_two_worker_scenario_with_generation_cuts(native_cuts_two_workers_harness: Harness, name: str) -> None:
    run(native_cuts_two_workers_harness, named(name))


# Gym's scenarios with two workers on every participant server, and its concurrent sessions and session routing.
@pytest.mark.parametrize("name", scenario_params(SERVER_WORKER_SCENARIOS, TWO_WORKER_SCENARIOS))
def test_scenario_with_two_workers_on_every_server(native_two_servers_harness: Harness, name: str) -> None:
    run(native_two_servers_harness, named(name))


@pytest.mark.parametrize("name", sorted(MIXED_SCENARIOS))
def test_mixed_scenario(mixed_harness: Harness, name: str) -> None:
    run(mixed_harness, MIXED_SCENARIOS[name])


@pytest.mark.parametrize("name", sorted(SLOW_SCENARIOS["wait"]))
def test_slow_wait_scenario(slow_wait_harness: Harness, name: str) -> None:
    run(slow_wait_harness, SLOW_SCENARIOS["wait"][name])


@pytest.mark.parametrize("name", sorted(SLOW_SCENARIOS["replay"]))
def test_slow_replay_scenario(slow_replay_harness: Harness, name: str) -> None:
    run(slow_replay_harness, SLOW_SCENARIOS["replay"][name])


@pytest.mark.parametrize("name", sorted(TIME_SCENARIOS))
def test_time_scenario(slow_replay_jumps_harness: Harness, name: str) -> None:
    run(slow_replay_jumps_harness, TIME_SCENARIOS[name])


@pytest.mark.parametrize("name", sorted(TIME_SCENARIOS))
def test_time_scenario_with_two_policy_workers(slow_replay_jumps_two_workers_harness: Harness, name: str) -> None:
    """The jump reaches the policy model through one of its workers, which waits while the coordinator moves every
    worker's clock, its own too (a timed wait there fired on the jump: 503 on `POST /_ctl/clock`)."""
    run(slow_replay_jumps_two_workers_harness, TIME_SCENARIOS[name])


@pytest.fixture(scope="module")
def faulty_harnesses() -> Iterator[dict[DeploymentSpec, Harness]]:
    """One harness per deployment the planted faults show in (ten here, 61 faults), replanted for each fault."""
    started: dict[DeploymentSpec, Harness] = {}
    try:
        yield started
    finally:
        for harness in started.values():
            harness.close()


def planted_in(fault: str, harnesses: dict[DeploymentSpec, Harness]) -> Harness:
    """A harness of the deployment `fault` shows in, with it alone planted: the one that deployment already has,
    its next servers started with `fault` (`Harness.replant`), or a new one (`harness_for`)."""
    deployment = attrs.evolve(DeploymentSpec.for_faults([planted(fault)]), faults=())
    harness = harnesses.get(deployment)
    if harness is None:
        harness = harnesses[deployment] = harness_for(fault)
    else:
        harness.replant((fault,))
    return harness


def test_every_fault_has_a_scenario() -> None:
    assert sorted(FAULT_SCENARIOS) == sorted(fault.name for fault in CATALOGUE)


# An intermittent fault misbehaves on a coin toss (half its occasions): its scenario runs until it fails, at most
# this often, so it is missed with a chance of 2**-20 (about one in a million) and every run must either pass or
# fail with the catalogue's property.
INTERMITTENT_RUNS_MAX = 20


@pytest.mark.parametrize("fault", sorted(FAULT_SCENARIOS))
def test_the_scenario_catches_the_planted_fault(fault: str, faulty_harnesses: dict[DeploymentSpec, Harness]) -> None:
    """Each run settles as the minimiser's candidates do (`CANDIDATE_SETTLE_TIMEOUT_S`): a fault shown by a count
    or an admission that stays wrong is confirmed in 2 s, not 10 (six faults spent 10 s each waiting). The scenario
    passes fault-free with the full settle timeout (the tests above), and a run that ends otherwise than with the
    catalogue's property (a nemesis waiting out a lease needs more than 2 s) is run again with the full timeout
    before it fails the test, so a short wait never decides the verdict."""
    harness = planted_in(fault, faulty_harnesses)
    expected = REGISTRY[BY_NAME[fault].caught_by].violation
    try:
        caught = caught_in(fault, harness, CANDIDATE_SETTLE_TIMEOUT_S)
    except QuiescenceTimeout:  # a nemesis that waits out a lease needs the full timeout
        caught = None
    if type(caught) is not expected:
        caught = caught_in(fault, harness, SETTLE_TIMEOUT_S)
    assert caught is not None, f"{fault} did not show in its scenario"
    assert type(caught) is expected, f"caught by {caught.property_id}:\n{caught}"


def caught_in(fault: str, harness: Harness, settle_timeout_s: float) -> PropertyViolation | None:
    """The violation the fault's scenario ends with (an intermittent fault's: within `INTERMITTENT_RUNS_MAX` runs)."""
    for _ in range(INTERMITTENT_RUNS_MAX if BY_NAME[fault].intermittent else 1):
        try:
            run(harness, named(FAULT_SCENARIOS[fault]), settle_timeout_s)
        except PropertyViolation as violation:
            return violation
    return None


REPLAYS = 20


def test_a_failing_example_fails_identically_on_every_replay(
    faulty_harnesses: dict[DeploymentSpec, Harness],
) -> None:
    """The machine owns every race, so the same steps give the same violation, message and all, every time. The
    fault is judged on definite evidence (a commit reply and the records on disk), so each replay is quick."""
    fault = "agent_export_drops_unstarted"
    harness = planted_in(fault, faulty_harnesses)
    messages = []
    for _ in range(REPLAYS):
        with pytest.raises(PropertyViolation) as caught:
            run(harness, named(FAULT_SCENARIOS[fault]))
        messages.append((type(caught.value).__name__, str(caught.value)))
    assert len(set(messages)) == 1, sorted(set(messages))
    assert messages[0][0] == "P1Violation"


def test_a_failure_writes_a_regression_file_that_replays_it(faulty_harnesses: dict[DeploymentSpec, Harness]) -> None:
    fault = "resume_deletes_records"
    harness = planted_in(fault, faulty_harnesses)
    scenario = named(FAULT_SCENARIOS[fault])
    with pytest.raises(PropertyViolation) as caught:
        run(harness, scenario)
    assert harness.regressions_dir is not None
    kept = runstore.kept_of(caught.value)
    assert kept is not None
    path = kept.shown
    assert path.parent == harness.regressions_dir.absolute()
    assert path.name.startswith(f"P9-native-{fault}-")  # and a digest of the steps that first failed on this harness
    assert f"ckpt-model replay {path}" in "\n".join(caught.value.__notes__)

    document = regression.load(path)
    assert [tuple(step) for step in document["steps"]] == list(scenario.steps)
    assert (document["topology"], document["faults"], document["failure"]["property"]) == ("native", [fault], "P9")
    with pytest.raises(P9Violation):
        replay(document)


def test_a_counter_scenario_whose_counts_do_not_hold_fails(counter_harness: Harness) -> None:
    """The counts are checked too: c1 holds r0's count 3 (nothing delivered), not 4."""
    scenario = Scenario(steps("dispatch", "prepare", "commit"), counts={"c1": {"r0": 4}})
    with pytest.raises(ScenarioFactMismatch, match=r"counts in c1's resources records: expected \{'r0': 4\}"):
        run(counter_harness, scenario)


def test_a_step_that_is_not_enabled_is_a_harness_error(native_harness: Harness) -> None:
    """A scenario that drifts from its preconditions cannot pass silently: `commit` needs a prepared checkpoint."""
    with pytest.raises(StepNotEnabled, match=r"step 2 \(commit"):
        run(native_harness, steps("dispatch", "commit"))


def missed_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every deadline the checker would jump past has already passed when it is sent: a prepare that misses it, as
    on a machine too slow for it."""
    monkeypatch.setattr(Clocks, "room", lambda self, seconds: -1.0)


def test_a_quiet_controller_whose_prepare_missed_its_deadline_is_a_harness_error(
    native_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of `SituationNotReached`: every try of the rule resumes (allowed), and the scenario named
    for the lapse says it never saw one instead of passing."""
    missed_deadlines(monkeypatch)
    with pytest.raises(
        SituationNotReached, match=r"quiet_controller: the prepares \['c1', .*\] missed their deadlines, none lapsed"
    ):
        run(native_harness, SCENARIOS["quiet_controller__lease_lapses_and_admission_reopens"])


def test_time_that_never_passed_is_a_harness_error_not_a_fault_not_shown(
    slow_replay_jumps_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How `parked_time_counts` once went "not shown" at load 11-15: the prepare missed its deadline, and no time
    passed; now the scenario names that."""
    missed_deadlines(monkeypatch)
    with pytest.raises(SituationNotReached, match="time_passes: the prepare missed its deadline, so no time passed"):
        run(slow_replay_jumps_harness, TIME_SCENARIOS["time_passes__parked_episode_keeps_its_budget"])


def test_a_scenario_whose_facts_do_not_hold_fails(native_harness: Harness) -> None:
    """The facts are checked, not decoration: the same steps pinned to a call the backend never saw fail."""
    with pytest.raises(ScenarioFactMismatch, match="backend calls per attempt"):
        run(native_harness, Scenario(steps("dispatch"), calls={"r0": (0, 0, 1)}))
