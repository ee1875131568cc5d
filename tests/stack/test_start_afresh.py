"""`Stack.start_afresh`, and the pool of stacks the stack tests share through it: a stack started afresh must look
to a test as a new one would, or one test's leftovers decide the next one's verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_model.gym_tasks import native_run_body
from ckpt_model.wire import EpisodeId
from fakes.stack import Stack
from tests.stack.conftest import Deployment, StackOptions, StackPool, deadline, process_gone

pytestmark = pytest.mark.processes

FAULT = "agent_export_drops_unstarted"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack("native", tmp_path / "stack") as started:
        started.start_backend()
        started.start_gym()
        yield started


def committed_agent_episodes(deployment: Deployment, checkpoint_id: str) -> list[str]:
    """Hold a `/run` at its first model call, prepare and commit it: what the agent exported (none with FAULT)."""
    run = deployment.start_held(native_run_body(checkpoint_id, 0), calls_delivered=len(deployment.calls()))
    assert deployment.control.prepare(checkpoint_id, deadline()).prepared
    directory = str(deployment.stack.checkpoint_root / checkpoint_id)
    scope = [EpisodeId(rollout_id=checkpoint_id)]
    committed = deployment.control.commit(checkpoint_id, directory, scope, deadline())
    deployment.stack.crash_gym()
    run.wait()
    return committed["agent"]["episode_ids"]


@pytest.fixture
def deployments() -> Iterator[list[Deployment]]:
    """The test's controller clients on the stack, closed at teardown (also when the test fails)."""
    made: list[Deployment] = []
    yield made
    for deployment in made:
        deployment.http.close()


def test_start_afresh__new_servers_a_reset_backend_empty_directories_and_the_faults_asked_for(
    stack: Stack, deployments: list[Deployment]
) -> None:
    before = Deployment(stack)
    deployments.append(before)
    assert committed_agent_episodes(before, "c1") == ["c1"]
    old_pids = {server.pid for server in stack.gym.values()}
    backend_pid = stack.backend.pid if stack.backend else None
    assert any(stack.checkpoint_root.iterdir())
    assert stack.durability_journal.exists()
    assert before.calls()  # the held call, still waiting at the backend

    stack.start_afresh((FAULT,))

    assert stack.backend is not None
    assert stack.backend.pid == backend_pid
    assert not {server.pid for server in stack.gym.values()} & old_pids
    assert all(process_gone(pid) for pid in old_pids)
    assert list(stack.checkpoint_root.iterdir()) == []
    assert list(stack.capture_dir.iterdir()) == []
    assert not stack.durability_journal.exists()
    after = Deployment(stack)
    deployments.append(after)
    assert after.calls() == []
    reply = after.run(native_run_body("unheld", 0))  # no hold and no gate left: it runs to its reward
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0, reply.text
    assert committed_agent_episodes(after, "c2") == []  # the fault is planted


def test_start_afresh__an_unknown_fault_is_refused_and_the_servers_run_on(stack: Stack) -> None:
    pids = {name: server.pid for name, server in stack.gym.items()}
    with pytest.raises(ValueError, match="unknown fault"):
        stack.start_afresh(("no_such_fault",))
    assert {name: server.pid for name, server in stack.gym.items()} == pids
    assert stack.faults == ()


def test_the_pool__reuses_a_stack_for_the_same_options_and_stops_what_it_does_not_keep(tmp_path: Path) -> None:
    pool = StackPool(tmp_path, keep=1)
    native, slow = StackOptions("native"), StackOptions("slow")
    try:
        first = pool.take(native, ())
        pool.give_back(native, first)
        assert first.gym == {}  # the test's servers die at its teardown
        again = pool.take(native, (FAULT,))
        assert again is first
        assert again.faults == (FAULT,)
        assert again.gym
        pool.give_back(native, again)

        other = pool.take(slow, ())
        assert other is not first
        pool.give_back(slow, other)  # keeps one: the native stack is stopped
        assert first.backend is None
        assert first.fork_server is None
        assert list(pool.idle) == [slow]
    finally:
        pool.close()
    assert other.backend is None
    assert other.fork_server is None
