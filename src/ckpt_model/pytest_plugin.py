"""The pytest plugin `ckpt_model` (entry point group `pytest11`): a deployment of the embedded stack, chosen on the
command line, as the session fixture `ckpt_harness`.

    pytest --ckpt-topology slow --ckpt-verify-mode replay --ckpt-faults resume_deletes_records my_tests/

    def test_my_machine(ckpt_harness):            # a `ckpt_model.deployment.Harness`, started once per session
        run_state_machine_as_test(machine_for(ckpt_harness))

`--ckpt-token-capture` turns on the policy model's capture ledgers (P5), `--ckpt-generation-cuts` generation cuts
too (P12). Defaults: topology native, verify mode wait, no faults, neither. An unknown fault is a usage error
naming the known ones.

The plugin is inert unless used: it imports nothing heavy at load time (the stack is imported when the fixture is
first requested), starts nothing unless a test requests `ckpt_harness`, loads no Hypothesis profile (the suites do
that themselves, `ckpt_model.profiles`), and adds its report header line only when one of its options is given
(the header is printed before collection, so it cannot know whether a test will use the fixture).
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ckpt_model.contract import Topology, VerifyMode

if TYPE_CHECKING:
    from ckpt_model.deployment import Harness

TOPOLOGIES: tuple[str, ...] = typing.get_args(Topology)
VERIFY_MODES: tuple[str, ...] = typing.get_args(VerifyMode)
OPTIONS = ("ckpt_topology", "ckpt_verify_mode", "ckpt_faults", "ckpt_policy_workers")
FLAGS = ("ckpt_token_capture", "ckpt_generation_cuts")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ckpt-model", "ckpt-model: the deployment behind the `ckpt_harness` fixture")
    group.addoption(
        "--ckpt-topology", choices=TOPOLOGIES, default=None, help="topology of ckpt_harness (default: native)"
    )
    group.addoption(
        "--ckpt-verify-mode",
        choices=VERIFY_MODES,
        default=None,
        help="verify mode of ckpt_harness, for the slow topology (default: wait)",
    )
    group.addoption("--ckpt-faults", default=None, metavar="A,B", help="comma-separated planted faults of ckpt_harness")
    group.addoption("--ckpt-token-capture", action="store_true", help="ckpt_harness's policy model keeps ledgers")
    group.addoption(
        "--ckpt-generation-cuts", action="store_true", help="ckpt_harness cuts generations (implies token capture)"
    )
    group.addoption(
        "--ckpt-policy-workers", type=int, default=None, help="worker processes of ckpt_harness's policy model"
    )


def capture(config: pytest.Config) -> dict[str, Any]:
    """The deployment options beyond topology, verify mode and faults (`Harness.embedded`'s keywords)."""
    cuts = bool(config.getoption("ckpt_generation_cuts"))
    return {
        "token_capture": cuts or bool(config.getoption("ckpt_token_capture")),
        "generation_cuts": cuts,
        "policy_workers": config.getoption("ckpt_policy_workers") or 1,
    }


def chosen(config: pytest.Config) -> tuple[str, str, tuple[str, ...]]:
    """The topology, verify mode and faults the options name, with the defaults filled in."""
    faults_text = config.getoption("ckpt_faults") or ""
    faults = tuple(dict.fromkeys(name.strip() for name in faults_text.split(",") if name.strip()))
    return config.getoption("ckpt_topology") or "native", config.getoption("ckpt_verify_mode") or "wait", faults


def used(config: pytest.Config) -> bool:
    return any(config.getoption(name) is not None for name in OPTIONS) or any(map(config.getoption, FLAGS))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("ckpt_faults") is None:
        return
    from ckpt_model.deployment import fault_catalogue

    known = [fault.name for fault in fault_catalogue()]
    unknown = [name for name in chosen(config)[2] if name not in known]
    if unknown:
        raise pytest.UsageError(
            f"--ckpt-faults: unknown fault(s) {', '.join(map(repr, unknown))}; known faults: {', '.join(known)}"
        )


def pytest_report_header(config: pytest.Config) -> str | None:
    if not used(config):
        return None
    topology, verify_mode, faults = chosen(config)
    chosen_options = capture(config)
    options = [name.replace("_", " ") for name in ("token_capture", "generation_cuts") if chosen_options[name]]
    if chosen_options["policy_workers"] != 1:
        options.append(f"{chosen_options['policy_workers']} policy model workers")
    return (
        f"ckpt-model: ckpt_harness topology {topology}, verify mode {verify_mode}, faults {','.join(faults) or 'none'}"
        + (f", {', '.join(options)}" if options else "")
    )


@pytest.fixture(scope="session")
def ckpt_harness(pytestconfig: pytest.Config) -> Iterator[Harness]:
    """A harness over the embedded stack in the deployment the `--ckpt-*` options name; closed at session end."""
    from ckpt_model.deployment import Harness

    topology, verify_mode, faults = chosen(pytestconfig)
    with Harness.embedded(topology, faults=faults, verify_mode=verify_mode, **capture(pytestconfig)) as harness:
        yield harness
