"""The multi-worker policy model server's parts, in one process: frames, the channel, the policy-specific merge and
export functions on hand-built values, and a coordinator with worker links over a real Unix socket (no HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from fakes import clock
from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import PrepareReport
from fakes.gym.control.plane import ControlPlane
from fakes.gym.policy.model_workers import (
    POLICY_SOCKET_ENV,
    CoordinatedPolicyParticipant,
    PolicyWorker,
    coordinator_control_plane,
    export_records,
    install_refusal,
)
from fakes.gym.protocol.errors import ControlError, InvalidPhaseError, StaleAttemptError, UnauthorizedError
from fakes.gym.protocol.wire import CheckpointRequest, CommitRequest, EpisodeId, RestoreRequest, RetireRequest
from fakes.gym.workers import runtime
from fakes.gym.workers.channel import (
    FRAME_BYTES_MAX,
    LIGHT_TIMEOUT_S,
    Channel,
    ChannelClosed,
    Framed,
    FrameError,
    RemoteControlError,
    encode_frame,
    read_frame,
)
from fakes.gym.workers.coordinator import Worker, WorkerPool
from fakes.gym.workers.link import CONTROL_EXTRA_S, WorkerLink, control_timeout_s
from fakes.gym.workers.placement import PLACED_HEADER, CallPlacement, placement_refusal
from fakes.gym.workers.reports import merge_reports

TOKEN = "test-token"
WAIT_TIMEOUT_S = 10.0
# Above Linux's largest pid_max (2**22), so no process ever has it.
PID_NEVER_USED = 2**22 + 1
ZERO_COUNTS = {"inflight": 0, "held": 0, "cut": 0, "cut_failed": 0, "cut_skipped": 0}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def reader_of(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` (messages cross a real socket, so no event says when) until it holds; fail naming `what`."""
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


# --- frames -------------------------------------------------------------------------------------------------------


def test_a_frame_is_a_big_endian_length_then_compact_json() -> None:
    payload = b'{"id":1,"kind":"open","body":{}}'
    assert len(payload) == 0x20
    assert encode_frame({"id": 1, "kind": "open", "body": {}}) == b"\x00\x00\x00\x20" + payload


@pytest.mark.anyio
async def test_frames_read_back_in_order_and_a_clean_end_reads_none() -> None:
    reader = reader_of(encode_frame({"a": [1, 2]}) + encode_frame({"b": None}))
    assert await read_frame(reader) == {"a": [1, 2]}
    assert await read_frame(reader) == {"b": None}
    assert await read_frame(reader) is None


@pytest.mark.anyio
async def test_a_framed_body_carries_its_bytes_raw_beside_its_json() -> None:
    data = b'{"raw": "lines"}\n\x00\xff'
    frame = encode_frame({"id": 2, "body": Framed({"n": 1}, data)})
    payload = b'{"id":2,"body":{"n":1}}'
    assert frame == (len(payload) | 1 << 31).to_bytes(4, "big") + payload + len(data).to_bytes(4, "big") + data
    reader = reader_of(frame + encode_frame({"b": None}) + encode_frame({"body": Framed(None, b"")}))
    assert await read_frame(reader) == {"id": 2, "body": Framed({"n": 1}, data)}
    assert await read_frame(reader) == {"b": None}
    assert await read_frame(reader) == {"body": Framed(None, b"")}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x00\x00", "frame header"),
        (b"\x00\x00\x00\x09{}", "inside a frame"),
        ((FRAME_BYTES_MAX + 1).to_bytes(4, "big"), "at most"),
        (b"\x00\x00\x00\x02[]", "JSON object"),
        (b"\x00\x00\x00\x02{x", "JSON"),
        (b"\x80\x00\x00\x02{}\x00\x00", "data length"),
        (b"\x80\x00\x00\x02{}\x00\x00\x00\x03ab", "inside a frame"),
    ],
    ids=["truncated-header", "truncated-body", "too-long", "not-an-object", "not-json", "no-data-length", "short-data"],
)
async def test_a_bad_frame_is_refused_naming_what_is_wrong(data: bytes, problem: str) -> None:
    with pytest.raises(FrameError, match=problem):
        await read_frame(reader_of(data))


