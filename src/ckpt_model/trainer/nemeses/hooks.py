"""Hooks: one participant's close, export or install hook raises."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from ckpt_model.deployments.faults import EXPORT_HOOK
from ckpt_model.errors import CoordinationError, ParticipantFailure
from ckpt_model.model.contract import Attempt
from ckpt_model.properties.fencing import p10_failed_close_refused, p10_reopened_after_failed_close
from ckpt_model.properties.state import P8Violation
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.controller import CONTROL_DEADLINE_S
from ckpt_model.trainer.pipeline import PICK, MachineBase, WriteFault, choose

HOOKS = Family(
    "hooks",
    "a participant's close, export or install hook raises",
    4,
    goals=(
        goals.retry_goal(
            "failed_close_retried",
            "a close that failed after closing, then a new prepare",
            "failing_close",
            True,
            applies=goals.without_cuts,
        ),
        goals.retry_goal(
            "failed_export_retried",
            "an export hook that raised, then the commit retried",
            "failing_export",
            True,
        ),
        goals.retry_goal(
            "failed_export_given_up",
            "an export hook that raised, then a resume",
            "failing_export",
            False,
        ),
    ),
)


class Hooks(MachineBase):
    """The rules of the hooks family (`HOOKS`)."""

    @action(
        lambda self: self._may_commit() and self.harness.faults.can_fail_hooks,
        family=HOOKS,
        needs=(checkable.FAIL_HOOKS,),
        judges=("P16",),
        victim=PICK,
        then_retry=st.booleans(),
    )
    def failing_export(self, victim: int, then_retry: bool) -> None:
        """As `storage_fault`, with the victim's export hook raising instead (P16: 500 checkpoint_error); the
        retry must export afresh, since the first export never returned."""
        self._write_fault(victim, EXPORT_HOOK, EXPORT_HOOK, "failing export hook", then_retry, self._export_failing)

    @action(
        lambda self: self.harness.faults.can_fail_hooks and self._may_checkpoint() and not self.ledgers.cuts,
        family=HOOKS,
        needs=(checkable.FAIL_HOOKS, checkable.NO_CUTS),
        applies=goals.without_cuts,
        victim=PICK,
        then_retry=st.booleans(),
    )
    def failing_close(self, victim: int, then_retry: bool) -> None:
        """A prepare in which one participant's close of admission fails after it closed: that participant alone
        refuses (500), idle with admission open again (P10); the controller resumes, and with `then_retry` prepares
        again under a new ID. (Never with generation cuts: a cut round of the failed prepare would be judged as the
        next one's.)"""
        name = choose(self.controller.members(), victim).name
        model, checkpoint_id = self.model.prepare()
        self._fail_hook(name, "close")
        try:
            self.controller.prepare(checkpoint_id)
            refused = None
        except CoordinationError as error:
            refused = error
        p10_failed_close_refused(checkpoint_id, name, refused)
        p10_reopened_after_failed_close(checkpoint_id, name, self.harness.statuses()[name])
        self.controller.resume(checkpoint_id)
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(model.resume(), f"prepare({checkpoint_id}), {name}'s close failed; resume({checkpoint_id})")
        if then_retry:
            self.prepare()

    @action(
        lambda self: self.harness.faults.can_fail_hooks and self._may_restore(),
        family=HOOKS,
        needs=(checkable.FAIL_HOOKS, checkable.FRESH),
        judges=("P8",),
        pick=PICK,
        victim=PICK,
    )
    def failing_install(self, pick: int, victim: int) -> None:
        """Restore a committed checkpoint while one participant's install hook fails having installed nothing: it
        alone refuses (500 checkpoint_error), and the cleanup leaves nothing behind (P8). Processes that served
        something are crashed first."""
        self._crash_unless_fresh()
        checkpoint = choose(list(self.model.committed), pick)
        name = choose(self.controller.members(), victim).name
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        self._fail_hook(name, "install")
        self._refused_restore(restore_id, checkpoint, ([name], "its install hook failed"), code="checkpoint_error")
        label = f"failing_install({checkpoint.checkpoint_id}) as {restore_id}, {name}'s install hook failed"
        self._advance(model, label, violation=P8Violation, counts_final=True)

    # -- a hook that raises -------------------------------------------------------------------------------------

    def _fail_hook(self, victim: str, hook: str) -> None:
        """Make `victim`'s next call of its `hook` (close, export, install) raise; journaled."""
        self.harness.faults.fail_hook(victim, hook)
        invocation = self.controller.invoke("hook fault", f"{victim}: {hook}")
        self.controller.complete(invocation, "ok")

    def _export_failing(
        self, fault: WriteFault, checkpoint_id: str, scope: Sequence[Attempt]
    ) -> ParticipantFailure | None:
        """The victim's commit of `scope`, its export hook set to raise: its refusal, or None if it committed."""
        self._fail_hook(fault.victim, "export")
        return self._commit_refusal(fault.victim, checkpoint_id, scope, CONTROL_DEADLINE_S)
