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
from ckpt_model.deployment import Harness
from ckpt_model.errors import CoordinationError, HarnessError, PropertyViolation, QuiescenceTimeout
from ckpt_model.history import Event, History
from ckpt_model.storage import CheckpointUnreadable, fingerprint, participant_dir
from ckpt_model.tasks import legacy_run_body, native_run_body
from ckpt_model.wire import EpisodeId

CONTROL_DEADLINE_S = 20.0
# A prepare the model knows will not become ready waits this long for its blockers, then reports them.
BLOCKED_PREPARE_DEADLINE_S = 0.25
SETTLE_TIMEOUT_S = 10.0
SETTLE_POLL_S = 0.002
COUNT_GRACE_S = 1.0
COUNT_PREFIX = "status of "
PICK = st.integers(min_value=0, max_value=7)
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
        self.retired_attempts: dict[str, Attempt] = {}
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
        key = self.model.current()[rollout].key
        index = self._observe().waiting.get(key)
        if index is None:
            raise QuiescenceTimeout(prediction=f"{key} waits at the backend", observed="it does not", pending=[key])
        self.harness.backend.release([index])  # type: ignore[union-attr]
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
        """Prepare a new checkpoint: everything is at a boundary, so every stage must become prepared. A prepare
        of another ID is then refused with checkpoint_conflict (P10: one checkpoint at a time)."""
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
        self.history.note("controller", "prepared", checkpoint_id)
        other = f"other{model.checkpoint_seq}"
        self._refused_prepare(other, "checkpoint_conflict")
        self._advance(model, f"prepare() -> {checkpoint_id}; prepare({other}) refused")

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
        self._control("resume", checkpoint_id, lambda d: self.control.resume(checkpoint_id, d))
        self._advance(model, f"prepare_blocked() -> {checkpoint_id} blocked by {blockers}; resume({checkpoint_id})")
        for key in blockers:
            self._retire(EpisodeId.from_capture_key(key).rollout_id, again=True)

    @precondition(lambda self: self.model.phase == "prepared")
    @rule()
    @step
    def commit(self) -> None:
        """Commit every unfinished attempt (running, or restored and not yet started) and check P1 and P9."""
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
        self.fingerprints[checkpoint_id] = self._read_checkpoint(directory)
        model, _ = self.model.commit()
        self._advance(model, f"commit() -> {checkpoint_id} exports {sorted(a.key for a in scope)}")

    @precondition(lambda self: self.model.checkpoint_open)
    @rule()
    @step
    def resume(self) -> None:
        """End the open checkpoint: admission re-opens and held responses are delivered. A prepare naming the
        resumed ID is then refused with stale_checkpoint (P10: a delayed prepare never re-opens it)."""
        checkpoint_id = self.model.open_checkpoint
        assert checkpoint_id is not None
        self._control("resume", checkpoint_id, lambda d: self.control.resume(checkpoint_id, d))
        self._refused_prepare(checkpoint_id, "stale_checkpoint")
        self._advance(self.model.resume(), f"resume({checkpoint_id}); prepare({checkpoint_id}) refused")

    @precondition(lambda self: not self.model.fresh)
    @rule()
    @step
    def crash(self) -> None:
        """SIGKILL every Gym process group and start fresh processes; the backend and the disk survive."""
        self.history.invoke("controller", "crash")
        self.crashes += 1
        self.harness.crash()
        self._wait_runs_ended()
        stale = sorted(self._observe().waiting.values())
        if stale:
            self.harness.backend.release(stale)  # type: ignore[union-attr]
        self.retired_attempts.clear()
        self._advance(self.model.crash(), "crash()")

    @precondition(lambda self: self.model.can_restore())
    @rule(pick=PICK)
    @step
    def restore(self, pick: int) -> None:
        """Restore the latest or an earlier checkpoint into the fresh processes, then resume."""
        checkpoint = _pick(list(self.model.committed), pick)
        model, restore_id = self.model.restore(checkpoint.checkpoint_id)
        scope = [EpisodeId.from_capture_key(key) for key in checkpoint.exported]
        directory = str(self.harness.checkpoint_dir / checkpoint.checkpoint_id)
        self._control("restore", restore_id, lambda d: self.control.restore(restore_id, directory, scope, d))
        self._control("resume", restore_id, lambda d: self.control.resume(restore_id, d))
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
        self._control("retire", retire_id, lambda d: self.control.retire(retire_id, [episode], d))
        if attempt.status == "running":
            self.must_refuse.add(attempt.key)
        self.retired_attempts[rollout] = attempt
        model = self.model.retire(rollout)
        label = f"retire({rollout}) of {attempt.key}"
        if again:
            model = model.start_over(rollout)
            self._send_run(model.current()[rollout])
            label += f", then start_over as {model.current()[rollout].key}"
        self._advance(model, label, violation=props.P7Violation)

    @precondition(lambda self: not self.model.checkpoint_open and bool(self.model.retired_marks))
    @rule()
    @step
    def forget(self) -> None:
        """Forget every retired rollout: the marks go everywhere."""
        rollouts = list(self.model.retired_marks)
        self.retire_seq += 1
        forget_id = f"forget{self.retire_seq}"
        self._control("forget", forget_id, lambda d: self.control.forget(forget_id, rollouts, d))
        self.retired_attempts.clear()
        self._advance(self.model.forget(), f"forget({rollouts})", violation=props.P7Violation)

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
        self._check_clean_end()

    def _check_clean_end(self) -> None:
        observation = self._observe()
        for name, status in observation.statuses.items():
            leftovers = {k: v for k, v in status["report"]["counts"].items() if v and k not in ("cut_skipped",)}
            dirty = status["phase"] != "idle" or status.get("retired_rollouts") or leftovers
            dirty = dirty or status.get("restored_pending") or status.get("retired_sessions")
            if dirty:
                raise props.P13Violation(
                    rollout=None,
                    expected=f"{name} idle with nothing left after the drain",
                    observed={k: status.get(k) for k in ("phase", "retired_rollouts", "restored_pending")}
                    | {"counts": status["report"]["counts"], "retired_sessions": status.get("retired_sessions")},
                )

    # -- the machinery ----------------------------------------------------------------------------------------

    @property
    def control(self) -> Any:
        return self.harness.control

    def _advance(self, model: Model, label: str, violation: type[PropertyViolation] | None = None) -> None:
        self.model = model
        self.steps.append(label)
        self._settle(violation=violation)

    def _control(self, operation: str, checkpoint_id: str, call: Callable[[float], Any]) -> Any:
        invocation = self.history.invoke("controller", operation, checkpoint_id)
        try:
            result = call(time.time() + CONTROL_DEADLINE_S)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            raise
        self.history.complete(invocation, "ok")
        return result

    def _refused_prepare(self, checkpoint_id: str, code: str) -> None:
        invocation = self.history.invoke("controller", "prepare", checkpoint_id)
        try:
            self.control.prepare(checkpoint_id, time.time() + CONTROL_DEADLINE_S)
        except CoordinationError as error:
            self.history.complete(invocation, "fail", str(error))
            props.p10_refused(f"prepare({checkpoint_id})", code, error)
            return
        self.history.complete(invocation, "ok")
        props.p10_refused(f"prepare({checkpoint_id})", code, None)

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

    def _observe(self) -> Observation:
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

    def _read_checkpoint(self, directory: Path) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for member in self.control.participants:
            try:
                read[member.name] = fingerprint(
                    participant_dir(directory, member.kind, member.name), member.kind, member.name
                )
            except CheckpointUnreadable as error:
                read[member.name] = error
        return read

    # -- settling: wait for the predicted quiet state, then check ------------------------------------------------

    def _settle(self, violation: type[PropertyViolation] | None = None) -> Observation:
        """Poll until the system shows what the model predicts; then check the history and the checkpoints.

        Calls, replies and waits may take up to `settle_timeout_s`. Status counts change in the same process
        step as the calls and replies already observed, so once only counts differ they get `COUNT_GRACE_S`.
        """
        expected = expect(self.model)
        deadline = time.monotonic() + self.settle_timeout_s
        counts_deadline: float | None = None
        while True:
            observation = self._observe()
            pending = self._pending(expected, observation)
            if not pending:
                break
            now = time.monotonic()
            if all(item.startswith(COUNT_PREFIX) for item in pending):
                counts_deadline = counts_deadline or now + COUNT_GRACE_S
            else:
                counts_deadline = None
            if now > deadline or (counts_deadline is not None and now > counts_deadline):
                self._timed_out(expected, observation, pending, violation)
            time.sleep(SETTLE_POLL_S)
        props.p2_no_reply_while_prepared(self.history)
        for checkpoint_id, before in self.fingerprints.items():
            props.p9_unchanged(
                checkpoint_id, before, self._read_checkpoint(self.harness.checkpoint_dir / checkpoint_id)
            )
        return observation

    def _pending(self, expected: Expectation, observation: Observation) -> list[str]:
        """What has not arrived yet; raises at once on what no amount of waiting can fix."""
        pending = [f"call of {key}" for key in props.p4_calls(expected.calls, observation.calls)]
        pending += [f"{key} waiting at the backend" for key in expected.waiting if key not in observation.waiting]
        pending += [f"{key} released" for key in observation.waiting if key not in expected.waiting]
        pending += self._pending_runs()
        for name, status in observation.statuses.items():
            if (status["phase"], status.get("checkpoint_id")) != self._expected_phase(expected):
                raise props.P10Violation(
                    rollout=None,
                    expected=f"{name} in phase {self._expected_phase(expected)}",
                    observed=f"{name} in phase {(status['phase'], status.get('checkpoint_id'))}",
                )
            pending += [f"{COUNT_PREFIX}{name} {what}" for what in _count_mismatches(expected, status)]
        return pending

    def _expected_phase(self, expected: Expectation) -> tuple[str, str | None]:
        return expected.phase, expected.checkpoint_id

    def _pending_runs(self) -> list[str]:
        pending = []
        for attempt in self.model.attempts:
            outcome = self.outcomes.get(attempt.key)
            if attempt.status == "replied":
                if outcome is None:
                    pending.append(f"{attempt.key} reply")
                else:
                    props.p3_reply_complete(attempt.key, outcome.status_code, outcome.body, 1.0)
            elif attempt.status == "running" and outcome is not None and attempt.key not in self.must_refuse:
                self._unexpected_reply(attempt, outcome)
        for key in sorted(self.must_refuse):
            outcome = self.outcomes.get(key)
            if outcome is None:
                pending.append(f"{key} refused after retire")
            elif outcome.error is None:
                props.p7_refused(key, outcome.status_code, outcome.body)
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

    def _timed_out(
        self,
        expected: Expectation,
        observation: Observation,
        pending: list[str],
        violation: type[PropertyViolation] | None,
    ) -> None:
        held = observation.statuses.get(self._model_server(), {}).get("report", {}).get("counts", {}).get("held")
        if self.model.checkpoint_open and held != expected.held:
            props.p2_held_responses(self.model.open_checkpoint or "", expected.held, held)
        if violation is not None and any(item.startswith(COUNT_PREFIX) for item in pending):
            raise violation(rollout=None, expected=_describe(expected), observed="; ".join(pending))
        if all(item.startswith(COUNT_PREFIX) for item in pending):
            # Calls, replies and phases all arrived; a participant's counts still disagree with the model, so it
            # holds state (or lacks it) that the contract does not explain.
            raise props.P10Violation(rollout=None, expected=_describe(expected), observed="; ".join(pending))
        raise QuiescenceTimeout(
            prediction=_describe(expected),
            observed=observation.summary(),
            pending=pending,
            timeout_s=self.settle_timeout_s,
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
            calls = self._observe().calls
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


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _count_mismatches(expected: Expectation, status: dict[str, Any]) -> list[str]:
    counts = status["report"]["counts"]
    wanted: dict[str, int] = {}
    if status["kind"] == "environment":
        wanted["episodes"] = expected.episodes
    elif status["kind"] == "agent":
        wanted["sessions"] = expected.sessions
    elif status["kind"] == "model":
        wanted.update(inflight=expected.inflight, held=expected.held)
    problems = [f"counts {k}={counts.get(k)} (expected {v})" for k, v in wanted.items() if counts.get(k) != v]
    if status.get("retired_rollouts") != expected.retired_rollouts:
        problems.append(f"retired_rollouts={status.get('retired_rollouts')} (expected {expected.retired_rollouts})")
    if status["kind"] == "environment" and tuple(status.get("restored_pending", ())) != expected.restored_pending:
        problems.append(
            f"restored_pending={status.get('restored_pending')} (expected {list(expected.restored_pending)})"
        )
    return problems


def _describe(expected: Expectation) -> str:
    return (
        f"phase {expected.phase} ({expected.checkpoint_id}); calls {expected.calls}; "
        f"waiting {sorted(expected.waiting)}; "
        f"model inflight {expected.inflight} held {expected.held}; episodes {expected.episodes}; "
        f"sessions {expected.sessions}; restored_pending {list(expected.restored_pending)}; "
        f"retired_rollouts {expected.retired_rollouts}"
    )


def machine_for(harness: Harness, stats: SearchStats | None = None) -> type[CheckpointMachine]:
    """Bind a harness to the machine (the class keeps its source, so Hypothesis's database key stays stable)."""
    CheckpointMachine.harness = harness
    CheckpointMachine.stats = stats
    return CheckpointMachine
