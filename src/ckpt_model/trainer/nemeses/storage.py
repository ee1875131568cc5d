"""Storage: a commit's write fails (a full or failing disk) or stalls past its deadline on one participant."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

from ckpt_model.deployments.faults import STALL, STALL_POINTS, STORAGE_FAILURES, STORAGE_POINTS
from ckpt_model.deployments.observe import poll
from ckpt_model.errors import ParticipantFailure, QuiescenceTimeout
from ckpt_model.model.contract import Attempt
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.controller import CONTROL_DEADLINE_S
from ckpt_model.trainer.pipeline import PICK, MachineBase, WriteFault, choose

STORAGE = Family(
    "storage",
    "a commit's write fails or stalls",
    4,
    goals=(
        goals.retry_goal(
            "failed_write_retried",
            "a failed write retried in its process",
            "storage_fault",
            True,
        ),
        goals.retry_goal(
            "failed_write_given_up",
            "a failed write given up by a resume",
            "storage_fault",
            False,
        ),
        goals.retry_goal(
            "stalled_write_retried",
            "a stalled write retried once it ended",
            "stalled_write",
            True,
        ),
        goals.retry_goal(
            "stalled_write_stopped",
            "a stalled write stopped by a resume",
            "stalled_write",
            False,
        ),
    ),
)

# A commit sent into a stalled write carries a deadline this close: it lapses while the write stands still, in
# about a second of the example's time, and far enough ahead that the request starts its write before it.
STALLED_COMMIT_DEADLINE_S = 1.0


class Storage(MachineBase):
    """The rules of the storage family (`STORAGE`)."""

    @action(
        lambda self: self._may_commit() and self.harness.faults.can_break_storage,
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
        at = choose(list(STORAGE_POINTS), point)
        self._write_fault(victim, at, errno, f"{errno} at {at}", then_retry, self._commit_meeting_storage)

    @action(
        lambda self: self._may_commit() and self.harness.faults.can_break_storage,
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
        at = choose(list(STALL_POINTS), point)
        label = f"{STALL} at {at}"
        self._write_fault(victim, at, STALL, label, then_retry, self._commit_meeting_storage, self._release_write)

    # -- the write's fault --------------------------------------------------------------------------------------

    def _commit_meeting_storage(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit of `scope` while `fault` waits in its write: a failure (ENOSPC, EIO) meets the write
        once; a stall holds it until `_release_write`, and the commit's deadline passes while it stalls
        (`_commit_stalled`). Returns the victim's refusal (None if it committed), once a stalled write stands at the
        stall."""
        self.harness.faults.break_storage(fault.victim, fault.point, fault.how)
        invocation = self.controller.invoke("storage fault", f"{fault.victim}: {fault.label}")
        self.controller.complete(invocation, "ok")
        if fault.how == STALL:
            return self._commit_stalled(fault, checkpoint_id, scope)
        refusal = self._commit_refusal(fault.victim, checkpoint_id, scope, CONTROL_DEADLINE_S)
        self.harness.faults.release_storage(fault.victim)  # a fault no write met must not meet a later one
        return refusal

    def _commit_stalled(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit, sent with a deadline `STALLED_COMMIT_DEADLINE_S` ahead (`Clocks.room`), whose write
        stalls: once it stands at the stall, the clocks pass the deadline (`Clocks.jump_to`; in real time where
        they are not the checker's), and the commit's answer comes. A commit that answers without its write ever
        reaching the stall (a writer that skips the stalled step) is returned as it is, for P16 to judge."""
        deadline_ts = self.harness.clocks.now() + self.harness.clocks.room(STALLED_COMMIT_DEADLINE_S)
        refusal = self.controller.runs.submit(
            self._commit_refusal, fault.victim, checkpoint_id, scope, 0.0, deadline_ts
        )
        stalled = "its write stands at the stall"
        self._wait_storage(fault, lambda state: state["stalled_at"] == fault.point or refusal.done(), stalled)
        self.harness.clocks.jump_to(deadline_ts)
        answer = refusal.result(timeout=CONTROL_DEADLINE_S)
        if answer is None:  # it committed, so its write never stood at the stall: P16 judges that, not a wait
            return answer
        self._wait_storage(fault, lambda state: state["stalled_at"] == fault.point, stalled)
        return answer

    def _release_write(self, fault: WriteFault) -> None:
        """Let the stalled write go on, and wait until it ended (published, failed or stopped)."""
        self.harness.faults.release_storage(fault.victim)
        self._wait_storage(fault, lambda state: state["writes"] == 0, "its stalled write ended once released")

    def _wait_storage(self, fault: WriteFault, condition: Callable[[dict[str, Any]], bool], prediction: str) -> None:
        """Until the victim's storage state (`Faults.storage_state`) meets `condition`."""
        timeout_s = self.quiescence.timeout_s
        if not poll(lambda: condition(self.harness.faults.storage_state(fault.victim)), timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{fault.victim} ({fault.label}): {prediction}",
                observed=self.harness.faults.storage_state(fault.victim),
                pending=[f"{fault.victim} storage"],
                timeout_s=timeout_s,
            )