def test_a_message_that_is_not_strict_json_is_not_sent() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        encode_frame({"deadline_ts": float("nan")})


# --- the channel --------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def channel_pair(handlers: dict[str, Any]) -> AsyncIterator[tuple[Channel, Channel]]:
    """A requesting end and a serving end (with `handlers`) over a socket pair, both served."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    peer_reader, peer_writer = await asyncio.open_connection(sock=theirs)
    client = Channel(reader, writer, name="server")
    server = Channel(peer_reader, peer_writer, name="client", handlers=handlers)
    tasks = [asyncio.ensure_future(client.serve()), asyncio.ensure_future(server.serve())]
    try:
        yield client, server
    finally:
        client.close()
        server.close()
        await asyncio.gather(*tasks)
        for end in (writer, peer_writer):
            with contextlib.suppress(OSError):
                await end.wait_closed()


async def echo(body: Any) -> Any:
    return {"echo": body}


async def refuse(body: Any) -> Any:
    raise InvalidPhaseError("resume first")


async def crash(body: Any) -> Any:
    raise KeyError("boom")


@pytest.mark.anyio
async def test_a_request_gets_its_handlers_reply() -> None:
    async with channel_pair({"echo": echo}) as (client, _):
        assert await client.request("echo", {"x": 1}) == {"echo": {"x": 1}}
        assert await asyncio.gather(*(client.request("echo", n) for n in range(5))) == [{"echo": n} for n in range(5)]


@pytest.mark.anyio
async def test_raw_bytes_go_both_ways_beside_a_request_and_its_reply() -> None:
    async def upper(body: Any) -> Framed:
        return Framed({"got": body.body}, body.data.upper())

    async with channel_pair({"upper": upper}) as (client, _):
        assert await client.request("upper", Framed([1], b"abc")) == Framed({"got": [1]}, b"ABC")
        megabytes = bytes(range(97, 123)) * 100_000  # more than a socket or a stream buffer holds at once
        assert await client.request("upper", Framed(None, megabytes)) == Framed({"got": None}, megabytes.upper())


@pytest.mark.anyio
async def test_a_refusal_keeps_its_status_code_and_detail_and_a_crash_is_a_500() -> None:
    async with channel_pair({"refuse": refuse, "crash": crash}) as (client, _):
        with pytest.raises(RemoteControlError) as refused:
            await client.request("refuse", {})
        assert (refused.value.status_code, refused.value.code, refused.value.detail) == (
            409,
            "invalid_phase",
            "resume first",
        )
        assert refused.value.to_wire() == {"error": {"code": "invalid_phase", "detail": "resume first"}}
        for kind in ("crash", "unknown"):
            with pytest.raises(RemoteControlError) as failed:
                await client.request(kind, {})
            assert (failed.value.status_code, failed.value.code) == (500, "checkpoint_error")


@pytest.mark.anyio
async def test_requests_run_in_the_order_they_arrive_and_notifications_get_no_reply() -> None:
    seen: list[int] = []

    async def note(body: Any) -> None:
        seen.append(body)

    async with channel_pair({"note": note, "echo": echo}) as (client, _):
        for n in range(20):
            client.notify("note", n)
        assert await client.request("echo", "last") == {"echo": "last"}
        await wait_for(lambda: len(seen) == 20, "every notification handled")
        assert seen == list(range(20))


@pytest.mark.anyio
async def test_a_closing_channel_fails_what_waits_and_says_so() -> None:
    release = asyncio.Event()

    async def stall(body: Any) -> None:
        await release.wait()

    closed: list[str] = []
    async with channel_pair({"stall": stall}) as (client, server):
        client.on_close(lambda: closed.append("client"))
        waiting = asyncio.ensure_future(client.request("stall", {}))
        await asyncio.sleep(0)
        server.close()
        with pytest.raises(ChannelClosed):
            await waiting
        await wait_for(lambda: closed == ["client"], "the client's close callback")
        with pytest.raises(ChannelClosed):
            client.notify("stall", {})
        release.set()


@pytest.mark.anyio
async def test_a_request_without_a_reply_times_out() -> None:
    async def never(body: Any) -> None:
        await asyncio.Event().wait()

    async with channel_pair({"never": never}) as (client, _):
        with pytest.raises(TimeoutError):
            await client.request("never", {}, timeout_s=0.05)


def test_a_forwarded_control_call_waits_for_its_deadline_plus_ten_seconds() -> None:
    soon = CheckpointRequest(checkpoint_id="c1", deadline_ts=time.time() + 5)
    passed = CheckpointRequest(checkpoint_id="c1", deadline_ts=time.time() - 5)
    assert 5 + CONTROL_EXTRA_S - 1 < control_timeout_s("prepare", soon) <= 5 + CONTROL_EXTRA_S
    assert control_timeout_s("commit", passed) == CONTROL_EXTRA_S
    assert control_timeout_s("status", None) == LIGHT_TIMEOUT_S


def test_a_forwarded_clock_move_waits_without_a_timer_its_own_jump_would_fire() -> None:
    assert control_timeout_s("skew clock", None) is None


# --- policy-specific functions ------------------------------------------------------------------------------------


def gate_report(ready: bool = True, blockers: tuple[str, ...] = (), **counts: int) -> dict[str, Any]:
    return {
        "ready": ready,
        "blockers": list(blockers),
        "counts": {**ZERO_COUNTS, **counts},
        "restarts": [],
        "served": False,
    }


def merged(*reports: dict[str, Any], unreported: int = 0, lost: bool = False) -> PrepareReport:
    own = PrepareReport(ready=True, counts=dict(ZERO_COUNTS))
    return merge_reports(own, reports, label="policy_model", workers=len(reports), unreported=unreported, lost=lost)


def test_merged_reports_sum_counts_unite_blockers_and_are_ready_only_if_every_worker_is() -> None:
    report = merged(gate_report(inflight=2, held=1), gate_report(False, ("r1",), inflight=3, cut_skipped=1))
    assert report == PrepareReport(
        ready=False,
        blockers=("r1",),
        counts={"inflight": 5, "held": 1, "cut": 0, "cut_failed": 0, "cut_skipped": 1, "workers": 2},
    )
    assert merged(gate_report(), gate_report()).ready


def test_an_unreported_or_lost_worker_is_a_blocker_of_its_own() -> None:
    unreported = merged(gate_report(), unreported=1)
    assert (unreported.ready, unreported.blockers) == (False, ("policy_model-workers-unreported:1",))
    lost = merged(gate_report(), gate_report(blockers=("r2",)), lost=True)
    assert (lost.ready, lost.blockers) == (False, ("policy_model-worker-lost", "r2"))
    assert merged().counts == {**ZERO_COUNTS, "workers": 0}


def record(key: str, *call_ids: str, cuts: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    rows = [{"model_call_id": call_id, "staging_key": f"{key}/{call_id}"} for call_id in call_ids]
    return {"episode_id": EpisodeId.from_capture_key(key).wire(), "rows": rows, "generation_cuts": list(cuts)}


def snapshot(
    undelivered: dict[str, str], *cuts: tuple[str, float, str], restored: tuple[str, ...] = ("r0", "r1")
) -> dict[str, Any]:
    return {
        "undelivered": undelivered,
        "cuts": [{"capture_key": key, "admitted_at": at, "record": {"model_call_id": c}} for key, at, c in cuts],
        "restored_cuts": list(restored),
    }


def episodes(*keys: str) -> list[EpisodeId]:
    return [EpisodeId.from_capture_key(key) for key in keys]


def test_export_drops_the_rows_of_calls_undelivered_on_any_worker() -> None:
    records = [record("r0", "c0", "c1", "c2"), record("r1", "c3")]
    snapshots = [snapshot({"c1": "r0"}), snapshot({"c3": "r1", "c9": "r9"})]
    assert export_records(episodes("r0", "r1"), records, snapshots) == [record("r0", "c0", "c2")]


def test_export_takes_the_latest_admitted_worker_cut_and_keeps_a_restored_one_otherwise() -> None:
    restored = {"model_call_id": "restored"}
    records = [record("r0", "c0", cuts=(restored,)), record("r1", "c4", cuts=(restored,))]
    snapshots = [
        snapshot({"c1": "r0"}, ("r0", 1.0, "old"), ("r2", 5.0, "only"), ("out", 1.0, "x")),
        snapshot({}, ("r0", 2.0, "new")),
    ]
    assert export_records(episodes("r0", "r1", "r2"), records, snapshots) == [
        record("r0", "c0", cuts=({"model_call_id": "new"},)),
        record("r1", "c4", cuts=(restored,)),
        {"episode_id": {"rollout_id": "r2", "attempt": 0}, "rows": [], "generation_cuts": [{"model_call_id": "only"}]},
    ]


def test_export_drops_a_restored_cut_a_worker_used_up() -> None:
    restored = {"model_call_id": "restored"}
    records = [record("r0", "c0", cuts=(restored,)), record("r1", cuts=(restored,))]
    snapshots = [snapshot({}), snapshot({}, restored=("r0",))]  # the second worker delivered r1's continuation
    assert export_records(episodes("r0", "r1"), records, snapshots) == [record("r0", "c0", cuts=(restored,))]


def test_export_without_token_capture_is_what_one_process_exports() -> None:
    assert export_records(episodes("r0"), [], [snapshot({}), snapshot({})]) == []


def test_install_is_refused_unless_the_server_is_fresh() -> None:
    assert install_refusal(served=[], left=False, unreported=0) is None
    assert "[11, 12] have served calls" in str(install_refusal(served=[12, 11], left=False, unreported=0))
    assert "left since it started" in str(install_refusal(served=[], left=True, unreported=0))
    assert "1 did not answer" in str(install_refusal(served=[], left=False, unreported=1))


# --- configuration ------------------------------------------------------------------------------------------------


def model_config(workers: int = 2) -> ServerConfig:
    return ServerConfig(name="policy_model", role="policy_model", port=0, token=TOKEN, workers=workers)


@pytest.mark.parametrize("workers", [0, -1, True, 1.5])
def test_a_worker_count_must_be_a_positive_integer(workers: Any) -> None:
    with pytest.raises(ValueError, match="'workers' must be an integer >= 1"):
        model_config(workers)


def test_only_the_legacy_relay_may_not_run_several_workers() -> None:
    with pytest.raises(ValueError, match="'workers' must be 1 for role 'legacy_relay'"):
        ServerConfig(name="environment", role="legacy_relay", port=0, token=TOKEN, workers=2)
    assert ServerConfig(name="environment", role="environment", port=0, token=TOKEN, workers=2).workers == 2
    assert ServerConfig.from_json(model_config(3).to_json()).workers == 3


# --- a coordinator and its workers, in one process ----------------------------------------------------------------


@attrs.define
class Coordinated:
    """A coordinator's control plane and pool, and a way to start workers linked to it."""

    config: ServerConfig
    control_plane: ControlPlane
    pool: WorkerPool
    workers: list[PolicyWorker] = attrs.Factory(list)
    links: list[WorkerLink] = attrs.Factory(list)
    lost: list[WorkerLink] = attrs.Factory(list)

    @property
    def participant(self) -> CoordinatedPolicyParticipant:
        return self.control_plane.participant  # type: ignore[return-value]

    async def join(self) -> PolicyWorker:
        link = WorkerLink(self.config, socket_env=POLICY_SOCKET_ENV)
        worker = PolicyWorker(self.config, link)
        await link.start(on_lost=lambda: self.lost.append(link))
        self.workers.append(worker)
        self.links.append(link)
        return worker

    def reported(self) -> bool:
        return self.pool.unreported() == 0 and all(w.report is not None for w in self.pool.workers.values())


