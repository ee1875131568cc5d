"""The policy model server as two uvicorn workers behind one port (reference 1.4, 7.4), over HTTP only.

Every reply of a worker names the worker's pid (`x-ckpt-worker`). Requests to the policy model go through a
client that keeps no connection alive, so each opens a new connection, which the kernel hands to whichever worker
accepts first; repeating one until every worker has answered reaches each of them, and nothing here depends on
which worker gets which connection. (The deployment's own client reuses connections: one a killed worker held is
reset.)
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest

from ckpt_model.protocol.gym_tasks import native_run_body
from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX, EpisodeId
from fakes.gym.protocol.wire import PLACEMENT_ROUTE
from fakes.gym.workers.runtime import runtime_dir
from fakes.processes.process_groups import process_state
from tests.stack.conftest import Deployment, deadline, group_gone, process_gone, wait_until
from tests.stack.test_scenarios import Deploy, checkpoint, crash_and_restore, n_messages

pytestmark = pytest.mark.processes

WORKERS = 2
MODEL = "policy_model"
MESSAGES = [{"role": "developer", "content": "You answer."}, {"role": "user", "content": "Weather in SF?"}]
REQUEST_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def fresh_http() -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=limits, trust_env=False) as client:
        yield client


@attrs.define
class Workers:
    """A deployment whose policy model runs two workers, and requests to that server on fresh connections."""

    deployment: Deployment
    http: httpx.Client

    @property
    def url(self) -> str:
        return self.deployment.url(MODEL)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.deployment.stack.token}"}

    def status(self) -> dict[str, Any]:
        reply = self.http.get(self.url + CHECKPOINT_ROUTE_PREFIX + "/status", headers=self.auth())
        assert reply.status_code == 200, reply.text
        return reply.json()

    def statuses(self) -> dict[int, dict[str, Any]]:
        """The status from each worker, by pid."""
        url = self.url + CHECKPOINT_ROUTE_PREFIX + "/status"
        replies = from_every_worker(lambda: self.http.get(url, headers=self.auth()), "a status")
        assert all(reply.status_code == 200 for reply in replies.values()), {p: r.text for p, r in replies.items()}
        return {pid: reply.json() for pid, reply in replies.items()}

    def post(self, op: str, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(f"{self.url}{CHECKPOINT_ROUTE_PREFIX}/{op}", json=body, headers=self.auth())

    def generate(self, capture_key: str) -> httpx.Response:
        url = f"{self.url}/ng-rollout/{capture_key}/v1/chat/completions"
        return self.http.post(url, json={"model": "fake-model", "messages": MESSAGES})


def deploy_workers(deploy: Deploy, fresh_http: httpx.Client, **options: Any) -> Workers:
    return Workers(deploy("native", policy_workers=WORKERS, **options), fresh_http)


def from_every_worker(send: Callable[[], httpx.Response], what: str) -> dict[int, httpx.Response]:
    """`send()` until every worker has answered; the last reply of each, by worker pid."""
    replies: dict[int, httpx.Response] = {}

    def every_worker_answered() -> bool:
        response = send()
        replies[int(response.headers["x-ckpt-worker"])] = response
        return len(replies) == WORKERS

    wait_until(every_worker_answered, f"{what} from each of the {WORKERS} workers")
    return replies


def error_of(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


def test_every_worker_answers_every_control_call_as_the_one_coordinator(
    deploy: Deploy, fresh_http: httpx.Client
) -> None:
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
    idle = workers.statuses()
    assert {(s["phase"], s["checkpoint_id"], s["workers"], s["expected_workers"]) for s in idle.values()} == {
        ("idle", None, WORKERS, WORKERS)
    }
    assert {s["report"]["counts"]["workers"] for s in idle.values()} == {WORKERS}

    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()
    during = workers.statuses()
    assert {(s["phase"], s["checkpoint_id"], s["lease_expires_at"]) for s in during.values()} == {
        ("prepared", "c1", during[next(iter(during))]["lease_expires_at"])
    }

    deployment.control.resume("c1", deadline())
    body = {"checkpoint_id": "c1", "deadline_ts": deadline()}
    replayed = from_every_worker(lambda: workers.post("resume", body), "a repeated resume")
    assert [reply.json() for reply in replayed.values()] == [{"phase": "idle", "idempotent": True}] * WORKERS
    stale = from_every_worker(lambda: workers.post("prepare", body), "a prepare of a resumed checkpoint")
    assert {error_of(reply) for reply in stale.values()} == {(409, "stale_checkpoint")}
    status_url = workers.url + CHECKPOINT_ROUTE_PREFIX + "/status"
    unauthorized = from_every_worker(lambda: workers.http.get(status_url), "a status without token")
    assert {error_of(reply) for reply in unauthorized.values()} == {(401, "unauthorized")}
    malformed = from_every_worker(lambda: workers.post("prepare", {"checkpoint_id": "c2"}), "a malformed prepare")
    assert {reply.status_code for reply in malformed.values()} == {422}
    assert {(s["phase"], s["checkpoint_id"]) for s in workers.statuses().values()} == {("idle", None)}


def test_native_episode_continues_after_a_crash_with_two_workers(deploy: Deploy, fresh_http: httpx.Client) -> None:
    """Gym's scenario 1 with `policy_workers` 2."""
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
    original = deployment.start_held(native_run_body("crash-1", 0), calls_delivered=1)
    scope = [EpisodeId(rollout_id="crash-1", attempt=0)]
    directory = checkpoint(deployment, "c1", scope)

    crash_and_restore(deployment, "r1", directory, scope)
    reply = deployment.run(native_run_body("crash-1", 1))

    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0
    assert n_messages(deployment) == [2, 4, 4]
    original.wait()
    assert original.error is not None, "the crashed attempt's /run should have been cut off"


