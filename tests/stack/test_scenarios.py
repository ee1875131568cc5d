"""Gym's e2e scenarios against the look-alike stack, driven over HTTP only (real processes, real SIGKILL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.protocol.client import PrepareResult
from ckpt_model.protocol.gym_tasks import COUNTER_SCRIPT, counter_run_body, legacy_run_body, native_run_body
from ckpt_model.protocol.storage import participant_dir, read_records
from ckpt_model.protocol.wire import EpisodeId
from fakes import clock
from tests.stack.conftest import Deployment, deadline, move_clock, wait_until

pytestmark = pytest.mark.processes

Deploy = Callable[..., Deployment]


def n_messages(deployment: Deployment) -> list[int]:
    return [call["n_messages"] for call in deployment.calls()]


def n_messages_of_policy(deployment: Deployment) -> list[int]:
    return [call["n_messages"] for call in deployment.calls() if call["kind"] == "policy"]


def environment_records(directory: str) -> list[Any]:
    return read_records(participant_dir(Path(directory), "environment", "environment"), "environment", "environment")


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


# Each topology's episode, the model calls its crash, restore and continuation make, and where its reply says the
# reward.
CONTINUED_EPISODES = pytest.mark.parametrize(
    ("topology", "body", "expected_messages", "reward_of"),
    [
        ("native", native_run_body, [2, 4, 4], lambda reply: reply["result"]["reward"]),
        ("legacy", legacy_run_body, [1, 3, 3], lambda reply: reply["reward"]),
    ],
    ids=["native", "legacy"],
)


@CONTINUED_EPISODES
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


def resources_records(directory: str) -> list[Any]:
    return read_records(participant_dir(Path(directory), "resources", "resources"), "resources", "resources")


@pytest.mark.parametrize("restore_resources", [True, False], ids=["restored", "resources-restore-skipped"])
def test_resources_state_is_restored_with_the_episode(deploy: Deploy, restore_resources: bool) -> None:
    """Gym's scenario 5: only a restored counter (4 after the first increment) ends at the expected 6. The
    negative control plants `resources_restore_skipped`: the continuation then counts from 0 and earns nothing."""
    faults = () if restore_resources else ("resources_restore_skipped",)
    deployment = deploy("counter", faults=faults)
    deployment.backend("/_ctl/script", {"tool_calls": list(COUNTER_SCRIPT)})
    deployment.start_held(counter_run_body("counter-1", 0), calls_delivered=1)
    scope = [EpisodeId(rollout_id="counter-1", attempt=0)]
    directory = checkpoint(deployment, "c1", scope)
    (record,) = resources_records(directory)
    assert (record["episode_id"], record["state"]) == ({"rollout_id": "counter-1", "attempt": 0}, {"count": 4})

    deployment.crash_and_restart()
    restored = deployment.control.restore("r1", directory, scope, deadline())
    deployment.control.resume("r1", deadline())
    reply = deployment.run(counter_run_body("counter-1", 1))

    assert restored["resources"]["restored"] == (["counter-1-a1"] if restore_resources else [])
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == (1.0 if restore_resources else 0.0)
    assert n_messages(deployment) == [1, 3, 3, 5]


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


def judge_calls(deployment: Deployment, key: str) -> int:
    return sum(1 for call in deployment.calls() if call["kind"] == "judge" and call["capture_key"] == key)


# A prepare the environment may block answers once its deadline passed: this far ahead, so that no loaded machine
# makes a stage refuse it as late, and passed by moving the environment's clock (libfaketime) once it reports its
# blockers; without libfaketime the deadline is this close instead, and waited out.
BLOCKED_DEADLINE_S = 60.0
BLOCKED_DEADLINE_WAITED_S = 1.5


def prepare_blocked_or_not(deployment: Deployment, checkpoint_id: str) -> PrepareResult:
    """A prepare of `checkpoint_id` that answers at once if nothing blocks it, else once the environment gave up
    waiting on its blockers (its clock moved past the deadline, then back)."""
    if clock.library() is None:
        return deployment.control.prepare(checkpoint_id, time.time() + BLOCKED_DEADLINE_WAITED_S)
    deadline_ts = time.time() + BLOCKED_DEADLINE_S
    with ThreadPoolExecutor(1) as pool:
        prepare = pool.submit(deployment.control.prepare, checkpoint_id, deadline_ts)

        def blocked() -> bool:
            status = deployment.status("environment")
            return status["phase"] == "preparing" and bool(status["report"]["blockers"])

        wait_until(lambda: prepare.done() or blocked(), "the prepare answered, or the environment blocked")
        if not prepare.done():
            move_clock(deployment, "environment", deadline_ts - time.time() + 1.0)
            try:
                return prepare.result()
            finally:
                move_clock(deployment, "environment", 0.0)
        return prepare.result()


@pytest.mark.parametrize("verify_mode", ["wait", "replay"])
def test_verification_in_flight_is_waited_for_or_replayed(deploy: Deploy, verify_mode: str) -> None:
    """Gym's scenario 9: `wait` verification blocks prepare and never runs again after restore; `replay` does
    not block, is exported as the step still to do, and runs again for the continued attempt."""
    deployment = deploy("slow", verify_mode)
    deployment.backend("/_ctl/gate")
    run = deployment.run_in_background(native_run_body("verify-1", 0))
    deployment.release_when_waiting(0, "policy")
    deployment.release_when_waiting(1, "policy")
    wait_until(lambda: judge_calls(deployment, "verify-1") == 1, "the judge call of verify-1")

    early = prepare_blocked_or_not(deployment, "c1")
    scope = [EpisodeId(rollout_id="verify-1", attempt=0)]
    if verify_mode == "wait":
        assert not early.prepared
        assert early.blockers() == {"environment": ["verify-1"]}
        deployment.backend("/_ctl/step", {"indices": [2]})  # verification ends; the episode parks at `return`
    else:
        assert early.prepared, early.blockers()
    directory = checkpoint(deployment, "c1", scope)
    assert not run.done, "no reply while the checkpoint is open"
    (record,) = environment_records(directory)
    assert record["boundary"]["next"] == ("return" if verify_mode == "wait" else "verify")

    crash_and_restore(deployment, "c1-restore", directory, scope)
    deployment.backend("/_ctl/gate")  # the crash released (and ungated) everything
    replacement = deployment.run_in_background(native_run_body("verify-1", 1))
    if verify_mode == "replay":
        deployment.release_when_waiting(3, "judge")
    reply = replacement.result()

    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0
    assert n_messages_of_policy(deployment) == [2, 4]
    assert judge_calls(deployment, "verify-1-a1") == (0 if verify_mode == "wait" else 1)


def call_kinds(deployment: Deployment) -> list[str]:
    return [call["kind"] for call in deployment.calls()]


@pytest.mark.parametrize("crash", [False, True], ids=["resume", "crash"])
def test_an_episode_that_finishes_during_prepare_is_neither_lost_nor_redone(deploy: Deploy, crash: bool) -> None:
    """Gym's scenario 10: a prepare waits for a `wait` verification; once it ends, the episode parks at `return`
    without replying, the commit exports it there, and it replies exactly once: after resume, or as attempt 1
    after a crash without asking the judge again."""
    deployment = deploy("slow", "wait")
    run, prepared = deployment.finish_verification_during_prepare("done-1", "c1")

    assert prepared.prepared, prepared.blockers()
    statuses = deployment.control.status_all()
    assert {name: status["phase"] for name, status in statuses.items()} == dict.fromkeys(statuses, "prepared")
    # The episode is parked at `return`: still live (a reply would have ended it), and nothing else holds it.
    assert statuses["environment"]["report"]["counts"] == {"episodes": 1}
    assert statuses["environment"]["report"]["blockers"] == []
    assert statuses["agent"]["report"]["counts"] == {"sessions": 0, "at_boundary": 0}
    assert statuses["resources"]["report"]["counts"] == {"inflight": 0, "sessions": 0}
    assert statuses["policy_model"]["report"]["counts"]["inflight"] == 0
    assert statuses["policy_model"]["report"]["counts"]["held"] == 0
    assert not run.done, "the /run replied while the checkpoint was prepared"

    scope = [EpisodeId(rollout_id="done-1", attempt=0)]
    directory = str(deployment.stack.checkpoint_root / "c1")
    committed = deployment.control.commit("c1", directory, scope, deadline())
    assert committed["environment"]["episode_ids"] == ["done-1"]
    (record,) = environment_records(directory)
    assert record["boundary"]["next"] == "return"
    assert not run.done, "the /run replied while the checkpoint was committed"

    if crash:
        crash_and_restore(deployment, "r1", directory, scope)
        reply = deployment.run(native_run_body("done-1", 1))
        run.wait()
        assert run.error is not None, "the crashed attempt's /run should have been cut off"
    else:
        deployment.control.resume("c1", deadline())
        reply = run.result()

    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0
    # Two policy calls and one judge call in all: the restored `return` boundary replies without verifying again.
    assert call_kinds(deployment) == ["policy", "policy", "judge"]
