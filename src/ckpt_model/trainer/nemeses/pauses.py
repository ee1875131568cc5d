"""Pauses: one participant frozen (SIGSTOP) across a commit's deadline, a prepare's deadline or its lease, and let
go on (SIGCONT) once the clock passed it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from hypothesis import strategies as st

from ckpt_model.deployments.faults import PAUSE
from ckpt_model.deployments.observe import poll
from ckpt_model.errors import CoordinationError, ParticipantFailure, QuiescenceTimeout
from ckpt_model.model.contract import Attempt
from ckpt_model.properties.clocks import p21_lapsed_on_waking, p21_refused_on_waking, p21_still_idle
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.controller import CONTROL_DEADLINE_S
from ckpt_model.trainer.pipeline import PICK, MachineBase, WriteFault, choose, only_deadline_missed

T = TypeVar("T")


def paused_lease_reached(step: goals.Step) -> bool:
    """A participant frozen past its lease, judged to the end: it lapsed on waking and refused the commit (a
    prepare that missed its short deadline judges neither)."""
    return step.rule == "paused_lease" and any("lapsed on waking" in label for label in step.labels)


PAUSES = Family(
    "pauses",
    "a participant frozen (SIGSTOP) across a deadline or its lease",
    4,
    goals=(
        goals.retry_goal(
            "paused_commit_retried",
            "a commit paused past its deadline, retried",
            "paused_commit",
            True,
        ),
        goals.retry_goal(
            "paused_commit_given_up",
            "a commit paused past its deadline, given up",
            "paused_commit",
            False,
        ),
        *(
            goals.retry_goal(
                f"paused_prepare_{outcome}",
                f"a prepare a frozen participant read past its deadline, {'then a new one' if retried else 'given up'}",
                "paused_prepare",
                retried,
                applies=goals.without_cuts,
            )
            for outcome, retried in (("retried", True), ("given_up", False))
        ),
        goals.Goal(
            "paused_lease_lapsed", "a participant frozen past its lease, lapsed on waking", paused_lease_reached
        ),
    ),
)
# A call sent to a frozen participant (a commit, a prepare) carries a deadline this close; it wakes once it passed.
# Where the checker owns time, the deadline has this room instead (`Clocks.room`), less than other rules': a
# prepare whose first stage is frozen parks no episode, and where time jumps (monotonic clocks too) every jump past
# it spends the running episodes' budgets, a rule that may be drawn in every step of an example.
PAUSED_DEADLINE_S = 0.5
FROZEN_ROOM_S = 5.0
# A prepare whose lease a frozen participant outsleeps is due this soon (its lease then lapses a grace later): room
# for the prepare and the renewal of the others' leases that follows it, on a loaded machine too.
PAUSED_LEASE_DEADLINE_S = 2.0
# ... and it stays frozen this long past its lease, as a GC pause or a frozen VM outlasts it.
PAUSED_PAST_LEASE_S = 1.0


class Pauses(MachineBase):
    """The rules of the pauses family (`PAUSES`)."""

    @action(
        lambda self: self._may_commit() and self.harness.faults.can_pause,
        family=PAUSES,
        needs=(checkable.PAUSE,),
        judges=("P16",),
        victim=PICK,
        then_retry=st.booleans(),
    )
    def paused_commit(self, victim: int, then_retry: bool) -> None:
        """One participant is frozen (SIGSTOP) while the others commit and its own commit's deadline passes; woken
        (SIGCONT), it must refuse that commit and stay prepared (P16); the controller retries or resumes."""
        self._write_fault(victim, PAUSE, PAUSE, "pause across its deadline", then_retry, self._commit_paused)

    @action(
        lambda self: self.harness.faults.can_pause and self._may_checkpoint_anew() and not self.ledgers.cuts,
        family=PAUSES,
        needs=(checkable.PAUSE, checkable.NO_CUTS),
        judges=("P21",),
        applies=goals.without_cuts,
        victim=PICK,
        then_retry=st.booleans(),
    )
    def paused_prepare(self, victim: int, then_retry: bool) -> None:
        """One participant is frozen (SIGSTOP) while a prepare reaches it, until the prepare's deadline passed; woken
        (SIGCONT), it refuses it with deadline_exceeded and stays idle (P21). The participants that took the prepare
        hold a lease of its short deadline, which may lapse before a retry of the same ID could reach them, so the
        controller gives the ID up: it resumes, which fences the ID everywhere (P10), and with `then_retry` prepares
        anew under a new ID, as after a failed close. (Never with generation cuts, as for a failed close.) A
        checkpoint open before it is resumed first."""
        self._resumed_first()
        name = choose(self.controller.members(), victim).name
        model, checkpoint_id = self.model.prepare()
        first = self._prepare_paused(name, checkpoint_id)
        p21_refused_on_waking(checkpoint_id, name, first)
        p21_still_idle(checkpoint_id, name, self.harness.statuses()[name])
        self.controller.resume(checkpoint_id)
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(
            model.resume(),
            f"prepare({checkpoint_id}), {name} frozen past its deadline; resume({checkpoint_id}); "
            f"prepare({checkpoint_id}) refused",
        )
        if then_retry:
            self.prepare()

    @action(
        lambda self: (
            not self.model.tried.pause_lapse
            and self.harness.faults.can_pause
            and self.controller.may_lapse
            and self._may_checkpoint()
        ),
        family=PAUSES,
        needs=(checkable.PAUSE, checkable.LEASE_LAPSES),
        judges=("P10", "P21"),
        victim=PICK,
    )
    def paused_lease(self, victim: int) -> None:
        """One participant is frozen (SIGSTOP) across its lease while the controller renews the others'; woken
        (SIGCONT), it lapses at once, so the controller's commit is refused by it alone and never published (P21);
        the controller resumes, and the checkpoint stays incomplete."""
        name = choose(self.controller.members(), victim).name
        others = [m.name for m in self.controller.members() if m.name != name]
        model, checkpoint_id = self.model.having_tried(pause_lapse=True).prepare()
        deadline_ts = self.harness.clocks.now() + self.harness.clocks.room(PAUSED_LEASE_DEADLINE_S)
        judge = self._judge_prepare(checkpoint_id)
        try:
            outcome = self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if only_deadline_missed(error, [name, *others]):  # a slow machine: the short deadline passed first
                self._not_reached("paused_lease", "the prepare reached some past its deadline, so no lease lapsed")
                self.controller.resume(checkpoint_id)
                self._advance(model.resume(), f"prepare({checkpoint_id}) reached some past its deadline; resumed")
                return
            raise
        # As `prepare`: every rollout is at a boundary, so nothing may block (a prepare left unready until its
        # deadline would otherwise surface as the renewal's refusal once the leases lapsed).
        judge(outcome)
        self.controller.renew_on(others, checkpoint_id)
        lapses_at_ts = deadline_ts + self.harness.spec.lease_grace_s
        self._frozen_until(name, lapses_at_ts + PAUSED_PAST_LEASE_S)
        self.quiescence.wait_lapsed(name, checkpoint_id, lapses_at_ts)
        model = self._stale_commit(name, others, model, checkpoint_id, p21_lapsed_on_waking)
        self._advance(
            model,
            f"prepare({checkpoint_id}); {name} frozen past its lease, lapsed on waking; commit "
            "refused by it; resume, incomplete",
        )

    # -- a participant frozen past a deadline -------------------------------------------------------------------

    def _commit_paused(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit, read by it only once frozen past the commit's deadline (`_frozen_past`)."""

        def send(deadline_ts: float) -> Future[Any]:
            commit = functools.partial(self.controller.commit_on, deadline_ts=deadline_ts)
            return self.controller.runs.submit(commit, [fault.victim], checkpoint_id, scope)

        try:
            self._frozen_past(fault.victim, send).result(timeout=CONTROL_DEADLINE_S)
        except CoordinationError as error:
            return error.failures.get(fault.victim)
        return None

    def _prepare_paused(self, victim: str, checkpoint_id: str) -> CoordinationError | None:
        """A prepare of `checkpoint_id` as the controller sends it, which `victim` reads only once frozen past the
        prepare's deadline (`_frozen_past`): its error, or None if every participant prepared."""

        def attempt(deadline_ts: float) -> CoordinationError | None:
            try:
                self.controller.prepare_by(checkpoint_id, deadline_ts)
            except CoordinationError as error:
                return error
            return None

        (frozen,) = self.controller.named([victim])
        stage = [
            member.name for member in self.controller.control.participants.of_kind(frozen.kind) if member != frozen
        ]
        future = self._frozen_past(
            victim, lambda deadline_ts: self.controller.runs.submit(attempt, deadline_ts), sent_with_it=stage
        )
        return future.result(timeout=CONTROL_DEADLINE_S)

    def _frozen_past(
        self, victim: str, send: Callable[[float], Future[T]], sent_with_it: Sequence[str] = ()
    ) -> Future[T]:
        """Freeze `victim` (SIGSTOP), `send` a call whose deadline is `PAUSED_DEADLINE_S` ahead (`Clocks.room`), wait
        until the controller's clock passed it, and let the victim go on (SIGCONT): it reads the call only then. The
        deadline is fixed here, not in the thread that sends the call: the victim must go on only once this very
        deadline passed (a deadline taken later in a slow thread once let a commit start with time left).

        Where the checker owns time, the wait is a jump (`Clocks.jump_to`): the victim's clock jumps past the
        deadline just before it freezes (the clock a frozen process wakes to; it can take no jump while stopped,
        and one given after SIGCONT could come after the call), and the rest of the system's once the call was sent
        to it (a staged prepare reaches the participants before it with their clocks where they were)."""
        deadline_ts = self.harness.clocks.now() + self.harness.clocks.room(PAUSED_DEADLINE_S, FROZEN_ROOM_S)
        passed_s = self.harness.clocks.passed_at(deadline_ts)
        if self.harness.clocks.owns_time:
            self.harness.clocks.jump_one(victim, passed_s)
        self._freeze(victim)
        try:
            sent_before, calls_before = self._calls_to(victim), len(self.controller.control.control_calls())
            future = send(deadline_ts)
            if self.harness.clocks.owns_time:
                self._wait_sent(victim, sent_before, future)
                self._wait_others_answered(victim, calls_before, sent_with_it)
                self.harness.clocks.pass_until(passed_s)
            self._wait_clock_past(deadline_ts, f"the deadline of the call {victim} reads once it goes on", victim)
        finally:
            self._go_on(victim)
        return future

    def _calls_to(self, victim: str) -> int:
        return sum(call.participant == victim for call in self.controller.control.control_calls())

    def _wait_sent(self, victim: str, sent_before: int, future: Future[Any]) -> None:
        """Until the controller sent `victim` a call more than `sent_before`, or the call ended without it."""
        timeout_s = self.quiescence.timeout_s
        if not poll(lambda: self._calls_to(victim) > sent_before or future.done(), timeout_s):
            raise QuiescenceTimeout(
                prediction=f"the controller sends {victim} its call while it is frozen",
                observed="it never did",
                pending=[f"{victim} frozen"],
                timeout_s=timeout_s,
            )

    def _wait_others_answered(self, victim: str, calls_before: int, sent_with_it: Sequence[str]) -> None:
        """Until every call sent with the victim's was answered, each of `sent_with_it` (the participants of its
        stage) among them: the jump that follows must find none of them still reading its clock against the
        deadline (on `mixed`, a participant of the victim's kind then refused the prepare too, in 1 to 2 of 10
        runs; and under the nightly's load, once, one whose call was not yet sent when the wait looked). A call
        that never answers (its connection failed) ends the wait at the timeout, and the jump comes all the same."""

        def answered() -> bool:
            sent = [
                call for call in self.controller.control.control_calls()[calls_before:] if call.participant != victim
            ]
            return all(call.answered for call in sent) and set(sent_with_it) <= {call.participant for call in sent}

        poll(answered, self.quiescence.timeout_s)

    def _frozen_until(self, victim: str, until_ts: float) -> None:
        """Freeze `victim` (SIGSTOP) until the controller's clock passed `until_ts`, then let it go on (SIGCONT):
        whatever timer of its fell due meanwhile fires as it wakes (where the checker owns time, the clocks jump to
        `until_ts`, and the victim's as it goes on: `Faults.continue_server`)."""
        self._freeze(victim)
        try:
            self._wait_clock_past(until_ts, "the end of its lease", victim)
        finally:
            self._go_on(victim)

    def _freeze(self, victim: str) -> None:
        """SIGSTOP `victim`'s process group (returns once every process of it is stopped); journaled."""
        self.harness.faults.pause_server(victim)
        invocation = self.controller.invoke("pause", victim)
        self.controller.complete(invocation, "ok")

    def _go_on(self, victim: str) -> None:
        """SIGCONT `victim`'s process group. Journaled first: once it goes on, the answer of a call it holds is
        journaled from the thread that waits for it."""
        invocation = self.controller.invoke("continue", victim)
        self.controller.complete(invocation, "ok")
        self.harness.faults.continue_server(victim)

    def _wait_clock_past(self, when_ts: float, what: str, victim: str) -> None:
        """Until the controller's clock passed `when_ts`: at once where the checker owns time (its clocks jump
        there), else in real time."""
        self.harness.clocks.jump_to(when_ts)
        timeout_s = self.quiescence.timeout_s
        if not poll(lambda: self.harness.clocks.now() > when_ts, timeout_s):
            raise QuiescenceTimeout(
                prediction=f"the clock passes {what} while {victim} is frozen",
                observed=f"the controller's clock {self.harness.clocks.now():.3f}, then {when_ts:.3f}",
                pending=[f"{victim} frozen"],
                timeout_s=timeout_s,
            )
