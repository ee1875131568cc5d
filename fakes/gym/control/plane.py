"""The checkpoint control plane every look-alike participant server shares (reference sections 2, 3 and 10).

It owns what the wire contract says about a participant: phases, fencing of resumed IDs, one checkpoint at
a time, idempotent replay of completed operations, deadlines, the lease, storage and the retired marks. The
server's `Participant` owns only its live state and is reached through its hooks, so all four servers answer
the control routes identically.

The routes and their bodies are `fakes.gym.control.routes`; the retired marks are `fakes.gym.control.retired`.
How operations are serialised, bounded by their deadlines, run in the background and replayed is the
`WorkRunner`'s (`fakes.gym.control.work_runner`); the lease's time and timer are the `Lease`'s
(`fakes.gym.control.lease`). The prepare's readiness wait runs outside the lock too. A resume interrupts running
work (cancels an export or a read, stops a write so it never publishes, waits for a cleanup or an install) before
it re-opens admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import APIRouter

from fakes import clock
from fakes.gym.config import ServerConfig
from fakes.gym.control.lease import Lease
from fakes.gym.control.participant import Participant, PrepareReport
from fakes.gym.control.planted import PlantedFaults, coin_toss
from fakes.gym.control.retired import RetiredAttempts
from fakes.gym.control.routes import (
    BULKY_OPERATIONS,
    ClockSkewRequest,
    HookFaultRequest,
    LostReplyRequest,
    StorageFaultRequest,
    check_bearer,
    control_router,
    parse_forwarded,
)
from fakes.gym.control.store import (
    MANIFEST_NAME,
    EncodedRecord,
    collector_paused,
    participant_dir,
    read_participant_state,
    record_episode,
    write_participant_state,
)
from fakes.gym.control.telemetry import Telemetry
from fakes.gym.control.work_runner import Reply, Result, Work, WorkRunner
from fakes.gym.faults.failpoints import BEFORE_INSTALL, BETWEEN_FILES, Failpoints
from fakes.gym.faults.hooks import HookFaults
from fakes.gym.faults.lost_replies import LOSABLE, LostReplies
from fakes.gym.faults.power_cuts import Journal
from fakes.gym.faults.storage import StorageFaults
from fakes.gym.protocol.errors import (
    CheckpointConflictError,
    CheckpointStateError,
    ControlError,
    InvalidPhaseError,
    ReplyLost,
    RestartInScopeError,
    StaleCheckpointError,
)
from fakes.gym.protocol.wire import (
    CheckpointRequest,
    CommitRequest,
    EpisodeId,
    ForgetRequest,
    RestoreRequest,
    RetireRequest,
    bearer,
)

log = logging.getLogger(__name__)

RESUMED_IDS_KEPT = 64
READY_RECHECK_S = 1.0

# "restoring" is internal: a restore holds its ID while it reads and installs, but the wire still shows idle.
_WIRE_PHASE = {"restoring": "idle"}
_ALLOWED_PHASES: dict[str, frozenset[str]] = {
    "prepare": frozenset({"idle", "preparing"}),
    "renew": frozenset({"preparing", "prepared", "committed", "restored", "restoring"}),
    "commit": frozenset({"prepared"}),
    "restore": frozenset({"idle"}),
    "retire": frozenset({"idle", "restored"}),
    "forget": frozenset({"idle", "restored"}),
}

# Per operation: the ControlPlane method that runs it (its route and body: `fakes.gym.control.routes`).
_OPERATIONS: dict[str, str] = {
    "status": "_status_op",
    "prepare": "prepare",
    "renew": "renew",
    "commit": "commit",
    "restore": "restore",
    "resume": "resume",
    "retire": "retire",
    "forget": "forget",
    "failpoints": "_failpoint_state",
    "arm failpoint": "_arm_failpoint",
    "storage": "_storage_state",
    "arm storage": "_arm_storage",
    "release storage": "_release_storage",
    "lost replies": "_lost_reply_state",
    "lose reply": "_lose_reply",
    "hooks": "_hook_state",
    "fail hook": "_fail_hook",
    "clock": "_clock_state",
    "skew clock": "_skew_clock",
}

# Loop turns a clock's jump is given before its reply: one runs the timers now due, the next the closes they
# scheduled.
TIMER_TURNS = 3


def _op_args(checkpoint_dir: str, scope: list[EpisodeId] | None) -> tuple[Any, ...]:
    """What a replay must match: the directory and the sorted scope capture keys (None: no scope given)."""
    keys = None if scope is None else tuple(sorted({episode.capture_key for episode in scope}))
    return (checkpoint_dir, keys)


def _record_key(record: Any) -> str:
    """The capture key of a record's `episode_id`; a record without a valid one is corrupt state."""
    if isinstance(record, EncodedRecord):
        return record.key
    return record_episode(record).capture_key