@contextlib.asynccontextmanager
async def coordinated(monkeypatch: pytest.MonkeyPatch, expected: int = 2) -> AsyncIterator[Coordinated]:
    directory = Path(tempfile.mkdtemp(prefix="ckpt-test-"))  # short: a Unix socket path has at most 107 bytes
    path = directory / "coordinator.sock"
    config = model_config(expected)
    pool = WorkerPool(expected)
    control_plane = coordinator_control_plane(config, pool)
    server = await asyncio.start_unix_server(pool.accept, path=str(path))
    monkeypatch.setenv(POLICY_SOCKET_ENV, str(path))
    coordination = Coordinated(config, control_plane, pool)
    try:
        yield coordination
    finally:
        for link in coordination.links:
            if link.channel is not None:
                link.channel.close()
                with contextlib.suppress(OSError):
                    await link.channel.writer.wait_closed()
        await wait_for(lambda: not pool.workers, "the coordinator to see every worker go")
        server.close()
        await server.wait_closed()
        await control_plane.close()
        shutil.rmtree(directory)


def soon(seconds: float = 20.0) -> float:
    return time.time() + seconds


def request(**fields: Any) -> CheckpointRequest:
    return CheckpointRequest(checkpoint_id=fields.pop("checkpoint_id", "c1"), deadline_ts=soon(), **fields)


