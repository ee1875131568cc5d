"""Storage: a commit's write fails (a full or failing disk) or stalls past its deadline on one participant."""

from __future__ import annotations

from hypothesis import strategies as st

from ckpt_model import checkable
from ckpt_model.deployment import (
    STALL,
    STALL_POINTS,
    STORAGE_FAILURES,
    STORAGE_POINTS,
)
from ckpt_model.families import Family
from ckpt_model.pipeline import PICK, MachineBase
from ckpt_model.steplog import action

STORAGE = Family("storage", "a commit's write fails or stalls", 4)


class Storage(MachineBase):
    """The rules of the storage family (`STORAGE`)."""

    @action(
        lambda self: self._may_commit() and self.harness.can_break_storage,
        family=STORAGE,
        needs=(checkable.BREAK_STORAGE,),
        judges=("P16",),
        victim=PICK,
        point=PICK,
        errno=st.sampled_from(STORAGE_FAILURES),
        then_retry=st.booleans(),
    )
    def storage_fault(self, victim: int, point: int, errno: str, then_retry: bool) -> None:
        """The commit meets a full or failing disk (`errno`, for that one write) on one participant (P16); the
        controller then retries the commit in the same process, or resumes and leaves the checkpoint incomplete."""
        self._write_fault(victim, STORAGE_POINTS, point, errno, then_retry)

    @action(
        lambda self: self._may_commit() and self.harness.can_break_storage,
        family=STORAGE,
        needs=(checkable.BREAK_STORAGE,),
        judges=("P16",),
        victim=PICK,
        point=PICK,
        then_retry=st.booleans(),
    )
    def stalled_write(self, victim: int, point: int, then_retry: bool) -> None:
        """The commit's write stalls past its deadline on one participant (P16); the controller retries once the
        write went on and ended, or resumes while it stalls, and the stopped write must never publish."""
        self._write_fault(victim, STALL_POINTS, point, STALL, then_retry)
