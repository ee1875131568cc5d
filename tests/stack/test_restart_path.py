"""The harness's restart path: standbys that say they serve need no health check, and a restart that keeps every
server's URL is verified by the next status round instead of a discovery (and discovered anew if it changed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
import pytest

from ckpt_model.deployments.harness import Harness
from ckpt_model.protocol.client import Participants
from ckpt_model.protocol.gym_tasks import legacy_run_body
from fakes.deployment import EmbeddedDeployment
from fakes.processes.server_processes import ServerProcess
from fakes.stack import launcher as stack_module
from fakes.stack.launcher import Stack
from tests.stack.conftest import wait_until

processes = pytest.mark.processes
# Restarts of the policy model under a legacy `/run` that its crash ends with a 500: without `/run`s on their own
# connections, 10 of 25 discoveries right after such a restart were reset (measured on 2 loaded cores).
RESTARTS_UNDER_A_FAILING_RUN = 10


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with Harness.embedded("native") as started:
        started.begin_example()
        yield started


def _stack(harness: Harness) -> Stack:
    assert isinstance(harness.deployment, EmbeddedDeployment)
    return harness.deployment.stack


def _count_discoveries(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[Mapping[str, str]]:
    control = harness._control
    assert control is not None
    discovered: list[Mapping[str, str]] = []
    real = control.discover_from_servers

    def discover(servers: Mapping[str, str]) -> Participants:
        discovered.append(dict(servers))
        return real(servers)

    monkeypatch.setattr(control, "discover_from_servers", discover)
    return discovered


@processes
def test_standbys_that_say_they_serve__are_not_health_checked(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = _stack(harness)
    assert stack.fork_server is not None
    stack.fork_server.wait_idle()  # every standby built, as when an example ran between two restarts
    checked: list[str] = []
    real = stack_module.wait_healthy

    def wait_healthy(servers: Sequence[ServerProcess], path: str, **options: Any) -> None:
        checked.extend(server.name for server in servers)
        real(servers, path, **options)

    monkeypatch.setattr(stack_module, "wait_healthy", wait_healthy)
    harness.crash()
    assert checked == []
    assert {reply["phase"] for reply in harness.statuses().values()} == {"idle"}


@processes
def test_a_restart_on_the_same_urls__is_verified_by_the_next_status_round_without_a_discovery(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    discovered = _count_discoveries(harness, monkeypatch)
    harness.crash()
    statuses = harness.statuses()
    assert discovered == []
    control = harness._control
    assert control is not None
    assert {name: reply["kind"] for name, reply in statuses.items()} == {m.name: m.kind for m in control.participants}


@processes
def test_control_used_before_the_status_round__verifies_first(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    discovered = _count_discoveries(harness, monkeypatch)
    harness.crash()
    assert harness._unverified
    assert harness.control is not None
    assert not harness._unverified
    assert discovered == []


@processes
def test_a_participant_that_answers_as_another_kind__is_discovered_anew(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = harness._control
    assert control is not None
    right = control.participants
    harness.crash()
    # As if the restarted server on the environment's port were another kind of participant now.
    control.participants = Participants(
        [attrs.evolve(m, kind="agent") if m.name == "environment" else m for m in right]
    )
    discovered = _count_discoveries(harness, monkeypatch)
    harness.statuses()
    assert len(discovered) == 1
    assert control.participants == right


@processes
def test_a_run_that_the_crash_ends_with_a_500__leaves_no_connection_for_the_control_client() -> None:
    """The legacy relay's `/run` fails with a 500 from an unhandled exception when the policy model dies under it;
    uvicorn closes that connection only after logging, and the discovery right after the fast restart must not
    pick it up (`/run`s have a client of their own)."""
    with Harness.embedded("legacy") as legacy:
        for round_ in range(RESTARTS_UNDER_A_FAILING_RUN):
            legacy.begin_example()
            gate = legacy.backend
            assert gate is not None
            run = threading.Thread(
                target=lambda n=round_: legacy.run_http.post(legacy.run_url, json=legacy_run_body(f"r{n}", 0))
            )
            run.start()
            try:
                wait_until(lambda g=gate: any(c.get("waiting") for c in g.calls()), "the /run's first model call")
                legacy.restart_server("policy_model")
            finally:
                run.join()
            assert {reply["phase"] for reply in legacy.statuses().values()} == {"idle"}