def _select_in_scope(scope_keys: frozenset[str], record: Any) -> Any:
    return record if _record_key(record) in scope_keys else None


class ControlPlane:
    """One participant server's side of the checkpoint contract, served under `CHECKPOINT_ROUTE_PREFIX`."""

    def __init__(
        self,
        participant: Participant,
        *,
        instance: str,
        token: str,
        lease_grace_s: float = 600.0,
        faults: Iterable[str] = (),
        durability_journal: str = "",
        telemetry_dir: str = "",
    ):
        self.participant = participant
        self.faults = frozenset(faults)
        kind = participant.kind
        # Planted faults, read once here so each costs nothing when off.
        self._planted = planted = PlantedFaults.read(kind, self.faults)
        self._journal = Journal(durability_journal) if durability_journal else None
        self.failpoints = Failpoints()
        self.storage = StorageFaults()
        self.lost_replies = LostReplies()
        self.hooks = HookFaults()
        self.instance = instance
        self.telemetry = Telemetry(telemetry_dir, instance, kind, self.faults)
        self.retired = RetiredAttempts()
        self.checkpoint_id: str | None = None
        self.runner = WorkRunner(
            self._name, compares_requests=planted.retried_commit_conflicts, clock=planted.wall_clock
        )
        self.lease = Lease(
            lease_grace_s,
            on_lapse=self._lapse,
            spawn=self.runner.spawn,
            acts=not planted.lease_never_expires,
            clock=planted.wall_clock,
        )
        self._bearer = bearer(token).encode()
        self._phase = "idle"
        self._resumed: OrderedDict[str, None] = OrderedDict()
        self._exported: tuple[str, tuple[Any, ...], list[Any]] | None = None
        self._changed = asyncio.Event()
        # What else keeps this server's clock (`POST /_ctl/clock`): a coordinator's workers (`WorkerPool.move_clock`).
        self.clock_followers: list[Callable[[float], Awaitable[None]]] = []

    @classmethod
    def from_config(cls, participant: Participant, config: ServerConfig) -> ControlPlane:
        """The control plane of the server `config` describes (name, bearer, lease, planted faults)."""
        return cls(
            participant,
            instance=config.name,
            token=config.token,
            lease_grace_s=config.lease_grace_s,
            faults=config.faults,
            durability_journal=config.durability_journal,
            telemetry_dir=config.telemetry_dir,
        )

    # -- what participants use ------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.participant.kind

    @property
    def phase(self) -> str:
        return _WIRE_PHASE.get(self._phase, self._phase)

    def notify(self) -> None:
        """Wake every wait on this server's state; participants call it (on the loop) whenever it changes."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def close(self) -> None:
        """Stop the lease timer and background work (server shutdown; tests)."""
        self.lease.clear()
        await self.runner.close()
        self.telemetry.shutdown()

    # -- routes ---------------------------------------------------------------------------------------------

    def router(self) -> APIRouter:
        """The control routes, and the look-alike's own failpoint routes (`fakes.gym.faults.failpoints`)."""
        return control_router(self._call)

    async def _call(self, op: str, authorization: str | None, argument: Any, traceparent: str | None = None) -> Reply:
        """Check the bearer, then run the operation."""
        check_bearer(authorization, self._bearer)
        return await self._run(op, argument, traceparent)

    async def run_forwarded(self, op: str, body: Any, traceparent: str | None = None) -> Reply:
        """Run an operation a worker of a multi-worker server forwarded (`fakes.gym.workers.link`): the worker validated
        the body and checked the bearer, so the reply is exactly what this server's own route would give.

        A bulky operation (`BULKY_OPERATIONS`) is read and run with the collector paused: its thousands of episode
        objects, made with it on, live as long as the operation runs and can start a collection of the whole heap
        (a coordinator keeps its workers' reports and the restored records it holds)."""
        paused = collector_paused() if op in BULKY_OPERATIONS else contextlib.nullcontext()
        with paused:
            return await self._run(op, parse_forwarded(op, body), traceparent)

    async def _run(self, op: str, argument: Any, traceparent: str | None = None) -> Reply:
        """Run the operation `op` names through the runner (an unexpected exception becomes 500), a control operation
        inside its span (`fakes.gym.control.telemetry`)."""
        operation: Callable[..., Awaitable[Reply]] = getattr(self, _OPERATIONS[op])
        checkpoint_id = getattr(argument, "checkpoint_id", "")
        with self.telemetry.operation(op, checkpoint_id, traceparent, self.instance):
            reply = await self.runner.run(op, lambda: operation() if argument is None else operation(argument))
        if op in LOSABLE and self.lost_replies.take(op):
            # Planted: a result counts as recorded once its reply went out.
            if self._planted.replay_recorded_once_delivered:
                self.runner.drop_result(argument.checkpoint_id, op)
            raise ReplyLost(f"the reply to {op} of {argument.checkpoint_id!r} is lost on the wire")
        return reply

    async def _failpoint_state(self) -> Reply:
        return self.failpoints.state()

    async def _arm_failpoint(self, point: str) -> Reply:
        self.failpoints.arm(point)
        return self.failpoints.state()

    async def _clock_state(self) -> Reply:
        """Whether this server's clock can be skewed, its offset, and the time it reads now."""
        return {"skewable": clock.skewable(), "offset_s": clock.offset(), "time": time.time()}

    async def _skew_clock(self, request: ClockSkewRequest) -> Reply:
        if not clock.skewable():
            raise ControlError(
                f"{self._name} runs without libfaketime, so its clock cannot be skewed; install Debian's faketime"
            )
        clock.set_offset(request.offset_s)
        for follow in self.clock_followers:
            await follow(request.offset_s)
        # The lease's timer and the deadlines requests wait under run on the monotonic clock, which a move of the
        # wall clock alone leaves behind: time them again from the wall clock, so a lease or a deadline it jumped
        # past falls due now, as after that much real time; and wake every wait on this server's state (a prepare
        # waiting for readiness re-reads its deadline).
        self.lease.rearm()
        self.runner.clock_moved()
        self.notify()
        # A clock that jumped makes timers due: idle keep-alive connections close (monotonic too, `fakes.clock`),
        # leases lapse. Let the loop run them before answering, so the caller's next request on a pooled connection
        # never meets one this server is closing at that moment.
        for _ in range(TIMER_TURNS):
            await asyncio.sleep(0)
        return await self._clock_state()

    async def _hook_state(self) -> Reply:
        return self.hooks.state()

    async def _fail_hook(self, request: HookFaultRequest) -> Reply:
        self.hooks.arm(request.hook)
        return self.hooks.state()

    async def _lost_reply_state(self) -> Reply:
        return self.lost_replies.state()

    async def _lose_reply(self, request: LostReplyRequest) -> Reply:
        self.lost_replies.arm(request.operation)
        return self.lost_replies.state()

    async def _storage_state(self) -> Reply:
        return self.storage.state()

    async def _arm_storage(self, request: StorageFaultRequest) -> Reply:
        self.storage.arm(request.point, request.how)
        return self.storage.state()

    async def _release_storage(self) -> Reply:
        self.storage.release()
        return self.storage.state()

    async def _status_op(self) -> Reply:
        return self.status()

    # -- operations -----------------------------------------------------------------------------------------

    def status(self) -> Reply:
        """What `GET status` shows; a restore still reading or installing shows `idle` with its ID."""
        return {
            "kind": self.kind,
            "instance": self.instance,
            "phase": self.phase,
            "checkpoint_id": self.checkpoint_id,
            "lease_expires_at": self.lease.expires_at,
            "retired_rollouts": len(self.retired),
            "report": self.participant.report().to_wire(),
            **self.participant.status_extras(),
        }

    async def prepare(self, request: CheckpointRequest) -> Reply:
        """Close admission, then wait until the participant is ready or the deadline passes."""
        checkpoint_id = request.checkpoint_id
        async with self.runner.lock:
            self._admit(checkpoint_id, "prepare")
            replay = self._replay(checkpoint_id, "prepare", (), request.deadline_ts)
            if replay is not None:
                return replay
            self._require_phase("prepare", checkpoint_id)
            if self._planted.closes_before_deadline_check and self._phase == "idle":
                # Planted: admission closes before the deadline is checked, and a refusal leaves it closed.
                await self.participant.close_admission(request.deadline_ts)
            if self._planted.prepare_ignores_past_deadline:  # planted: the deadline is only a bound on the wait
                remaining_s = max(request.deadline_ts - time.time(), 0.0)
            else:
                remaining_s = self.runner.remaining_s(request.deadline_ts, f"prepare of {checkpoint_id!r}")
            if self._phase == "idle":
                await self._close_for_prepare(request, remaining_s)
            else:
                self._renew_lease(request.deadline_ts)
        try:
            with self.telemetry.step("wait_ready"):
                report = await self._await_ready(checkpoint_id, request.deadline_ts)
        except BaseException:
            await self._abort_prepare(checkpoint_id)
            raise
        phase = self.phase if self.checkpoint_id == checkpoint_id else "idle"
        return {"phase": phase, "report": report.to_wire()}

    async def renew(self, request: CheckpointRequest) -> Reply:
        """For a controller whose publication outlasts the last call's lease."""
        async with self.runner.lock:
            self._admit(request.checkpoint_id, "renew")
            self._require_phase("renew", request.checkpoint_id)
            self._renew_lease(request.deadline_ts)
            return {"lease_expires_at": self.lease.expires_at}

    async def commit(self, request: CommitRequest) -> Reply:
        """Export once, write records then manifest, then free restored state outside the scope."""
        checkpoint_id = request.checkpoint_id
        args = _op_args(request.checkpoint_dir, request.episode_ids)
        async with self.runner.lock:
            self._admit(checkpoint_id, "commit")
            replay = self._replay(checkpoint_id, "commit", args, request.deadline_ts, request=self.runner.keep(request))
            if replay is not None:
                return replay
            work = self.runner.running(checkpoint_id, "commit", args)
            if work is None:
                work = self._start_commit(request, args)
            else:
                self._renew_lease(request.deadline_ts)
        return await self.runner.wait(work, request.deadline_ts)

    async def restore(self, request: RestoreRequest) -> Reply:
        """Verify and install the in-scope records under their next attempts; all or nothing."""
        checkpoint_id = request.checkpoint_id
        args = _op_args(request.checkpoint_dir, request.episode_ids)
        async with self.runner.lock:
            self._admit(checkpoint_id, "restore", fenced=not self._planted.restore_skips_fence)
            replay = self._replay(checkpoint_id, "restore", args, request.deadline_ts)
            if replay is not None:
                return replay
            work = self.runner.running(checkpoint_id, "restore", args)
            if work is None:
                work = self._start_restore(request, args)
            else:
                self._renew_lease(request.deadline_ts)
        return await self.runner.wait(work, request.deadline_ts)

    async def resume(self, request: CheckpointRequest) -> Reply:
        """End the checkpoint and re-open admission; no deadline check, since aborting must always work."""
        with self.telemetry.step("end_checkpoint"):
            idempotent = await self._resume(request.checkpoint_id)
        return {"phase": "idle", "idempotent": idempotent}

    async def retire(self, request: RetireRequest) -> Reply:
        """Mark first (refusals start at once), then let the participant stop and free the attempts."""
        checkpoint_id = request.checkpoint_id
        async with self.runner.locked_by(request.deadline_ts, f"retire under {checkpoint_id!r}"):
            self._admit(checkpoint_id, "retire")
            self._require_phase("retire", checkpoint_id)
            remaining_s = self.runner.remaining_s(request.deadline_ts, f"retire under {checkpoint_id!r}")
            if self._phase == "restored":
                self._renew_lease(request.deadline_ts)
            self.retired.mark(request.episode_ids)
            self.notify()
            if self._phase == "restored" and self._planted.retire_leaves_restored:
                return {"retired": [episode.capture_key for episode in request.episode_ids]}
            async with self.runner.bounded(remaining_s, f"retire under {checkpoint_id!r}"):
                with self.telemetry.step("stop_and_free"):
                    await self.participant.retire(list(request.episode_ids))
        return {"retired": [episode.capture_key for episode in request.episode_ids]}

    async def forget(self, request: ForgetRequest) -> Reply:
        """Drop the marks once nothing of those rollouts can run; the participant may refuse first."""
        checkpoint_id = request.checkpoint_id
        rollout_ids = sorted(set(request.rollout_ids))
        async with self.runner.locked_by(request.deadline_ts, f"forget under {checkpoint_id!r}"):
            self._admit(checkpoint_id, "forget")
            self._require_phase("forget", checkpoint_id)
            remaining_s = self.runner.remaining_s(request.deadline_ts, f"forget under {checkpoint_id!r}")
            if self._phase == "restored":
                self._renew_lease(request.deadline_ts)
            async with self.runner.bounded(remaining_s, f"forget under {checkpoint_id!r}"):
                with self.telemetry.step("check_forget"):
                    await self.participant.check_forget(rollout_ids)
                self.retired.forget(rollout_ids)
                await self.participant.forget(rollout_ids)
            self.notify()
        return {"forgotten": rollout_ids}

    # -- admission, replay, the lease -----------------------------------------------------------------------

    @property
    def _name(self) -> str:
        return f"{self.kind}/{self.instance}"

    def _admit(self, checkpoint_id: str, op: str, *, fenced: bool = True) -> None:
        """The first two admission checks; the phase check comes after replay (a completed op replays).

        `fenced=False` skips the resumed-ID check: only the `resources_restore_skips_fence` fault passes it.
        """
        if fenced and checkpoint_id in self._resumed:
            raise StaleCheckpointError(
                f"checkpoint {checkpoint_id!r} was already resumed on {self._name}; {op} refused, "
                "use a new checkpoint ID"
            )
        if self.checkpoint_id is not None and self.checkpoint_id != checkpoint_id:
            raise CheckpointConflictError(
                f"checkpoint {self.checkpoint_id!r} is active on {self._name}; {op} of {checkpoint_id!r} "
                f"refused, resume {self.checkpoint_id!r} first"
            )

    def _replay(
        self,
        checkpoint_id: str,
        op: str,
        args: tuple[Any, ...],
        deadline_ts: float,
        *,
        request: Reply | None = None,
    ) -> Reply | None:
        """The recorded reply of a completed op (see `WorkRunner.replay`); replaying renews the lease."""
        reply = self.runner.replay(checkpoint_id, op, args, request=request)
        if reply is not None:
            self._renew_lease(deadline_ts)
        return reply

    def _require_phase(self, op: str, checkpoint_id: str) -> None:
        if self._phase in _ALLOWED_PHASES[op]:
            return
        if op in ("retire", "forget"):
            raise InvalidPhaseError(
                f"{op} under {checkpoint_id!r} refused on {self._name}: checkpoint {self.checkpoint_id!r} "
                f"is {self._phase}; resume first"
            )
        allowed = sorted(_ALLOWED_PHASES[op])
        raise InvalidPhaseError(
            f"{op} of {checkpoint_id!r} is not allowed on {self._name} in phase {self._phase!r} "
            f"(allowed: {', '.join(allowed)})"
        )

    def _renew_lease(self, deadline_ts: float) -> None:
        self.lease.renew(self.checkpoint_id, deadline_ts)

    async def _lapse(self, checkpoint_id: str) -> None:
        """An unreachable controller must not hold admission closed forever: re-open as its resume would."""
        log.warning("lease of checkpoint %r expired on %s; re-opening admission", checkpoint_id, self._name)
        self.telemetry.lease_expired(checkpoint_id)
        with contextlib.suppress(CheckpointConflictError):
            await self._resume(checkpoint_id)
        if self._planted.lapse_forgets_id:  # planted: the lapse re-opens as a resume would, but leaves the ID unfenced
            self._resumed.pop(checkpoint_id, None)

    # -- prepare --------------------------------------------------------------------------------------------

    async def _close_for_prepare(self, request: CheckpointRequest, remaining_s: float) -> None:
        """idle -> preparing; if closing admission fails, admission re-opens and the phase is idle again."""
        self._phase = "preparing"
        self.checkpoint_id = request.checkpoint_id
        self._renew_lease(request.deadline_ts)
        self.notify()
        try:
            async with self.runner.bounded(remaining_s, f"closing admission for {request.checkpoint_id!r}"):
                with self.telemetry.step("close_admission"):
                    await self.participant.close_admission(request.deadline_ts)
                self.hooks.hit("close")  # a close that fails after closing
        except BaseException:
            await self._abandon(reopen=not self._planted.failed_close_stays_closed)
            raise

    async def _await_ready(self, checkpoint_id: str, deadline_ts: float) -> PrepareReport:
        """Re-check readiness after every change notification (at least every second), outside the lock."""
        while True:
            changed = self._changed
            report = self.participant.report()
            if self.checkpoint_id != checkpoint_id or self._phase != "preparing":
                return report
            if report.ready:
                self._phase = "prepared"
                reply = {"phase": "prepared", "report": report.to_wire()}
                self.runner.record(checkpoint_id, "prepare", Result((), reply))
                self.notify()
                return report
            remaining_s = deadline_ts - time.time()
            if remaining_s <= 0:
                return report
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining_s, READY_RECHECK_S)):
                    await changed.wait()

    async def _abort_prepare(self, checkpoint_id: str) -> None:
        """A prepare whose wait raised (e.g. was cancelled) must not leave admission closed."""
        async with self.runner.lock:
            if self.checkpoint_id == checkpoint_id and self._phase == "preparing":
                await self._abandon()

    # -- commit ---------------------------------------------------------------------------------------------

    def _start_commit(self, request: CommitRequest, args: tuple[Any, ...]) -> Work:
        checkpoint_id = request.checkpoint_id
        self._require_phase("commit", checkpoint_id)
        self.runner.remaining_s(request.deadline_ts, f"commit of {checkpoint_id!r}")
        self._check_commit_scope(checkpoint_id, request.episode_ids)
        exported = self._exported
        if exported is not None and exported[0] == checkpoint_id and exported[1] != args[1]:
            raise CheckpointConflictError(
                f"checkpoint {checkpoint_id!r} was already exported on {self._name} for scope {exported[1]}; "
                f"a retried commit must repeat that scope (got {args[1]}), or resume and prepare again"
            )
        self._renew_lease(request.deadline_ts)
        work = Work(checkpoint_id, "commit", args, request=self.runner.keep(request))
        return self.runner.start(work, functools.partial(self._run_commit, request=request))

    def _check_commit_scope(self, checkpoint_id: str, scope: list[EpisodeId] | None) -> None:
        report = self.participant.report()
        if not report.ready:
            raise InvalidPhaseError(
                f"{self._name} is no longer ready to commit {checkpoint_id!r} (blockers: "
                f"{sorted(report.blockers)[:10]}); resume and prepare again"
            )
        if scope is None or self._planted.restart_in_scope_accepted:
            return
        restarts = set(report.restarts) & {episode.capture_key for episode in scope}
        if restarts:
            raise RestartInScopeError(
                f"the commit scope names {sorted(restarts)}, which {self._name} reported as restarts; "
                "leave restarts out of the scope (they start over instead of continuing)"
            )

    async def _run_commit(self, work: Work, *, request: CommitRequest) -> Reply:
        with collector_paused():  # thousands of records: see collector_paused
            return await self._commit_steps(work, request)

    async def _commit_steps(self, work: Work, request: CommitRequest) -> Reply:
        records = await self._export_once(work, request.episode_ids)
        keys = sorted({_record_key(record) for record in records})
        work.stage = "write"
        try:
            with self.storage.writing(), self.telemetry.step("write"):
                manifest = await asyncio.to_thread(
                    write_participant_state,
                    request.checkpoint_dir,
                    self.kind,
                    self.instance,
                    work.checkpoint_id,
                    records,
                    stop=work.stop,
                    between_files=functools.partial(self.failpoints.hit, BETWEEN_FILES),
                    manifest_first=self._planted.manifest_first,
                    journal=self._journal,
                    skip_records_fsync=self._planted.skip_records_fsync,
                    storage_fault=self.storage.hit,
                    faults=self._planted.writer,
                )
        except CheckpointStateError:
            if self._planted.failed_write_abandons:  # planted: the checkpoint is given up instead of staying prepared
                async with self.runner.lock:
                    if self.runner.current is work:
                        await self._abandon()
            raise
        work.stage = "cleanup"
        if request.episode_ids is not None:
            await self.participant.delete_restored({episode.capture_key for episode in request.episode_ids})
        reply = {
            "phase": "committed",
            "manifest": manifest,
            "episode_ids": keys,
            **self._commit_extras(records),
        }
        self._finish(work, "committed", reply)
        return reply

    async def _export_once(self, work: Work, scope: list[EpisodeId] | None) -> list[Any]:
        """A retry after a failed or timed-out write stores the first export again, never a fresh one."""
        exported = self._exported
        if exported is not None and exported[0] == work.checkpoint_id:
            return exported[2]
        work.stage = "export"
        if self._planted.export_placeholder:  # planted: "an export is under way", kept when the export fails
            self._exported = (work.checkpoint_id, work.args[1], [])
        self.hooks.hit("export")
        with self.telemetry.step("export"):
            records = list(await self.participant.export(scope))
        self._exported = (work.checkpoint_id, work.args[1], records)
        return records

    def _commit_extras(self, records: list[Any]) -> Reply:
        """Optional participant hook `commit_extras(records)` (the model adds `staging_keys`)."""
        extras = getattr(self.participant, "commit_extras", None)
        return dict(extras(records)) if extras is not None else {}

    # -- restore --------------------------------------------------------------------------------------------

    def _start_restore(self, request: RestoreRequest, args: tuple[Any, ...]) -> Work:
        self._require_phase("restore", request.checkpoint_id)
        self.runner.remaining_s(request.deadline_ts, f"restore of {request.checkpoint_id!r}")
        self._phase = "restoring"
        self.checkpoint_id = request.checkpoint_id
        self._renew_lease(request.deadline_ts)
        self.notify()
        work = Work(request.checkpoint_id, "restore", args)
        return self.runner.start(work, functools.partial(self._run_restore, request=request))

    async def _run_restore(self, work: Work, *, request: RestoreRequest) -> Reply:
        try:
            with collector_paused():  # thousands of records: see collector_paused
                return await self._restore_steps(work, request)
        except BaseException:
            async with self.runner.lock:
                if self.runner.current is work:
                    await self._abandon(reopen=not self._planted.failed_install_stays_closed)
            raise

    async def _restore_steps(self, work: Work, request: RestoreRequest) -> Reply:
        work.stage = "read"
        with self.telemetry.step("read"):
            manifest, records = await self._read_share(request)
            for record in records:
                self._validate_record(record)
        work.stage = "install"
        with self.telemetry.step("install"):
            await self.participant.close_admission(None)
            if self.failpoints.armed(BEFORE_INSTALL):
                await asyncio.to_thread(self.failpoints.hit, BEFORE_INSTALL)  # off the loop: status still answers
            self.hooks.hit("install")  # a hook that installs all or none fails having installed nothing
            installed = await self.participant.install(records, list(request.episode_ids))
        reply = {
            "phase": "restored",
            "source_checkpoint_id": manifest["checkpoint_id"],
            "restored": sorted(installed),
        }
        self._finish(work, "restored", reply)
        return reply

    async def _read_share(self, request: RestoreRequest) -> tuple[Any, list[Any]]:
        """This participant's manifest and its records of the episodes in the restore's scope."""
        scope_keys = frozenset(episode.capture_key for episode in request.episode_ids)
        share = participant_dir(request.checkpoint_dir, self.kind, self.instance) / MANIFEST_NAME
        if self._planted.missing_share_is_empty and not share.exists():
            return {"checkpoint_id": request.checkpoint_id}, []
        manifest, records = await asyncio.to_thread(
            read_participant_state,
            request.checkpoint_dir,
            self.kind,
            self.instance,
            functools.partial(_select_in_scope, scope_keys),
        )
        return manifest, list(records)

    def _validate_record(self, record: Any) -> None:
        try:
            self.participant.validate_record(record)
        except ControlError:
            raise
        except Exception as exc:
            raise CheckpointStateError(
                f"record of {_record_key(record)!r} is not one {self._name} can install: {exc}"
            ) from exc

    # -- completing a commit or a restore -------------------------------------------------------------------

    def _finish(self, work: Work, phase: str, reply: Reply) -> None:
        """Record a completed commit or restore, unless a resume ended its checkpoint meanwhile."""
        if self.checkpoint_id != work.checkpoint_id:
            raise self.runner.ended_during(work)
        self.runner.complete(work, reply)
        self._phase = phase
        self.notify()

    # -- ending a checkpoint --------------------------------------------------------------------------------

    async def _resume(self, checkpoint_id: str) -> bool:
        """End `checkpoint_id` as a resume does; True when there was nothing to end (idempotent)."""
        ended = False
        while True:
            async with self.runner.lock:
                unknown = self.checkpoint_id is None and checkpoint_id not in self._resumed
                if unknown and self._planted.resume_needs_known_id:
                    raise InvalidPhaseError(f"{self._name} has no checkpoint {checkpoint_id!r} to resume")
                if checkpoint_id in self._resumed or self.checkpoint_id is None:
                    # The planted fault forgets an ID it never saw (idle, nothing active).
                    if not self._planted.idle_resume_unfenced or checkpoint_id in self._resumed:
                        self._remember(checkpoint_id)
                    return not ended
                self._admit(checkpoint_id, "resume")
                work = self.runner.current
                if work is None or not work.running:
                    await self._end_checkpoint(checkpoint_id)
                    return False
                ended = True
                await work.interrupt()
                if work.stage == "write" and work.stop.never_publishes:
                    # Section 6.2: the resume waits only for a publication already under way; a write stopped
                    # before it (even one stalled on its disk) fails whenever it goes on, and publishes nothing.
                    await self._end_checkpoint(checkpoint_id)
                    return False
            # Outside the lock: the work's own ending (a failed restore re-opening admission) takes the lock.
            await work.ended()

    async def _end_checkpoint(self, checkpoint_id: str) -> None:
        if self._planted.resume_deletes_records or (self._planted.resume_deletes_records_sometimes and coin_toss()):
            self._delete_committed_records(checkpoint_id)
        self._remember(checkpoint_id)
        self.runner.forget(checkpoint_id)
        await self._abandon()

    async def _abandon(self, reopen: bool = True) -> None:
        """Back to idle with admission open (the ID is remembered only by a resume); `reopen=False` is a planted
        fault's: admission stays closed."""
        self._phase = "idle"
        self.checkpoint_id = None
        self.runner.abandon()
        self._exported = None
        self.lease.clear()
        self.notify()
        if reopen:
            await self.participant.open_admission()

    def _delete_committed_records(self, checkpoint_id: str) -> None:
        """Planted fault: clean up the records file of the checkpoint this participant committed."""
        committed = self.runner.result(checkpoint_id, "commit")
        if committed is None:
            return
        directory = participant_dir(committed.args[0], self.kind, self.instance)
        for records in directory.glob("records-*.jsonl"):
            records.unlink()

    def _remember(self, checkpoint_id: str) -> None:
        if self._planted.resumed_ids_unfenced:
            return  # planted fault `resumed_id_not_fenced` (or `agent_forgets_resumed_ids` on the agent)
        self._resumed[checkpoint_id] = None
        self._resumed.move_to_end(checkpoint_id)
        while len(self._resumed) > RESUMED_IDS_KEPT:
            self._resumed.popitem(last=False)
