"""Lost replies: a prepare, commit or resume runs in full on one participant and its reply is lost on the wire."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import strategies as st

from ckpt_model.errors import CoordinationError
from ckpt_model.model.contract import Attempt
from ckpt_model.properties.network import p17_only_reply_lost, p17_resume_replayed, p17_retry_answered, p17_took_effect
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.pipeline import PICK, MachineBase, choose


def lost_reply_reached(operation: str, retried: bool) -> Callable[[goals.Step], bool]:
    """A reply to `operation` lost, then the same call sent again (`retried`) or a resume instead; the step's
    label names the call whose reply was lost (the rule's `operation` argument only picks among those allowed)."""

    def reached(step: goals.Step) -> bool:
        if step.rule != "lost_reply" or bool(step.arguments.get("then_retry")) != retried:
            return False
        return any(label.startswith(f"{operation}(") and "reply lost" in label for label in step.labels)

    reached.__doc__ = f"A lost {operation} reply, then {'retried' if retried else 'resumed'}."
    return reached


LOST_REPLIES = Family(
    "lost_replies",
    "a control call's reply lost after it ran",
    4,
    goals=tuple(
        goals.Goal(
            f"lost_{op}_{outcome}",
            f"a lost {op} reply, {'retried' if retried else 'given up by a resume'}",
            lost_reply_reached(op, retried),
            applies=goals.one_sided(op),
            rule="lost_reply",
            pins=(("then_retry", retried),),
        )
        for op in ("prepare", "commit", "resume")
        for outcome, retried in (("retried", True), ("given_up", False))
    ),
)


class LostReplies(MachineBase):
    """The rules of the lost replies family (`LOST_REPLIES`)."""

    @action(
        lambda self: self.harness.faults.can_lose_replies and bool(self._one_sided()),
        family=LOST_REPLIES,
        needs=(checkable.LOSE_REPLIES,),
        judges=("P17",),
        victim=PICK,
        operation=PICK,
        then_retry=st.booleans(),
    )
    def lost_reply(self, victim: int, operation: int, then_retry: bool) -> None:
        """One participant runs a prepare, commit or resume in full and its reply is lost on the wire (an `info`
        outcome); the call took effect there (P17), and the controller then retries it (answered from the record)
        or resumes."""
        name = choose(self.controller.members(), victim).name
        lost = choose(self._one_sided(), operation)
        {"prepare": self._lost_prepare, "commit": self._lost_commit, "resume": self._lost_resume}[lost](
            name, then_retry
        )

    def _lost_prepare(self, name: str, then_retry: bool) -> None:
        model, checkpoint_id = self.model.prepare()
        self._reply_lost(name, "prepare", checkpoint_id)
        p17_took_effect("prepare", checkpoint_id, name, self.harness.statuses()[name])
        label = f"prepare({checkpoint_id}), {name}'s reply lost"
        if not then_retry:
            self._prepare_given_up(model, checkpoint_id, label)
            return
        self._prepare_again(checkpoint_id, lambda error: p17_retry_answered("prepare", checkpoint_id, error))
        self._advance(model, f"{label}; prepare retried")

    def _lost_commit(self, name: str, then_retry: bool) -> None:
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        self._reply_lost(name, "commit", checkpoint_id, scope)
        published = self.audits.has_manifest(checkpoint_id, name)
        p17_took_effect("commit", checkpoint_id, name, self.harness.statuses()[name], published)
        label = f"commit({checkpoint_id}), {name}'s reply lost"
        if then_retry:
            try:
                replies = self.controller.commit(checkpoint_id, scope)
            except CoordinationError as error:
                p17_retry_answered("commit", checkpoint_id, error)
            self.audits.commit(self.model, checkpoint_id, replies)
            model, _ = self.model.commit()
            label += "; commit retried"
        else:
            # The controller never saw the commit succeed, so it never publishes the checkpoint: whole on disk,
            # it is left unused; every share must still verify (P9).
            self.controller.resume(checkpoint_id)
            published_by = self.audits.published_after_crash(checkpoint_id)
            whole = published_by == {m.name for m in self.controller.members()}
            model = self.model.resume() if whole else self.model.commit_failed(published_by)
            label += f"; resume({checkpoint_id}), left unpublished"
        self._advance(model, label)

    def _lost_resume(self, name: str, then_retry: bool) -> None:
        if not self.model.checkpoint_open:
            self.prepare()
        checkpoint_id = self.model.opened
        self._reply_lost(name, "resume", checkpoint_id)
        p17_took_effect("resume", checkpoint_id, name, self.harness.statuses()[name])
        label = f"resume({checkpoint_id}), {name}'s reply lost"
        if then_retry:
            replies = self.controller.resume(checkpoint_id)
            p17_resume_replayed(checkpoint_id, name, replies[name])
            label += "; resume retried"
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(self.model.resume(), f"{label}; prepare({checkpoint_id}) refused")

    def _reply_lost(
        self, victim: str, operation: str, checkpoint_id: str, scope: Sequence[Attempt] = ()
    ) -> CoordinationError:
        """Send `operation` of `checkpoint_id` as the controller does while `victim` is set to lose its reply after
        running it; the call's error, in which only the victim's reply is missing (P17)."""
        self.harness.faults.lose_reply(victim, operation)
        invocation = self.controller.invoke("lose reply", f"{victim}: {operation}")
        self.controller.complete(invocation, "ok")
        error = self.controller.unanswered(operation, checkpoint_id, scope, self._judge_prepare(checkpoint_id))
        p17_only_reply_lost(operation, checkpoint_id, victim, error)
        return error