async def settled(coordination: Coordinated, condition: Callable[[], bool] | None = None) -> None:
    await wait_for(lambda: coordination.reported() and (condition is None or condition()), "the workers' reports")


@pytest.mark.anyio
async def test_workers_register_and_status_counts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    async with coordinated(monkeypatch) as coordination:
        first = await coordination.join()
        assert await coordination.links[0].health() == (
            503,
            {"status": "starting", "serving": False, "workers": 1, "expected_workers": 2},
        )
        await coordination.join()
        await settled(coordination)
        status = coordination.control_plane.status()
        assert (status["workers"], status["expected_workers"], status["report"]["counts"]["workers"]) == (2, 2, 2)
        assert first.gate.open
        assert (await coordination.links[1].health())[0] == 200


@pytest.mark.anyio
async def test_prepare_closes_every_worker_and_resume_opens_them(monkeypatch: pytest.MonkeyPatch) -> None:
    async with coordinated(monkeypatch) as coordination:
        workers = [await coordination.join(), await coordination.join()]
        reply = await coordination.control_plane.prepare(request())
        assert reply["phase"] == "prepared"
        assert [worker.gate.open for worker in workers] == [False, False]
        assert coordination.pool.generation == 1
        await coordination.control_plane.resume(request())
        assert [worker.gate.open for worker in workers] == [True, True]


