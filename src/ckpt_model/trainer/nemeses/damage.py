"""Damage: restores that must fail, of a copy with one share damaged or of a checkpoint a crash left incomplete.

How a share is damaged, in a copy beside the committed checkpoint, is `damaged_copies`.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from ckpt_model.model.contract import Checkpoint
from ckpt_model.properties.state import P8Violation
from ckpt_model.steps import checkable
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.nemeses import damaged_copies
from ckpt_model.trainer.pipeline import PICK, MachineBase, choose

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
        member, how, copy = self._damaged_copy(checkpoint, restore_id, rejected_record, victim)
        self._refused_restore(restore_id, checkpoint, ([member], f"damaged: {how}"), copy)
        label = f"failed_restore({checkpoint.checkpoint_id}) as {restore_id}, {member} damaged ({how}) refused it"
        self._advance(model, label, violation=P8Violation, counts_final=True)

    def _damaged_copy(
        self, checkpoint: Checkpoint, restore_id: str, rejected_record: bool, victim: int
    ) -> tuple[str, damaged_copies.Damage, Path]:
        """A copy of `checkpoint` beside it with one participant's share damaged (`damaged_copies`): whose (by
        `victim`, in name order) and how (`rejected_record`); returns the participant, the damage, the copy."""
        source = self.controller.directory(checkpoint.checkpoint_id)
        members = self.controller.members()
        member, how = damaged_copies.choose(source, members, checkpoint.exported, rejected_record, victim)
        destination = self.controller.directory(f"{restore_id}-damaged")
        copy = damaged_copies.damaged_copy(source, destination, member.kind, member.name, how, checkpoint.exported)
        return member.name, how, copy

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
        self._advance(model, label, violation=P8Violation, counts_final=True)
