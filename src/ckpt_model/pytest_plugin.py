"""The pytest plugin `ckpt_model` (entry point group `pytest11`): a deployment of the embedded stack, chosen on the
command line, as the session fixture `ckpt_harness`.

    pytest --ckpt-topology slow --ckpt-verify-mode replay --ckpt-faults resume_deletes_records my_tests/

    def test_my_machine(ckpt_harness):            # a `ckpt_model.deployment.Harness`, started once per session
        run_state_machine_as_test(machine_for(ckpt_harness))

The options are `ckpt-model check`'s, prefixed `--ckpt-`: one per deployment option (`--ckpt-token-capture` turns
on the policy model's capture ledgers, P5; `--ckpt-generation-cuts` generation cuts too, P12;
`--ckpt-policy-workers N`). The deployment is the one `DeploymentSpec.for_faults` picks, as `check` does: the
one the planted faults show in (else native, verify mode wait), with what the options ask for. An unknown fault is
a usage error naming the known ones.

The plugin is inert unless used: it imports nothing heavy at load time (the stack is imported when the fixture is
first requested), starts nothing unless a test requests `ckpt_harness`, loads no Hypothesis profile (the suites do
that themselves, `ckpt_model.profiles`), and adds its report header line only when one of its options is given
(the header is printed before collection, so it cannot know whether a test will use the fixture).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ckpt_model.spec import OPTIONS, DeploymentSpec, Option, OptionValue, SpecError, flag_keywords
from ckpt_model.topologies import TOPOLOGIES, VERIFY_MODES

if TYPE_CHECKING:
    from ckpt_model.deployment import Harness, PlantedFault

CHOICES = ("ckpt_topology", "ckpt_verify_mode", "ckpt_faults")


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


def asked_options(config: pytest.Config) -> dict[str, OptionValue]:
    """The option flags given (a count left out is None: the faults' and the default's)."""
    return {option.name: value for option in OPTIONS if (value := config.getoption(dest(option))) is not None}


def chosen(config: pytest.Config) -> DeploymentSpec:
    """The deployment the options name, with the defaults filled in (the catalogue is read only for faults)."""
    faults_text = config.getoption("ckpt_faults") or ""
    planted: tuple[PlantedFault, ...] = ()
    if faults_text.strip():
        from ckpt_model.deployment import faults_named

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


def pytest_configure(config: pytest.Config) -> None:
    if not used(config):
        return
    from ckpt_model.deployment import UnknownFaults

    try:
        chosen(config)
    except UnknownFaults as error:
        raise pytest.UsageError(f"--ckpt-faults: {error}") from None
    except SpecError as error:
        raise pytest.UsageError(f"ckpt-model: {error}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    if not used(config):
        return None
    spec = chosen(config)
    options = f", options {'+'.join(spec.option_words)}" if spec.option_words else ""
    return (
        f"ckpt-model: ckpt_harness topology {spec.topology}, verify mode {spec.verify_mode}, "
        f"faults {','.join(spec.faults) or 'none'}{options}"
    )


@pytest.fixture(scope="session")
def ckpt_harness(pytestconfig: pytest.Config) -> Iterator[Harness]:
    """A harness over the embedded stack in the deployment the `--ckpt-*` options name; closed at session end."""
    from ckpt_model.deployment import Harness

    with Harness.embedded(chosen(pytestconfig)) as harness:
        yield harness
