"""The Hypothesis state machine: the training controller, played against real server processes.

It only routes: every rule performs the real operation through the controller client or the harness, applies
the same rule to the pure model (`contract.Model`), then waits until the system shows the quiet state the model
predicts and checks the properties that apply. Everything that could race is gated: model calls wait at the
backend until `release` lets one go, so every example replays the same way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import attrs
import httpx
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from ckpt_model import properties as props
from ckpt_model import regression
from ckpt_model.contract import VERIFY, Attempt, Expectation, Model, ScriptCall, expect
from ckpt_model.coordination import request_body
from ckpt_model.deployment import Harness
from ckpt_model.errors import CoordinationError, HarnessError, ParticipantFailure, PropertyViolation, QuiescenceTimeout
from ckpt_model.history import Event, History
from ckpt_model.storage import CheckpointUnreadable, fingerprint, participant_dir
from ckpt_model.tasks import WEATHER_SCRIPT, expected_reward, legacy_run_body, native_run_body, task_tools
from ckpt_model.wire import EpisodeId

# Far ahead, so a lease (deadline + grace) never lapses between two steps of an example, even on a loaded machine.
CONTROL_DEADLINE_S = 60.0
# A prepare the model knows will not become ready waits this long for its blockers, then reports them.
BLOCKED_PREPARE_DEADLINE_S = 0.25
# The quiet controller's prepare: short, so its lease lapses soon after (deadline + the harness's lease grace).
QUIET_PREPARE_DEADLINE_S = 0.5
QUIET_LEASE_GRACE_MAX_S = 1.0
SETTLE_TIMEOUT_S = 10.0
# Polls back off from the first to the last interval: quick when the state is almost there, and gentle on two
# loaded cores when a participant lags.
POLL_INTERVAL_MIN_S = 0.001
POLL_INTERVAL_MAX_S = 0.02
PICK = st.integers(min_value=0, max_value=7)
# How pending items and status mismatches are told apart when the settle timeout has passed.
REFUSAL_PENDING = "refusal"
ADMISSION_MISMATCH = "accepting="
# Operations a delayed call of an older controller can carry (resume of a resumed ID is idempotent instead).
LATE_OPERATIONS = ("prepare", "renew", "commit", "restore", "retire", "forget")
F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class ExampleStat:
    steps: int
    crashes: int
    seconds: float


@attrs.define
class SearchStats:
    """Counts examples, their steps and crashes, and times the first failure (benchmarks and fault tests)."""

    started_s: float = attrs.field(factory=time.monotonic)
    examples: int = 0
    first_failure_s: float | None = None
    finished: list[ExampleStat] = attrs.field(factory=list)


@attrs.frozen
class RunOutcome:
    """How one `/run` ended: an HTTP reply, or a transport error (a crash cut it off)."""

    status_code: int | None
    body: Any
    error: str | None = None

    @property
    def refused_stale(self) -> bool:
        code = self.body.get("error", {}).get("code") if isinstance(self.body, dict) else None
        return self.status_code == 409 and code == "stale_attempt"


@attrs.frozen
class Observation:
    """One poll of the system: backend calls per capture key, waiting keys, and every participant's status."""

    calls: dict[str, tuple[ScriptCall, ...]]
    waiting: dict[str, int]
    statuses: dict[str, dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        phases = {name: (s["phase"], s.get("checkpoint_id")) for name, s in self.statuses.items()}
        counts = {name: s["report"]["counts"] for name, s in self.statuses.items()}
        return {"calls": self.calls, "waiting": sorted(self.waiting), "phases": phases, "counts": counts}


@attrs.frozen
class SentCall:
    """The last control call the controller completed, kept to retry it with the same arguments."""

    operation: str
    checkpoint_id: str
    arguments: dict[str, Any]
    replies: dict[str, Any]
    after_crash: bool = False


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
            self.annotate(error)
            raise
        finally:
            self.rule_depth -= 1
        self.broken = False
        return result

    return wrapper  # type: ignore[return-value]


class CheckpointMachine(RuleBasedStateMachine):
    """Plays the controller; subclasses bind a harness (topology) through `harness`."""

    harness: ClassVar[Harness]
    settle_timeout_s: ClassVar[float] = SETTLE_TIMEOUT_S
    stats: ClassVar[SearchStats | None] = None

    def __init__(self) -> None:
        super().__init__()
        if self.stats is not None:
            self.stats.examples += 1
        self.harness.begin_example()
        self.model = Model(topology=self.harness.topology, verify_mode=self.harness.verify_mode)  # type: ignore[arg-type]
        self.history = History()
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="run")
        self.outcomes: dict[str, RunOutcome] = {}
        self.futures: dict[str, Future[RunOutcome]] = {}
        self.must_refuse: set[str] = set()
        self.must_refuse_closed: set[str] = set()
        self.retired_attempts: dict[str, Attempt] = {}
        self.last_call: SentCall | None = None
        self.reward = expected_reward(task_tools(self.model.topology), WEATHER_SCRIPT)
        self.fingerprints: dict[str, dict[str, Any]] = {}
        self.steps: list[str] = []
        # The rules as called (name, keyword arguments), outermost only: what a regression file replays.
        self.rule_calls: list[tuple[str, dict[str, Any]]] = []
        self.rule_depth = 0
        self.draining = False
        self.retire_seq = 0
        self.crashes = 0
        self.broken = False
        self.started_s = time.monotonic()

    # -- rules ------------------------------------------------------------------------------------------------

    @precondition(lambda self: self.model.can_dispatch())
    @rule()
    @step
    def dispatch(self) -> None:
        """A new rollout starts and stops at its first model call."""
        model, rollout = self.model.dispatch()
        self._send_run(model.current()[rollout])
        self._advance(model, f"dispatch() -> {rollout}")

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

    @precondition(lambda self: self.model.can_prepare())
    @rule()
    @step
    def prepare(self) -> None:
        """Prepare a new checkpoint: everything is at a boundary, so every stage must become prepared. Every
        participant, asked on its own, then refuses a prepare of another ID (P10: one checkpoint at a time)."""
        model, checkpoint_id = self.model.prepare()
        result = self._control("prepare", checkpoint_id, lambda d: self.control.prepare(checkpoint_id, d))
        if not result.prepared:
            verifying = [a.key for a in self.model.with_status("running") if a.verifying]
            raise (props.P11Violation if verifying else props.P10Violation)(
                rollout=None,
                expected=f"{checkpoint_id} prepared everywhere (every rollout waits at a model call"
                + (f"; {verifying} verify in mode replay, which never blocks)" if verifying else ")"),
                observed=f"not prepared; blockers {result.blockers()}",
            )
        self._prepared(checkpoint_id, result.replies)
        self._advance(model, f"prepare() -> {checkpoint_id}; prepare(other{model.checkpoint_seq}) refused")

    def _prepared(self, checkpoint_id: str, replies: dict[str, Any]) -> None:
        self.history.note("controller", "prepared", checkpoint_id)
        self.last_call = SentCall("prepare", checkpoint_id, {}, replies)
        self._probe("prepare", f"other{self.model.checkpoint_seq + 1}", "checkpoint_conflict")

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
        owner = self.model.episode_owner
        if result.prepared or result.blockers() != {owner: blockers}:
            raise props.P11Violation(
                rollout=blockers[0],
                expected=f"{checkpoint_id} not prepared: {owner} blocked by {blockers} (verification in mode wait)",
                observed="prepared" if result.prepared else f"blockers {result.blockers()}",
            )
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
        future = self.pool.submit(self.control.prepare, checkpoint_id, time.time() + CONTROL_DEADLINE_S)
        self._wait_preparing(checkpoint_id, blockers, future)
        self._release_keys(blockers)
        try:
            result = future.result(timeout=CONTROL_DEADLINE_S)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            raise
        self.history.complete(invocation, "ok")
        if not result.prepared:
            raise props.P11Violation(
                rollout=blockers[0],
                expected=f"{checkpoint_id} prepared once the verifications of {blockers} finished",
                observed=f"not prepared; blockers {result.blockers()}",
            )
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
        for member in self.control.participants:
            props.p1_exports_exact(
                checkpoint_id,
                member.name,
                self.model.exports(member.kind),
                replies[member.name]["episode_ids"],
                read[member.name].episode_ids,
            )
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

    def _resume_call(self, checkpoint_id: str) -> None:
        replies = self._control("resume", checkpoint_id, lambda d: self.control.resume(checkpoint_id, d))
        self.last_call = SentCall("resume", checkpoint_id, {}, replies)

    @precondition(lambda self: not self.model.fresh)
    @rule()
    @step
    def crash(self) -> None:
        """SIGKILL every Gym process group and start fresh processes; the backend and the disk survive."""
        self.history.invoke("controller", "crash")
        self.crashes += 1
        self.harness.crash()
        self._wait_runs_ended()
        stale = sorted(self.observe().waiting.values())
        if stale:
            self.harness.backend.release(stale)  # type: ignore[union-attr]
        self.retired_attempts.clear()
        # A commit retried after the crash reaches processes that never saw it (P10: refused, P9: disk unchanged).
        last = self.last_call
        self.last_call = attrs.evolve(last, after_crash=True) if last and last.operation == "commit" else None
        self._advance(self.model.crash(), "crash()")

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
        self._control("restore", restore_id, lambda d: self.control.restore(restore_id, directory, scope, d))
        self._resume_call(restore_id)
        self._advance(model, f"restore({checkpoint.checkpoint_id}) as {restore_id}")

    # The controller's two routines as single steps as well. A bug that needs a checkpoint, a crash and a
    # restore in a row is then four steps deep instead of seven, so a random search reaches it far more often
    # (restored-pending episodes dropped by a second checkpoint; a restore that ignores boundaries).

    @precondition(lambda self: self.model.can_prepare())
    @rule(then_resume=st.booleans())
    @step
    def checkpoint(self, then_resume: bool) -> None:
        """The routine checkpoint: prepare and commit in one step, then resume (or leave it committed, so a crash
        or another rule can come first)."""
        self.prepare()
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

    def _retire(self, rollout: str, again: bool) -> None:
        attempt = self.model.current()[rollout]
        self.retire_seq += 1
        retire_id = f"retire{self.retire_seq}"
        episode = EpisodeId(rollout_id=rollout, attempt=attempt.attempt)
        replies = self._control("retire", retire_id, lambda d: self.control.retire(retire_id, [episode], d))
        self.last_call = SentCall("retire", retire_id, {"episode_ids": (episode,)}, replies)
        if attempt.status == "running":
            self.must_refuse.add(attempt.key)
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

    @precondition(lambda self: bool(self.retired_attempts))
    @rule(pick=PICK)
    @step
    def late_run(self, pick: int) -> None:
        """A late `/run` of a retired attempt is refused with stale_attempt until forget (P7)."""
        rollout = _pick(sorted(self.retired_attempts), pick)
        attempt = self.retired_attempts[rollout]
        outcome = self._post_run(attempt)
        self.steps.append(f"late_run({attempt.key}) -> HTTP {outcome.status_code}")
        props.p7_refused(attempt.key, outcome.status_code, outcome.body)
        self._settle(violation=props.P7Violation)

    @precondition(lambda self: self.model.checkpoint_open)
    @rule()
    @step
    def run_while_open(self) -> None:
        """A new `/run` while a checkpoint is open is refused with admission_closed and owns nothing (P10)."""
        model, rollout = self.model.refused_dispatch()
        attempt = Attempt(rollout=rollout, attempt=0, status="running", script=self.model.script)
        self.must_refuse_closed.add(attempt.key)
        self._send_run(attempt)
        self._advance(model, f"run_while_open() -> {rollout} refused", violation=props.P10Violation)

    @precondition(lambda self: bool(self.model.resumed))
    @rule(operation=st.sampled_from(LATE_OPERATIONS), pick=PICK)
    @step
    def late_call(self, operation: str, pick: int) -> None:
        """A delayed call of an older controller names a checkpoint ID the participants resumed: every one of
        them, asked on its own, refuses it with stale_checkpoint, whatever the operation (P10)."""
        checkpoint_id = self.model.resumed[pick % len(self.model.resumed)]
        self._probe(operation, checkpoint_id, "stale_checkpoint")
        self._advance(self.model, f"late_call({operation}, {checkpoint_id}) refused")

    @precondition(lambda self: self.last_call is not None)
    @rule()
    @step
    def retry(self) -> None:
        """The controller retries its last control call with the same arguments and a new deadline: a completed
        call answers its first result again (resume: idempotent); after a crash a commit is refused (P10)."""
        last = self.last_call
        assert last is not None
        body = request_body(last.operation, last.checkpoint_id, time.time() + CONTROL_DEADLINE_S, **last.arguments)
        invocation = self.history.invoke("controller", f"retry {last.operation}", last.checkpoint_id)
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

    @precondition(lambda self: self.model.can_prepare() and self.harness.lease_grace_s <= QUIET_LEASE_GRACE_MAX_S)
    @rule()
    @step
    def quiet_controller(self) -> None:
        """The controller prepares and goes quiet: the lease lapses, every participant re-opens as a resume would
        and remembers the ID, and the controller's late commit of it is refused (P10)."""
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
            self._wait_lease_lapsed(checkpoint_id, deadline_ts + self.harness.lease_grace_s)
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
                self._drain()
                self.broken = False
        except (PropertyViolation, HarnessError, CoordinationError) as error:
            self.annotate(error)
            raise
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            if self.stats is not None:
                rules = sum(1 for label in self.steps if not label.startswith("-- "))
                seconds = time.monotonic() - self.started_s
                self.stats.finished.append(ExampleStat(steps=rules, crashes=self.crashes, seconds=seconds))

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
        props.p13_clean_end(self.observe().statuses)

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
            result = call(time.time() + CONTROL_DEADLINE_S)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            raise
        self.history.complete(invocation, "ok")
        return result

    def _probe(self, operation: str, checkpoint_id: str, code: str) -> None:
        """Send `operation` naming `checkpoint_id` to every participant on its own; each must refuse with `code`."""
        arguments: dict[str, Any] = {
            "commit": {"checkpoint_dir": str(self.harness.checkpoint_dir / f"probe-{checkpoint_id}")},
            "restore": {"checkpoint_dir": str(self.harness.checkpoint_dir / f"probe-{checkpoint_id}")},
            "retire": {"episode_ids": (EpisodeId(rollout_id="probe", attempt=0),)},
            "forget": {"rollout_ids": ("probe",)},
        }.get(operation, {})
        deadline_ts = time.time() + CONTROL_DEADLINE_S
        invocation = self.history.invoke("controller", f"probe {operation}", checkpoint_id)
        outcomes = self.control.post_each(
            operation, request_body(operation, checkpoint_id, deadline_ts, **arguments), deadline_ts
        )
        self.history.complete(invocation, "ok", {name: _outcome_text(o) for name, o in outcomes.items()})
        props.p10_each_refused(f"{operation}({checkpoint_id})", code, outcomes)

    def _release_keys(self, keys: list[str]) -> None:
        """Release the call each capture key has waiting at the backend."""
        waiting = self.observe().waiting
        missing = [key for key in keys if key not in waiting]
        if missing:
            raise QuiescenceTimeout(
                prediction=f"{missing} wait at the backend", observed="they do not", pending=missing
            )
        self.harness.backend.release([waiting[key] for key in keys])  # type: ignore[union-attr]

    def _run_body(self, attempt: Attempt) -> dict[str, Any]:
        build = legacy_run_body if self.model.topology == "legacy" else native_run_body
        return build(attempt.rollout, attempt.attempt)

    def _post_run(self, attempt: Attempt) -> RunOutcome:
        invocation = self.history.invoke(attempt.key, "run", {"attempt": attempt.attempt})
        try:
            response = self.harness.http.post(self.harness.run_url, json=self._run_body(attempt))
        except httpx.HTTPError as error:
            self.history.complete(invocation, "info", f"{type(error).__name__}: {error}")
            return RunOutcome(status_code=None, body=None, error=str(error))
        body = _json(response)
        self.history.complete(invocation, "ok" if response.status_code == 200 else "fail", body)
        return RunOutcome(status_code=response.status_code, body=body)

    def _send_run(self, attempt: Attempt) -> None:
        """`/run` in the background: its completion is an event, attributed whenever it arrives.

        A capture key can be sent again (restoring one checkpoint twice reuses the attempt number); the earlier
        `/run` of that key has ended by then (crashes wait for theirs), so its outcome is cleared first."""
        self.outcomes.pop(attempt.key, None)
        self.must_refuse.discard(attempt.key)
        future: Future[RunOutcome] = self.pool.submit(self._post_run, attempt)
        future.add_done_callback(lambda f, key=attempt.key: self.outcomes.__setitem__(key, f.result()))
        self.futures[attempt.key] = future

    def _wait_runs_ended(self) -> None:
        """After a crash every `/run` in flight ends with a transport error; wait for each (bounded)."""
        deadline = time.monotonic() + self.settle_timeout_s
        for key, future in list(self.futures.items()):
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise QuiescenceTimeout(
                    prediction="every /run in flight ends when its server is killed",
                    observed=f"the /run of {key} is still open",
                    pending=[key],
                    timeout_s=self.settle_timeout_s,
                ) from None
        self.futures.clear()

    def _wait_preparing(self, checkpoint_id: str, blockers: list[str], future: Future[Any]) -> None:
        """Poll until the episode owner reports the prepare waiting on exactly `blockers` (P11: `wait` blocks)."""
        owner = self.model.episode_owner
        deadline = time.monotonic() + self.settle_timeout_s
        interval = POLL_INTERVAL_MIN_S
        while True:
            status = self.control.status_all()[owner]
            seen = (status["phase"], status.get("checkpoint_id"), sorted(status["report"].get("blockers", ())))
            if seen == ("preparing", checkpoint_id, blockers):
                return
            if future.done() or time.monotonic() > deadline:
                raise props.P11Violation(
                    rollout=blockers[0],
                    expected=f"{owner} preparing {checkpoint_id}, waiting for the verifications of {blockers}",
                    observed=f"(phase, checkpoint, blockers) {seen}"
                    + ("; the prepare returned" if future.done() else ""),
                )
            time.sleep(interval)
            interval = min(interval * 2, POLL_INTERVAL_MAX_S)

    def _wait_lease_lapsed(self, checkpoint_id: str, lapses_at_ts: float) -> None:
        """Poll until every participant is idle again after the lease of `checkpoint_id` lapsed (P10)."""
        deadline = max(lapses_at_ts - time.time(), 0.0) + self.settle_timeout_s + time.monotonic()
        interval = POLL_INTERVAL_MIN_S
        while True:
            statuses = self.control.status_all()
            phases = {name: (s["phase"], s.get("checkpoint_id")) for name, s in statuses.items()}
            if all(phase == ("idle", None) for phase in phases.values()):
                return
            if time.monotonic() > deadline:
                raise props.P10Violation(
                    rollout=None,
                    expected=f"every participant idle again once the lease of {checkpoint_id} lapsed",
                    observed=f"phases {phases} {time.time() - lapses_at_ts:.1f} s after it lapsed",
                )
            time.sleep(interval)
            interval = min(interval * 2, POLL_INTERVAL_MAX_S)

    def observe(self) -> Observation:
        calls: dict[str, tuple[ScriptCall, ...]] = {}
        waiting: dict[str, int] = {}
        for call in self.harness.backend.calls():  # type: ignore[union-attr]
            key = call.get("capture_key")
            if key is None:
                continue
            made = VERIFY if call.get("kind") == "judge" else call["n_messages"]
            calls[key] = (*calls.get(key, ()), made)
            if call.get("waiting"):
                waiting[key] = call["index"]
        return Observation(calls=calls, waiting=waiting, statuses=self.control.status_all())

    def _read_checkpoint(self, directory: Path, checkpoint_id: str) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for member in self.control.participants:
            try:
                read[member.name] = fingerprint(
                    participant_dir(directory, member.kind, member.name),
                    member.kind,
                    member.name,
                    checkpoint_id=checkpoint_id,
                )
            except CheckpointUnreadable as error:
                read[member.name] = error
        return read

    # -- settling: wait for the predicted quiet state, then check ------------------------------------------------

    def _settle(self, violation: type[PropertyViolation] | None = None, counts_final: bool = False) -> Observation:
        """Poll until the system shows what the model predicts; then check the history and the checkpoints.

        Calls, replies, refusals and phases are definite: a wrong one fails at once, a missing one is waited for.
        A participant's counts, marks and admission are judged only once nothing else is pending, and only when
        confirmed: by the step's own reply (`counts_final`: retire and forget free everything before they reply,
        reference section 10), or by a mismatch that outlived the whole settle timeout and one fresh poll.
        Slowness alone is never a verdict.
        """
        expected = expect(self.model)
        deadline = time.monotonic() + self.settle_timeout_s
        interval = POLL_INTERVAL_MIN_S
        while True:
            observation = self.observe()
            pending = self._pending(expected, observation)
            mismatches = self._status_mismatches(expected, observation)
            if not pending and not mismatches:
                break
            if not pending and (counts_final or time.monotonic() > deadline):
                fresh = self.observe()
                if not self._pending(expected, fresh) and self._status_mismatches(expected, fresh):
                    self._status_violation(expected, fresh, violation)
                observation = fresh
                if not self._status_mismatches(expected, fresh) and not self._pending(expected, fresh):
                    break
            if time.monotonic() > deadline:
                self._timed_out(expected, violation)
            time.sleep(interval)
            interval = min(interval * 2, POLL_INTERVAL_MAX_S)
        props.p2_no_reply_while_prepared(self.history)
        for checkpoint_id, before in self.fingerprints.items():
            props.p9_unchanged(
                checkpoint_id, before, self._read_checkpoint(self.harness.checkpoint_dir / checkpoint_id, checkpoint_id)
            )
        return observation

    def _pending(self, expected: Expectation, observation: Observation) -> list[str]:
        """What has not arrived yet; raises at once on what no amount of waiting can fix."""
        pending = [f"call of {key}" for key in props.p4_calls(expected.calls, observation.calls)]
        pending += [f"{key} waiting at the backend" for key in expected.waiting if key not in observation.waiting]
        pending += [f"{key} released" for key in observation.waiting if key not in expected.waiting]
        pending += self._pending_runs()
        for name, status in observation.statuses.items():
            props.p10_phase(name, (expected.phase, expected.checkpoint_id), status)
        return pending

    def _timed_out(self, expected: Expectation, violation: type[PropertyViolation] | None) -> None:
        """The whole settle timeout passed with something still pending; one fresh poll decides what it was.

        A participant whose admission contradicts the model (closed after a resume, open while prepared)
        explains whatever stalled behind it, so it is P10. A refusal that never came while the statuses show the
        request was taken in (an episode counted) is the step's own property. Anything else is a harness error
        that names what was predicted and what is still pending: slowness alone is never a verdict."""
        fresh = self.observe()
        pending = self._pending(expected, fresh)
        mismatches = self._status_mismatches(expected, fresh)
        admission = [item for item in mismatches if ADMISSION_MISMATCH in item]
        if admission:
            raise props.P10Violation(
                rollout=None,
                expected=_describe(expected),
                observed="; ".join(admission) + f" (still pending after {self.settle_timeout_s:g} s: {pending})",
            )
        if mismatches and pending and all(REFUSAL_PENDING in item for item in pending):
            raise (violation or props.P10Violation)(
                rollout=None, expected=_describe(expected), observed="; ".join(pending + mismatches)
            )
        raise QuiescenceTimeout(
            prediction=_describe(expected),
            observed=fresh.summary(),
            pending=pending + mismatches,
            timeout_s=self.settle_timeout_s,
        )

    def _status_mismatches(self, expected: Expectation, observation: Observation) -> list[str]:
        return [
            f"status of {name} {problem}"
            for name, status in observation.statuses.items()
            for problem in props.status_mismatches(expected, status)
        ]

    def _status_violation(
        self, expected: Expectation, observation: Observation, violation: type[PropertyViolation] | None
    ) -> None:
        """A confirmed status mismatch: a held response delivered while prepared is P2; otherwise the step's own
        property (P7 after retire and forget) or P10."""
        model_status = observation.statuses.get(self._model_server(), {})
        held = model_status.get("report", {}).get("counts", {}).get("held")
        if self.model.checkpoint_open and held != expected.held:
            props.p2_held_responses(self.model.open_checkpoint or "", expected.held, held)
        mismatches = self._status_mismatches(expected, observation)
        raise (violation or props.P10Violation)(
            rollout=None, expected=_describe(expected), observed="; ".join(mismatches)
        )

    def _pending_runs(self) -> list[str]:
        pending = []
        for attempt in self.model.attempts:
            outcome = self.outcomes.get(attempt.key)
            if attempt.status == "replied":
                if outcome is None:
                    pending.append(f"{attempt.key} reply")
                else:
                    props.p3_reply_complete(attempt.key, outcome.status_code, outcome.body, self.reward)
            elif attempt.status == "running" and outcome is not None and attempt.key not in self.must_refuse:
                self._unexpected_reply(attempt, outcome)
        for key in sorted(self.must_refuse):
            outcome = self.outcomes.get(key)
            if outcome is None:
                pending.append(f"{key} {REFUSAL_PENDING} after retire")
            elif outcome.error is None:
                props.p7_refused(key, outcome.status_code, outcome.body)
        for key in sorted(self.must_refuse_closed):
            outcome = self.outcomes.get(key)
            if outcome is None:
                pending.append(f"{key} {REFUSAL_PENDING} while a checkpoint is open")
            else:
                props.p10_admission_refused(key, outcome.status_code, outcome.body)
        return pending

    def _unexpected_reply(self, attempt: Attempt, outcome: RunOutcome) -> None:
        if outcome.error is not None:
            raise props.P3Violation(
                rollout=attempt.key, expected="the /run still running", observed=f"it failed: {outcome.error}"
            )
        if self.model.checkpoint_open:
            raise props.P2Violation(
                rollout=attempt.key,
                expected=f"no reply while {self.model.open_checkpoint} is open",
                observed=f"HTTP {outcome.status_code}: {outcome.body}",
            )
        violation = props.P4Violation if outcome.status_code == 200 else props.P3Violation
        raise violation(
            rollout=attempt.key,
            expected=f"the /run still running at call {attempt.calls_made} of {len(attempt.script)}",
            observed=f"it ended with HTTP {outcome.status_code}: {outcome.body}",
        )

    def _model_server(self) -> str:
        return next((m.name for m in self.control.participants if m.kind == "model"), "policy_model")

    # -- failure report ---------------------------------------------------------------------------------------

    def annotate(self, error: BaseException) -> None:
        """Attach the readable steps, the history tail, the server logs and how to replay."""
        if getattr(error, "_ckpt_annotated", False):
            return
        if self.stats is not None and self.stats.first_failure_s is None:
            self.stats.first_failure_s = time.monotonic() - self.stats.started_s
        error._ckpt_annotated = True  # type: ignore[attr-defined]
        error.add_note("Steps (model names):\n" + "\n".join(f"  {i}. {s}" for i, s in enumerate(self.steps, 1)))
        rollout = getattr(error, "rollout", None)
        events: list[Event] = list(self.history.events)
        if rollout:
            events = [e for e in events if e.process in (rollout, "controller")]
        error.add_note("History (last events):\n" + self.history.format(events, last=30))
        try:
            calls = self.observe().calls
        except Exception as observe_error:
            calls = {"unavailable": str(observe_error)}
        error.add_note(f"Backend calls (message counts per capture key): {calls}")
        error.add_note("Server log tails:\n" + self.harness.log_tails())
        error.add_note(
            "Reproduce: rerun the same pytest command; Hypothesis replays this example from its database "
            "(.hypothesis/), and prints @reproduce_failure(...) when print_blob is on (the ci and debug profiles)."
        )
        try:
            path = regression.write(self.harness, self.rule_calls, error)
        except OSError as write_error:
            error.add_note(f"Replay file not written: {write_error}")
        else:
            error.add_note(f"Replay without Hypothesis (survives code edits): python -m ckpt_model.regression {path}")


def _pick(items: list[Any], pick: int) -> Any:
    return items[pick % len(items)]


def _outcome_text(outcome: Any) -> Any:
    """A participant's answer as the history shows it: the reply, or the refusal's description."""
    return outcome.describe() if isinstance(outcome, ParticipantFailure) else outcome


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _describe(expected: Expectation) -> str:
    return (
        f"phase {expected.phase} ({expected.checkpoint_id}); calls {expected.calls}; "
        f"waiting {sorted(expected.waiting)}; "
        f"model inflight {expected.inflight} held {expected.held}; episodes {expected.episodes}; "
        f"sessions {expected.sessions}; resources sessions {expected.resources_sessions}; "
        f"restored_pending {list(expected.restored_pending)}; retired_rollouts {expected.retired_rollouts}; "
        f"admission {'open' if expected.accepting else 'closed'}"
    )


def machine_for(harness: Harness, stats: SearchStats | None = None) -> type[CheckpointMachine]:
    """Bind a harness to the machine (the class keeps its source, so Hypothesis's database key stays stable)."""
    CheckpointMachine.harness = harness
    CheckpointMachine.stats = stats
    return CheckpointMachine
