"""The nemesis: Gym's faults as the machine draws them, each a real effect on real processes.

Every Gym process group SIGKILLed (with a power cut that keeps only what was fsynced), one server killed and
started again alone, a crash that lands inside a commit, a restore, a retire or a forget after it reached some
participants, and a participant held by a failpoint inside its own commit or restore; a commit whose write fails or
stalls, or whose participant is frozen (SIGSTOP) until its deadline passed; a call whose reply is lost after it ran;
a participant hook (close, export, install) that raises; a participant the controller cannot reach (its calls to it
refused on connect) while it runs on.
Each is journaled through the controller, so the watchers hear of every process that died, and each ends where the
model can predict it: every `/run` the crash cut off has ended, the calls it left waiting at the backend are
released, and a frozen participant runs again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ckpt_model import damage
from ckpt_model.contract import Attempt, Checkpoint, Model
from ckpt_model.controller import CONTROL_DEADLINE_S, Controller, episodes_keyed, episodes_of, outcomes_text
from ckpt_model.coordination import Participant
from ckpt_model.deployment import (
    EXPORT_HOOK,
    FAILPOINT_BETWEEN_FILES,
    PAUSE,
    STALL,
    Harness,
)
from ckpt_model.errors import CoordinationError, ParticipantFailure, QuiescenceTimeout
from ckpt_model.history import Event
from ckpt_model.quiescence import poll
from ckpt_model.topologies import SERVER_WORKER_KINDS
from ckpt_model.wire import RETIRE_ORDER

T = TypeVar("T")

# A commit sent into a stalled write carries a deadline this close: it lapses while the write stands still, in
# about a second of the example's time, and far enough ahead that the request starts its write before it.
STALLED_COMMIT_DEADLINE_S = 1.0
# A call sent to a frozen participant (a commit, a prepare) carries a deadline this close; it wakes once it passed.
PAUSED_DEADLINE_S = 0.5


@attrs.frozen
class HeldCommit:
    """A commit sent to one participant that a failpoint holds between its records file and its manifest."""

    name: str
    invocation: Event
    answer: Future[Any]


@attrs.frozen
class WriteFault:
    """What one participant's commit meets: a storage fault `how` (ENOSPC, EIO, stall) at `point` of its write,
    (`how` PAUSE) its process frozen until the commit's deadline passed, or (`how` EXPORT_HOOK) its export hook
    raising."""

    victim: str
    point: str
    how: str

    @property
    def label(self) -> str:
        if self.how == PAUSE:
            return "pause across its deadline"
        if self.how == EXPORT_HOOK:
            return "failing export hook"
        return f"{self.how} at {self.point}"


class Nemesis:
    """Crashes and failpoints, journaled through the controller; counts what it did for the search statistics."""

    def __init__(self, harness: Harness, controller: Controller) -> None:
        self.harness = harness
        self.controller = controller
        self.crashes = 0
        self.crashes_inside = 0

    @property
    def timeout_s(self) -> float:
        return self.controller.quiescence.timeout_s

    def crash(self, *, inside: bool = False, power_loss: bool = False) -> None:
        """SIGKILL every Gym process group and start fresh processes (the backend and the disk survive)."""
        invocation = self.controller.invoke("crash", "power loss" if power_loss else None)
        self.crashes += 1
        self.crashes_inside += inside
        self.harness.crash(power_loss)
        self.controller.crashed(tuple(self.controller.control.participants), invocation)
        self.controller.runs.wait_ended(self.timeout_s)
        self.controller.release_stale()

    def restart(self, member: Participant) -> None:
        """SIGKILL one participant alone and start it again: it comes back idle and empty."""
        invocation = self.controller.invoke("crash", member.name)
        self.harness.restart_server(member.name)
        self.controller.crashed((member,), invocation)

    def kill_worker(self, member: Participant, index: int) -> None:
        """SIGKILL worker `index` of `member`'s server alone: its coordinator and the other workers run on, and
        remember the marks and resumed IDs (the coordinator keeps them)."""
        invocation = self.controller.invoke("kill worker", f"{member.name}: worker {index}")
        self.harness.kill_worker(member.name, index)
        self.controller.complete(invocation, "ok")

    def killable_workers(self, model: Model) -> list[Participant]:
        """The participants whose server runs several workers (the environment, agent and resources servers), when
        the model lets one worker die now."""
        if not self.harness.can_kill_workers or self.harness.control is None or not model.worth_killing_a_worker():
            return []
        return [m for m in self.controller.members() if m.kind in SERVER_WORKER_KINDS]

    # -- crashes inside an operation --------------------------------------------------------------------------

    def hold_inside_commit(self, name: str, checkpoint_id: str, scope: Sequence[Attempt]) -> HeldCommit:
        """Send `name` its commit with a failpoint armed between its two files; return once its work stands there."""
        self.harness.arm_failpoint(name, FAILPOINT_BETWEEN_FILES)
        directory = str(self.controller.directory(checkpoint_id))
        episodes = episodes_of(scope)
        body = self.controller.body("commit", checkpoint_id, checkpoint_dir=directory, episode_ids=episodes)
        invocation = self.controller.invoke("commit", checkpoint_id, checkpoint_id=checkpoint_id)
        post = self.controller.control.post_each
        answer = self.controller.runs.submit(post, "commit", body, body["deadline_ts"], [name])
        if not poll(lambda: self.harness.failpoint_reached(name, FAILPOINT_BETWEEN_FILES), self.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{name}'s commit stops between its records file and its manifest",
                observed="it never got there" + (f": {answer.result()}" if answer.done() else ""),
                pending=[f"{name} at {FAILPOINT_BETWEEN_FILES}"],
                timeout_s=self.timeout_s,
            )
        return HeldCommit(name, invocation, answer)

    def ended_by_crash(self, held: HeldCommit) -> None:
        """The held commit's answer once the crash ended it: indeterminate (`info`)."""
        outcomes = held.answer.result(timeout=CONTROL_DEADLINE_S)
        self.controller.complete(held.invocation, "info", outcomes_text(outcomes))

    def crash_inside_restore(self, restore_id: str, source: str, exported: Iterable[str], reached: int) -> list[str]:
        """A restore of `source` reaches its first `reached` participants (modulo their number, in name order,
        each alone), each of which must answer it; then everything crashes. Returns the names reached."""
        scope = episodes_keyed(exported)
        directory = str(self.controller.directory(source))
        body = self.controller.body("restore", restore_id, checkpoint_dir=directory, episode_ids=scope)
        members = self.controller.members()
        stages = [[m.name] for m in members[: reached % len(members)]]
        return self._crash_inside("restore", restore_id, body, stages, source=source, episodes=tuple(scope))

    def crash_inside_retire(self, retire_id: str, lost: Attempt, reached: int) -> list[str]:
        """A retire of `lost` reaches the first `reached` stages of the retire order (callers before callees)."""
        episodes = episodes_of([lost])
        body = self.controller.body("retire", retire_id, episode_ids=episodes)
        stages = self._retire_stages(reached)
        return self._crash_inside("retire", retire_id, body, stages, episodes=tuple(episodes))

    def crash_inside_forget(self, forget_id: str, rollouts: Sequence[str], reached: int) -> list[str]:
        """A forget of `rollouts` reaches the first `reached` stages of the retire order."""
        body = self.controller.body("forget", forget_id, rollout_ids=rollouts)
        return self._crash_inside("forget", forget_id, body, self._retire_stages(reached))

    def _crash_inside(
        self, operation: str, operation_id: str, body: dict[str, Any], stages: list[list[str]], **event: Any
    ) -> list[str]:
        reached: list[str] = []
        for names in stages:
            self.controller.send_each(operation, operation_id, body, names, **event)
            reached += names
        self.crash(inside=True)
        return reached

    def _retire_stages(self, reached: int) -> list[list[str]]:
        participants = self.controller.control.participants
        order = [[m.name for m in participants.of_kinds(kinds)] for kinds in RETIRE_ORDER]
        return order[: reached % len(order)]

    def damaged_copy(
        self, checkpoint: Checkpoint, restore_id: str, rejected_record: bool, victim: int
    ) -> tuple[str, damage.Damage, Path]:
        """A copy of `checkpoint` beside it with one participant's share damaged (`ckpt_model.damage`): whose
        (by `victim`, in name order) and how (`rejected_record`); returns the participant, the damage, the copy."""
        source = self.controller.directory(checkpoint.checkpoint_id)
        member, how = damage.choose(source, self.controller.members(), checkpoint.exported, rejected_record, victim)
        destination = self.controller.directory(f"{restore_id}-damaged")
        copy = damage.damaged_copy(source, destination, member.kind, member.name, how, checkpoint.exported)
        return member.name, how, copy

    # -- storage that fails or stalls ---------------------------------------------------------------------------

    def commit_meeting(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit of `scope` while `fault` waits in its write: a failure (ENOSPC, EIO) meets the write
        once; a stall holds it until `release_write`, and the commit's deadline passes while it stalls
        (`_commit_stalled`). Returns the victim's refusal (None if it committed), once a stalled write stands at the
        stall."""
        if fault.how == PAUSE:
            return self._commit_paused(fault, checkpoint_id, scope)
        if fault.how == EXPORT_HOOK:
            self.fail_hook(fault.victim, "export")
            return self._refusal(fault.victim, checkpoint_id, scope, CONTROL_DEADLINE_S)
        self.harness.break_storage(fault.victim, fault.point, fault.how)
        invocation = self.controller.invoke("storage fault", f"{fault.victim}: {fault.label}")
        self.controller.complete(invocation, "ok")
        if fault.how == STALL:
            return self._commit_stalled(fault, checkpoint_id, scope)
        refusal = self._refusal(fault.victim, checkpoint_id, scope, CONTROL_DEADLINE_S)
        self.harness.release_storage(fault.victim)  # a fault no write met must not meet a later one
        return refusal

    def _commit_stalled(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit, sent with a deadline `STALLED_COMMIT_DEADLINE_S` ahead (`Harness.room`), whose write
        stalls: once it
        stands at the stall, the clocks pass the deadline (`Harness.jump_to`; in real time where they are not the
        checker's), and the commit's answer comes. A commit that answers without its write ever reaching the stall
        (a writer that skips the stalled step) is returned as it is, for P16 to judge."""
        deadline_ts = self.harness.now() + self.harness.room(STALLED_COMMIT_DEADLINE_S)
        refusal = self.controller.runs.submit(self._refusal, fault.victim, checkpoint_id, scope, 0.0, deadline_ts)
        stalled = "its write stands at the stall"
        self._wait_storage(fault, lambda state: state["stalled_at"] == fault.point or refusal.done(), stalled)
        self.harness.jump_to(deadline_ts)
        answer = refusal.result(timeout=CONTROL_DEADLINE_S)
        if answer is None:  # it committed, so its write never stood at the stall: P16 judges that, not a wait
            return answer
        self._wait_storage(fault, lambda state: state["stalled_at"] == fault.point, stalled)
        return answer

    def _commit_paused(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit, read by it only once frozen past the commit's deadline (`frozen_past`)."""

        def send(deadline_ts: float) -> Future[Any]:
            commit = functools.partial(self.controller.commit_on, deadline_ts=deadline_ts)
            return self.controller.runs.submit(commit, [fault.victim], checkpoint_id, scope)

        try:
            self.frozen_past(fault.victim, send).result(timeout=CONTROL_DEADLINE_S)
        except CoordinationError as error:
            return error.failures.get(fault.victim)
        return None

    def prepare_paused(self, victim: str, checkpoint_id: str) -> CoordinationError | None:
        """A prepare of `checkpoint_id` as the controller sends it, which `victim` reads only once frozen past the
        prepare's deadline (`frozen_past`): its error, or None if every participant prepared."""

        def attempt(deadline_ts: float) -> CoordinationError | None:
            try:
                self.controller.prepare_by(checkpoint_id, deadline_ts)
            except CoordinationError as error:
                return error
            return None

        future = self.frozen_past(victim, lambda deadline_ts: self.controller.runs.submit(attempt, deadline_ts))
        return future.result(timeout=CONTROL_DEADLINE_S)

    def frozen_past(self, victim: str, send: Callable[[float], Future[T]]) -> Future[T]:
        """Freeze `victim` (SIGSTOP), `send` a call whose deadline is `PAUSED_DEADLINE_S` ahead (`Harness.room`), wait
        until the controller's clock passed it, and let the victim go on (SIGCONT): it reads the call only then. The
        deadline is fixed here, not in the thread that sends the call: the victim must go on only once this very
        deadline passed (a deadline taken later in a slow thread once let a commit start with time left).

        Where the checker owns time, the wait is a jump (`Harness.jump_to`): the victim's clock jumps past the
        deadline just before it freezes (the clock a frozen process wakes to; it can take no jump while stopped,
        and one given after SIGCONT could come after the call), and the rest of the system's once the call was sent
        to it (a staged prepare reaches the participants before it with their clocks where they were)."""
        deadline_ts = self.harness.now() + self.harness.room(PAUSED_DEADLINE_S)
        passed_s = self.harness.passed_at(deadline_ts)
        if self.harness.owns_time:
            self.harness.jump_one(victim, passed_s)
        self.freeze(victim)
        try:
            sent_before, calls_before = self._calls_to(victim), len(self.controller.control.control_calls())
            future = send(deadline_ts)
            if self.harness.owns_time:
                self._wait_sent(victim, sent_before, future)
                self._wait_others_answered(victim, calls_before)
                self.harness.pass_until(passed_s)
            self._wait_clock_past(deadline_ts, f"the deadline of the call {victim} reads once it goes on", victim)
        finally:
            self.go_on(victim)
        return future

    def _calls_to(self, victim: str) -> int:
        return sum(call.participant == victim for call in self.controller.control.control_calls())

    def _wait_sent(self, victim: str, sent_before: int, future: Future[Any]) -> None:
        """Until the controller sent `victim` a call more than `sent_before`, or the call ended without it."""
        if not poll(lambda: self._calls_to(victim) > sent_before or future.done(), self.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"the controller sends {victim} its call while it is frozen",
                observed="it never did",
                pending=[f"{victim} frozen"],
                timeout_s=self.timeout_s,
            )

    def _wait_others_answered(self, victim: str, calls_before: int) -> None:
        """Until every call sent with the victim's (the participants of its stage) was answered: the jump that
        follows must find none of them still reading its clock against the deadline (on `mixed`, a participant
        of the victim's kind then refused the prepare too, in 1 to 2 of 10 runs). A call that never answers (its
        connection failed) ends the wait at the timeout, and the jump comes all the same."""

        def answered() -> bool:
            sent = self.controller.control.control_calls()[calls_before:]
            return all(call.answered for call in sent if call.participant != victim)

        poll(answered, self.timeout_s)

    def frozen_until(self, victim: str, until_ts: float) -> None:
        """Freeze `victim` (SIGSTOP) until the controller's clock passed `until_ts`, then let it go on (SIGCONT):
        whatever timer of its fell due meanwhile fires as it wakes (where the checker owns time, the clocks jump to
        `until_ts`, and the victim's as it goes on: `Harness.continue_server`)."""
        self.freeze(victim)
        try:
            self._wait_clock_past(until_ts, "the end of its lease", victim)
        finally:
            self.go_on(victim)

    def freeze(self, victim: str) -> None:
        """SIGSTOP `victim`'s process group (returns once every process of it is stopped); journaled."""
        self.harness.pause_server(victim)
        invocation = self.controller.invoke("pause", victim)
        self.controller.complete(invocation, "ok")

    def go_on(self, victim: str) -> None:
        """SIGCONT `victim`'s process group. Journaled first: once it goes on, the answer of a call it holds is
        journaled from the thread that waits for it."""
        invocation = self.controller.invoke("continue", victim)
        self.controller.complete(invocation, "ok")
        self.harness.continue_server(victim)

    def _wait_clock_past(self, when_ts: float, what: str, victim: str) -> None:
        """Until the controller's clock passed `when_ts`: at once where the checker owns time (its clocks jump
        there), else in real time."""
        self.harness.jump_to(when_ts)
        if not poll(lambda: self.harness.now() > when_ts, self.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"the clock passes {what} while {victim} is frozen",
                observed=f"the controller's clock {self.harness.now():.3f}, then {when_ts:.3f}",
                pending=[f"{victim} frozen"],
                timeout_s=self.timeout_s,
            )

    def _refusal(
        self,
        victim: str,
        checkpoint_id: str,
        scope: Sequence[Attempt],
        deadline_s: float,
        deadline_ts: float | None = None,
    ) -> ParticipantFailure | None:
        """The victim's commit of `scope` (due in `deadline_s`, or at `deadline_ts`): its refusal, or None if it
        committed."""
        try:
            self.controller.commit_on([victim], checkpoint_id, scope, deadline_s, deadline_ts)
        except CoordinationError as error:
            return error.failures.get(victim)
        return None

    # -- hooks that fail ----------------------------------------------------------------------------------------

    def fail_hook(self, victim: str, hook: str) -> None:
        """Make `victim`'s next call of its `hook` (close, export, install) raise; journaled."""
        self.harness.fail_hook(victim, hook)
        invocation = self.controller.invoke("hook fault", f"{victim}: {hook}")
        self.controller.complete(invocation, "ok")

    def release_write(self, fault: WriteFault) -> None:
        """Let the stalled write go on, and wait until it ended (published, failed or stopped)."""
        self.harness.release_storage(fault.victim)
        self._wait_storage(fault, lambda state: state["writes"] == 0, "its stalled write ended once released")

    def _wait_storage(self, fault: WriteFault, condition: Any, prediction: str) -> None:
        if not poll(lambda: condition(self.harness.storage_state(fault.victim)), self.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{fault.victim} ({fault.label}): {prediction}",
                observed=self.harness.storage_state(fault.victim),
                pending=[f"{fault.victim} storage"],
                timeout_s=self.timeout_s,
            )
