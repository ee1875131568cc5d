"""Damage: restores that must fail, of a copy with one share damaged or of a checkpoint a crash left incomplete."""

from __future__ import annotations

from hypothesis import strategies as st

from ckpt_model import checkable
from ckpt_model import properties as props
from ckpt_model.families import Family
from ckpt_model.pipeline import PICK, MachineBase, choose
from ckpt_model.steplog import action

DAMAGE = Family("damage", "restores that must fail: a damaged copy or an incomplete checkpoint", 3)


class Damage(MachineBase):
    """The rules of the damage family (`DAMAGE`)."""

    @action(
        lambda self: self._may_restore(),
        family=DAMAGE,
        needs=(checkable.FRESH,),
        judges=("P8",),
        mechanisms=("rejected_record",),
        pick=PICK,
        victim=PICK,
        rejected_record=st.booleans(),
    )
    def failed_restore(self, pick: int, victim: int, rejected_record: bool) -> None:
        """Restore a copy of a committed checkpoint with one participant's share damaged: it alone refuses (P8).
        Processes that served something are crashed first."""
        self._crash_unless_fresh()
        checkpoint = choose(list(self.model.committed), pick)
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        member, how, copy = self.nemesis.damaged_copy(checkpoint, restore_id, rejected_record, victim)
        self._refused_restore(restore_id, checkpoint, ([member], f"damaged: {how}"), copy)
        label = f"failed_restore({checkpoint.checkpoint_id}) as {restore_id}, {member} damaged ({how}) refused it"
        self._advance(model, label, violation=props.P8Violation, counts_final=True)

    @action(
        lambda self: self.model.can_restore_incomplete() or (self._may_crash_first() and bool(self.model.incomplete)),
        family=DAMAGE,
        needs=(checkable.FRESH,),
        judges=("P8",),
        pick=PICK,
    )
    def restore_incomplete(self, pick: int) -> None:
        """Restore a checkpoint whose commit a crash cut short: those without a share refuse it (P8). Processes that
        served something are crashed first."""
        self._crash_unless_fresh()
        checkpoint = choose(list(self.model.incomplete), pick)
        missing = [m.name for m in self.controller.control.participants if m.name not in checkpoint.shares]
        self._forget_covering(checkpoint.checkpoint_id, incomplete=True)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        self._refused_restore(restore_id, checkpoint, (missing, "no share: the crash came first"))
        label = f"restore_incomplete({checkpoint.checkpoint_id}) as {restore_id}, refused by {missing}"
        self._advance(model, label, violation=props.P8Violation, counts_final=True)
