"""The shared control plane over HTTP, against a small in-memory participant defined here."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from fastapi import FastAPI

from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX, EpisodeId
from fakes import faults as fault_catalogue
from fakes.gym.config import ServerConfig
from fakes.gym.control import plane as control_plane_module
from fakes.gym.control import store
from fakes.gym.control.participant import PrepareReport
from fakes.gym.control.plane import ControlPlane
from fakes.gym.protocol.errors import CheckpointStateError, ControlError, install_error_handlers

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT_TIMEOUT_S = 5.0
# Deadlines (and so leases) that pass within a test: long enough that no request of the test arrives after them
# with two CPU-bound processes beside the suite (0.2-0.5 s did not: a prepare arrived 0.17 s past its deadline).
SHORT_DEADLINE_S = 1.5
KINDS = ("environment", "agent", "resources", "model")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeParticipant:
    """Live episodes keyed by capture key; readiness, restarts and failures are set by the test."""

    kind = "environment"

    def __init__(self) -> None:
        self.plane: ControlPlane | None = None
        self.accepting = True
        self.live: dict[str, dict[str, Any]] = {}
        self.restored: set[str] = set()
        self.blockers: set[str] = set()
        self.restarts: set[str] = set()
        self.export_calls = 0
        self.export_error: Exception | None = None
        self.close_error: Exception | None = None
        self.retire_saw_marks: list[bool] = []
        self.forgotten: list[list[str]] = []
        self.kept_by_cleanup: list[set[str]] = []

    def set_blockers(self, *keys: str) -> None:
        self.blockers = set(keys)
        assert self.plane is not None
        self.plane.notify()

    def report(self) -> PrepareReport:
        counts = {"episodes": len(self.live)}
        return PrepareReport(
            ready=not self.blockers, blockers=tuple(self.blockers), counts=counts, restarts=tuple(self.restarts)
        )

    async def close_admission(self, deadline_ts: float | None) -> None:
        if self.close_error is not None:
            raise self.close_error
        self.accepting = False

    async def open_admission(self) -> None:
        self.accepting = True

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        self.export_calls += 1
        if self.export_error is not None:
            raise self.export_error
        return [
            {"episode_id": EpisodeId.from_capture_key(key).wire(), "state": dict(state)}
            for key, state in sorted(self.live.items())
        ]

    def validate_record(self, record: dict[str, Any]) -> None:
        if not isinstance(record.get("state"), dict):
            raise CheckpointStateError(f"record {record['episode_id']} has no 'state' object")

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        if self.live or self.restored:
            raise ControlError("restore requires a process without live episodes")
        keys = [EpisodeId.model_validate(record["episode_id"]).next_attempt().capture_key for record in records]
        self.restored = set(keys)
        return keys

    async def delete_restored(self, keep: set[str]) -> None:
        self.kept_by_cleanup.append(set(keep))
        self.restored &= keep

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        assert self.plane is not None
        self.retire_saw_marks.append(all(self.plane.retired.is_retired(episode) for episode in episode_ids))
        for key in list(self.live):
            if self.plane.retired.is_retired(EpisodeId.from_capture_key(key)):
                del self.live[key]

    async def check_forget(self, rollout_ids: list[str]) -> None:
        return None

    async def forget(self, rollout_ids: list[str]) -> None:
        self.forgotten.append(list(rollout_ids))

    def status_extras(self) -> dict[str, Any]:
        return {"accepting": self.accepting, "restored_pending": sorted(self.restored)}


@attrs.define
class Stack:
    client: httpx.AsyncClient
    plane: ControlPlane
    participant: FakeParticipant
    checkpoint_dir: Path

    async def post(
        self, op: str, checkpoint_id: str = "c1", *, deadline_s: float = 10.0, **fields: Any
    ) -> httpx.Response:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": time.time() + deadline_s, **fields}
        return await self.client.post(f"{CHECKPOINT_ROUTE_PREFIX}/{op}", json=body)

    async def ok(self, op: str, checkpoint_id: str = "c1", **fields: Any) -> dict[str, Any]:
        reply = await self.post(op, checkpoint_id, **fields)
        assert reply.status_code == 200, reply.text
        return reply.json()

    async def status(self) -> dict[str, Any]:
        reply = await self.client.get(f"{CHECKPOINT_ROUTE_PREFIX}/status")
        assert reply.status_code == 200, reply.text
        return reply.json()

    async def commit(self, checkpoint_id: str = "c1", scope: list[str] | None = None, **fields: Any) -> httpx.Response:
        fields.setdefault("checkpoint_dir", str(self.checkpoint_dir))
        if scope is not None:
            fields["episode_ids"] = [EpisodeId.from_capture_key(key).wire() for key in scope]
        return await self.post("commit", checkpoint_id, **fields)

    async def restore(self, checkpoint_id: str, scope: list[str], **fields: Any) -> httpx.Response:
        fields.setdefault("checkpoint_dir", str(self.checkpoint_dir))
        fields["episode_ids"] = [EpisodeId.from_capture_key(key).wire() for key in scope]
        return await self.post("restore", checkpoint_id, **fields)


@contextlib.asynccontextmanager
async def open_stack(
    checkpoint_dir: Path, *, lease_grace_s: float = 600.0, kind: str = "environment", faults: tuple[str, ...] = ()
) -> AsyncIterator[Stack]:
    """One control plane over HTTP; `kind` makes it answer as that participant kind (planted faults check it)."""
    participant = FakeParticipant()
    participant.kind = kind
    plane = ControlPlane(participant, instance="env-1", token=TOKEN, lease_grace_s=lease_grace_s, faults=faults)
    participant.plane = plane
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(plane.router())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://participant", headers=AUTH) as client:
        try:
            yield Stack(client, plane, participant, checkpoint_dir)
        finally:
            await plane.close()


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    """Poll a condition (never a fixed sleep); fail with what was awaited."""
    give_up_at = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up_at:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
        await asyncio.sleep(0.005)


def error_of(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


async def test_status_of_a_fresh_server_is_idle(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        status = await stack.status()

    assert status == {
        "kind": "environment",
        "instance": "env-1",
        "phase": "idle",
        "checkpoint_id": None,
        "lease_expires_at": None,
        "retired_rollouts": 0,
        "report": {"ready": True, "blockers": [], "blocker_count": 0, "counts": {"episodes": 0}, "restarts": []},
        "accepting": True,
        "restored_pending": [],
    }


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": f"bearer {TOKEN}"}],
    ids=["missing", "wrong-token", "no-scheme", "lowercase-scheme"],
)
async def test_control_routes_need_the_exact_bearer(tmp_path: Path, headers: dict[str, str]) -> None:
    async with open_stack(tmp_path) as stack:
        stack.client.headers.pop("Authorization")
        body = {"checkpoint_id": "c1", "deadline_ts": time.time() + 10}
        prepare = await stack.client.post(f"{CHECKPOINT_ROUTE_PREFIX}/prepare", json=body, headers=headers)
        status = await stack.client.get(f"{CHECKPOINT_ROUTE_PREFIX}/status", headers=headers)
        phase = stack.plane.phase

    assert error_of(prepare) == (401, "unauthorized")
    assert error_of(status) == (401, "unauthorized")
    assert phase == "idle"


@pytest.mark.parametrize(
    "body",
    [
        {"checkpoint_id": "c1", "deadline_ts": 1e12, "surprise": 1},
        {"checkpoint_id": "../c1", "deadline_ts": 1e12},
        {"checkpoint_id": "c1"},
    ],
    ids=["extra-field", "bad-id", "missing-deadline"],
)
async def test_malformed_body_is_422_even_without_a_bearer(tmp_path: Path, body: dict[str, Any]) -> None:
    async with open_stack(tmp_path) as stack:
        stack.client.headers.pop("Authorization")
        reply = await stack.client.post(f"{CHECKPOINT_ROUTE_PREFIX}/prepare", json=body)

    assert reply.status_code == 422
    assert isinstance(reply.json()["detail"], list)


async def test_prepare_commit_resume_walk_the_phases(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {"step": 1}, "r1-a1": {"step": 2}}
        prepared = await stack.ok("prepare")
        closed = not stack.participant.accepting
        committed = await stack.ok("commit", checkpoint_dir=str(tmp_path), episode_ids=None)
        status = await stack.status()
        resumed = await stack.ok("resume")
        after = await stack.status()

    assert prepared["phase"] == "prepared"
    assert prepared["report"]["ready"] is True
    assert closed
    assert committed["phase"] == "committed"
    assert committed["episode_ids"] == ["r0", "r1-a1"]
    assert committed["manifest"] == store.read_participant_state(tmp_path, "environment", "env-1")[0]
    assert (status["phase"], status["checkpoint_id"]) == ("committed", "c1")
    assert status["lease_expires_at"] > time.time()
    assert resumed == {"phase": "idle", "idempotent": False}
    assert (after["phase"], after["checkpoint_id"], after["lease_expires_at"], after["accepting"]) == (
        "idle",
        None,
        None,
        True,
    )


async def test_resumed_id_is_stale_and_resuming_it_again_is_idempotent(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        await stack.ok("prepare")
        await stack.ok("resume")
        stale = [
            await stack.post("prepare"),
            await stack.post("renew"),
            await stack.commit(),
            await stack.restore("c1", ["r0"]),
            await stack.post("retire", episode_ids=[{"rollout_id": "r0", "attempt": 0}]),
            await stack.post("forget", rollout_ids=["r0"]),
        ]
        again = await stack.ok("resume")

    assert [error_of(reply) for reply in stale] == [(409, "stale_checkpoint")] * 6
    assert again == {"phase": "idle", "idempotent": True}


async def test_resume_while_idle_remembers_the_id(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        resumed = await stack.ok("resume", "c9")
        late_prepare = await stack.post("prepare", "c9")
        accepting = stack.participant.accepting

    assert resumed == {"phase": "idle", "idempotent": True}
    assert error_of(late_prepare) == (409, "stale_checkpoint")
    assert accepting


async def test_another_checkpoint_id_conflicts_while_one_is_active(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        await stack.ok("prepare", "c1")
        replies = [await stack.post("prepare", "c2"), await stack.commit("c2"), await stack.post("resume", "c2")]
        status = await stack.status()

    assert [error_of(reply) for reply in replies] == [(409, "checkpoint_conflict")] * 3
    assert (status["phase"], status["checkpoint_id"]) == ("prepared", "c1")


async def test_commit_while_idle_is_invalid_phase(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        reply = await stack.commit("c1")

    assert error_of(reply) == (409, "invalid_phase")
    assert not (tmp_path / "gym").exists()


async def test_retire_and_forget_while_prepared_say_resume_first(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        await stack.ok("prepare")
        retire = await stack.post("retire", episode_ids=[{"rollout_id": "r1", "attempt": 0}])
        forget = await stack.post("forget", rollout_ids=["r1"])
        retired = len(stack.plane.retired)

    for reply in (retire, forget):
        assert error_of(reply) == (409, "invalid_phase")
        assert "resume first" in reply.json()["error"]["detail"]
    assert retired == 0


async def test_prepare_that_reaches_its_deadline_reports_blockers_and_keeps_admission_closed(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.blockers = {"r1", "r2-a1"}
        reply = await stack.ok("prepare", deadline_s=SHORT_DEADLINE_S)
        status = await stack.status()
        accepting = stack.participant.accepting
        stack.participant.set_blockers()
        retried = await stack.ok("prepare")

    assert reply["phase"] == "preparing"
    assert reply["report"]["ready"] is False
    assert reply["report"]["blockers"] == ["r1", "r2-a1"]
    assert reply["report"]["blocker_count"] == 2
    assert (status["phase"], status["checkpoint_id"]) == ("preparing", "c1")
    assert not accepting
    assert retried["phase"] == "prepared"


async def test_prepare_becomes_prepared_when_the_participant_notifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the periodic re-check an hour away, only the participant's notify() can end the wait.
    monkeypatch.setattr(control_plane_module, "READY_RECHECK_S", 3600.0)
    async with open_stack(tmp_path) as stack:
        stack.participant.blockers = {"r1"}
        prepare = asyncio.ensure_future(stack.ok("prepare", deadline_s=60))
        await wait_until(lambda: stack.plane.phase == "preparing", "the prepare is waiting")
        blocked = not prepare.done()
        stack.participant.set_blockers()
        reply = await asyncio.wait_for(prepare, WAIT_TIMEOUT_S)

    assert blocked
    assert reply["phase"] == "prepared"
    assert reply["report"]["blockers"] == []


async def test_prepare_whose_close_fails_reopens_admission(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.close_error = ControlError("cannot close admission")
        reply = await stack.post("prepare")
        status = await stack.status()

    assert error_of(reply) == (409, "checkpoint_error")
    assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("idle", None, True)


async def test_completed_commit_replays_with_the_same_arguments_and_conflicts_with_others(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {"step": 1}}
        await stack.ok("prepare")
        first = await stack.commit(scope=["r0"])
        stack.participant.live["r0"] = {"step": 99}  # a fresh export would now differ
        again = await stack.commit(scope=["r0"])
        other_scope = await stack.commit(scope=["r0", "r5"])
        other_dir = await stack.commit(scope=["r0"], checkpoint_dir=str(tmp_path / "elsewhere"))
        prepare_again = await stack.ok("prepare")
        export_calls = stack.participant.export_calls

    assert first.status_code == 200, first.text
    assert again.json() == first.json()
    assert error_of(other_scope) == (409, "checkpoint_conflict")
    assert error_of(other_dir) == (409, "checkpoint_conflict")
    assert prepare_again["phase"] == "prepared"  # the recorded prepare reply
    assert export_calls == 1


async def test_commit_retried_after_a_failed_write_stores_the_first_export(tmp_path: Path) -> None:
    blocked_dir = tmp_path / "blocked"
    blocked_dir.mkdir()
    (blocked_dir / "gym").write_text("a file where the gym directory should be")
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {"step": 1}}
        await stack.ok("prepare")
        failed = await stack.commit(checkpoint_dir=str(blocked_dir))
        stack.participant.live["r0"] = {"step": 2}
        (blocked_dir / "gym").unlink()
        retried = await stack.commit(checkpoint_dir=str(blocked_dir))
        export_calls = stack.participant.export_calls

    assert error_of(failed) == (422, "invalid_checkpoint_state")
    assert retried.status_code == 200, retried.text
    _, records = store.read_participant_state(blocked_dir, "environment", "env-1")
    assert records == [{"episode_id": {"rollout_id": "r0", "attempt": 0}, "state": {"step": 1}}]
    assert export_calls == 1


async def test_commit_refused_when_readiness_regressed(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        await stack.ok("prepare")
        stack.participant.set_blockers("r3")
        reply = await stack.commit()

    assert error_of(reply) == (409, "invalid_phase")
    assert "no longer ready to commit" in reply.json()["error"]["detail"]
    assert not (tmp_path / "gym").exists()


async def test_commit_scope_naming_a_restart_is_refused(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.restarts = {"r2"}
        prepared = await stack.ok("prepare")
        reply = await stack.commit(scope=["r1", "r2"])

    assert prepared["report"]["restarts"] == ["r2"]
    assert error_of(reply) == (409, "restart_in_scope")
    assert "r2" in reply.json()["error"]["detail"]


async def test_commit_cleanup_keeps_only_restored_state_in_scope(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.restored = {"r0-a1", "r1-a1"}
        await stack.ok("prepare")
        await stack.commit(scope=["r0-a1"])
        pending = sorted(stack.participant.restored)

    assert pending == ["r0-a1"]


async def test_unexpected_exception_in_a_control_route_is_500_checkpoint_error(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.export_error = RuntimeError("export bug")
        await stack.ok("prepare")
        reply = await stack.commit()

    assert error_of(reply) == (500, "checkpoint_error")
    assert "export bug" in reply.json()["error"]["detail"]


async def _commit_checkpoint(
    checkpoint_dir: Path, live: dict[str, dict[str, Any]], *, kind: str = "environment"
) -> None:
    async with open_stack(checkpoint_dir, kind=kind) as stack:
        stack.participant.live = live
        await stack.ok("prepare", "c1")
        await stack.ok("commit", "c1", checkpoint_dir=str(checkpoint_dir))
        await stack.ok("resume", "c1")


async def test_restore_installs_under_next_attempts_and_refuses_a_second_restore(tmp_path: Path) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}, "r1-a2": {"step": 3}, "r2": {"step": 5}})
    async with open_stack(tmp_path) as stack:  # a fresh server after a crash
        restored = await stack.restore("c2", ["r0", "r1-a2"])
        status = await stack.status()
        replayed = await stack.restore("c2", ["r0", "r1-a2"])
        other_scope = await stack.restore("c2", ["r0"])
        other_id = await stack.restore("c3", ["r0"])
        await stack.ok("resume", "c2")
        into_live_process = await stack.restore("c4", ["r0"])

    assert restored.status_code == 200, restored.text
    assert restored.json() == {"phase": "restored", "source_checkpoint_id": "c1", "restored": ["r0-a1", "r1-a3"]}
    assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("restored", "c2", False)
    assert status["restored_pending"] == ["r0-a1", "r1-a3"]
    assert replayed.json() == restored.json()
    assert error_of(other_scope) == (409, "checkpoint_conflict")
    assert error_of(other_id) == (409, "checkpoint_conflict")
    assert error_of(into_live_process) == (409, "checkpoint_error")


async def test_failed_restore_reopens_admission_and_returns_to_idle(tmp_path: Path) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}})
    records_path = next((tmp_path / "gym" / "environment" / "env-1").glob("records-*.jsonl"))
    records_path.write_text(records_path.read_text().replace('"step": 1', '"step": 2'))
    async with open_stack(tmp_path) as stack:
        reply = await stack.restore("c2", ["r0"])
        status = await stack.status()

    assert error_of(reply) == (422, "invalid_checkpoint_state")
    assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("idle", None, True)
    assert status["restored_pending"] == []


async def test_restore_validates_only_in_scope_records(tmp_path: Path) -> None:
    store.write_participant_state(
        tmp_path,
        "environment",
        "env-1",
        "c1",
        [
            {"episode_id": {"rollout_id": "r0", "attempt": 0}, "state": {}},
            {"episode_id": {"rollout_id": "r1", "attempt": 0}, "state": "not an object"},
        ],
    )
    async with open_stack(tmp_path) as stack:
        out_of_scope_bad = await stack.restore("c2", ["r0"])
        await stack.ok("resume", "c2")
    async with open_stack(tmp_path) as stack:
        in_scope_bad = await stack.restore("c3", ["r1"])

    assert out_of_scope_bad.json()["restored"] == ["r0-a1"]
    assert error_of(in_scope_bad) == (422, "invalid_checkpoint_state")


async def test_retire_marks_before_the_participant_stops_and_forget_clears(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r1": {}, "r1-a1": {}, "r2": {}}
        retired = await stack.ok("retire", "c7", episode_ids=[{"rollout_id": "r1", "attempt": 1}])
        after_retire = await stack.status()
        marks = (
            stack.plane.retired.is_retired(EpisodeId(rollout_id="r1", attempt=0)),
            stack.plane.retired.is_retired(EpisodeId(rollout_id="r1", attempt=2)),
        )
        live = sorted(stack.participant.live)
        forgotten = await stack.ok("forget", "c7", rollout_ids=["r1", "r1"])
        after_forget = await stack.status()
        saw_marks = stack.participant.retire_saw_marks

    assert retired == {"retired": ["r1-a1"]}
    assert after_retire["retired_rollouts"] == 1
    assert marks == (True, False)
    assert saw_marks == [True]
    assert live == ["r2"]
    assert forgotten == {"forgotten": ["r1"]}
    assert after_forget["retired_rollouts"] == 0


async def test_retire_after_restore_under_the_same_id_is_allowed(tmp_path: Path) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}})
    async with open_stack(tmp_path) as stack:
        await stack.restore("c2", ["r0"])
        same_id = await stack.post("retire", "c2", episode_ids=[{"rollout_id": "r0", "attempt": 1}])
        other_id = await stack.post("retire", "c3", episode_ids=[{"rollout_id": "r0", "attempt": 1}])

    assert same_id.json() == {"retired": ["r0-a1"]}
    assert error_of(other_id) == (409, "checkpoint_conflict")


async def test_past_deadline_is_deadline_exceeded_and_changes_nothing(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        prepare = await stack.post("prepare", deadline_s=-1)
        retire = await stack.post("retire", deadline_s=-1, episode_ids=[{"rollout_id": "r1", "attempt": 0}])
        status = await stack.status()

    assert error_of(prepare) == (409, "deadline_exceeded")
    assert error_of(retire) == (409, "deadline_exceeded")
    assert (status["phase"], status["retired_rollouts"], status["accepting"]) == ("idle", 0, True)


async def test_renew_extends_the_lease_and_is_refused_while_idle(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        idle = await stack.post("renew")
        await stack.ok("prepare", deadline_s=10)
        first = stack.plane.lease.expires_at
        renewed = await stack.ok("renew", deadline_s=20)
        shorter = await stack.ok("renew", deadline_s=1)

    assert error_of(idle) == (409, "invalid_phase")
    assert first is not None
    assert renewed["lease_expires_at"] > first
    assert shorter["lease_expires_at"] == renewed["lease_expires_at"]  # a lease never shrinks


async def test_lease_expiry_reopens_admission_like_a_resume(tmp_path: Path) -> None:
    async with open_stack(tmp_path, lease_grace_s=0.05) as stack:
        prepared = await stack.ok("prepare", deadline_s=SHORT_DEADLINE_S)
        await wait_until(lambda: stack.plane.phase == "idle", "the lease expired")
        status = await stack.status()
        late = await stack.post("prepare")

    assert prepared["phase"] == "prepared"
    assert (status["checkpoint_id"], status["lease_expires_at"], status["accepting"]) == (None, None, True)
    assert error_of(late) == (409, "stale_checkpoint")


async def test_resume_during_a_commit_write_publishes_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()

    def held_write(*args: Any, **kwargs: Any) -> dict[str, Any]:
        entered.set()
        release.wait(WAIT_TIMEOUT_S)
        return store.write_participant_state(*args, **kwargs)

    monkeypatch.setattr(control_plane_module, "write_participant_state", held_write)
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {}}
        await stack.ok("prepare")
        commit = asyncio.ensure_future(stack.commit())
        await wait_until(entered.is_set, "the write started")
        resume = asyncio.ensure_future(stack.ok("resume"))
        work = stack.plane.runner.current
        await wait_until(lambda: work is not None and work.stop.stopped, "the resume stopped the write")
        release.set()
        commit_reply, resume_reply = await asyncio.wait_for(asyncio.gather(commit, resume), WAIT_TIMEOUT_S)
        status = await stack.status()

    assert error_of(commit_reply) == (409, "stale_checkpoint")
    assert resume_reply == {"phase": "idle", "idempotent": False}
    assert not (tmp_path / "gym" / "environment" / "env-1" / store.MANIFEST_NAME).exists()
    assert (status["phase"], status["accepting"]) == ("idle", True)


async def test_commit_retried_while_its_write_runs_awaits_the_same_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()

    def held_write(*args: Any, **kwargs: Any) -> dict[str, Any]:
        entered.set()
        release.wait(WAIT_TIMEOUT_S)
        return store.write_participant_state(*args, **kwargs)

    monkeypatch.setattr(control_plane_module, "write_participant_state", held_write)
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {"step": 1}}
        await stack.ok("prepare")
        timed_out = await stack.commit(scope=["r0"], deadline_s=SHORT_DEADLINE_S)
        write_started = entered.is_set()
        retry = asyncio.ensure_future(stack.commit(scope=["r0"]))
        other_args = await stack.commit(scope=["r0"], checkpoint_dir=str(tmp_path / "elsewhere"))
        release.set()
        retried = await asyncio.wait_for(retry, WAIT_TIMEOUT_S)
        export_calls = stack.participant.export_calls

    assert write_started
    assert error_of(timed_out) == (409, "deadline_exceeded")
    assert error_of(other_args) == (409, "checkpoint_conflict")
    assert retried.status_code == 200, retried.text
    assert retried.json()["episode_ids"] == ["r0"]
    assert export_calls == 1


async def test_resume_during_a_restore_read_abandons_it_and_reopens_admission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}})
    entered, release = threading.Event(), threading.Event()

    def held_read(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(WAIT_TIMEOUT_S)
        return store.read_participant_state(*args, **kwargs)

    monkeypatch.setattr(control_plane_module, "read_participant_state", held_read)
    async with open_stack(tmp_path) as stack:
        restore = asyncio.ensure_future(stack.restore("c2", ["r0"]))
        await wait_until(entered.is_set, "the restore is reading")
        during = await stack.status()
        resumed = await stack.ok("resume", "c2")
        release.set()
        restore_reply = await asyncio.wait_for(restore, WAIT_TIMEOUT_S)
        after = await stack.status()

    assert (during["phase"], during["checkpoint_id"]) == ("idle", "c2")
    assert resumed == {"phase": "idle", "idempotent": False}
    assert error_of(restore_reply) == (409, "stale_checkpoint")
    assert (after["phase"], after["checkpoint_id"], after["accepting"], after["restored_pending"]) == (
        "idle",
        None,
        True,
        [],
    )


async def test_the_last_64_resumed_ids_are_remembered(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        for index in range(65):
            await stack.ok("resume", f"c{index}")
        oldest = await stack.post("prepare", "c0")
        await stack.ok("resume", "c0")
        newest = await stack.post("prepare", "c64")

    assert oldest.json()["phase"] == "prepared"  # c0 was forgotten after 64 newer IDs
    assert error_of(newest) == (409, "stale_checkpoint")


# -- retries, fencing and the lease as the checker probes them (reference 2.6, 2.7, 3) ---------------------------


async def test_retries_with_a_new_deadline_return_the_first_result(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {"step": 1}, "r1": {"step": 2}}
        first_prepare = await stack.ok("prepare", deadline_s=10)
        first_lease = stack.plane.lease.expires_at
        again_prepare = await stack.ok("prepare", deadline_s=20)
        first = await stack.commit(scope=["r1", "r0"], deadline_s=10)
        stack.participant.live["r0"] = {"step": 99}  # a fresh export would now differ
        again = await stack.commit(scope=["r0", "r1", "r0"], deadline_s=30)  # same scope, other order, new deadline
        prepare_after_commit = await stack.ok("prepare", deadline_s=40)
        lease_after_retries = stack.plane.lease.expires_at
        resumed = await stack.ok("resume")
        resumed_again = await stack.ok("resume", deadline_s=50)
        retire = [await stack.ok("retire", "c2", episode_ids=[{"rollout_id": "r1", "attempt": 0}]) for _ in range(2)]
        forget = [await stack.ok("forget", "c2", rollout_ids=["r1"]) for _ in range(2)]
        export_calls = stack.participant.export_calls

    assert first_prepare["phase"] == again_prepare["phase"] == prepare_after_commit["phase"] == "prepared"
    assert again_prepare == first_prepare
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.content == first.content  # the recorded reply, byte for byte: same manifest, same episode_ids
    assert again.json()["episode_ids"] == ["r0", "r1"]
    assert export_calls == 1
    assert first_lease is not None
    assert lease_after_retries is not None
    assert lease_after_retries > first_lease  # the replayed prepare and commit renewed the lease
    assert resumed == {"phase": "idle", "idempotent": False}
    assert resumed_again == {"phase": "idle", "idempotent": True}
    assert retire == [{"retired": ["r1"]}] * 2
    assert forget == [{"forgotten": ["r1"]}] * 2


async def test_restore_retried_with_a_new_deadline_returns_the_first_result(tmp_path: Path) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}})
    async with open_stack(tmp_path) as stack:
        first = await stack.restore("c2", ["r0"], deadline_s=10)
        again = await stack.restore("c2", ["r0"], deadline_s=30)

    assert first.status_code == 200, first.text
    assert again.content == first.content


@pytest.mark.parametrize("kind", KINDS)
async def test_every_operation_naming_a_resumed_id_is_stale_on_every_kind(tmp_path: Path, kind: str) -> None:
    async with open_stack(tmp_path, kind=kind) as stack:
        await stack.ok("prepare", "c1")
        await stack.ok("resume", "c1")
        await stack.ok("resume", "c2")  # c1 is now an older resumed ID, not the latest
        await stack.ok("prepare", "c3")  # and another checkpoint is open: the fence is checked before the conflict
        replies = {
            "prepare": await stack.post("prepare", "c1"),
            "renew": await stack.post("renew", "c1"),
            "commit": await stack.commit("c1"),
            "restore": await stack.restore("c1", ["r0"]),
            "retire": await stack.post("retire", "c1", episode_ids=[{"rollout_id": "r0", "attempt": 0}]),
            "forget": await stack.post("forget", "c1", rollout_ids=["r0"]),
        }
        resumed_again = await stack.ok("resume", "c1")
        status = await stack.status()

    assert {op: error_of(reply) for op, reply in replies.items()} == dict.fromkeys(replies, (409, "stale_checkpoint"))
    assert resumed_again == {"phase": "idle", "idempotent": True}
    assert (status["phase"], status["checkpoint_id"]) == ("prepared", "c3")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("closed_in", ["prepared", "committed"])
async def test_lease_expiry_reopens_admission_and_fences_a_late_commit(
    tmp_path: Path, kind: str, closed_in: str
) -> None:
    async with open_stack(tmp_path, kind=kind, lease_grace_s=0.05) as stack:
        await stack.ok("prepare", deadline_s=SHORT_DEADLINE_S)
        if closed_in == "committed":
            await stack.ok("commit", checkpoint_dir=str(tmp_path), deadline_s=SHORT_DEADLINE_S, episode_ids=[])
        closed = await stack.status()
        await wait_until(lambda: stack.plane.phase == "idle", "the lease expired")
        status = await stack.status()
        late_commit = await stack.commit(episode_ids=[])
        late_resume = await stack.ok("resume")

    assert (closed["phase"], closed["accepting"]) == (closed_in, False)
    assert (status["phase"], status["checkpoint_id"], status["lease_expires_at"], status["accepting"]) == (
        "idle",
        None,
        None,
        True,
    )
    assert error_of(late_commit) == (409, "stale_checkpoint")
    assert late_resume == {"phase": "idle", "idempotent": True}


# -- planted faults: each next to the fault-free behaviour it breaks ---------------------------------------------


def test_the_faults_planted_in_the_control_plane_are_in_the_catalogue() -> None:
    planted = {"agent_forgets_resumed_ids", "resources_restore_skips_fence", "lease_never_expires"}
    planted |= {"retried_commit_conflicts", "resumed_id_not_fenced", "resume_deletes_records"}
    assert planted <= set(fault_catalogue.BY_NAME)


@pytest.mark.parametrize("kind", KINDS)
async def test_agent_forgets_resumed_ids_only_on_the_agent(tmp_path: Path, kind: str) -> None:
    async with open_stack(tmp_path, kind=kind, faults=("agent_forgets_resumed_ids",)) as stack:
        await stack.ok("prepare", "c1")
        await stack.ok("resume", "c1")
        late = await stack.post("prepare", "c1")
        status = await stack.status()

    if kind == "agent":
        assert late.status_code == 200, late.text
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("prepared", "c1", False)
    else:
        assert error_of(late) == (409, "stale_checkpoint")
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("idle", None, True)


@pytest.mark.parametrize("faults", [(), ("resources_restore_skips_fence",)], ids=["fault-free", "fault"])
async def test_resources_restore_skips_fence_lets_a_stale_restore_through(
    tmp_path: Path, faults: tuple[str, ...]
) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}}, kind="resources")
    async with open_stack(tmp_path, kind="resources", faults=faults) as stack:
        await stack.ok("resume", "c2")  # a fresh process whose controller already resumed c2
        others = [await stack.post("prepare", "c2"), await stack.post("renew", "c2")]
        stale_restore = await stack.restore("c2", ["r0"])
        status = await stack.status()

    assert [error_of(reply) for reply in others] == [(409, "stale_checkpoint")] * 2  # only restore skips the fence
    if faults:
        assert stale_restore.status_code == 200, stale_restore.text
        assert stale_restore.json()["restored"] == ["r0-a1"]
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("restored", "c2", False)
    else:
        assert error_of(stale_restore) == (409, "stale_checkpoint")
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("idle", None, True)


async def test_resources_restore_skips_fence_only_on_resources(tmp_path: Path) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}})
    async with open_stack(tmp_path, faults=("resources_restore_skips_fence",)) as stack:
        await stack.ok("resume", "c2")
        stale_restore = await stack.restore("c2", ["r0"])

    assert error_of(stale_restore) == (409, "stale_checkpoint")


async def test_resources_restore_skips_fence_still_answers_the_phase_check(tmp_path: Path) -> None:
    await _commit_checkpoint(tmp_path, {"r0": {"step": 1}}, kind="resources")
    async with open_stack(tmp_path, kind="resources", faults=("resources_restore_skips_fence",)) as stack:
        await stack.ok("resume", "c1")
        await stack.ok("prepare", "c2")
        await stack.ok("resume", "c2")
        await stack.ok("prepare", "c3")
        while_open = await stack.restore("c1", ["r0"])
        await stack.ok("resume", "c3")
        stack.participant.live = {"r5": {}}
        into_live_process = await stack.restore("c2", ["r0"])

    assert error_of(while_open) == (409, "checkpoint_conflict")
    assert error_of(into_live_process) == (409, "checkpoint_error")  # "restore requires a process without live ..."


@pytest.mark.parametrize("faults", [(), ("lease_never_expires",)], ids=["fault-free", "fault"])
async def test_lease_never_expires_leaves_admission_closed_past_the_lease(
    tmp_path: Path, faults: tuple[str, ...]
) -> None:
    # A fault-free plane with the same lease is the witness that the lease time has passed and its timer fired.
    async with (
        open_stack(tmp_path, lease_grace_s=0.05, faults=faults) as stack,
        open_stack(tmp_path / "witness", lease_grace_s=0.05) as witness,
    ):
        await stack.ok("prepare", deadline_s=SHORT_DEADLINE_S)
        await witness.ok("prepare", deadline_s=SHORT_DEADLINE_S)
        lease_expires_at = stack.plane.lease.expires_at
        await wait_until(lambda: witness.plane.phase == "idle", "the witness's lease expired")
        assert lease_expires_at is not None
        await wait_until(lambda: time.time() > lease_expires_at, "the lease time passed")
        if not faults:
            await wait_until(lambda: stack.plane.phase == "idle", "the lease expired")
        status = await stack.status()
        late_commit = await stack.commit(episode_ids=[])

    if faults:
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("prepared", "c1", False)
        assert status["lease_expires_at"] == lease_expires_at  # shown, never acted on
        assert late_commit.status_code == 200, late_commit.text
    else:
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("idle", None, True)
        assert error_of(late_commit) == (409, "stale_checkpoint")


@pytest.mark.parametrize("kind", ["environment", "agent"])
@pytest.mark.parametrize("faults", [(), ("retried_commit_conflicts",)], ids=["fault-free", "fault"])
async def test_retried_commit_conflicts_on_the_environment_only(
    tmp_path: Path, kind: str, faults: tuple[str, ...]
) -> None:
    async with open_stack(tmp_path, kind=kind, faults=faults) as stack:
        stack.participant.live = {"r0": {"step": 1}}
        await stack.ok("prepare")
        body = {
            "checkpoint_id": "c1",
            "deadline_ts": time.time() + 10,
            "checkpoint_dir": str(tmp_path),
            "episode_ids": [{"rollout_id": "r0", "attempt": 0}],
        }
        first = await stack.client.post(f"{CHECKPOINT_ROUTE_PREFIX}/commit", json=body)
        identical = await stack.client.post(f"{CHECKPOINT_ROUTE_PREFIX}/commit", json=body)
        new_deadline = await stack.commit(scope=["r0"], deadline_s=20)

    assert first.status_code == 200, first.text
    assert identical.content == first.content
    if faults and kind == "environment":
        assert error_of(new_deadline) == (409, "checkpoint_conflict")
    else:
        assert new_deadline.content == first.content


# -- the lease grace a deployment chooses --------------------------------------------------------------------------


def test_the_deployments_lease_grace_reaches_every_control_plane(tmp_path: Path) -> None:
    from fakes.stack.launcher import Stack as Deployment

    deployment = Deployment("native", tmp_path, backend_url="http://127.0.0.1:1", lease_grace_s=0.25)
    first = deployment.configs()
    restarted = deployment.configs()  # a restart (and the fork server's standbys) build from the same configs
    default = Deployment("native", tmp_path / "default", backend_url="http://127.0.0.1:1").configs()
    planes = {
        name: ControlPlane.from_config(FakeParticipant(), ServerConfig.from_json(config.to_json()))
        for name, config in first.items()
    }

    assert {config.lease_grace_s for config in first.values()} == {0.25}
    assert {name: config.to_json() for name, config in restarted.items()} == {
        name: config.to_json() for name, config in first.items()
    }
    assert {plane.lease.grace_s for plane in planes.values()} == {0.25}
    assert {config.lease_grace_s for config in default.values()} == {600.0}
    assert deployment.describe()["lease_grace_s"] == 0.25


@pytest.mark.parametrize("grace", [-1.0, float("nan"), float("inf")])
def test_a_lease_grace_must_be_finite_and_not_negative(tmp_path: Path, grace: float) -> None:
    from fakes.stack.launcher import Stack as Deployment

    with pytest.raises(ValueError, match="lease_grace_s"):
        Deployment("native", tmp_path, backend_url="http://127.0.0.1:1", lease_grace_s=grace)
    with pytest.raises(ValueError, match="lease_grace_s"):
        ServerConfig(name="agent", role="agent", port=1, token=TOKEN, lease_grace_s=grace)


async def test_a_write_failed_by_a_full_disk_stays_prepared_and_its_retry_commits(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {"step": 1}}
        await stack.ok("prepare")
        armed = await stack.client.post("/_ctl/storage", json={"point": "manifest.write", "how": "ENOSPC"})
        failed = await stack.commit(scope=["r0"])
        status = await stack.status()
        retried = await stack.commit(scope=["r0"])
        storage = (await stack.client.get("/_ctl/storage")).json()

    assert armed.json()["armed"] == {"point": "manifest.write", "how": "ENOSPC"}
    assert error_of(failed) == (422, "invalid_checkpoint_state")
    assert "ENOSPC injected by the checker at manifest.write" in failed.json()["error"]["detail"]
    assert (status["phase"], status["checkpoint_id"]) == ("prepared", "c1")
    assert retried.status_code == 200, retried.text
    assert storage == {"armed": None, "stalled_at": None, "writes": 0}
    assert stack.participant.export_calls == 1


async def test_a_failed_write_gives_the_checkpoint_up_under_the_planted_fault(tmp_path: Path) -> None:
    async with open_stack(tmp_path, faults=("failed_write_abandons_checkpoint",)) as stack:
        stack.participant.live = {"r0": {}}
        await stack.ok("prepare")
        await stack.client.post("/_ctl/storage", json={"point": "records.write", "how": "EIO"})
        failed = await stack.commit()
        status = await stack.status()

    assert error_of(failed) == (422, "invalid_checkpoint_state")
    assert (status["phase"], status["accepting"]) == ("idle", True)


async def test_a_resume_returns_while_a_stopped_write_still_stalls_and_it_never_publishes(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.participant.live = {"r0": {}}
        await stack.ok("prepare")
        await stack.client.post("/_ctl/storage", json={"point": "records.fsync", "how": "stall"})
        timed_out = await stack.commit(deadline_s=SHORT_DEADLINE_S)
        stalled = stack.plane.storage.state()
        resumed = await asyncio.wait_for(stack.ok("resume"), WAIT_TIMEOUT_S)
        status = await stack.status()
        await stack.client.post("/_ctl/storage/release")
        await wait_until(lambda: stack.plane.storage.state()["writes"] == 0, "the stopped write ended")

    assert error_of(timed_out) == (409, "deadline_exceeded")
    assert stalled == {"armed": None, "stalled_at": "records.fsync", "writes": 1}
    assert resumed == {"phase": "idle", "idempotent": False}
    assert (status["phase"], status["accepting"]) == ("idle", True)
    assert not (tmp_path / "gym" / "environment" / "env-1" / store.MANIFEST_NAME).exists()


def test_the_storage_faults_planted_in_the_control_plane_are_in_the_catalogue() -> None:
    planted = {"store_error_is_internal", "store_failed_write_leaves_manifest", "failed_write_abandons_checkpoint"}
    planted |= {"stalled_write_publishes_after_resume"}
    assert planted <= set(fault_catalogue.BY_NAME)


@pytest.mark.parametrize("kind", KINDS)
async def test_prepare_ignores_past_deadline_closes_admission_on_the_agent_only(tmp_path: Path, kind: str) -> None:
    async with open_stack(tmp_path, kind=kind, faults=("prepare_ignores_past_deadline",)) as stack:
        late = await stack.post("prepare", deadline_s=-1)

    if kind == "agent":
        assert late.status_code == 200
        assert late.json()["phase"] == "prepared"
        assert not stack.participant.accepting
    else:
        assert error_of(late) == (409, "deadline_exceeded")
        assert stack.participant.accepting
