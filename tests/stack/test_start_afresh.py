"""`Stack.start_afresh`, and the pool of stacks the stack tests share through it: a stack started afresh must look
to a test as a new one would, or one test's leftovers decide the next one's verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.protocol.gym_tasks import native_run_body
from ckpt_model.protocol.wire import EpisodeId
from fakes.stack.launcher import Stack
from fakes.stack.topologies import TOPOLOGIES
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


def test_redeploy__the_next_start_is_the_deployment_asked_for_on_the_same_backend(stack: Stack) -> None:
    backend_pid = stack.backend.pid if stack.backend else None
    stack.redeploy("mixed", verify_mode="replay", token_capture=True, generation_cuts=True, policy_workers=2)
    stack.start_afresh()
    assert stack.backend is not None
    assert stack.backend.pid == backend_pid
    assert sorted(stack.gym) == sorted(TOPOLOGIES["mixed"])
    configs = stack.configs()
    assert {config.verify_mode for config in configs.values()} == {"replay"}
    assert configs["policy_model"].workers == 2
    assert configs["policy_model"].token_capture
    assert configs["policy_model"].generation_cuts
    status = stack.http.get(stack.gym["restart_resources"].url + "/health")
    assert status.status_code == 200


@pytest.mark.parametrize(
    ("keywords", "error"),
    [
        ({"topology": "no_such_topology"}, "'topology' must be one of"),
        ({"topology": "slow", "verify_mode": "maybe"}, "'verify_mode' must be one of"),
        ({"topology": "slow", "generation_cuts": True}, "'generation_cuts' needs 'token_capture'"),
        ({"topology": "slow", "policy_workers": 0}, "'policy_workers' must be an integer >= 1"),
    ],
)
def test_redeploy__a_bad_value_is_refused_and_changes_nothing(keywords: dict[str, Any], error: str) -> None:
    stack = Stack("native", Path("/nonexistent/not-started"))

    def deployment() -> tuple[object, ...]:
        return stack.topology, stack.verify_mode, stack.token_capture, stack.generation_cuts, stack.policy_workers

    before = deployment()
    with pytest.raises(ValueError, match=error):
        stack.redeploy(**keywords)
    assert deployment() == before


def test_the_pool__reuses_an_idle_stack_redeployed_and_stops_what_it_does_not_keep(tmp_path: Path) -> None:
    pool = StackPool(tmp_path, keep=1)
    native, slow, cold = StackOptions("native"), StackOptions("slow"), StackOptions("native", fork_server=False)
    try:
        first = pool.take(native, ())
        pool.give_back(native, first)
        assert first.gym == {}  # the test's servers die at its teardown
        again = pool.take(native, (FAULT,))
        assert again is first
        assert again.faults == (FAULT,)
        assert again.gym
        pool.give_back(native, again)

        # Other options: the same stack, its backend and fork server, now serving the slow topology.
        backend_pid = first.backend.pid if first.backend else None
        other = pool.take(slow, ())
        assert other is first
        assert other.topology == "slow"
        assert sorted(other.gym) == sorted(TOPOLOGIES["slow"])
        assert other.backend is not None
        assert other.backend.pid == backend_pid
        assert other.faults == ()
        pool.give_back(slow, other)

        # A cold start cannot be redeployed from a stack with a fork server: a new stack, and one is kept.
        cold_stack = pool.take(cold, ())
        assert cold_stack is not first
        assert cold_stack.fork_server is None
        pool.give_back(cold, cold_stack)
        assert list(pool.idle) == [cold]
        assert first.backend is None
        assert first.fork_server is None
    finally:
        pool.close()
    assert cold_stack.backend is None