@pytest.mark.anyio
async def test_a_worker_joining_while_closed_closes_at_once_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    async with coordinated(monkeypatch) as coordination:
        await coordination.join()
        assert (await coordination.control_plane.prepare(request()))["phase"] == "prepared"
        late = await coordination.join()
        assert late.gate.open is False
        await settled(coordination, lambda: len(coordination.pool.reports()) == 2)
        assert coordination.participant.report().ready
        await coordination.control_plane.resume(request())
        assert late.gate.open


def test_a_worker_that_has_not_reported_for_this_close_blocks() -> None:
    pool = WorkerPool(2)
    pool.open, pool.generation = False, 3
    pool.workers = {
        "a": Worker("a", 1, None, report=gate_report(), generation=3),  # type: ignore[arg-type]  # never sends here
        "b": Worker("b", 2, None, report=gate_report(), generation=2),  # type: ignore[arg-type]
    }
    assert pool.unreported() == 1
    pool.open = True
    assert pool.unreported() == 0


def test_the_newest_report_of_a_worker_wins_whatever_order_it_is_read_in() -> None:
    pool = WorkerPool(1)
    worker = Worker("a", 1, None)  # type: ignore[arg-type]  # never sends here
    pool.take_report(worker, {"generation": 1, "seq": 2, "report": gate_report(held=1)})
    pool.take_report(worker, {"generation": 1, "seq": 1, "report": gate_report()})  # a close reply read late
    assert (worker.report["counts"]["held"], worker.seq) == (1, 2)


