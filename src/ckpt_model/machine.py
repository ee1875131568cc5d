"""The Hypothesis state machine: the training controller, played against real server processes.

It only routes: every rule performs the real operation through the controller client or the harness, applies
the same rule to the pure model (`contract.Model`), then waits until the system shows the quiet state the model
predicts and checks the properties that apply. Everything that could race is gated: model calls wait at the
backend until `release` lets one go, so every example replays the same way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar, cast

import attrs
import httpx
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from ckpt_model import damage, timing
from ckpt_model import properties as props
from ckpt_model.contract import RESTART_SERVERS, Attempt, Model
from ckpt_model.coordination import request_body
from ckpt_model.deployment import FAILPOINT_BEFORE_INSTALL, FAILPOINT_BETWEEN_FILES, Harness
from ckpt_model.errors import CoordinationError, HarnessError, ParticipantFailure, PropertyViolation, QuiescenceTimeout
from ckpt_model.history import History
from ckpt_model.ledger_watch import LedgerWatch
from ckpt_model.quiescence import SETTLE_TIMEOUT_S, Observation, Quiescence, backend_calls, observe, poll
from ckpt_model.regression import deployment_options, option_words
from ckpt_model.report import annotate
from ckpt_model.runs import RunPool
from ckpt_model.stats import SearchStats
from ckpt_model.storage import MANIFEST_NAME, CheckpointUnreadable, FingerprintCache, participant_dir, read_records
from ckpt_model.tasks import expected_reward, resources_state, run_body, script_for
from ckpt_model.wire import RETIRE_ORDER, EpisodeId

# Far ahead, so a lease (deadline + grace) never lapses between two steps of an example, even on a loaded machine.
CONTROL_DEADLINE_S = 60.0
# A prepare the model knows will not become ready waits this long for its blockers, then reports them.
BLOCKED_PREPARE_DEADLINE_S = 0.25
# The quiet controller's prepare: short, so its lease lapses soon after (deadline + the harness's lease grace).
QUIET_PREPARE_DEADLINE_S = 0.1
# A prepare whose generation cut hangs: the model server may spend at most half of it on the cut (reference 7.3),
# so it is prepared in about half this time; a server that spends all of it misses the deadline.
HUNG_CUT_PREPARE_DEADLINE_S = 4.0
QUIET_LEASE_GRACE_MAX_S = 1.0
PICK = st.integers(min_value=0, max_value=7)
# Each refused release of stale calls means the backend cancelled at least one of them meanwhile; a crash leaves
# at most one waiting call per live rollout.
STALE_RELEASE_TRIES = 8
# Operations a delayed call of an older controller can carry (resume of a resumed ID is idempotent instead).
LATE_OPERATIONS = ("prepare", "renew", "commit", "restore", "retire", "forget")
F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class SentCall:
    """The last control call the controller completed, kept to retry it with the same arguments."""

    operation: str
    checkpoint_id: str
    arguments: dict[str, Any]
    replies: dict[str, Any]
    after_crash: bool = False
    retried: bool = False


def step(method: F) -> F:
    """Mark the machine broken while a rule runs and attach the failure report to whatever it raises."""

    @functools.wraps(method)
    def wrapper(self: CheckpointMachine, *args: Any, **kwargs: Any) -> Any:
        if self.rule_depth == 0 and not self.draining:
            self.rule_calls.append((method.__name__, dict(kwargs)))
        self.broken = True
        self.rule_depth += 1
        try:
            result = method(self, *args, **kwargs)
        except (PropertyViolation, HarnessError, CoordinationError) as error:
            self.report(error)
            raise
        finally:
            self.rule_depth -= 1
        self.broken = False
        return result

    return wrapper  # type: ignore[return-value]


class CheckpointMachine(RuleBasedStateMachine):
    """Plays the controller against the deployment `harness` wraps (bound by `machine_for`, one per deployment)."""

    def __init__(
        self, harness: Harness, stats: SearchStats | None = None, settle_timeout_s: float = SETTLE_TIMEOUT_S
    ) -> None:
        super().__init__()
        self.harness = harness
        self.stats = stats
        if stats is not None:
            stats.example_started()
        harness.begin_example()
        self.model = Model(topology=harness.topology, verify_mode=harness.verify_mode)  # type: ignore[arg-type]
        self.history = History()
        self.runs = RunPool(harness.run_http, self._run_url, self._run_body, self.history)
        reward = expected_reward(self.model.topology, script_for(self.model.topology))
        self.quiescence = Quiescence(harness, self.runs, reward, settle_timeout_s)
        # P5: the capture ledgers the checker predicts and reads (token capture only).
        self.ledgers = LedgerWatch(harness)
        self.retired_attempts: dict[str, Attempt] = {}
        # Which participants committed each checkpoint a crash cut short (`crash_in_commit`).
        self.incomplete_shares: dict[str, frozenset[str]] = {}
        self.last_call: SentCall | None = None
        # The paths of a misbehaving controller run once per occasion: a rule that is always enabled and changes
        # nothing is drawn over and over (Hypothesis favours argument-free rules) and crowds out `release`.
        self.lease_lapsed = False
        self.refused_during: str | None = None
        self.late_calls_for: tuple[str, ...] = ()
        self.ledger_removal_tried_in: str | None = None
        self.fingerprints: dict[str, dict[str, Any]] = {}
        # P9 reads every committed directory after every step: in full only when a file changed.
        self.fingerprint_cache = FingerprintCache(harness.checkpoint_dir.parent)
        self.steps: list[str] = []
        # The rules as called (name, keyword arguments), outermost only: what a regression file replays.
        self.rule_calls: list[tuple[str, dict[str, Any]]] = []
        self.rule_depth = 0
        self.draining = False
        self.retire_seq = 0
        self.crashes = 0
        self.crashes_inside = 0
        self.crashed_alone = False
        self.broken = False
        self.started_s = time.monotonic()

    # -- rules ------------------------------------------------------------------------------------------------

    @precondition(lambda self: self.harness.backend is not None and self.model.can_dispatch())
    @rule()
    @step
    def dispatch(self) -> None:
        """A new rollout starts and stops at its first model call."""
        model, rollout = self.model.dispatch()
        self._send_run(model.current()[rollout])
        self._advance(model, f"dispatch() -> {rollout}")

    @precondition(lambda self: self.harness.backend is not None and self.model.can_dispatch_restart())
    @rule()
    @step
    def dispatch_restart(self) -> None:
        """A new rollout starts on the restart environment (topology `mixed`): its `restart_only` resources server
        makes it a restart, which never holds up a checkpoint, is never exported and starts over after a crash."""
        model, rollout = self.model.dispatch(restart=True)
        self._send_run(model.current()[rollout])
        self._advance(model, f"dispatch_restart() -> {rollout}")

    @precondition(lambda self: bool(self.model.releasable()))
    @rule(pick=PICK)
    @step
    def release(self, pick: int) -> None:
        """Let one rollout's waiting call return: a policy call (held by the model server while a checkpoint is
        open) or, in the slow topology, a judge call (its verification step ends)."""
        rollout = _pick(self.model.releasable(), pick)
        self._release_keys([self.model.current()[rollout].key])
        self._advance(self.model.release(rollout), f"release({rollout})")

    @precondition(lambda self: bool(self.model.before_verification()))
    @rule(pick=PICK)
    @step
    def release_to_verification(self, pick: int) -> None:
        """Release one rollout's policy calls until its judge call waits (slow topology): a random run rarely
        releases the same rollout twice in a row, so without this rule verification would be rare."""
        rollout = _pick(self.model.before_verification(), pick)
        while not self.model.current()[rollout].verifying:
            self.release(self.model.releasable().index(rollout))

    @precondition(lambda self: self.model.can_prepare() and self._worth_a_checkpoint())
    @rule()
    @step
    def prepare(self) -> None:
        """Prepare a new checkpoint: everything is at a boundary, so every stage must become prepared. Every
        participant, asked on its own, then refuses a prepare of another ID (P10: one checkpoint at a time)."""
        model, checkpoint_id = self.model.prepare()
        verifying = [a.key for a in self.model.with_status("running") if a.verifying]
        result = self._prepare_within_settle(checkpoint_id, verifying)
        props.p10_prepared_everywhere(checkpoint_id, result.prepared, result.blockers(), verifying)
        self._prepared(checkpoint_id, result.replies)
        self._advance(model, f"prepare() -> {checkpoint_id}; prepare(other{model.checkpoint_seq}) refused")

    def _prepare_within_settle(self, checkpoint_id: str, verifying: list[str]) -> Any:
        """A prepare the model says must succeed, waited for as long as a settle: everything is at a boundary, so
        nothing the system could still be doing makes it ready later. Its deadline (and so its lease) stays far
        ahead; if it has not answered by then, the participants' own reports of what blocks them are the verdict,
        instead of the control deadline's full minute (each failing replay of a blocking bug paid it)."""
        rounds_before = self.ledgers.cut_rounds_before()
        invocation = self.history.invoke("controller", "prepare", checkpoint_id)
        future = self.runs.submit(self.control.prepare, checkpoint_id, time.time() + CONTROL_DEADLINE_S)
        try:
            with timing.span("control"):
                result = future.result(timeout=self.quiescence.timeout_s)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            raise
        except TimeoutError:
            statuses = self.control.status_all()
            blockers = {name: s["report"]["blockers"] for name, s in statuses.items() if s["report"]["blockers"]}
            self.history.complete(invocation, "info", "still preparing")
            props.p10_prepared_everywhere(checkpoint_id, False, blockers, verifying, waited_s=self.quiescence.timeout_s)
            raise
        self.history.complete(invocation, "ok")
        self.ledgers.cut(checkpoint_id, rounds_before)
        return result

    def _prepared(self, checkpoint_id: str, replies: dict[str, Any]) -> None:
        self.history.note("controller", "prepared", checkpoint_id)
        props.p1_restarts_reported(checkpoint_id, self.model.restarts(), replies)
        self.last_call = SentCall("prepare", checkpoint_id, {}, replies)
        self._probe("prepare", f"other{self.model.checkpoint_seq + 1}", "checkpoint_conflict")

    @precondition(lambda self: self.ledgers.cuts and self.model.can_prepare() and bool(self.model.waiting()))
    @rule()
    @step
    def prepare_with_hung_cut(self) -> None:
        """A prepare with a short deadline while the backend's cut endpoint hangs: the model server gives the cut
        at most half the time left, so the prepare is still prepared within its deadline (P10), and nothing is cut
        (P12: the failed cut costs only a regeneration after a restore). The controller then renews the lease
        with its usual deadline."""
        model, checkpoint_id = self.model.prepare()
        rounds_before = self.ledgers.cut_rounds_before()
        deadline_ts = time.time() + HUNG_CUT_PREPARE_DEADLINE_S
        self.harness.backend.stall_cuts(True)  # type: ignore[union-attr]
        try:
            result = self._control("prepare", checkpoint_id, lambda _: self.control.prepare(checkpoint_id, deadline_ts))
        except CoordinationError as error:
            raise props.P10Violation(
                rollout=None,
                expected=f"{checkpoint_id} prepared within {HUNG_CUT_PREPARE_DEADLINE_S:g} s although its cut hangs",
                observed=str(error),
            ) from error
        finally:
            self.harness.backend.stall_cuts(False)  # type: ignore[union-attr]
        props.p10_prepared_everywhere(checkpoint_id, result.prepared, result.blockers(), [])
        self._control("renew", checkpoint_id, lambda d: self.control.renew(checkpoint_id, d))
        self.ledgers.cut(checkpoint_id, rounds_before, durable=False)
        self._prepared(checkpoint_id, result.replies)
        self._advance(model, f"prepare_with_hung_cut() -> {checkpoint_id}, its cut hung; renewed")

    @precondition(lambda self: self.model.can_prepare_blocked())
    @rule()
    @step
    def prepare_blocked(self) -> None:
        """A prepare with a short deadline while `wait` verification runs: it must end with exactly those
        blockers. The controller then resumes, retires every blocker and dispatches it again (attempt + 1)."""
        blockers = self.model.blockers()
        model, checkpoint_id = self.model.prepare_blocked()
        result = self._control(
            "prepare",
            checkpoint_id,
            lambda _: self.control.prepare(checkpoint_id, time.time() + BLOCKED_PREPARE_DEADLINE_S),
        )
        props.p11_blocked(checkpoint_id, self.model.episode_owner, blockers, result.prepared, result.blockers())
        self._resume_call(checkpoint_id)
        self._advance(model, f"prepare_blocked() -> {checkpoint_id} blocked by {blockers}; resume({checkpoint_id})")
        for key in blockers:
            self._retire(EpisodeId.from_capture_key(key).rollout_id, again=True)

    @precondition(lambda self: self.model.can_prepare_blocked())
    @rule()
    @step
    def prepare_waiting(self) -> None:
        """A prepare left waiting on `wait` verifications while the controller releases their judge calls: each
        episode finishes during the prepare, which then succeeds; the episode is neither lost nor redone
        (Gym's scenario 10). P11: the prepare waits for the verification and names it as its blocker."""
        blockers = self.model.blockers()
        model, checkpoint_id = self.model.prepare_waited()
        invocation = self.history.invoke("controller", "prepare", checkpoint_id)
        future = self.runs.submit(self.control.prepare, checkpoint_id, time.time() + CONTROL_DEADLINE_S)
        self.quiescence.wait_preparing(self.model.episode_owner, checkpoint_id, blockers, future)
        self._release_keys(blockers)
        try:
            result = future.result(timeout=CONTROL_DEADLINE_S)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            raise
        self.history.complete(invocation, "ok")
        props.p11_prepared_once_verified(checkpoint_id, blockers, result.prepared, result.blockers())
        self._prepared(checkpoint_id, result.replies)
        self._advance(model, f"prepare_waiting() -> {checkpoint_id}; {blockers} finished during it")

    @precondition(lambda self: self.model.phase == "prepared")
    @rule()
    @step
    def commit(self) -> None:
        """Commit every unfinished attempt (running, or restored and not yet started); check P1 on every
        participant's reply and records, and P9 (the checkpoint verifies)."""
        checkpoint_id = self.model.open_checkpoint
        assert checkpoint_id is not None
        scope = self.model.scope()
        directory = self.harness.checkpoint_dir / checkpoint_id
        episode_ids = [EpisodeId(rollout_id=a.rollout, attempt=a.attempt) for a in scope]
        self._probe_restart_in_scope(checkpoint_id, episode_ids)
        replies = self._control(
            "commit", checkpoint_id, lambda d: self.control.commit(checkpoint_id, str(directory), episode_ids, d)
        )
        owner = self.model.episode_owner
        replied = [a.key for a in self.model.with_status("replied")]
        props.p1_replied_or_exported(
            checkpoint_id, [a.key for a in scope], replied, replies[owner]["episode_ids"], owner
        )
        read = self._read_checkpoint(directory, checkpoint_id)
        props.p9_verifies(checkpoint_id, read)
        self._check_shares(checkpoint_id, self.control.participants, replies, read, directory)
        self._check_exported_state(directory, checkpoint_id)
        self.fingerprints[checkpoint_id] = read
        self.last_call = SentCall(
            "commit",
            checkpoint_id,
            {"checkpoint_dir": str(directory), "episode_ids": tuple(episode_ids)},
            replies,
        )
        model, _ = self.model.commit()
        self._advance(model, f"commit() -> {checkpoint_id} exports {sorted(a.key for a in scope)}")

    @precondition(lambda self: self.model.checkpoint_open)
    @rule()
    @step
    def resume(self) -> None:
        """End the open checkpoint: admission re-opens and held responses are delivered. Every participant, asked
        on its own, then refuses a prepare naming the resumed ID (P10: a delayed prepare never re-opens it)."""
        checkpoint_id = self.model.open_checkpoint
        assert checkpoint_id is not None
        self._resume_call(checkpoint_id)
        self._probe("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(self.model.resume(), f"resume({checkpoint_id}); prepare({checkpoint_id}) refused")

    def _check_shares(
        self,
        checkpoint_id: str,
        members: Iterable[Any],
        replies: Mapping[str, Any],
        read: Mapping[str, Any],
        directory: Path,
    ) -> None:
        """P1: each member's commit reply and records on disk name exactly what the model says it writes. With
        token capture the policy model writes the scoped attempts that have ledger rows, each carrying exactly its
        chain (P5)."""
        members = list(members)
        scoped = {a.key: (a.delivered if a.status == "running" else 0) for a in self.model.scope()}
        model_keys = (
            self.ledgers.committed(checkpoint_id, scoped, directory) if any(m.kind == "model" for m in members) else []
        )
        for member in members:
            props.p1_exports_exact(
                checkpoint_id,
                member.name,
                model_keys if member.kind == "model" else self.model.exports(member.kind, member.name),
                replies[member.name]["episode_ids"],
                read[member.name].episode_ids,
                optional=self.model.may_also_export(member.kind),
            )

    def _probe_restart_in_scope(self, checkpoint_id: str, episode_ids: list[EpisodeId]) -> None:
        """A commit whose scope also names the running restarts, sent first to each restart server on its own:
        each must refuse it (409 `restart_in_scope`) and stay prepared, which the real commit then shows."""
        restarts = [EpisodeId.from_capture_key(key) for key in self.model.restarts()]
        names = [m.name for m in self.control.participants if m.name in RESTART_SERVERS]
        if not restarts or not names:
            return
        outcomes = self._post_probe(
            "commit naming restarts",
            "commit",
            checkpoint_id,
            names,
            checkpoint_dir=str(self.harness.checkpoint_dir / f"probe-{checkpoint_id}"),
            episode_ids=(*episode_ids, *restarts),
        )
        props.p1_restart_in_scope_refused(checkpoint_id, outcomes)

    def _resume_call(self, checkpoint_id: str) -> None:
        replies = self._control("resume", checkpoint_id, lambda d: self.control.resume(checkpoint_id, d))
        self.last_call = SentCall("resume", checkpoint_id, {}, replies)

    @precondition(lambda self: not self.model.fresh)
    @rule()
    @step
    def crash(self) -> None:
        """SIGKILL every Gym process group and start fresh processes; the backend and the disk survive."""
        self._crash_everything()
        self._advance(self.model.crash(), "crash()")

    @precondition(lambda self: not self.model.fresh and self.harness.can_lose_unsynced and bool(self.model.committed))
    @rule()
    @step
    def power_loss(self) -> None:
        """As `crash`, and the power is cut too: the checkpoint directories keep only what the writers fsynced
        (a deployment without `lose_unsynced` never draws it). Every committed checkpoint must still verify and be
        unchanged (P9): a commit is published only once its files are durable."""
        self._crash_everything(power_loss=True)
        self._advance(self.model.crash(), "power_loss()")

    def _crash_everything(self, inside: bool = False, power_loss: bool = False) -> None:
        self.history.invoke("controller", "crash", "power loss" if power_loss else None)
        self.crashes += 1
        self.crashes_inside += inside
        self.harness.crash(power_loss)
        self.ledgers.model_died()
        self.runs.wait_ended(self.quiescence.timeout_s)
        with timing.span("release_stale"):
            self._release_stale()
        self.retired_attempts.clear()
        # A commit retried after the crash reaches processes that never saw it (P10: refused, P9: disk unchanged).
        last = self.last_call
        self.last_call = None
        if last is not None and last.operation == "commit":
            self.last_call = attrs.evolve(last, after_crash=True, retried=False)

    @precondition(lambda self: self.model.phase == "prepared")
    @rule(committed=PICK, inside=st.booleans())
    @step
    def crash_in_commit(self, committed: int, inside: bool) -> None:
        """Gym crashes inside a commit: the first `committed` participants (modulo their number, in name order)
        committed, and with `inside` the next one is stopped inside its own commit, between its records file and
        its manifest (a deployment failpoint; ignored by a deployment without one); then every process group is
        SIGKILLed. Those that committed replied with and wrote exactly their share (P1) and it verifies (P9); after
        the crash every share whose manifest was published verifies in full (P9: the manifest is the commit point,
        published only once the records are durable). The controller never publishes the checkpoint, and
        `restore_incomplete` later shows it cannot be restored as if complete."""
        checkpoint_id = self.model.open_checkpoint
        assert checkpoint_id is not None
        members = sorted(self.control.participants, key=lambda m: m.name)
        done = members[: committed % len(members)]
        stopped = members[len(done)] if inside and self.harness.can_stop_inside_commit else None
        directory = self.harness.checkpoint_dir / checkpoint_id
        episode_ids = [EpisodeId(rollout_id=a.rollout, attempt=a.attempt) for a in self.model.scope()]
        deadline_ts = time.time() + CONTROL_DEADLINE_S
        body = request_body(
            "commit", checkpoint_id, deadline_ts, checkpoint_dir=str(directory), episode_ids=episode_ids
        )
        if done:
            names = [m.name for m in done]
            replies = self._control("commit", checkpoint_id, lambda d: self.control.post_each("commit", body, d, names))
            failures = {name: r for name, r in replies.items() if isinstance(r, ParticipantFailure)}
            if failures:
                raise CoordinationError("commit", failures, replies)
            read = self._read_checkpoint(directory, checkpoint_id)
            props.p9_verifies(checkpoint_id, {m.name: read[m.name] for m in done})
            self._check_shares(checkpoint_id, done, replies, read, directory)
        stopped_commit = None if stopped is None else self._stop_inside_commit(stopped.name, body, deadline_ts)
        self._crash_everything(inside=True)
        if stopped_commit is not None:
            stopped_commit.result(timeout=CONTROL_DEADLINE_S)  # ended by the crash
        read = self._read_checkpoint(directory, checkpoint_id)
        published = [m.name for m in members if (participant_dir(directory, m.kind, m.name) / MANIFEST_NAME).exists()]
        props.p9_verifies(checkpoint_id, {name: read[name] for name in published})
        self.incomplete_shares[checkpoint_id] = frozenset(published)
        where = f", {stopped.name} stopped between its files" if stopped is not None else ""
        self._advance(
            self.model.crash_in_commit(), f"crash_in_commit() -> {checkpoint_id} committed by {published}{where}"
        )

    def _stop_inside_commit(self, name: str, body: dict[str, Any], deadline_ts: float) -> Future[Any]:
        """Send `name` its commit with a failpoint armed between its two files; return once its work stands there."""
        self.harness.arm_failpoint(name, FAILPOINT_BETWEEN_FILES)
        commit = self.runs.submit(self.control.post_each, "commit", body, deadline_ts, [name])
        if not poll(lambda: self.harness.failpoint_reached(name, FAILPOINT_BETWEEN_FILES), self.quiescence.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{name}'s commit stops between its records file and its manifest",
                observed="it never got there" + (f": {commit.result()}" if commit.done() else ""),
                pending=[f"{name} at {FAILPOINT_BETWEEN_FILES}"],
                timeout_s=self.quiescence.timeout_s,
            )
        return commit

    @precondition(lambda self: bool(self._interruptible()))
    @rule(pick=PICK, reached=PICK)
    @step
    def crash_in_operation(self, pick: int, reached: int) -> None:
        """Gym crashes inside a restore, a retire or a forget (whichever can run now, by `pick`): a restore of the
        latest committed checkpoint reaches the first `reached` participants (modulo their number, in name order);
        a retire of the first lost or restored attempt, or a forget of the retired rollouts, the first `reached`
        stages of the retire order (callers before callees); each that is reached must answer it; then every
        process group is SIGKILLed. Nothing of it may outlive the crash: the fresh processes are idle and empty,
        and every committed checkpoint is unchanged (P9), so the next restore works as if the operation never
        started."""
        operation = _pick(self._interruptible(), pick)
        deadline_ts = time.time() + CONTROL_DEADLINE_S
        if operation == "restore":
            checkpoint = self.model.committed[-1]
            covered = self.model.marks_covering(checkpoint.checkpoint_id)
            if covered:
                self._forget(covered)
            checkpoint_id = f"{checkpoint.checkpoint_id}-restore{self.model.checkpoint_seq + 1}"
            scope = [EpisodeId.from_capture_key(key) for key in checkpoint.exported]
            directory = str(self.harness.checkpoint_dir / checkpoint.checkpoint_id)
            body = request_body("restore", checkpoint_id, deadline_ts, checkpoint_dir=directory, episode_ids=scope)
            members = sorted(self.control.participants, key=lambda m: m.name)
            stages = [[m.name] for m in members[: reached % len(members)]]
        else:
            self.retire_seq += 1
            checkpoint_id = f"{operation}{self.retire_seq}"
            if operation == "retire":
                lost = self.model.with_status("dead", "pending")[0]
                episodes = [EpisodeId(rollout_id=lost.rollout, attempt=lost.attempt)]
                body = request_body("retire", checkpoint_id, deadline_ts, episode_ids=episodes)
            else:
                body = request_body("forget", checkpoint_id, deadline_ts, rollout_ids=self.model.marked_rollouts())
            order = [[m.name for m in self.control.participants.of_kinds(kinds)] for kinds in RETIRE_ORDER]
            stages = order[: reached % len(order)]
        for names in stages:
            answers = self._control(
                operation, checkpoint_id, functools.partial(self._post_each_by, operation, body, names)
            )
            failures = {name: a for name, a in answers.items() if isinstance(a, ParticipantFailure)}
            if failures:
                raise CoordinationError(operation, failures, answers)
        reached_names = [name for names in stages for name in names]
        if any(m.kind == "model" and m.name in reached_names for m in self.control.participants):
            # What the policy model did to its ledgers is on disk and outlives the crash (P5).
            if operation == "restore":
                self.ledgers.restored(checkpoint.checkpoint_id)
            elif operation == "retire":
                self.ledgers.retired(episodes)
        self._crash_everything(inside=True)
        self._advance(
            self.model.crash(), f"crash_in_operation() inside {operation} {checkpoint_id}, reached {reached_names}"
        )

    def _post_each_by(self, operation: str, body: dict[str, Any], names: list[str], deadline_ts: float) -> Any:
        return self.control.post_each(operation, body, deadline_ts, names)

    def _interruptible(self) -> list[str]:
        """The operations a crash can land inside now."""
        model = self.model
        available = {
            "restore": model.can_restore(),
            "retire": not model.checkpoint_open and bool(model.with_status("dead", "pending")),
            "forget": not model.checkpoint_open and bool(model.retired_marks),
        }
        return [operation for operation, possible in available.items() if possible]

    @precondition(lambda self: self.model.can_restore_incomplete())
    @rule(pick=PICK)
    @step
    def restore_incomplete(self, pick: int) -> None:
        """Restore a checkpoint whose commit a crash cut short. P8: exactly the participants that had not
        committed it (their share is missing) refuse with invalid_checkpoint_state, whatever the others
        installed; the controller's cleanup retires the next attempts everywhere and resumes, and afterwards
        nothing of it is installed anywhere, as after `failed_restore`."""
        checkpoint = _pick(list(self.model.incomplete), pick)
        checkpoint_id = checkpoint.checkpoint_id
        missing = [m.name for m in self.control.participants if m.name not in self.incomplete_shares[checkpoint_id]]
        covered = self.model.marks_covering(checkpoint_id, incomplete=True)
        if covered:
            self._forget(covered)
        model, restore_id = self.model.failed_restore(checkpoint_id)
        directory = str(self.harness.checkpoint_dir / checkpoint_id)
        self._refused_restore(
            model,
            restore_id,
            directory,
            checkpoint.exported,
            missing,
            "no share: the crash came first",
            f"restore_incomplete({checkpoint_id}) as {restore_id}, refused by {missing}",
        )

    def _refused_restore(
        self,
        model: Model,
        restore_id: str,
        directory: str,
        exported: tuple[str, ...],
        refusers: list[str],
        why: str,
        label: str,
    ) -> None:
        """Restore what exactly `refusers` cannot install (`why`); P8 on their refusals and the client's cleanup,
        then settle on `model` as P8, its counts confirmed by the cleanup's retire."""
        scope = [EpisodeId.from_capture_key(key) for key in exported]
        try:
            self._control("restore", restore_id, lambda d: self.control.restore(restore_id, directory, scope, d))
        except CoordinationError as error:
            props.p8_refused_by(restore_id, refusers, why, error.failures, getattr(error, "__notes__", []))
        else:
            raise props.P8Violation(
                rollout=None,
                expected=f"restore {restore_id} refused by {refusers} ({why})",
                observed="every participant installed it",
            )
        self.ledgers.burned(exported)
        # The restore, its cleanup retire and resume came after the last call the controller kept, so sending that
        # one again is no retry: a forget, which runs again rather than replays, would drop the cleanup's marks.
        self.last_call = None
        self._advance(model, label, violation=props.P8Violation, counts_final=True)

    @precondition(
        lambda self: (
            not self.crashed_alone
            and bool(self.model.retired_marks or self.model.resumed or self.model.with_status("running"))
            and bool(self._crashable_alone())
        )
    )
    @rule(pick=PICK)
    @step
    def crash_participant(self, pick: int) -> None:
        """SIGKILL one participant alone and start it again: it comes back idle and empty, having forgotten its
        marks and resumed IDs, while the others keep theirs (each participant that remembers the latest resumed
        ID, asked on its own, still refuses it). The controller then retires every running attempt, whose work
        lost a server; each `/run` ends (how does not matter) and everything they held is freed (P7). Drawn once
        there is something to lose: marks, resumed IDs or running work."""
        self.crashed_alone = True
        member = _pick(self._crashable_alone(), pick)
        model_before = self.model
        running = model_before.with_status("running")
        self.history.invoke("controller", "crash", member.name)
        self.harness.restart_server(member.name)
        if member.kind == "model":
            self.ledgers.model_died()
        # A retry would reach a participant that never saw the first call; a controller does not retry across it.
        self.last_call = None
        model = self.model.crash_participant(member.kind)
        label = f"crash_participant({member.name})"
        if model.resumed:
            latest = model.resumed[-1]
            remembering = [m.name for m in self.control.participants if model.remembers(m.kind, latest)]
            self._probe("prepare", latest, "stale_checkpoint", names=remembering)
            label += f"; prepare({latest}) refused by {remembering}"
        if running:
            # First what fails by itself, so the retire always meets the same state (an agent session whose
            # activation failed, not one still running).
            ending = [a.run for a in model_before.ends_alone(member.kind)]
            self.runs.wait_ended(self.quiescence.timeout_s, ending, f"{member.name} crashed alone")
            self._retire_call([EpisodeId(rollout_id=a.rollout, attempt=a.attempt) for a in running])
            # Their calls at the backend are cancelled as their callers go away (the settle waits for it).
            self.runs.wait_ended(self.quiescence.timeout_s)
            self.retired_attempts.update({a.rollout: a for a in running})
            label += f"; retire({sorted(a.key for a in running)})"
        self._advance(model, label, violation=props.P7Violation, counts_final=bool(running))

    def _release_stale(self) -> None:
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
            except httpx.HTTPStatusError as error:
                if error.response.status_code != httpx.codes.CONFLICT or attempt == STALE_RELEASE_TRIES - 1:
                    raise

    def _crashable_alone(self) -> list[Any]:
        if not self.harness.can_restart_one or self.control is None:
            return []
        members = sorted(self.control.participants, key=lambda m: m.name)
        return [m for m in members if self.model.can_crash_participant(m.kind)]

    @precondition(lambda self: self.model.can_restore())
    @rule(pick=PICK)
    @step
    def restore(self, pick: int) -> None:
        """Restore the latest or an earlier checkpoint into the fresh processes, then resume. Rollouts retired
        since, whose marks would refuse the continued attempts, are forgotten first, as a controller must."""
        checkpoint = _pick(list(self.model.committed), pick)
        covered = self.model.marks_covering(checkpoint.checkpoint_id)
        if covered:
            self._forget(covered)
        model, restore_id = self.model.restore(checkpoint.checkpoint_id)
        scope = [EpisodeId.from_capture_key(key) for key in checkpoint.exported]
        directory = str(self.harness.checkpoint_dir / checkpoint.checkpoint_id)
        try:
            replies = self._control(
                "restore", restore_id, lambda d: self.control.restore(restore_id, directory, scope, d)
            )
        except CoordinationError as error:
            raise props.P9Violation(
                rollout=None,
                expected=f"committed checkpoint {checkpoint.checkpoint_id} restores (as {restore_id}) into fresh "
                "processes, also again after its replacement made calls",
                observed=str(error),
            ) from error
        self._check_restored_state(Path(directory), checkpoint.checkpoint_id, restore_id, checkpoint.exported, replies)
        self.ledgers.restored(checkpoint.checkpoint_id)
        self._resume_call(restore_id)
        self._advance(model, f"restore({checkpoint.checkpoint_id}) as {restore_id}")

    @precondition(lambda self: self.model.can_restore())
    @rule(pick=PICK, victim=PICK, rejected_record=st.booleans())
    @step
    def failed_restore(self, pick: int, victim: int, rejected_record: bool) -> None:
        """Restore a copy of a committed checkpoint in which one participant's share is damaged
        (`ckpt_model.damage`): a line added to its records file, or (`rejected_record`, among the participants
        that hold a record the restore continues) the first such record cut to its episode ID in a file sealed
        again. P8: that participant alone refuses with invalid_checkpoint_state while the others install; the
        controller's client then retires the next attempts everywhere and resumes, as Gym's does, and afterwards
        nothing of the restore is installed anywhere (no restored-pending episode, no session), admission is open,
        and its attempts never run (the backend sees no call of them); the rollouts start over. The committed
        checkpoint is untouched."""
        checkpoint = _pick(list(self.model.committed), pick)
        source = self.harness.checkpoint_dir / checkpoint.checkpoint_id
        members = sorted(self.control.participants, key=lambda m: m.name)
        holding = [m for m in members if damage.holds_records(source, m.kind, m.name, checkpoint.exported)]
        how: damage.Damage = "record" if rejected_record and holding else "digest"
        member = _pick(holding if how == "record" else members, victim)
        covered = self.model.marks_covering(checkpoint.checkpoint_id)
        if covered:
            self._forget(covered)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        copy = damage.damaged_copy(
            source,
            self.harness.checkpoint_dir / f"{restore_id}-damaged",
            member.kind,
            member.name,
            how,
            checkpoint.exported,
        )
        self._refused_restore(
            model,
            restore_id,
            str(copy),
            checkpoint.exported,
            [member.name],
            f"damaged: {how}",
            f"failed_restore({checkpoint.checkpoint_id}) as {restore_id}, {member.name} damaged ({how}) refused it",
        )

    @precondition(lambda self: self.model.can_restore() and bool(self._can_die_in_restore()))
    @rule(pick=PICK, victim=PICK)
    @step
    def dies_in_restore(self, pick: int, victim: int) -> None:
        """One participant dies during its own restore while the others finish theirs: a deployment failpoint
        holds its restore after it closed admission, just before it installs; the checker polls until it stands
        there and every other participant has restored, then SIGKILLs it and starts it again alone. P8: every
        other participant installed, the dead one answered nothing, and the controller's cleanup, as Gym's client
        runs it (retire the next attempts everywhere, then resume), succeeds on all, the restarted one included;
        afterwards nothing of the restore is installed anywhere and its attempts never run."""
        checkpoint = _pick(list(self.model.committed), pick)
        member = _pick(self._can_die_in_restore(), victim)
        covered = self.model.marks_covering(checkpoint.checkpoint_id)
        if covered:
            self._forget(covered)
        model, restore_id = self.model.died_in_restore(checkpoint.checkpoint_id, member.kind)
        scope = [EpisodeId.from_capture_key(key) for key in checkpoint.exported]
        directory = str(self.harness.checkpoint_dir / checkpoint.checkpoint_id)
        deadline_ts = time.time() + CONTROL_DEADLINE_S
        body = request_body("restore", restore_id, deadline_ts, checkpoint_dir=directory, episode_ids=scope)
        others = [m for m in self.control.participants if m.name != member.name]
        self.harness.arm_failpoint(member.name, FAILPOINT_BEFORE_INSTALL)
        invocation = self.history.invoke("controller", "restore", restore_id)
        restore = self.runs.submit(self.control.post_each, "restore", body, deadline_ts)

        def others_restored() -> bool:
            statuses = self.harness.statuses()
            return self.harness.failpoint_reached(member.name, FAILPOINT_BEFORE_INSTALL) and all(
                statuses[m.name]["phase"] == "restored" for m in others
            )

        if not poll(others_restored, self.quiescence.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{member.name} stands before its install while {[m.name for m in others]} restored",
                observed=self.harness.statuses(),
                pending=[f"{member.name} at {FAILPOINT_BEFORE_INSTALL}"],
                timeout_s=self.quiescence.timeout_s,
            )
        self.history.invoke("controller", "crash", member.name)
        self.harness.restart_server(member.name)
        outcomes = restore.result(timeout=CONTROL_DEADLINE_S)
        self.history.complete(invocation, "fail", {name: _outcome_text(o) for name, o in outcomes.items()})
        props.p8_died_in_restore(restore_id, member.name, outcomes)
        next_attempts = [episode.next_attempt() for episode in scope]
        try:
            self._control("retire", restore_id, lambda d: self.control.retire(restore_id, next_attempts, d))
            self._resume_call(restore_id)
        except CoordinationError as error:
            raise props.P8Violation(
                rollout=None,
                expected=f"the cleanup of restore {restore_id} (retire the next attempts, resume) succeeds everywhere",
                observed=str(error),
            ) from error
        self.last_call = None
        self.ledgers.burned(checkpoint.exported)
        self._advance(
            model,
            f"dies_in_restore({checkpoint.checkpoint_id}) as {restore_id}: {member.name} died before installing",
            violation=props.P8Violation,
            counts_final=True,
        )

    def _can_die_in_restore(self) -> list[Any]:
        """Participants that can die during their own restore: with failpoints and single restarts, and the only
        one of its kind (the model says what one participant forgets by its kind)."""
        if not (self.harness.can_stop_inside_commit and self.harness.can_restart_one) or self.control is None:
            return []
        members = sorted(self.control.participants, key=lambda m: m.name)
        kinds = [m.kind for m in members]
        return [m for m in members if kinds.count(m.kind) == 1]

    # The controller's two routines as single steps as well. A bug that needs a checkpoint, a crash and a
    # restore in a row is then four steps deep instead of seven, so a random search reaches it far more often
    # (restored-pending episodes dropped by a second checkpoint; a restore that ignores boundaries).

    @precondition(lambda self: self.model.can_prepare() and self._worth_a_checkpoint())
    @rule(then_resume=st.booleans(), hold_one=st.booleans())
    @step
    def checkpoint(self, then_resume: bool, hold_one: bool = False) -> None:
        """The routine checkpoint: prepare and commit in one step, then resume (or leave it committed, so a crash
        or another rule can come first). With `hold_one`, the first waiting call returns between the two, so its
        reply is held across the commit (Gym's scenario 8): its episode is exported at the call before it."""
        self.prepare()
        if hold_one and self.model.releasable():
            self.release(0)
        self.commit()
        if then_resume:
            self.resume()

    @precondition(lambda self: not self.model.fresh and bool(self.model.committed))
    @rule(pick=PICK)
    @step
    def recover(self, pick: int) -> None:
        """The routine recovery: crash, then restore the latest or an earlier checkpoint and resume."""
        self.crash()
        self.restore(pick)

    @precondition(lambda self: not self.model.checkpoint_open and bool(self.model.with_status("pending")))
    @rule(pick=PICK)
    @step
    def start_replacement(self, pick: int) -> None:
        """Send a restored rollout's next attempt with the same task: it continues from its boundary."""
        rollout = _pick(sorted(a.rollout for a in self.model.with_status("pending")), pick)
        model = self.model.start_replacement(rollout)
        self._send_run(model.current()[rollout])
        self._advance(model, f"start_replacement({rollout}) as {model.current()[rollout].key}")

    @precondition(lambda self: not self.model.checkpoint_open and bool(self.model.with_status("dead")))
    @rule(pick=PICK)
    @step
    def start_over(self, pick: int) -> None:
        """Start a rollout lost in a crash over from its input as attempt + 1."""
        rollout = _pick(sorted(a.rollout for a in self.model.with_status("dead")), pick)
        model = self.model.start_over(rollout)
        self._send_run(model.current()[rollout])
        self._advance(model, f"start_over({rollout}) as {model.current()[rollout].key}")

    @precondition(lambda self: not self.model.checkpoint_open and bool(self.model.live()))
    @rule(pick=PICK, again=st.booleans())
    @step
    def retire(self, pick: int, again: bool) -> None:
        """Retire a rollout's attempt everywhere; then start it over as attempt + 1, or give it up."""
        self._retire(_pick(sorted(a.rollout for a in self.model.live()), pick), again)

    def _retire_call(self, episodes: list[EpisodeId]) -> tuple[str, Any]:
        """One retire of `episodes` under a fresh ID; returns the ID and every participant's reply."""
        self.retire_seq += 1
        retire_id = f"retire{self.retire_seq}"
        replies = self._control("retire", retire_id, lambda d: self.control.retire(retire_id, episodes, d))
        self.ledgers.retired(episodes)
        return retire_id, replies

    def _retire(self, rollout: str, again: bool) -> None:
        attempt = self.model.current()[rollout]
        episode = EpisodeId(rollout_id=rollout, attempt=attempt.attempt)
        retire_id, replies = self._retire_call([episode])
        self.last_call = SentCall("retire", retire_id, {"episode_ids": (episode,)}, replies)
        if attempt.status == "running":
            self.runs.refused_stale[attempt.run] = attempt.key
        self.retired_attempts[rollout] = attempt
        model = self.model.retire(rollout)
        label = f"retire({rollout}) of {attempt.key}"
        if again:
            model = model.start_over(rollout)
            self._send_run(model.current()[rollout])
            label += f", then start_over as {model.current()[rollout].key}"
        self._advance(model, label, violation=props.P7Violation, counts_final=True)

    @precondition(lambda self: not self.model.checkpoint_open and bool(self.model.retired_marks))
    @rule()
    @step
    def forget(self) -> None:
        """Forget every retired rollout: the marks go everywhere."""
        self._forget(list(self.model.marked_rollouts()))

    def _forget(self, rollouts: list[str]) -> None:
        self.retire_seq += 1
        forget_id = f"forget{self.retire_seq}"
        replies = self._control("forget", forget_id, lambda d: self.control.forget(forget_id, rollouts, d))
        self.last_call = SentCall("forget", forget_id, {"rollout_ids": tuple(rollouts)}, replies)
        for rollout in rollouts:
            self.retired_attempts.pop(rollout, None)
        model = self.model.forget(tuple(rollouts))
        self._advance(model, f"forget({rollouts})", violation=props.P7Violation, counts_final=True)

    @precondition(lambda self: bool(self._late_runs()))
    @rule(pick=PICK)
    @step
    def late_run(self, pick: int) -> None:
        """A late `/run` of a retired attempt is refused with stale_attempt until forget (P7), also when the
        server it reaches first restarted alone and only a callee still holds the mark."""
        rollout = _pick(self._late_runs(), pick)
        attempt = self.retired_attempts[rollout]
        outcome = self.runs.post(attempt)
        self.steps.append(f"late_run({attempt.key}) -> HTTP {outcome.status_code}")
        props.p7_refused(attempt.key, outcome.status_code, outcome.body)
        self._settle(violation=props.P7Violation)

    def _late_runs(self) -> list[str]:
        return sorted(r for r, a in self.retired_attempts.items() if self.model.refuses_late_run(r, a.attempt))

    @precondition(lambda self: self.model.checkpoint_open and self.refused_during != self.model.open_checkpoint)
    @rule()
    @step
    def run_while_open(self) -> None:
        """A new `/run` while a checkpoint is open is refused with admission_closed and owns nothing (P10)."""
        self.refused_during = self.model.open_checkpoint
        model, attempt = self.model.refused_dispatch()
        self.runs.refused_closed[attempt.run] = attempt.key
        self.runs.send(attempt)
        self._advance(model, f"run_while_open() -> {attempt.rollout} refused", violation=props.P10Violation)

    @precondition(
        lambda self: (
            self.ledgers.enabled
            and self.model.checkpoint_open
            and self.ledger_removal_tried_in != self.model.open_checkpoint
        )
    )
    @rule()
    @step
    def remove_ledgers_while_open(self) -> None:
        """The trainer asks the policy model to retire, then delete, the live attempts' ledgers while a checkpoint
        is open: both are refused (P10), and every ledger stays as it was (P5, read at the next change)."""
        checkpoint_id = self.model.open_checkpoint
        assert checkpoint_id is not None
        self.ledger_removal_tried_in = checkpoint_id
        keys = sorted(a.key for a in self.model.live()) or ["probe"]
        outcomes = {operation: getattr(self.harness.ledger, operation)(keys) for operation in ("retire", "delete")}
        self.steps.append(f"remove_ledgers_while_open({keys}) refused")
        props.p10_ledger_removal_refused(checkpoint_id, outcomes)
        self._settle(violation=props.P10Violation)

    @precondition(lambda self: bool(self.model.resumed) and self.late_calls_for != self.model.resumed)
    @rule(pick=PICK)
    @step
    def late_call(self, pick: int) -> None:
        """Delayed calls of an older controller name a checkpoint ID the participants resumed: every one of them
        that remembers it (all but one restarted alone since), asked on its own, refuses each operation (prepare,
        renew, commit, restore, retire, forget) with stale_checkpoint (P10). Every operation is probed, not one
        drawn: a fence missing from one operation is then found as soon as any late call runs."""
        checkpoint_id = self.model.resumed[pick % len(self.model.resumed)]
        self.late_calls_for = self.model.resumed
        remembering = [m.name for m in self.control.participants if self.model.remembers(m.kind, checkpoint_id)]
        if remembering:
            for operation in LATE_OPERATIONS:
                self._probe(operation, checkpoint_id, "stale_checkpoint", names=remembering)
        self._advance(self.model, f"late_call({checkpoint_id}) refused by {remembering}")

    @precondition(lambda self: self.last_call is not None and not self.last_call.retried)
    @rule()
    @step
    def retry(self) -> None:
        """The controller retries its last control call with the same arguments and a new deadline: a completed
        call answers its first result again (resume: idempotent); after a crash a commit is refused (P10)."""
        last = self.last_call
        assert last is not None
        self.last_call = attrs.evolve(last, retried=True)
        body = request_body(last.operation, last.checkpoint_id, time.time() + CONTROL_DEADLINE_S, **last.arguments)
        invocation = self.history.invoke("controller", f"retry {last.operation}", last.checkpoint_id)
        with timing.span("control"):
            outcomes = self.control.post_each(last.operation, body, time.time() + CONTROL_DEADLINE_S)
        self.history.complete(invocation, "ok", {name: _outcome_text(o) for name, o in outcomes.items()})
        label = f"retry({last.operation} {last.checkpoint_id})"
        if last.after_crash:
            props.p10_each_refused(f"{label} after a crash", "invalid_phase", outcomes)
        elif last.operation == "resume":
            idempotent = {"phase": "idle", "idempotent": True}
            props.p10_each_replied(label, dict.fromkeys(outcomes, idempotent), outcomes)
        else:
            props.p10_each_replied(label, last.replies, outcomes)
        self._advance(self.model, label)

    @precondition(
        lambda self: (
            not self.lease_lapsed
            and self.model.can_prepare()
            and self._worth_a_checkpoint()
            and self.harness.lease_grace_s <= QUIET_LEASE_GRACE_MAX_S
        )
    )
    @rule()
    @step
    def quiet_controller(self) -> None:
        """The controller prepares and goes quiet: the lease lapses, every participant re-opens as a resume would
        and remembers the ID, and the controller's late commit of it is refused (P10)."""
        self.lease_lapsed = True
        model, checkpoint_id = self.model.lease_expired()
        deadline_ts = time.time() + QUIET_PREPARE_DEADLINE_S
        invocation = self.history.invoke("controller", "prepare", checkpoint_id)
        try:
            prepared = self.control.prepare(checkpoint_id, deadline_ts).prepared
        except CoordinationError as error:
            if {f.code for f in error.failures.values()} != {"deadline_exceeded"}:
                self.history.complete(invocation, "fail", str(error))
                raise
            prepared = False
        self.history.complete(invocation, "ok" if prepared else "info", "prepared" if prepared else "missed")
        if prepared:
            self.quiescence.wait_lease_lapsed(checkpoint_id, deadline_ts + self.harness.lease_grace_s)
        else:
            # On a loaded machine the short prepare can miss its deadline; ending it as a controller would
            # leaves the participants exactly where a lapsed lease does.
            self._control("resume", checkpoint_id, lambda d: self.control.resume(checkpoint_id, d))
        self.last_call = None
        self._probe("commit", checkpoint_id, "stale_checkpoint")
        self._advance(model, f"quiet_controller() -> {checkpoint_id} lapsed; commit({checkpoint_id}) refused")

    # -- teardown: drain and the end-of-run properties ---------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.broken:
                self.broken = True
                with timing.span("drain"):
                    self._drain()
                self.broken = False
        except (PropertyViolation, HarnessError, CoordinationError) as error:
            self.report(error)
            raise
        finally:
            self.runs.shutdown()
            if self.stats is not None:
                rules = sum(1 for label in self.steps if not label.startswith("-- "))
                self.stats.example_finished(
                    rules, self.crashes, time.monotonic() - self.started_s, crashes_inside=self.crashes_inside
                )

    def _drain(self) -> None:
        """Resume, start everything unfinished, release every call; then P3, P4, P7, P9 and P13."""
        self.steps.append("-- teardown: drain --")
        self.draining = True
        if self.model.checkpoint_open:
            self.resume()
        while self.model.with_status("pending"):
            self.start_replacement(0)
        while self.model.with_status("dead"):
            self.start_over(0)
        while self.model.waiting():
            self.release(0)
        if self.model.retired_marks:
            self.forget()
        self.ledgers.check(self.model.checkpoint_open, everything=True)
        props.p13_clean_end(observe(self.harness).statuses)

    def _worth_a_checkpoint(self) -> bool:
        """A checkpoint with nothing in flight checks little beyond fencing, and with many rules enabled the search
        then rarely dispatches and releases; so with a gated backend a checkpoint needs some rollout unfinished.
        Without a gate nothing is ever dispatched, and checkpoints are all that is left to check."""
        return self.harness.backend is None or bool(self.model.live())

    # -- the machinery ----------------------------------------------------------------------------------------

    @property
    def control(self) -> Any:
        return self.harness.control

    def _advance(
        self,
        model: Model,
        label: str,
        violation: type[PropertyViolation] | None = None,
        counts_final: bool = False,
    ) -> None:
        self.model = model
        self.steps.append(label)
        self._settle(violation=violation, counts_final=counts_final)

    def _control(self, operation: str, checkpoint_id: str, call: Callable[[float], Any]) -> Any:
        invocation = self.history.invoke("controller", operation, checkpoint_id)
        try:
            with timing.span("control"):
                result = call(time.time() + CONTROL_DEADLINE_S)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            raise
        self.history.complete(invocation, "ok")
        return result

    def _probe(self, operation: str, checkpoint_id: str, code: str, names: list[str] | None = None) -> None:
        """Send `operation` naming `checkpoint_id` to every participant (or those `names`) on its own; each must
        refuse with `code`."""
        probe_arguments: dict[str, dict[str, Any]] = {
            "commit": {"checkpoint_dir": str(self.harness.checkpoint_dir / f"probe-{checkpoint_id}")},
            "restore": {"checkpoint_dir": str(self.harness.checkpoint_dir / f"probe-{checkpoint_id}")},
            "retire": {"episode_ids": (EpisodeId(rollout_id="probe", attempt=0),)},
            "forget": {"rollout_ids": ("probe",)},
        }
        outcomes = self._post_probe(operation, operation, checkpoint_id, names, **probe_arguments.get(operation, {}))
        props.p10_each_refused(f"{operation}({checkpoint_id})", code, outcomes)

    def _post_probe(
        self, label: str, operation: str, checkpoint_id: str, names: list[str] | None, **arguments: Any
    ) -> dict[str, Any]:
        """Send `operation` to every participant (or those `names`) on its own, as history event `probe <label>`;
        return each one's answer, refusals included."""
        deadline_ts = time.time() + CONTROL_DEADLINE_S
        body = request_body(operation, checkpoint_id, deadline_ts, **arguments)
        invocation = self.history.invoke("controller", f"probe {label}", checkpoint_id)
        with timing.span("probe"):
            outcomes = self.control.post_each(operation, body, deadline_ts, names)
        self.history.complete(invocation, "ok", {name: _outcome_text(o) for name, o in outcomes.items()})
        return outcomes

    def _release_keys(self, keys: list[str]) -> None:
        """Release the call each capture key has waiting at the backend."""
        with timing.span("release"):
            self._release_waiting(keys)

    def _release_waiting(self, keys: list[str]) -> None:
        _, waiting = backend_calls(self.harness)
        missing = [key for key in keys if key not in waiting]
        if missing:
            raise QuiescenceTimeout(
                prediction=f"{missing} wait at the backend", observed="they do not", pending=missing
            )
        assert self.harness.backend is not None, "only a gated backend holds calls to release"
        self.harness.backend.release([waiting[key] for key in keys])

    def _send_run(self, attempt: Attempt) -> None:
        """Send an attempt's `/run`: a new execution, which writes its ledger from the rows it holds."""
        self.ledgers.started(attempt.key)
        self.runs.send(attempt)

    def _run_url(self, attempt: Attempt) -> str:
        return self.harness.restart_run_url if attempt.restart else self.harness.run_url

    def _run_body(self, attempt: Attempt) -> dict[str, Any]:
        return run_body(self.model.topology, attempt.rollout, attempt.attempt)

    def _check_exported_state(self, directory: Path, checkpoint_id: str) -> None:
        """P6 at a commit: each resources record holds the state the checker computes for its attempt."""
        topology = self.model.topology
        scoped = {a.key: a for a in self.model.scope()}
        for member in self._resources_members():
            expected = {
                key: resources_state(topology, scoped[key].tool_rounds)
                for key in self.model.exports("resources", member.name)
            }
            records = self._resources_records(directory, checkpoint_id, member.name)
            props.p6_exported_state(checkpoint_id, member.name, expected, records)

    def _check_restored_state(
        self, directory: Path, checkpoint_id: str, restore_id: str, scope: tuple[str, ...], replies: dict[str, Any]
    ) -> None:
        """P6 at a restore: the resources participant installed the sessions of its in-scope records (read with the
        checker's own reader), under their next attempts: its reply names them, and its status counts them."""
        for member in self._resources_members():
            records = self._resources_records(directory, checkpoint_id, member.name)
            keys = [props.record_key(record) for record in records]
            expected = [EpisodeId.from_capture_key(key).next_attempt().capture_key for key in keys if key in scope]
            sessions = self.control.status(member)["report"]["counts"].get("sessions")
            props.p6_restored(restore_id, member.name, expected, replies[member.name].get("restored"), sessions)

    def _resources_members(self) -> list[Any]:
        return [m for m in self.control.participants if m.kind == "resources"]

    def _resources_records(self, directory: Path, checkpoint_id: str, name: str) -> list[Any]:
        with timing.span("fingerprint"):
            return read_records(
                participant_dir(directory, "resources", name), "resources", name, checkpoint_id=checkpoint_id
            )

    def _read_checkpoint(self, directory: Path, checkpoint_id: str) -> dict[str, Any]:
        with timing.span("fingerprint"):
            return self._fingerprints(directory, checkpoint_id)

    def _fingerprints(self, directory: Path, checkpoint_id: str) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for member in self.control.participants:
            try:
                read[member.name] = self.fingerprint_cache.fingerprint(
                    participant_dir(directory, member.kind, member.name),
                    member.kind,
                    member.name,
                    checkpoint_id=checkpoint_id,
                )
            except CheckpointUnreadable as error:
                read[member.name] = error
        return read

    def _settle(self, violation: type[PropertyViolation] | None = None, counts_final: bool = False) -> Observation:
        """Wait for the quiet state the model predicts (`quiescence`), then the history's P2 and the disk's P9."""
        observation = self.quiescence.settle(self.model, violation, counts_final)
        self.ledgers.check(self.model.checkpoint_open)
        with timing.span("p2_history"):
            props.p2_no_reply_while_prepared(self.history)
        with timing.span("p9_reread"):
            for checkpoint_id, before in self.fingerprints.items():
                directory = self.harness.checkpoint_dir / checkpoint_id
                props.p9_unchanged(checkpoint_id, before, self._read_checkpoint(directory, checkpoint_id))
        return observation

    def report(self, error: BaseException) -> None:
        """Attach the failure report (steps, history, calls, logs, replay file) once."""
        if (
            annotate(
                error,
                harness=self.harness,
                steps=self.steps,
                history=self.history,
                rule_calls=self.rule_calls,
                backend_calls=lambda: observe(self.harness).calls,
            )
            and self.stats is not None
        ):
            self.stats.failed()


def _pick(items: list[Any], pick: int) -> Any:
    return items[pick % len(items)]


def _outcome_text(outcome: Any) -> Any:
    """A participant's answer as the history shows it: the reply, or the refusal's description."""
    return outcome.describe() if isinstance(outcome, ParticipantFailure) else outcome


def machine_for(harness: Harness, stats: SearchStats | None = None) -> type[CheckpointMachine]:
    """A factory of machines bound to `harness`, for `run_state_machine_as_test`.

    Hypothesis keys its example database (and, derandomized, its draws) on the factory's source plus this digest,
    so each deployment (topology, verify mode, faults) keeps its own examples: a failure saved by one topology is
    not replayed against another."""

    def factory() -> CheckpointMachine:
        return CheckpointMachine(harness, stats)

    factory._hypothesis_internal_add_digest = deployment_key(harness).encode()  # type: ignore[attr-defined]
    # `run_state_machine_as_test` is typed for the class but calls what it gets with no arguments; a factory that
    # closes over the harness is how a machine is bound by composition.
    return cast(type[CheckpointMachine], factory)


def deployment_key(harness: Harness) -> str:
    """What makes one deployment behave differently from another, as one string."""
    options = option_words(deployment_options(harness))
    return "/".join((harness.topology, harness.verify_mode, ",".join(sorted(harness.faults)), *options))