def test_a_checkpoint_without_a_crash_parks_then_resumes_with_two_workers(
    deploy: Deploy, fresh_http: httpx.Client
) -> None:
    """Gym's scenario 8 with `policy_workers` 2: the worker that has the call holds its reply until resume."""
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
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


def concurrent_held_calls(workers: Workers, keys: list[str]) -> list[httpx.Response]:
    """Send one call per key at once, each on its own connection; once all wait at the backend, check that every
    worker's status counts all of them in flight, then release them; their replies."""
    deployment = workers.deployment
    before = len(deployment.calls())
    deployment.backend("/_ctl/hold", {"after_calls": before})
    replies: list[httpx.Response] = []

    def send(key: str) -> None:
        replies.append(workers.generate(key))

    threads = [threading.Thread(target=send, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(deployment.calls()) == before + len(keys), "every call to wait at the backend")
    inflight = {status["report"]["counts"]["inflight"] for status in workers.statuses().values()}
    assert inflight == {len(keys)}, "every worker's status must count the calls in flight on all workers"
    deployment.backend("/_ctl/release")
    for thread in threads:
        thread.join()
    return replies


def test_concurrent_generation_calls_are_served_by_both_workers(deploy: Deploy, fresh_http: httpx.Client) -> None:
    workers = deploy_workers(deploy, fresh_http)
    served_by: set[int] = set()
    for round_ in range(4):  # 8 concurrent connections rarely all land on one worker; 4 rounds make it ~never
        replies = concurrent_held_calls(workers, [f"spread-{round_}-{i}" for i in range(8)])
        assert [reply.status_code for reply in replies] == [200] * len(replies), [reply.text for reply in replies]
        served_by |= {int(reply.headers["x-ckpt-worker"]) for reply in replies}
        if len(served_by) == WORKERS:
            break
    assert len(served_by) == WORKERS, f"only workers {served_by} served calls"


def test_a_retired_attempt_is_refused_by_every_worker_until_forgotten(deploy: Deploy, fresh_http: httpx.Client) -> None:
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
    deployment.control.retire("retire", [EpisodeId(rollout_id="gone-1")], deadline())
    refused = from_every_worker(lambda: workers.generate("gone-1"), "a call of the retired attempt")
    assert {error_of(reply) for reply in refused.values()} == {(409, "stale_attempt")}
    later = from_every_worker(lambda: workers.generate("gone-1-a1"), "a call of the next attempt")
    assert {reply.status_code for reply in later.values()} == {200}

    deployment.control.forget("forget", ["gone-1"], deadline())
    accepted = from_every_worker(lambda: workers.generate("gone-1"), "a call after forget")
    assert {reply.status_code for reply in accepted.values()} == {200}
    assert {s["retired_rollouts"] for s in workers.statuses().values()} == {0}


def test_a_worker_lost_while_prepared_blocks_commit_until_resume_and_the_server_no_longer_restores(
    deploy: Deploy, fresh_http: httpx.Client
) -> None:
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
    victim = min(workers.statuses())
    directory = checkpoint(deployment, "c0", [])
    deployment.control.resume("c0", deadline())
    assert deployment.control.prepare("c1", deadline()).prepared

    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: workers.status()["workers"] == WORKERS - 1, "the coordinator to see the loss")
    status = workers.status()
    assert status["report"]["ready"] is False
    assert status["report"]["blockers"] == [f"{MODEL}-worker-lost"]
    body = {"checkpoint_id": "c1", "deadline_ts": deadline(), "checkpoint_dir": str(deployment.stack.checkpoint_root)}
    refused = workers.post("commit", {**body, "episode_ids": []})
    assert error_of(refused) == (409, "invalid_phase"), refused.text
    assert workers.http.get(workers.url + "/health").status_code == 503

    assert workers.post("resume", {"checkpoint_id": "c1", "deadline_ts": deadline()}).status_code == 200
    assert workers.status()["report"] == {
        "ready": True,
        "blockers": [],
        "blocker_count": 0,
        "counts": {"inflight": 0, "held": 0, "cut": 0, "cut_failed": 0, "cut_skipped": 0, "workers": WORKERS - 1},
        "restarts": [],
    }
    restore = {"checkpoint_id": "r1", "deadline_ts": deadline(), "checkpoint_dir": directory, "episode_ids": []}
    refused = workers.post("restore", restore)
    assert error_of(refused) == (409, "checkpoint_error"), refused.text
    assert "freshly started model server" in refused.json()["error"]["detail"]


