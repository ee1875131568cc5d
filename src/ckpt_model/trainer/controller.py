"""The controller: performs every control operation and every `/run` for the machine, and journals each once.

Jepsen's interpreter, for one training controller. Each operation is journaled in the history exactly once (invoke,
then ok, fail, or info when a crash cut it short or its answer never came); its wire body and checkpoint directory
are built here; the one retry memory (`last_call`) is kept here; and each journal event is handed to the watchers as
one `Operation` (the ledger watch keeps the predicted token lineage in step with it). Rules never touch the
history, the retry memory, wire bodies or the watchers; what an operation answered is judged by the audits and the
properties. Gym's crashes and restarts of one server are the nemesis's (`ckpt_model.trainer.kills`), and every other
fault is its family's (`ckpt_model.trainer.nemeses`: failpoints, storage faults, pauses, ...); each journals through the
same controller.

The retry memory is the last operation the controller sent to every participant and may send again with the same
arguments (prepare, commit, resume, retire, forget). A renew, a restore, a send to some participants only, and the
cleanup after a lost server or a failed restore are never retried; a crash keeps only a commit (sent again after
it, it must be refused), a server restarted alone or a refused restore keeps nothing (a retry would reach processes
that never saw the first call, or drop the cleanup's marks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs
import httpx

from ckpt_model import timing
from ckpt_model.deployments.gate import Gate
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import backend_calls, poll
from ckpt_model.errors import (
    ControlCallFailed,
    CoordinationError,
    HarnessError,
    ParticipantFailure,
    QuiescenceTimeout,
)
from ckpt_model.model.contract import RESTART_SERVERS, Attempt
from ckpt_model.properties.fencing import p10_lease_renewed, p10_reply_phase, p10_report_consistent, p10_resume_accepted
from ckpt_model.properties.identifiers import p15_capture_keys, p15_forgotten_echoed, p15_retired_echoed
from ckpt_model.properties.state import p8_cleanup_succeeds
from ckpt_model.protocol.client import Participant, Participants, PrepareResult, request_body
from ckpt_model.protocol.history import Event, EventType, History
from ckpt_model.protocol.wire import EpisodeId
from ckpt_model.trainer.placement import Placement
from ckpt_model.trainer.quiescence import Quiescence
from ckpt_model.trainer.runs import RunOutcome, RunPool

# Far ahead, so a lease (deadline + grace) never lapses between two steps of an example, even on a loaded machine.
CONTROL_DEADLINE_S = 60.0
# The ID a body is built with before a rejected one replaces it (`Controller.probe_rejected_id`).
PLACEHOLDER_CHECKPOINT_ID = "probe"
# A prepare the model knows will not become ready waits this long for its blockers, then reports them.
BLOCKED_PREPARE_DEADLINE_S = 0.25
# The quiet controller's prepare: short, so its lease lapses soon after (deadline + the harness's lease grace); a
# deployment whose grace is longer than this does not let it go quiet (the wait would be long).
QUIET_PREPARE_DEADLINE_S = 0.1
QUIET_LEASE_GRACE_MAX_S = 1.0
# A prepare whose generation cut hangs: the model server may spend at most half of it on the cut (reference 7.3),
# so it is prepared in about half this time; a server that spends all of it misses the deadline.
HUNG_CUT_PREPARE_DEADLINE_S = 4.0
# Each refused release of stale calls means the backend cancelled at least one of them meanwhile; a crash leaves
# at most one waiting call per live rollout.
STALE_RELEASE_TRIES = 8
# A renewed lease is compared with the renew's deadline plus the grace, summed here and by the participant: the two
# sums may round apart.
LEASE_SLACK_S = 0.001
# A late call's deadline passed this long before it is sent (it sat in a controller's queue): every participant
# must refuse it with deadline_exceeded and change nothing (reference section 2.6).
PAST_DEADLINE_S = 1.0
# Judges a prepare that ended not prepared everywhere (raises the property it breaks).
Judge = Callable[["Prepared"], None]
# What a prepare's generation cuts can be judged by: cut in full ("durable"), hung ("hung"), or not at all (a
# deadline too short to judge a cut, or a prepare that did not complete).
CutJudgement = Literal["durable", "hung"] | None


@attrs.frozen
class Operation:
    """One journal event of the controller, as the watchers see it."""

    f: str
    type: EventType
    checkpoint_id: str | None = None
    # Whom it reached: the participants sent to, or for a crash those killed.
    reached: tuple[Participant, ...] = ()
    # commit: its scope; restore: what it continues; retire: what it retires.
    episodes: tuple[EpisodeId, ...] = ()
    # commit: per scoped key, how many of its calls were delivered (0 for a restored attempt not started).
    delivered: Mapping[str, int] = attrs.field(factory=dict)
    # commit, restore: the directory written or read; restore: the committed checkpoint it restores.
    directory: Path | None = None
    source: str | None = None
    cut: CutJudgement = None
    # run: the capture key of the attempt sent, and whether it continues a restored attempt from its boundary
    # (else it starts from the beginning of its script).
    key: str | None = None
    continues: bool = False


class Watcher(Protocol):
    """Keeps a prediction in step with what the controller did (the ledger watch)."""

    def observe(self, operation: Operation) -> None: ...


@attrs.frozen
class SentCall:
    """The last control call the controller completed, kept to retry it with the same arguments."""

    operation: str
    checkpoint_id: str
    arguments: dict[str, Any]
    replies: dict[str, Any]
    after_crash: bool = False
    retried: bool = False


@attrs.frozen
class Prepared:
    """How a prepare ended: prepared or not, the participants' replies, and what blocks it. `waited_s` is set when
    no answer came within the wait and the blockers are the participants' own status reports."""

    prepared: bool
    replies: dict[str, Any]
    blockers: dict[str, list[str]]
    waited_s: float | None = None

    @classmethod
    def from_result(cls, result: PrepareResult) -> Prepared:
        return cls(prepared=result.prepared, replies=result.replies, blockers=result.blockers())