@pytest.mark.anyio
async def test_a_worker_lost_while_closed_blocks_commit_until_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    async with coordinated(monkeypatch) as coordination:
        await coordination.join()
        await coordination.join()
        assert (await coordination.control_plane.prepare(request()))["phase"] == "prepared"
        assert coordination.links[0].channel is not None
        coordination.links[0].channel.close()
        await wait_for(lambda: len(coordination.pool.workers) == 1, "the coordinator to see the loss")
        report = coordination.participant.report()
        assert (report.ready, report.blockers) == (False, ("policy_model-worker-lost",))
        commit = CommitRequest(checkpoint_id="c1", deadline_ts=soon(), checkpoint_dir="/nonexistent", episode_ids=[])
        with pytest.raises(InvalidPhaseError, match="no longer ready"):
            await coordination.control_plane.commit(commit)
        await coordination.control_plane.resume(request())
        assert coordination.participant.report().ready
        assert coordination.pool.left


@pytest.mark.anyio
async def test_the_clock_moves_on_every_worker_and_a_joining_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """`POST /_ctl/clock` on the coordinator moves the server's time: every worker's clock with it (each worker
    sets its own process's offset; here all run in this process, so the offset is read back from it)."""
    monkeypatch.setenv(clock.OFFSET_ENV, "+0")
    async with coordinated(monkeypatch) as coordination:
        assert coordination.control_plane.clock_followers == [coordination.pool.move_clock]
        await coordination.join()
        await coordination.join()
        await coordination.pool.move_clock(7.5)
        assert clock.offset() == 7.5
        monkeypatch.setenv(clock.OFFSET_ENV, "+0")
        await coordination.join()
        assert clock.offset() == 7.5, "a worker that registers later takes the server's offset"


@pytest.mark.anyio
async def test_retired_marks_reach_every_worker_and_a_joining_one_until_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with coordinated(monkeypatch, expected=3) as coordination:
        await coordination.join()
        await coordination.join()
        retire = RetireRequest(checkpoint_id="x", deadline_ts=soon(), episode_ids=episodes("r0-a1"))
        assert (await coordination.control_plane.retire(retire)) == {"retired": ["r0-a1"]}
        await coordination.join()
        r0 = EpisodeId(rollout_id="r0")
        assert [link.retired.is_retired(r0) for link in coordination.links] == [True, True, True]
        assert not any(link.retired.is_retired(EpisodeId(rollout_id="r0", attempt=2)) for link in coordination.links)
        forget = {"checkpoint_id": "x", "deadline_ts": soon(), "rollout_ids": ["r0"]}
        await coordination.control_plane.run_forwarded("forget", forget)
        assert [link.retired.is_retired(r0) for link in coordination.links] == [False, False, False]


@pytest.mark.anyio
async def test_when_a_retire_returns_the_status_already_counts_what_the_workers_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with coordinated(monkeypatch) as coordination:
        worker = await coordination.join()
        await coordination.join()

        async def generation() -> None:
            ticket = await worker.gate.admit("r0")
            try:
                await worker.gate.run(ticket, asyncio.Event().wait)
            finally:
                worker.gate.exit(ticket)

        running = asyncio.ensure_future(generation())
        await settled(coordination, lambda: coordination.participant.report().counts["inflight"] == 1)
        retire = RetireRequest(checkpoint_id="x", deadline_ts=soon(), episode_ids=episodes("r0"))
        await coordination.control_plane.retire(retire)
        assert coordination.control_plane.status()["report"]["counts"]["inflight"] == 0  # no wait: already merged
        with pytest.raises(StaleAttemptError):
            await running