def test_a_crash_kills_every_worker_and_leaves_nothing(deploy: Deploy, fresh_http: httpx.Client) -> None:
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
    server = deployment.stack.gym[MODEL]
    pids = list(workers.statuses())
    assert {os.getpgid(pid) for pid in pids} == {server.pgid}
    assert runtime_dir(server.pid).is_dir()

    deployment.stack.crash_gym()

    assert group_gone(server.pgid)
    assert all(process_state(pid) is None for pid in pids), {pid: process_state(pid) for pid in pids}
    assert not runtime_dir(server.pid).exists()
    # Orphaned by their coordinator, the workers were re-parented to the fork server (a child subreaper) and
    # reaped by it, not left for init to collect a second later.
    assert deployment.stack.fork_server is not None
    assert [deployment.stack.fork_server.exit_status(pid) for pid in pids] == [-signal.SIGKILL] * WORKERS


def test_the_policy_model_restarts_alone_with_fresh_workers(deploy: Deploy, fresh_http: httpx.Client) -> None:
    workers = deploy_workers(deploy, fresh_http)
    deployment = workers.deployment
    environment_pid = deployment.stack.gym["environment"].pid
    old = deployment.stack.gym[MODEL]
    old_workers = set(workers.statuses())
    assert workers.generate("before-1").status_code == 200

    deployment.stack.restart_server(MODEL)

    assert group_gone(old.pgid)
    assert all(process_gone(pid) for pid in old_workers)
    fresh = workers.statuses()
    assert not set(fresh) & old_workers
    assert {(s["phase"], s["workers"]) for s in fresh.values()} == {("idle", WORKERS)}
    assert deployment.stack.gym["environment"].pid == environment_pid
    assert workers.generate("after-1").status_code == 200


def test_a_cold_started_server_runs_its_workers_too(deploy: Deploy, fresh_http: httpx.Client) -> None:
    """Without the fork server (`fork_server=False`) the coordinator binds its own socket and forks its workers."""
    workers = deploy_workers(deploy, fresh_http, fork_server=False)
    fresh = workers.statuses()
    assert {(s["phase"], s["workers"], s["expected_workers"]) for s in fresh.values()} == {("idle", WORKERS, WORKERS)}
    calls = from_every_worker(lambda: workers.generate("cold-1"), "a call")
    assert {reply.status_code for reply in calls.values()} == {200}


def place(workers: Workers, placement: dict[str, int]) -> httpx.Response:
    return workers.http.post(workers.url + PLACEMENT_ROUTE, json={"placement": placement}, headers=workers.auth())


def test_a_placed_call_is_served_by_its_worker_whichever_worker_accepts_it(
    deploy: Deploy, fresh_http: httpx.Client
) -> None:
    workers = deploy_workers(deploy, fresh_http)
    assert place(workers, {"placed-0": 0, "placed-1": 1}).status_code == 200
    served: dict[str, set[int]] = {"placed-0": set(), "placed-1": set()}
    for _ in range(6):  # fresh connections: the kernel hands them to either worker
        for key, pids in served.items():
            reply = workers.generate(key)
            assert reply.status_code == 200, reply.text
            pids.add(int(reply.headers["x-ckpt-worker"]))
    calls = workers.deployment.calls()
    assert {call["capture_key"]: call["worker"] for call in calls} == {"placed-0": 0, "placed-1": 1}
    assert all(len(pids) == 1 for pids in served.values()), f"each key's calls must come from one worker: {served}"
    assert served["placed-0"] != served["placed-1"], "the two keys are placed on different workers"
    unplaced = workers.generate("unplaced")
    assert unplaced.status_code == 200, "a key the placement does not name is served where it is accepted"


def test_a_placement_naming_a_worker_the_server_lacks_is_refused(deploy: Deploy, fresh_http: httpx.Client) -> None:
    workers = deploy_workers(deploy, fresh_http)
    refused = place(workers, {"placed": WORKERS})
    assert refused.status_code >= 400, refused.text
    assert "outside 0..1" in refused.text, refused.text
    assert place(workers, {"placed": 1}).status_code == 200
    assert workers.http.post(workers.url + PLACEMENT_ROUTE, json={"placement": {}}).status_code == 401
