"""Pauses: one participant frozen (SIGSTOP) across a commit's deadline, a prepare's deadline or its lease."""

from __future__ import annotations

from hypothesis import strategies as st

from ckpt_model import checkable, goals
from ckpt_model import properties as props
from ckpt_model.deployment import (
    PAUSE,
)
from ckpt_model.errors import CoordinationError
from ckpt_model.families import Family
from ckpt_model.pipeline import PICK, MachineBase, choose, only_deadline_missed
from ckpt_model.steplog import action

PAUSES = Family("pauses", "a participant frozen (SIGSTOP) across a deadline or its lease", 4)
# A prepare whose lease a frozen participant outsleeps is due this soon (its lease then lapses a grace later): room
# for the prepare and the renewal of the others' leases that follows it, on a loaded machine too.
PAUSED_LEASE_DEADLINE_S = 2.0
# ... and it stays frozen this long past its lease, as a GC pause or a frozen VM outlasts it.
PAUSED_PAST_LEASE_S = 1.0


class Pauses(MachineBase):
    """The rules of the pauses family (`PAUSES`)."""

    @action(
        lambda self: self._may_commit() and self.harness.can_pause,
        family=PAUSES,
        needs=(checkable.PAUSE,),
        judges=("P16",),
        victim=PICK,
        then_retry=st.booleans(),
    )
    def paused_commit(self, victim: int, then_retry: bool) -> None:
        """One participant is frozen (SIGSTOP) while the others commit and its own commit's deadline passes; woken
        (SIGCONT), it must refuse that commit and stay prepared (P16); the controller retries or resumes."""
        self._write_fault(victim, (PAUSE,), 0, PAUSE, then_retry)

    @action(
        lambda self: self.harness.can_pause and self._may_checkpoint() and not self.ledgers.cuts,
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
        anew under a new ID, as after a failed close. (Never with generation cuts, as for a failed close.)"""
        name = choose(self.controller.members(), victim).name
        model, checkpoint_id = self.model.prepare()
        first = self.nemesis.prepare_paused(name, checkpoint_id)
        props.p21_refused_on_waking(checkpoint_id, name, first)
        props.p21_still_idle(checkpoint_id, name, self.harness.statuses()[name])
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
            and self.harness.can_pause
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
        deadline_ts = self.harness.now() + PAUSED_LEASE_DEADLINE_S
        verifying = [a.key for a in self.model.with_status("running") if a.verifying]
        try:
            outcome = self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if only_deadline_missed(error, [name, *others]):  # a slow machine: the short deadline passed first
                self.controller.resume(checkpoint_id)
                self._advance(model.resume(), f"prepare({checkpoint_id}) reached some past its deadline; resumed")
                return
            raise
        # As `prepare`: every rollout is at a boundary, so nothing may block (a prepare left unready until its
        # deadline would otherwise surface as the renewal's refusal once the leases lapsed).
        props.p10_prepared_everywhere(checkpoint_id, outcome.prepared, outcome.blockers, verifying, outcome.waited_s)
        self.controller.renew_on(others, checkpoint_id)
        lapses_at_ts = deadline_ts + self.harness.lease_grace_s
        self.nemesis.frozen_until(name, lapses_at_ts + PAUSED_PAST_LEASE_S)
        self.quiescence.wait_lapsed(name, checkpoint_id, lapses_at_ts)
        model = self._stale_commit(name, others, model, checkpoint_id, props.p21_lapsed_on_waking)
        self._advance(
            model,
            f"prepare({checkpoint_id}); {name} frozen past its lease, lapsed on waking; commit "
            "refused by it; resume, incomplete",
        )