@pytest.mark.anyio
async def test_commit_then_restore_into_a_fresh_server_and_not_once_a_worker_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = tempfile.mkdtemp(prefix="ckpt-test-checkpoint-")
    try:
        async with coordinated(monkeypatch) as coordination:
            workers = [await coordination.join(), await coordination.join()]
            control_plane = coordination.control_plane
            await control_plane.prepare(request())
            committed = await control_plane.commit(
                CommitRequest(
                    checkpoint_id="c1", deadline_ts=soon(), checkpoint_dir=directory, episode_ids=episodes("r0")
                )
            )
            assert (committed["episode_ids"], committed["staging_keys"]) == ([], [])
            await control_plane.resume(request())

            restore = RestoreRequest(
                checkpoint_id="r1", deadline_ts=soon(), checkpoint_dir=directory, episode_ids=episodes("r0")
            )
            assert (await control_plane.restore(restore))["restored"] == ["r0-a1"]
            assert [worker.gate.restored_targets for worker in workers] == [{"r0-a1"}, {"r0-a1"}]
            await control_plane.resume(request(checkpoint_id="r1"))

            workers[1].gate.served = True
            workers[1].gate.changed()
            await settled(coordination, lambda: any(r["served"] for r in coordination.pool.reports()))
            again = RestoreRequest(
                checkpoint_id="r2", deadline_ts=soon(), checkpoint_dir=directory, episode_ids=episodes("r0")
            )
            with pytest.raises(ControlError, match="have served calls"):
                await control_plane.restore(again)
            assert [worker.gate.open for worker in workers] == [True, True]
    finally:
        shutil.rmtree(directory)


@pytest.mark.anyio
async def test_a_worker_forwards_control_calls_and_their_refusals_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    async with coordinated(monkeypatch) as coordination:
        await coordination.join()
        await coordination.join()
        await settled(coordination)
        link = coordination.links[0]
        bearer = f"Bearer {TOKEN}"
        forwarded: Awaitable[Any] = link.handle_control("status", bearer, None)
        assert await forwarded == coordination.control_plane.status()
        with pytest.raises(UnauthorizedError):
            await link.handle_control("status", "Bearer wrong", None)
        commit = CommitRequest(checkpoint_id="c1", deadline_ts=soon(), checkpoint_dir="/nowhere", episode_ids=[])
        with pytest.raises(RemoteControlError) as refused:
            await link.handle_control("commit", bearer, commit)
        assert (refused.value.status_code, refused.value.code) == (409, "invalid_phase")


# --- runtime directories ------------------------------------------------------------------------------------------


def test_a_runtime_dir_is_private_and_a_dead_coordinators_is_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(tempfile.mkdtemp(prefix="ckpt-test-runtime-")) / "root"
    monkeypatch.setattr(runtime, "RUNTIME_ROOT", root)
    try:
        dead = runtime.runtime_dir(PID_NEVER_USED)
        dead.mkdir(parents=True)
        directory = runtime.make_runtime_dir(os.getpid())
        assert (directory.stat().st_mode & 0o777, root.stat().st_mode & 0o777) == (0o700, 0o700)
        assert not dead.exists(), "the directory of a coordinator that is gone is swept"
        runtime.remove_runtime_dir(os.getpid())
        assert not directory.exists()
    finally:
        shutil.rmtree(root.parent)


def test_a_placement_must_name_workers_of_the_server() -> None:
    assert placement_refusal({"r0#0": 0, "r1#0": 1}, 2) is None
    assert placement_refusal({}, 2) is None
    refusal = placement_refusal({"r0#0": 2, "r1#0": -1, "r2#0": 1}, 2)
    assert refusal is not None
    assert "{'r0#0': 2, 'r1#0': -1}" in refusal


def test_a_worker_forwards_only_a_tagged_unforwarded_call_placed_on_another_worker() -> None:
    placement = CallPlacement(POLICY_SOCKET_ENV)
    placement.placement = {"here": 1, "there": 0}
    plain = attrs.make_class("Plain", {"headers": attrs.field(default={})})()
    forwarded = attrs.make_class("Forwarded", {"headers": attrs.field(default={PLACED_HEADER: "1"})})()
    assert placement.elsewhere("there", plain) is None, "a worker that does not know its index forwards nothing"
    placement.index = 1
    assert placement.elsewhere("there", plain) == 0
    assert placement.elsewhere("here", plain) is None
    assert placement.elsewhere("unplaced", plain) is None
    assert placement.elsewhere(None, plain) is None
    assert placement.elsewhere("there", forwarded) is None, "a forwarded call is served where it arrives"
