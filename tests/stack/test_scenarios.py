"""Gym's e2e scenarios against the look-alike stack, driven over HTTP only (real processes, real SIGKILL)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ckpt_model.tasks import legacy_run_body, native_run_body
from ckpt_model.wire import EpisodeId
from tests.stack.conftest import Deployment, deadline, wait_until

pytestmark = pytest.mark.processes

Deploy = Callable[[str], Deployment]


def n_messages(deployment: Deployment) -> list[int]:
    return [call["n_messages"] for call in deployment.calls()]


def checkpoint(deployment: Deployment, checkpoint_id: str, scope: list[EpisodeId]) -> str:
    """Prepare (asserting it is ready everywhere) and commit `scope`; return the checkpoint directory."""
    prepared = deployment.control.prepare(checkpoint_id, deadline())
    assert prepared.prepared, prepared.blockers()
    directory = str(deployment.stack.checkpoint_root / checkpoint_id)
    deployment.control.commit(checkpoint_id, directory, scope, deadline())
    return directory


def crash_and_restore(deployment: Deployment, restore_id: str, directory: str, scope: list[EpisodeId]) -> None:
    deployment.crash_and_restart()
    deployment.control.restore(restore_id, directory, scope, deadline())
    deployment.control.resume(restore_id, deadline())


@pytest.mark.parametrize(
    ("topology", "body", "expected_messages", "reward_of"),
    [
        ("native", native_run_body, [2, 4, 4], lambda reply: reply["result"]["reward"]),
        ("legacy", legacy_run_body, [1, 3, 3], lambda reply: reply["reward"]),
    ],
    ids=["native", "legacy"],
)
def test_an_episode_continues_from_its_last_boundary_after_a_crash(
    deploy: Deploy, topology: str, body: Callable, expected_messages: list[int], reward_of: Callable
) -> None:
    deployment = deploy(topology)
    original = deployment.start_held(body("crash-1", 0), calls_delivered=1)
    scope = [EpisodeId(rollout_id="crash-1", attempt=0)]
    directory = checkpoint(deployment, "c1", scope)

    crash_and_restore(deployment, "r1", directory, scope)
    reply = deployment.run(body("crash-1", 1))

    assert reply.status_code == 200, reply.text
    assert reward_of(reply.json()) == 1.0
    assert n_messages(deployment) == expected_messages
    original.wait()
    assert original.error is not None, "the crashed attempt's /run should have been cut off"


def test_a_checkpoint_without_a_crash_parks_the_episode_then_resumes_it(deploy: Deploy) -> None:
    deployment = deploy("native")
    run = deployment.start_held(native_run_body("park-1", 0), calls_delivered=0)
    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()

    deployment.backend("/_ctl/release")
    wait_until(lambda: deployment.calls()[0]["returned"], "the backend to return the first call")
    model = deployment.control.participants.of_kind("model")[0]
    wait_until(lambda: deployment.control.status(model)["report"]["counts"]["held"] == 1, "the response held")
    assert not run.done, "the /run replied while the checkpoint was prepared"
    assert len(deployment.calls()) == 1, "the agent made its second call while the checkpoint was prepared"

    deployment.control.resume("c1", deadline())
    reply = run.result()
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0
    assert n_messages(deployment) == [2, 4]


def test_a_retired_episode_stops_everywhere_and_leaves_nothing_behind(deploy: Deploy) -> None:
    deployment = deploy("native")
    run = deployment.start_held(native_run_body("gone-1", 0), calls_delivered=1)

    deployment.control.retire("retire", [EpisodeId(rollout_id="gone-1")], deadline())
    calls_at_retire = len(deployment.calls())
    reply = run.result()
    assert reply.status_code == 409
    assert reply.json()["error"]["code"] == "stale_attempt"
    deployment.backend("/_ctl/release")
    wait_until(lambda: all(not c["waiting"] for c in deployment.calls()), "the held call to end at the backend")

    statuses = deployment.control.status_all()
    assert len(deployment.calls()) == calls_at_retire, "a model call was made after the retire"
    assert statuses["environment"]["report"]["counts"]["episodes"] == 0
    assert statuses["agent"]["report"]["counts"]["sessions"] == 0
    assert statuses["resources"]["report"]["counts"]["sessions"] == 0
    assert statuses["policy_model"]["report"]["counts"]["inflight"] == 0
    assert {name: status["retired_rollouts"] for name, status in statuses.items()} == dict.fromkeys(statuses, 1)

    late = deployment.run(native_run_body("gone-1", 0))
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "stale_attempt"

    deployment.control.forget("forget", ["gone-1"], deadline())
    statuses = deployment.control.status_all()
    assert {name: status["retired_rollouts"] for name, status in statuses.items()} == dict.fromkeys(statuses, 0)
    assert statuses["resources"]["retired_sessions"] == 0


def test_a_retired_rollout_started_over_as_the_next_attempt_completes(deploy: Deploy) -> None:
    """Found by the state machine: a session cookie of the retired attempt rode along on the next attempt's seed."""
    deployment = deploy("native")
    run = deployment.start_held(native_run_body("again-1", 0), calls_delivered=0)
    deployment.control.retire("retire", [EpisodeId(rollout_id="again-1")], deadline())
    assert run.result().json()["error"]["code"] == "stale_attempt"
    deployment.backend("/_ctl/release")

    reply = deployment.run(native_run_body("again-1", 1))

    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0
    assert [(call["capture_key"], call["n_messages"]) for call in deployment.calls()][1:] == [
        ("again-1-a1", 2),
        ("again-1-a1", 4),
    ]