class Controller:
    """The training controller's hands: every call it makes, journaled, remembered for a retry, and watched."""

    def __init__(
        self,
        harness: Harness,
        history: History,
        runs: RunPool,
        quiescence: Quiescence,
        watchers: Sequence[Watcher] = (),
    ) -> None:
        self.harness = harness
        self.history = history
        self.runs = runs
        self.quiescence = quiescence
        self.watchers = tuple(watchers)
        # The checkpoint each open invocation names, by its history index, for its completion.
        self._checkpoint_named: dict[int, str | None] = {}
        self.last_call: SentCall | None = None
        self.placement = Placement(harness, history)

    # -- who is there -----------------------------------------------------------------------------------------

    @property
    def control(self) -> Any:
        return self.harness.control

    def members(self) -> list[Participant]:
        """Every participant, in name order (the order the crash rules count them in)."""
        return sorted(self.control.participants, key=lambda m: m.name)

    def named(self, names: Iterable[str]) -> tuple[Participant, ...]:
        wanted = set(names)
        return tuple(m for m in self.control.participants if m.name in wanted)

    def directory(self, checkpoint_id: str) -> Path:
        return self.harness.checkpoint_dir / checkpoint_id

    @property
    def may_lapse(self) -> bool:
        """The lease lapses soon enough after a short prepare for the controller to wait for it."""
        return self.harness.spec.lease_grace_s <= QUIET_LEASE_GRACE_MAX_S

    @property
    def can_retry(self) -> bool:
        return self.last_call is not None and not self.last_call.retried

    # -- rollouts ---------------------------------------------------------------------------------------------

    def run(self, attempt: Attempt, worker: int = 0, continues: bool = False) -> str:
        """Send an attempt's `/run` in the background: a new execution (the RunPool journals it), its calls placed
        on policy worker `worker` where the deployment places calls; a label suffix naming the worker. `continues`:
        the attempt is a restored one continuing from its boundary, not one starting from its script's start."""
        placed = self.placement.place(attempt.key, worker)
        self._notify(Operation("run", "invoke", key=attempt.key, continues=continues))
        self.runs.send(attempt)
        return placed

    def run_refused(self, attempt: Attempt) -> None:
        """Send a `/run` that must be refused with admission_closed (a checkpoint is open): it starts nothing. Placed
        as any `/run` is (on a live worker of every server), so the refusal is the one admission gives."""
        self.placement.place(attempt.key, 0)
        self.runs.refused_closed[attempt.run] = attempt.key
        self.runs.send(attempt)

    def run_rejected(self, attempt: Attempt) -> None:
        """Send a `/run` whose rollout ID Gym's rules reject: it must be refused and start nothing (P15). Not placed:
        the placement names capture keys, and a rejected name has none."""
        self.runs.rejected[attempt.run] = (attempt.rollout, attempt.attempt)
        self.runs.send(attempt)

    def late_run(self, attempt: Attempt) -> RunOutcome:
        """A late `/run` of a retired attempt, in this thread."""
        return self.runs.post(attempt)

    def release(self, keys: list[str]) -> None:
        """Release the call each capture key has waiting at the backend."""
        with timing.span("release"):
            _, waiting = backend_calls(self.harness)
            missing = [key for key in keys if key not in waiting]
            if missing:
                raise QuiescenceTimeout(
                    prediction=f"{missing} wait at the backend", observed="they do not", pending=missing
                )
            assert self.harness.backend is not None, "only a gated backend holds calls to release"
            self.harness.backend.release([waiting[key] for key in keys])

    # -- prepare ----------------------------------------------------------------------------------------------

    def prepare(self, checkpoint_id: str) -> Prepared:
        """A prepare the model says must succeed, waited for as long as a settle: everything is at a boundary, so
        nothing the system could still be doing makes it ready later. Its deadline (and so its lease) stays far
        ahead; without an answer by then, the participants' own reports of what blocks them are the outcome,
        instead of the control deadline's full minute."""
        invocation = self._invoke("prepare", checkpoint_id, checkpoint_id=checkpoint_id)
        future = self.runs.submit(self.control.prepare, checkpoint_id, self._ahead(CONTROL_DEADLINE_S))
        try:
            with timing.span("control"):
                result = future.result(timeout=self.quiescence.timeout_s)
        except CoordinationError as error:
            self._complete(invocation, "fail", str(error))
            raise
        except TimeoutError:
            statuses = self.control.status_all()
            blockers = {name: s["report"]["blockers"] for name, s in statuses.items() if s["report"]["blockers"]}
            self._complete(invocation, "info", "still preparing")
            return Prepared(False, {}, blockers, waited_s=self.quiescence.timeout_s)
        return self._prepared(invocation, Prepared.from_result(result), cut="durable")

    def prepare_short(self, checkpoint_id: str, deadline_s: float = BLOCKED_PREPARE_DEADLINE_S) -> Prepared:
        """A prepare with a short deadline, expected to end with blockers: nothing of it is retried or cut. Where
        the checker owns time the deadline has room (`Clocks.room`), and the clocks jump past it once a participant
        waits on blockers (`_outlast_blockers`): on a loaded machine a later stage would otherwise refuse the 0.25 s
        deadline before the one that blocks is asked."""
        deadline_ts = self._ahead(self.harness.clocks.room(deadline_s))
        if not self.harness.clocks.owns_time:
            result = self._call("prepare", checkpoint_id, lambda _: self.control.prepare(checkpoint_id, deadline_ts))
            return Prepared.from_result(result)

        def outlasted(_: float) -> PrepareResult:
            future = self.runs.submit(self.control.prepare, checkpoint_id, deadline_ts)
            self._outlast_blockers(checkpoint_id, future, deadline_ts)
            return future.result(timeout=CONTROL_DEADLINE_S)

        return Prepared.from_result(self._call("prepare", checkpoint_id, outlasted))

    def _outlast_blockers(self, checkpoint_id: str, prepare: Future[Any], deadline_ts: float) -> None:
        """Until the prepare of `checkpoint_id` answered, or a participant reports it not ready on two polls in a
        row (waiting on blockers, or on a call in flight); then the clocks jump past `deadline_ts`, so that
        participant gives up and reports what blocks it as after a real wait."""
        timeout_s = self.quiescence.timeout_s
        unready_before: set[str] = set()

        def waiting() -> bool:
            unready = {
                name
                for name, status in self.control.status_all().items()
                if status["phase"] == "preparing"
                and status.get("checkpoint_id") == checkpoint_id
                and not status["report"].get("ready", True)
            }
            still = bool(unready & unready_before)
            unready_before.clear()
            unready_before.update(unready)
            return still

        if not poll(lambda: prepare.done() or waiting(), timeout_s):
            raise QuiescenceTimeout(
                prediction=f"a participant waits, not ready, in the prepare of {checkpoint_id}, or it answered",
                observed="neither",
                pending=["prepare"],
                timeout_s=timeout_s,
            )
        if not prepare.done():
            self.harness.clocks.jump_to(deadline_ts)

    def prepare_by(self, checkpoint_id: str, deadline_ts: float) -> Prepared:
        """A prepare with the deadline `deadline_ts` (its lease follows from it); a refusal is raised."""
        invocation = self._invoke("prepare", checkpoint_id, checkpoint_id=checkpoint_id)
        result = self._answer(invocation, lambda: self.control.prepare(checkpoint_id, deadline_ts))
        return self._prepared(invocation, Prepared.from_result(result), cut="durable")

    def renew_on(self, names: list[str], checkpoint_id: str) -> None:
        """Extend the leases of the participants `names` only, to the control deadline plus the grace (P10)."""
        body = self.body("renew", checkpoint_id)
        replies = self.send_each("renew", checkpoint_id, body, names)
        p10_lease_renewed(checkpoint_id, body["deadline_ts"] + self.harness.spec.lease_grace_s - LEASE_SLACK_S, replies)

    def prepare_with_hung_cut(self, checkpoint_id: str, deadline_s: float = HUNG_CUT_PREPARE_DEADLINE_S) -> Prepared:
        """A prepare with a short deadline while the backend's cut endpoint hangs; the cuts are judged before the
        endpoint is freed (none may have been cut)."""
        gate = self.harness.backend
        assert gate is not None, "generation cuts need a gated backend"
        gate.stall_cuts(True)
        try:
            invocation = self._invoke("prepare", checkpoint_id, checkpoint_id=checkpoint_id)
            deadline_ts = self._ahead(self.harness.clocks.room(deadline_s))
            if not self.harness.clocks.owns_time:
                result = self._answer(invocation, lambda: self.control.prepare(checkpoint_id, deadline_ts))
                return self._prepared(invocation, Prepared.from_result(result), cut="hung")
            future = self.runs.submit(self.control.prepare, checkpoint_id, deadline_ts)
            self._outlast_hung_cuts(gate, future, deadline_ts)
            result = self._answer(invocation, lambda: future.result(timeout=CONTROL_DEADLINE_S))
            return self._prepared(invocation, Prepared.from_result(result), cut="hung")
        finally:
            gate.stall_cuts(False)

    def _outlast_hung_cuts(self, gate: Gate, prepare: Future[Any], deadline_ts: float) -> None:
        """Where the checker owns time (the deadline then has `Clocks.room`, so no stage on a loaded machine is
        asked after it): each time a cut request hangs at the backend, the clocks jump past the most its sender may
        spend on it (half the prepare time left when it began, reference 7.3) instead of that being waited out;
        returns once the prepare answered. A sender that spends longer, still hanging a settle timeout after the
        jump, has the clocks jump past the deadline too, and answers then, for P10 to judge."""
        timeout_s = self.quiescence.timeout_s

        def until(condition: Callable[[int], bool]) -> bool:
            return poll(lambda: prepare.done() or condition(gate.hanging_cuts()), timeout_s)

        while True:
            if not until(lambda hanging: hanging > 0):
                raise QuiescenceTimeout(
                    prediction="a cut request hangs at the backend, or the prepare answered",
                    observed=f"{gate.hanging_cuts()} cut request(s) hanging, the prepare unanswered",
                    pending=["prepare"],
                    timeout_s=timeout_s,
                )
            if prepare.done():
                return
            began_ts = self.harness.clocks.now()  # its sender took its budget before the request reached the backend
            self.harness.clocks.jump_to((began_ts + deadline_ts) / 2)
            if not until(lambda hanging: hanging == 0):  # its sender spends more than its budget on the cut
                self.harness.clocks.jump_to(deadline_ts)
                return

    def prepare_waiting(self, checkpoint_id: str, wait: Callable[[Future[Any]], None]) -> Prepared:
        """A prepare left waiting: `wait` runs while it is in flight (the caller releases what blocks it)."""
        invocation = self._invoke("prepare", checkpoint_id, checkpoint_id=checkpoint_id)
        future = self.runs.submit(self.control.prepare, checkpoint_id, self._ahead(CONTROL_DEADLINE_S))
        wait(future)
        result = self._answer(invocation, lambda: future.result(timeout=CONTROL_DEADLINE_S))
        return self._prepared(invocation, Prepared.from_result(result), cut="durable")

    def go_quiet(
        self,
        checkpoint_id: str,
        deadline_s: float = QUIET_PREPARE_DEADLINE_S,
        meanwhile: Callable[[], None] | None = None,
    ) -> bool:
        """Prepare with a short deadline (generous where the checker owns time: `Clocks.room`) and say nothing more
        until the lease lapsed (waited for, or jumped to); `meanwhile` runs once the participants are prepared (time
        passing, say). On a loaded machine the prepare can miss its
        deadline; the controller then resumes, which leaves the participants where a lapse does, and `meanwhile`
        never runs. Nothing of it is retried. Whether the participants were prepared."""
        deadline_ts = self._ahead(self.harness.clocks.room(deadline_s))
        invocation = self._invoke("prepare", checkpoint_id, checkpoint_id=checkpoint_id)
        try:
            prepared = self.control.prepare(checkpoint_id, deadline_ts).prepared
        except CoordinationError as error:
            if {f.code for f in error.failures.values()} != {"deadline_exceeded"}:
                self._complete(invocation, "fail", str(error))
                raise
            prepared = False
        self._complete(invocation, "ok" if prepared else "info", "prepared" if prepared else "missed")
        if prepared:
            if meanwhile is not None:
                meanwhile()
            self.quiescence.wait_lease_lapsed(checkpoint_id, deadline_ts + self.harness.spec.lease_grace_s)
        else:
            self._resume(checkpoint_id)
        self.last_call = None
        return prepared

    def renew(self, checkpoint_id: str) -> None:
        """Extend every lease; each must then run at least to the renew's deadline plus the grace (P10)."""
        deadline_ts = self._ahead(CONTROL_DEADLINE_S)
        replies = self._call("renew", checkpoint_id, lambda _: self.control.renew(checkpoint_id, deadline_ts))
        p10_lease_renewed(checkpoint_id, deadline_ts + self.harness.spec.lease_grace_s - LEASE_SLACK_S, replies)

    def _prepared(self, invocation: Event, outcome: Prepared, cut: CutJudgement) -> Prepared:
        self._complete(invocation, "ok", cut=cut)
        for name, reply in outcome.replies.items():
            p10_report_consistent(f"{name}'s prepare reply", reply["report"], reply["phase"])
            p15_capture_keys(f"{name}'s prepare report.restarts", reply["report"]["restarts"])
        if outcome.prepared:
            assert isinstance(invocation.value, str)
            self.history.note("controller", "prepared", invocation.value)
            self.last_call = SentCall("prepare", invocation.value, {}, outcome.replies)
        return outcome

    # -- commit, resume, restore -----------------------------------------------------------------------------

    def commit(self, checkpoint_id: str, scope: Sequence[Attempt]) -> dict[str, Any]:
        """Commit `scope` on every participant."""
        event = self._commit_event(checkpoint_id, scope)
        directory, episodes = event["directory"], event["episodes"]
        replies = self._call(
            "commit",
            checkpoint_id,
            lambda d: self.control.commit(checkpoint_id, str(directory), list(episodes), d),
            **event,
        )
        arguments = {"checkpoint_dir": str(directory), "episode_ids": episodes}
        self.last_call = SentCall("commit", checkpoint_id, arguments, replies)
        return replies

    def commit_on(
        self,
        names: list[str],
        checkpoint_id: str,
        scope: Sequence[Attempt],
        deadline_s: float = CONTROL_DEADLINE_S,
        deadline_ts: float | None = None,
    ) -> dict[str, Any]:
        """Commit `scope` on the participants `names` only (each on its own), with a deadline `deadline_s` ahead
        (or at `deadline_ts`, fixed by a caller that waits for it to pass); any refusal fails it."""
        event = self._commit_event(checkpoint_id, scope)
        body = self.body("commit", checkpoint_id, checkpoint_dir=str(event["directory"]), episode_ids=event["episodes"])
        body["deadline_ts"] = self._ahead(deadline_s) if deadline_ts is None else deadline_ts
        return self.send_each("commit", checkpoint_id, body, names, **event)

    def _commit_event(self, checkpoint_id: str, scope: Sequence[Attempt]) -> dict[str, Any]:
        """What the watchers learn of a commit of `scope`: its episodes, the calls delivered to each, its directory."""
        return {
            "episodes": tuple(episodes_of(scope)),
            "delivered": _delivered(scope),
            "directory": self.directory(checkpoint_id),
        }

    def resume(self, checkpoint_id: str) -> dict[str, Any]:
        replies = self._resume(checkpoint_id)
        self.last_call = SentCall("resume", checkpoint_id, {}, replies)
        return replies

    def _resume(
        self, checkpoint_id: str, refused: Callable[[str, CoordinationError], None] = p10_resume_accepted
    ) -> dict[str, Any]:
        """Resume everywhere: every participant then answers phase idle (P10). `refused` judges a refusal (by
        default P10, for a refusal no resume ever gets), before it is raised to the caller."""
        try:
            replies: dict[str, Any] = self._call(
                "resume", checkpoint_id, lambda d: self.control.resume(checkpoint_id, d)
            )
        except CoordinationError as error:
            refused(checkpoint_id, error)
            raise
        p10_reply_phase("resume", checkpoint_id, "idle", replies)
        return replies

    def restore(self, restore_id: str, source: str, exported: Iterable[str], directory: Path | None = None) -> Any:
        """Restore the checkpoint `source` (from `directory`, by default its own) as `restore_id`. Gym's client
        cleans up a refused restore itself (it retires the next attempts and resumes) and raises; nothing before
        it is retried then."""
        scope = episodes_keyed(exported)
        path = directory or self.directory(source)
        try:
            return self._call(
                "restore",
                restore_id,
                lambda d: self.control.restore(restore_id, str(path), scope, d),
                episodes=tuple(scope),
                directory=path,
                source=source,
            )
        except CoordinationError:
            self.last_call = None
            raise

    def undo_restore(self, restore_id: str, exported: Iterable[str]) -> None:
        """The cleanup of a restore that failed on some participant, as Gym's client runs it: retire the next
        attempts everywhere, then resume (a refused resume is P8, the cleanup failing). A cleanup, never retried."""
        self._retire(restore_id, [episode.next_attempt() for episode in episodes_keyed(exported)])
        self._resume(restore_id, refused=p8_cleanup_succeeds)

    # -- retire and forget ------------------------------------------------------------------------------------

    def retire(self, retire_id: str, attempts: Sequence[Attempt]) -> dict[str, Any]:
        """Retire `attempts` everywhere: a running one's `/run` must then be refused with stale_attempt."""
        episodes = episodes_of(attempts)
        replies = self._retire(retire_id, episodes)
        self.last_call = SentCall("retire", retire_id, {"episode_ids": tuple(episodes)}, replies)
        for attempt in attempts:
            if attempt.status == "running":
                self.runs.refused_stale[attempt.run] = attempt.key
        return replies

    def retire_lost(self, retire_id: str, attempts: Sequence[Attempt]) -> dict[str, Any]:
        """Retire work that lost a server (its `/run`s end however they end): a cleanup, never retried."""
        return self._retire(retire_id, episodes_of(attempts))

    def _retire(self, retire_id: str, episodes: Sequence[EpisodeId]) -> dict[str, Any]:
        """Retire everywhere: every participant then echoes the capture keys as given (P15)."""
        replies: dict[str, Any] = self._call(
            "retire",
            retire_id,
            lambda d: self.control.retire(retire_id, episodes, d),
            episodes=tuple(episodes),
        )
        p15_retired_echoed(retire_id, [episode.capture_key for episode in episodes], replies)
        return replies

    def forget(self, forget_id: str, rollouts: Sequence[str]) -> dict[str, Any]:
        replies = self._call("forget", forget_id, lambda d: self.control.forget(forget_id, rollouts, d))
        p15_forgotten_echoed(forget_id, rollouts, replies)
        self.last_call = SentCall("forget", forget_id, {"rollout_ids": tuple(rollouts)}, replies)
        return replies

    def remove_ledgers(self, keys: list[str]) -> dict[str, Any]:
        """The trainer asks the policy model to retire, then delete, the ledgers of `keys`; each answer."""
        ledger = self.harness.ledger
        outcomes: dict[str, Any] = {}
        for operation, call in (("retire", ledger.retire), ("delete", ledger.delete)):
            invocation = self._invoke(f"ledger {operation}", ",".join(keys))
            outcomes[operation] = call(keys)
            self._complete(invocation, "ok", outcomes[operation])
        return outcomes

    # -- probes and retries: every participant on its own ----------------------------------------------------

    def body(self, operation: str, checkpoint_id: str, **arguments: Any) -> dict[str, Any]:
        """The wire body of `operation`, with a fresh deadline."""
        return request_body(operation, checkpoint_id, self._ahead(CONTROL_DEADLINE_S), **arguments)

    def probe(self, operation: str, checkpoint_id: str, names: list[str] | None = None) -> dict[str, Any]:
        """Send `operation` naming `checkpoint_id` to every participant (or those `names`) on its own, with
        arguments that name nothing real; return each one's answer, refusals included."""
        arguments = self._naming_nothing(operation, f"probe-{checkpoint_id}")
        return self._probe(operation, operation, checkpoint_id, names, self.body(operation, checkpoint_id, **arguments))

    def probe_rejected_id(self, operation: str, checkpoint_id: str) -> dict[str, Any]:
        """Send `operation` naming `checkpoint_id`, which Gym's rules reject, to every participant on its own, with
        arguments that name nothing real; each one's answer, refusals included. The body is the valid one with
        only its `checkpoint_id` replaced: the checker's own schema would refuse to build it."""
        arguments = self._naming_nothing(operation, "probe-rejected-id")
        body = {**self.body(operation, PLACEHOLDER_CHECKPOINT_ID, **arguments), "checkpoint_id": checkpoint_id}
        return self._probe(f"{operation} with a rejected ID", operation, checkpoint_id, None, body)

    def _naming_nothing(self, operation: str, directory: str) -> dict[str, Any]:
        """Arguments of `operation` that name nothing real (a checkpoint directory named `directory`)."""
        probe_dir = str(self.directory(directory))
        naming_nothing: dict[str, dict[str, Any]] = {
            "commit": {"checkpoint_dir": probe_dir},
            "restore": {"checkpoint_dir": probe_dir},
            "retire": {"episode_ids": (EpisodeId(rollout_id="probe", attempt=0),)},
            "forget": {"rollout_ids": ("probe",)},
        }
        return naming_nothing.get(operation, {})

    def probe_past_deadline(self, operation: str, checkpoint_id: str, **arguments: Any) -> dict[str, Any]:
        """`operation` naming `checkpoint_id` with `arguments`, sent to every participant on its own with a
        deadline that passed `PAST_DEADLINE_S` ago; each one's answer, refusals included."""
        body = request_body(operation, checkpoint_id, self.harness.clocks.now() - PAST_DEADLINE_S, **arguments)
        return self._probe(f"{operation} past its deadline", operation, checkpoint_id, None, body)

    def probe_deadline_ahead(
        self, operation: str, checkpoint_id: str, ahead_s: float, names: list[str]
    ) -> dict[str, Any]:
        """`operation` naming `checkpoint_id`, sent to the participants `names` on their own with a deadline
        `ahead_s` ahead of the controller's clock; each one's answer, refusals included."""
        body = request_body(operation, checkpoint_id, self._ahead(ahead_s))
        return self._probe(f"{operation} due in {ahead_s:g} s", operation, checkpoint_id, names, body)

    def probe_commit_naming_restarts(
        self, checkpoint_id: str, scope: Sequence[Attempt], restarts: Sequence[str]
    ) -> dict[str, Any]:
        """A commit whose scope also names the running restarts, sent to each restart server on its own (nothing
        is sent, and nobody answers, when there is no restart or no restart server)."""
        names = [m.name for m in self.control.participants if m.name in RESTART_SERVERS]
        if not restarts or not names:
            return {}
        episodes = (*episodes_of(scope), *episodes_keyed(restarts))
        probe_dir = str(self.directory(f"probe-{checkpoint_id}"))
        body = self.body("commit", checkpoint_id, checkpoint_dir=probe_dir, episode_ids=episodes)
        return self._probe("commit naming restarts", "commit", checkpoint_id, names, body)

    def retry(self) -> tuple[SentCall, dict[str, Any]]:
        """Send the remembered call again to every participant, with the same arguments and a new deadline."""
        last = self.last_call
        assert last is not None, "retry needs a call the controller may send again"
        self.last_call = attrs.evolve(last, retried=True)
        body = self.body(last.operation, last.checkpoint_id, **last.arguments)
        invocation = self._invoke(f"retry {last.operation}", last.checkpoint_id, checkpoint_id=last.checkpoint_id)
        with timing.span("control"):
            outcomes = self.control.post_each(last.operation, body, self._ahead(CONTROL_DEADLINE_S))
        self._complete(invocation, "ok", outcomes_text(outcomes))
        return last, outcomes

    def send_each(
        self, operation: str, checkpoint_id: str, body: dict[str, Any], names: list[str], **event: Any
    ) -> dict[str, Any]:
        """Send `body` to the participants `names`, each on its own; any refusal fails it (journaled as failed).
        Never retried."""

        def post(deadline_ts: float) -> dict[str, Any]:
            replies = self.control.post_each(operation, body, deadline_ts, names)
            failures = {name: r for name, r in replies.items() if isinstance(r, ParticipantFailure)}
            if failures:
                raise CoordinationError(operation, failures, replies)
            return replies

        replies: dict[str, Any] = self._call(operation, checkpoint_id, post, reached=self.named(names), **event)
        return replies

    def _probe(
        self, label: str, operation: str, checkpoint_id: str, names: list[str] | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        invocation = self._invoke(f"probe {label}", checkpoint_id, checkpoint_id=checkpoint_id)
        with timing.span("probe"):
            # The transport waits for the answer as for any call; a late body's own deadline has already passed.
            outcomes = self.control.post_each(
                operation, body, max(body["deadline_ts"], self._ahead(CONTROL_DEADLINE_S)), names
            )
        self._complete(invocation, "ok", outcomes_text(outcomes))
        return outcomes

    # -- the crash hooks the nemesis calls --------------------------------------------------------------------

    def crashed(self, killed: Sequence[Participant], invocation: Event) -> None:
        """Processes were killed: after a crash of every one a commit is kept (retried, it must be refused), after
        one server restarted alone nothing is."""
        self._complete(invocation, "ok", kill=killed)
        last = self.last_call
        everything = len(killed) == len(self.control.participants)
        keep = everything and last is not None and last.operation == "commit"
        self.last_call = attrs.evolve(last, after_crash=True, retried=False) if keep and last else None

    def release_stale(self) -> None:
        """Release the calls the killed servers left waiting at the backend. The backend also cancels each one
        once it notices its client gone, which can fall between listing them and releasing them: the release is
        then refused (409 `not_waiting`, nothing released), and the ones still waiting are listed again."""
        gate = self.harness.backend
        if gate is None:
            return
        for attempt in range(STALE_RELEASE_TRIES):
            stale = sorted(backend_calls(self.harness)[1].values())
            if not stale:
                return
            try:
                gate.release(stale)
                return
            except ControlCallFailed as error:
                if error.status != httpx.codes.CONFLICT or attempt == STALE_RELEASE_TRIES - 1:
                    raise

    # -- calls that fail on one participant by design: a lost reply, a participant cut off ------------------------

    def unanswered(
        self, operation: str, checkpoint_id: str, scope: Sequence[Attempt] = (), judge: Judge | None = None
    ) -> CoordinationError:
        """`operation` (prepare, commit of `scope`, resume) of `checkpoint_id` sent as the controller sends it, while
        some participant is set to lose its reply: journaled as indeterminate (`info`: it may have taken effect,
        the controller cannot tell), and its error returned. A prepare that stopped at a stage not prepared, before
        it reached that participant, is handed to `judge` (P10); any other call that nobody failed is the
        deployment's fault."""
        return self._failing(operation, checkpoint_id, scope, "info", "lose a reply to", judge)

    def unreached(
        self, operation: str, checkpoint_id: str, scope: Sequence[Attempt] = (), judge: Judge | None = None
    ) -> CoordinationError:
        """As `unanswered`, while some participant is cut off from the controller: its connection refused, so the
        call never reached it, which the controller knows (journaled as `fail`)."""
        return self._failing(operation, checkpoint_id, scope, "fail", "be unreachable for", judge)

    def _failing(
        self,
        operation: str,
        checkpoint_id: str,
        scope: Sequence[Attempt],
        journaled: EventType,
        fault: str,
        judge: Judge | None,
    ) -> CoordinationError:
        committed = self._commit_event(checkpoint_id, scope)
        calls: dict[str, Callable[[float], Any]] = {
            "prepare": lambda d: self.control.prepare(checkpoint_id, d),
            "commit": lambda d: self.control.commit(
                checkpoint_id, str(committed["directory"]), list(committed["episodes"]), d
            ),
            "resume": lambda d: self.control.resume(checkpoint_id, d),
        }
        event = committed if operation == "commit" else {}
        invocation = self._invoke(operation, checkpoint_id, checkpoint_id=checkpoint_id)
        try:
            with timing.span("control"):
                answer = calls[operation](self._ahead(CONTROL_DEADLINE_S))
        except CoordinationError as error:
            self._complete(invocation, journaled, str(error), reached=self._took(error), **event)
            self.last_call = None
            return error
        self._complete(invocation, "ok", **event)
        if judge is not None and isinstance(answer, PrepareResult) and not answer.prepared:
            judge(Prepared.from_result(answer))
        raise HarnessError(
            f"some participant of the {self.harness.spec.label} deployment was to {fault} {operation} of "
            f"{checkpoint_id}, and every participant's reply arrived"
        )

    @contextlib.contextmanager
    def routed(self, name: str, url: str) -> Iterator[None]:
        """While inside, the controller's calls to participant `name` go to `url` instead (the nemesis's partition:
        a loopback port with nothing listening). Only the controller's calls: the audits read statuses once out."""
        control = self.control
        members = control.participants
        control.participants = Participants(
            tuple(attrs.evolve(member, url=url) if member.name == name else member for member in members)
        )
        try:
            yield
        finally:
            control.participants = members

    # -- the journal ------------------------------------------------------------------------------------------

    def _call(self, operation: str, checkpoint_id: str, call: Callable[[float], Any], **event: Any) -> Any:
        """One control call with the usual deadline, journaled, and handed to the watchers once answered."""
        invocation = self._invoke(operation, checkpoint_id, checkpoint_id=checkpoint_id)
        result = self._answer(invocation, lambda: call(self._ahead(CONTROL_DEADLINE_S)), **event)
        self._complete(invocation, "ok", **event)
        return result

    def _answer(self, invocation: Event, call: Callable[[], Any], **event: Any) -> Any:
        """Wait for a call's answer; a refusal completes the invocation as failed and is raised."""
        try:
            with timing.span("control"):
                return call()
        except CoordinationError as error:
            self._complete(invocation, "fail", str(error), **{**event, "reached": self._took(error)})
            raise

    def _ahead(self, seconds: float) -> float:
        """A deadline `seconds` from now on the controller's clock (`Clocks.now`: time may have passed)."""
        return self.harness.clocks.now() + seconds

    def _took(self, error: CoordinationError) -> tuple[Participant, ...]:
        """The participants that answered a failed call with a reply: they took it (a commit that one participant
        refused is still written by the others, and the watchers must learn what the policy model wrote)."""
        return self.named(name for name in error.replies if name not in error.failures)

    def invoke(self, f: str, value: Any = None, *, checkpoint_id: str | None = None) -> Event:
        """Journal the start of an operation (the nemesis's too); `checkpoint_id` when it is a control operation
        that names one (the watchers follow checkpoints by it)."""
        return self._invoke(f, value, checkpoint_id=checkpoint_id)

    def complete(self, invocation: Event, type_: EventType, value: Any = None, **event: Any) -> None:
        self._complete(invocation, type_, value, **event)

    def _invoke(self, f: str, value: Any = None, *, checkpoint_id: str | None = None) -> Event:
        invocation = self.history.invoke("controller", f, value)
        self._checkpoint_named[invocation.index] = checkpoint_id
        self._notify(Operation(f, "invoke", checkpoint_id=checkpoint_id))
        return invocation

    def _complete(
        self,
        invocation: Event,
        type_: EventType,
        value: Any = None,
        *,
        reached: tuple[Participant, ...] | None = None,
        kill: Sequence[Participant] = (),
        **event: Any,
    ) -> None:
        self.history.complete(invocation, type_, value)
        if reached is None:
            reached = tuple(kill) if invocation.f == "crash" else tuple(self.control.participants)
        checkpoint_id = self._checkpoint_named.pop(invocation.index, None)
        self._notify(Operation(invocation.f, type_, checkpoint_id=checkpoint_id, reached=reached, **event))

    def _notify(self, operation: Operation) -> None:
        for watcher in self.watchers:
            watcher.observe(operation)


def run_pool(harness: Harness, history: History) -> RunPool:
    """The pool that sends every `/run` the controller makes: to the restart environment for a restart, with the
    topology's task body."""

    def url(attempt: Attempt) -> str:
        return harness.restart_run_url if attempt.restart else harness.run_url

    def body(attempt: Attempt) -> dict[str, Any]:
        return harness.spec.traits.run_body(attempt.rollout, attempt.attempt, attempt.task)

    return RunPool(harness.run_http, url, body, history)


def episodes_keyed(keys: Iterable[str]) -> list[EpisodeId]:
    """The episode IDs that capture keys name."""
    return [EpisodeId.from_capture_key(key) for key in keys]


def episodes_of(attempts: Iterable[Attempt]) -> list[EpisodeId]:
    """The episode IDs of attempts, as the wire names them."""
    return [EpisodeId(rollout_id=a.rollout, attempt=a.attempt) for a in attempts]


def _delivered(scope: Iterable[Attempt]) -> dict[str, int]:
    """Per scoped key, the calls delivered to it so far (a restored attempt not yet started has none of its own)."""
    return {a.key: (a.delivered if a.status == "running" else 0) for a in scope}


def outcome_text(outcome: Any) -> Any:
    """A participant's answer as the history shows it: the reply, or the refusal's description."""
    return outcome.describe() if isinstance(outcome, ParticipantFailure) else outcome


def outcomes_text(outcomes: Mapping[str, Any]) -> dict[str, Any]:
    """Every participant's answer as the history shows it."""
    return {name: outcome_text(o) for name, o in outcomes.items()}
