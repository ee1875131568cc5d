"""The environment, agent and resources servers as two uvicorn workers each behind one port (reference 1.4,
Appendix B), over HTTP only: Gym's scenarios with `server_workers` 2, its concurrent sessions across workers, and
its session routing with one worker killed.

Where an episode runs is the placement's (`POST /_ctl/placement` on each server, as the checker sets it): every
request of a capture key is served by that worker, whichever worker the kernel hands the connection.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from ckpt_model.protocol.gym_tasks import native_run_body
from ckpt_model.protocol.wire import EpisodeId
from fakes.gym.protocol.wire import PLACEMENT_ROUTE, WORKERS_ROUTE, bearer
from tests.stack import test_scenarios as scenarios
from tests.stack.conftest import Deployment, process_gone, wait_until
from tests.stack.test_scenarios import CONTINUED_EPISODES, Deploy, checkpoint, crash_and_restore, n_messages

pytestmark = pytest.mark.processes

WORKERS = 2
SERVERS = ("environment", "agent", "resources")


def with_two_workers(deploy: Deploy) -> Deploy:
    return lambda *args, **options: deploy(*args, server_workers=WORKERS, **options)


def place(deployment: Deployment, placement: dict[str, int]) -> None:
    """Serve each capture key's requests on its worker of every participant server."""
    for name in SERVERS:
        reply = deployment.http.post(
            deployment.url(name) + PLACEMENT_ROUTE,
            json={"placement": placement},
            headers={"Authorization": bearer(deployment.stack.token)},
        )
        assert reply.status_code == 200, reply.text


def workers_of(deployment: Deployment, name: str) -> dict[int, int]:
    """Worker index -> pid of the live workers of server `name`."""
    reply = deployment.http.get(
        deployment.url(name) + WORKERS_ROUTE, headers={"Authorization": bearer(deployment.stack.token)}
    )
    assert reply.status_code == 200, reply.text
    return {int(worker["index"]): int(worker["pid"]) for worker in reply.json()["workers"]}


# --- Gym's scenarios, with two workers on every participant server --------------------------------------------


@CONTINUED_EPISODES
def test_an_episode_continues_from_its_last_boundary_after_a_crash(
    deploy: Deploy, topology: str, body: Callable, expected_messages: list[int], reward_of: Callable
) -> None:
    scenarios.test_an_episode_continues_from_its_last_boundary_after_a_crash(
        with_two_workers(deploy), topology, body, expected_messages, reward_of
    )


def test_resources_state_is_restored_with_the_episode(deploy: Deploy) -> None:
    scenarios.test_resources_state_is_restored_with_the_episode(with_two_workers(deploy), restore_resources=True)


def test_a_checkpoint_without_a_crash_parks_the_episode_then_resumes_it(deploy: Deploy) -> None:
    scenarios.test_a_checkpoint_without_a_crash_parks_the_episode_then_resumes_it(with_two_workers(deploy))


def test_a_retired_episode_stops_everywhere_and_leaves_nothing_behind(deploy: Deploy) -> None:
    scenarios.test_a_retired_episode_stops_everywhere_and_leaves_nothing_behind(with_two_workers(deploy))


def test_every_server_reports_its_workers(deploy: Deploy) -> None:
    deployment = with_two_workers(deploy)("native")
    for name in SERVERS:
        status = deployment.status(name)
        assert (status["workers"], status["expected_workers"]) == (WORKERS, WORKERS), status
        assert sorted(workers_of(deployment, name)) == [0, 1]


# --- concurrent sessions across workers ------------------------------------------------------------------------


def test_concurrent_sessions_across_workers_all_continue_after_a_crash(deploy: Deploy) -> None:
    """The older e2e's scenario: rollouts on both workers of every server, each at its second model call, are
    checkpointed together; after a crash and restore every replacement continues (whichever worker it is placed
    on now) and completes with the reward of an uninterrupted run."""
    deployment = with_two_workers(deploy)("native")
    rollouts = [f"across-{index}" for index in range(4)]
    place(deployment, {rollout: index % WORKERS for index, rollout in enumerate(rollouts)})
    deployment.backend("/_ctl/gate")
    runs = [deployment.run_in_background(native_run_body(rollout, 0)) for rollout in rollouts]
    wait_until(lambda: len(deployment.calls()) == len(rollouts), "every first call to wait")
    deployment.backend("/_ctl/step", {"indices": list(range(len(rollouts)))})
    wait_until(lambda: len(deployment.calls()) == 2 * len(rollouts), "every second call to wait")
    scope = [EpisodeId(rollout_id=rollout, attempt=0) for rollout in rollouts]
    directory = checkpoint(deployment, "c1", scope)

    crash_and_restore(deployment, "r1", directory, scope)
    # The replacements land on the other worker than their attempt did: a restored record follows its episode.
    place(deployment, {f"{rollout}-a1": (index + 1) % WORKERS for index, rollout in enumerate(rollouts)})
    replies = [deployment.run_in_background(native_run_body(rollout, 1)) for rollout in rollouts]

    for reply in replies:
        assert reply.result().status_code == 200, reply.result().text
        assert reply.result().json()["result"]["reward"] == 1.0
    assert sorted(n_messages(deployment)) == sorted([2] * 4 + [4] * 4 + [4] * 4)
    for run in runs:
        run.wait()
        assert run.error is not None, "a crashed attempt's /run should have been cut off"
    assert deployment.status("environment")["restored_pending"] == []


# --- session routing with one worker killed --------------------------------------------------------------------


def error_code(reply: Any) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


def test_a_killed_workers_sessions_answer_410_and_every_other_session_verifies(deploy: Deploy) -> None:
    """Gym's session-routing scenario: kill the resources worker holding a session; that session's requests answer
    410 on whichever worker they land, while the session on the other worker still verifies and its episode
    completes. The server goes on with one worker, and says so."""
    deployment = with_two_workers(deploy)("native")
    doomed, kept = "routed-0", "routed-1"
    place(deployment, {doomed: 1, kept: 0})
    deployment.backend("/_ctl/gate")
    doomed_run = deployment.run_in_background(native_run_body(doomed, 0))
    kept_run = deployment.run_in_background(native_run_body(kept, 0))
    wait_until(lambda: len(deployment.calls()) == 2, "both first model calls to wait")

    victim = workers_of(deployment, "resources")[1]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: process_gone(victim), "the killed worker to be gone")
    wait_until(lambda: deployment.status("resources")["workers"] == 1, "the coordinator to see the worker gone")

    verify = deployment.url("resources") + f"/ng-rollout/{doomed}/verify"
    for _ in range(4):  # each on a fresh connection: it lands on a live worker, which routes it to the dead one
        reply = deployment.http.post(verify, json={"response": {}}, headers={"connection": "close"})
        assert error_code(reply) == (410, "worker_lost"), reply.text

    deployment.backend("/_ctl/release")
    kept_reply = kept_run.result()
    assert kept_reply.status_code == 200, kept_reply.text
    assert kept_reply.json()["result"]["reward"] == 1.0
    doomed_reply = doomed_run.result()
    assert doomed_reply.status_code == 200, doomed_reply.text
    assert "failure" in doomed_reply.json(), doomed_reply.text

    status = deployment.status("resources")
    assert (status["workers"], status["expected_workers"]) == (1, WORKERS)
