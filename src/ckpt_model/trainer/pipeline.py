"""What every rule of the machine shares: the pipeline a step ends in (adopt the model's next value, then settle
and audit: `MachineBase._advance`), the probes and retries the protocol's rules and the nemeses both play, the
commit that meets a fault on one participant (`MachineBase._write_fault`, which three families play, each making
its own fault), and the draws they share (`PICK`, `WORKER`).

`MachineBase` is the base of every nemesis family (`ckpt_model.trainer.nemeses`) and so of `machine.CheckpointMachine`,
which mounts them; it imports no family and not the machine, so none of them imports the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from ckpt_model.deployments.faults import LOSABLE_OPERATIONS
from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import CoordinationError, HarnessError, ParticipantFailure, PropertyViolation
from ckpt_model.model.contract import Attempt, Checkpoint, Model
from ckpt_model.properties.state import P7Violation
from ckpt_model.protocol.history import History
from ckpt_model.steps.steplog import StepLog
from ckpt_model.trainer.audits import Audits
from ckpt_model.trainer.callees import Callees
from ckpt_model.trainer.controller import Controller, Prepared
from ckpt_model.trainer.kills import Nemesis
from ckpt_model.trainer.ledger_watch import LedgerWatch
from ckpt_model.trainer.quiescence import Quiescence

# Who must refuse a restore, and why; the property a step's settle judges by.
Refused = tuple[list[str], str]
Violation = type[PropertyViolation]
PICK = st.integers(min_value=0, max_value=7)


@attrs.frozen
class WriteFault:
    """A fault one participant's commit meets (`MachineBase._write_fault`), as its family makes it: `how` the victim
    must refuse the commit (a key of P16's `WRITE_REFUSAL`), at `point` of its write, said in words as `label`."""

    victim: str
    point: str
    how: str
    label: str


# How a family sends the victim's commit of a scope into its fault: the victim's refusal, or None if it committed.
Meeting = Callable[[WriteFault, str, Sequence[Attempt]], ParticipantFailure | None]
# How a family lets a write its fault holds (a stall) go on, returning once the write ended.
Release = Callable[[WriteFault], None]


def _worker_choice(machine: MachineBase) -> st.SearchStrategy[int]:
    """A worker to serve a new attempt's requests on every multi-worker server; with nothing to place, 0, drawn
    from nothing. (The argument itself still reorders Hypothesis's draws on every deployment: the same seed plays
    other examples than before.)"""
    harness = machine.harness
    return st.integers(0, harness.workers - 1) if harness.places_calls else st.just(0)


# The worker is drawn from the machine itself (Hypothesis hands a stateful test's runner to `st.runner()`).
WORKER = st.runner().flatmap(_worker_choice)


class MachineBase(RuleBasedStateMachine):
    """What the protocol's rules and every nemesis family play with, and the steps they share.

    The machine (`machine.CheckpointMachine`) builds these parts in its `__init__`; here they are only declared.
    The protocol rules a family also plays (a fault that needs a checkpoint prepares one first) are declared for the
    type checker alone: defined here at run time they would be rules without a precondition or a rule marker
    shadowed by the machine's, and a Protocol for `self` would restate every part above once more."""

    harness: Harness
    model: Model
    history: History
    quiescence: Quiescence
    ledgers: LedgerWatch
    controller: Controller
    nemesis: Nemesis
    callees: Callees
    audits: Audits
    log: StepLog
    # What a rule meant to reach and did not, in the order its steps ran: the branch a rule allows on a slow machine
    # (a prepare that missed its short deadline, so no lease lapsed and no time passed), which a random search may
    # take and a fixed scenario must not (`ckpt_model.search.scenarios.run` raises `SituationNotReached`).
    missed: list[str]

    if TYPE_CHECKING:

        def crash(self) -> None: ...

        def prepare(self) -> None: ...

        def restore(self, pick: int) -> None: ...

        def resume(self) -> None: ...

        def retire(self, pick: int, again: bool, worker: int = 0) -> None: ...

    def _not_reached(self, rule: str, why: str) -> None:
        """`rule` took the branch that skips its situation (`why`): recorded for a fixed scenario to refuse."""
        self.missed.append(f"{rule}: {why}")

    def _may_crash_first(self) -> bool:
        """Whether a restore-like rule may crash the processes first, to restore into fresh ones: they have served
        something since they started, and the deployment can crash them. Such a rule, which would otherwise wait for
        a crash to be drawn just before it, is then enabled whenever there is a checkpoint to restore."""
        return self.harness.can_crash and not self.model.fresh

    def _may_restore(self) -> bool:
        """Whether a rule that restores a committed checkpoint may be drawn: into fresh processes now, or after
        crashing them first (`_may_crash_first`, `_crash_unless_fresh`)."""
        return self.model.can_restore() or (self._may_crash_first() and bool(self.model.committed))

    def _crash_unless_fresh(self) -> None:
        if not self.model.fresh:
            self.crash()

    def _advance(
        self, model: Model, label: str, violation: Violation | None = None, counts_final: bool = False
    ) -> None:
        """Adopt the model's next value, then wait for the quiet state it predicts and audit the step."""
        self.model = model
        self.log.labels.append(label)
        self.quiescence.settle(self.model, violation, counts_final)
        self.controller.placement.audit()
        self.audits.after_step(self.model, self.history)

    def _refused(self, operation: str, checkpoint_id: str, code: str, names: list[str] | None = None) -> None:
        """`operation` naming `checkpoint_id`, sent to each participant (or those `names`), is refused with `code`."""
        outcomes = self.controller.probe(operation, checkpoint_id, names)
        self.audits.refused(f"{operation}({checkpoint_id})", code, outcomes)

    def _refused_past_deadline(self, operation: str, checkpoint_id: str, **arguments: Any) -> None:
        """`operation` of `checkpoint_id` (with the arguments the controller is about to send), its deadline passed
        a second ago, is refused by every participant with `deadline_exceeded` (P10); the call that follows sees
        nothing of it."""
        outcomes = self.controller.probe_past_deadline(operation, checkpoint_id, **arguments)
        self.audits.refused(f"{operation}({checkpoint_id}) past its deadline", "deadline_exceeded", outcomes)

    def _may_checkpoint(self) -> bool:
        """With a gated backend a checkpoint needs some rollout unfinished (one with nothing in flight checks
        little beyond fencing); without a gate checkpoints are all that is left to check."""
        return self.model.can_prepare() and (self.harness.backend is None or bool(self.model.live()))

    def _may_commit(self) -> bool:
        """A checkpoint is prepared, or one may be: a rule that commits prepares first when none is open, as the
        controller's routine does (`checkpoint`), so its fault is one step deep instead of two."""
        return self.model.phase == "prepared" or self._may_checkpoint()

    def _may_checkpoint_anew(self) -> bool:
        """A checkpoint may be prepared now, or once the open one is resumed: a rule that must prepare its own
        checkpoint resumes the open one first (`_resumed_first`), instead of waiting for a resume drawn before it
        (while a checkpoint is open, the families that need none are not on offer, so it would be drawn rarely)."""
        if self._may_checkpoint():
            return True
        if not self.model.checkpoint_open:
            return False
        resumed = self.model.resume()
        return resumed.can_prepare() and (self.harness.backend is None or bool(resumed.live()))

    def _resumed_first(self) -> None:
        if self.model.checkpoint_open:
            self.resume()

    def _prepared_first(self) -> None:
        if self.model.phase != "prepared":
            self.prepare()

    def _opened_first(self) -> None:
        """A rule that needs an open checkpoint prepares one first when none is (enabled then by `_may_checkpoint`),
        so it is one step deep instead of waiting for a prepare drawn before it."""
        if not self.model.checkpoint_open:
            self.prepare()

    def _may_retire(self) -> bool:
        """A live rollout may be retired: no checkpoint is open."""
        return not self.model.checkpoint_open and bool(self.model.live())

    def _prepare_given_up(self, model: Model, checkpoint_id: str, label: str) -> None:
        """The controller resumes a prepare it gave up on (`model`, as the prepare left it): every participant then
        refuses a prepare of its ID (P10)."""
        self.controller.resume(checkpoint_id)
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(model.resume(), f"{label}; resume({checkpoint_id}); prepare({checkpoint_id}) refused")

    def _judge_prepare(self, checkpoint_id: str) -> Callable[[Prepared], None]:
        """How a prepare of `checkpoint_id` the model says must succeed is judged when it ends not prepared (P10; an
        attempt in a `replay` verification never blocks, P11), as the `prepare` rule judges it."""
        verifying = [a.key for a in self.model.with_status("running") if a.verifying]
        return lambda outcome: self.audits.prepared_everywhere(checkpoint_id, verifying, outcome)

    def _prepared(self, checkpoint_id: str, replies: dict[str, Any]) -> None:
        """P1: the restarts are reported; P10: every participant refuses a prepare of another ID."""
        self.audits.prepared(self.model, checkpoint_id, replies)
        self._refused("prepare", f"other{self.model.checkpoint_seq + 1}", "checkpoint_conflict")

    def _write_fault(
        self,
        victim: int,
        point: str,
        how: str,
        says: str,
        then_retry: bool,
        meet: Meeting,
        release: Release | None = None,
    ) -> None:
        """The commit meets a fault (`how`, at `point`; `says` it in words) on one participant (by `victim`, in name
        order) while the others commit it: the family's `meet` sends the victim's commit into its fault, which the
        victim must refuse, staying prepared (P16); the controller then retries the commit in the same process, or
        resumes and leaves the checkpoint incomplete. A fault that holds the write (a stall) is let go by `release`:
        before the retry, after the resume, and before a verdict ends the step (a write left stalled would hold up
        the teardown's resume)."""
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        members = self.controller.members()
        name = choose(members, victim).name
        others = [m.name for m in members if m.name != name]
        fault = WriteFault(name, point, how, says)
        replies = self.controller.commit_on(others, checkpoint_id, scope) if others else {}
        self.audits.partial_commit(self.model, checkpoint_id, others, replies)
        refusal = meet(fault, checkpoint_id, scope)
        try:
            self.audits.write_refused(checkpoint_id, name, fault.label, how, refusal)
        except PropertyViolation:
            if release is not None:  # the violation is the verdict, whatever the release meets
                with contextlib.suppress(HarnessError):
                    release(fault)
            raise
        label = f"{name} meets a {fault.label} in commit {checkpoint_id}"
        if then_retry:
            if release is not None:
                release(fault)
            self._commit_again(
                checkpoint_id,
                scope,
                lambda error: self.audits.retried_commit_refused(checkpoint_id, fault.label, error),
            )
            self._advance(self.model.commit()[0], label + "; commit retried")
            return
        self.controller.resume(checkpoint_id)
        if release is not None:
            release(fault)
            self.audits.unpublished(checkpoint_id, name, "after a resume stopped its stalled write")
        self._left_incomplete(checkpoint_id, label)

    def _commit_refusal(
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

    def _commit_again(
        self, checkpoint_id: str, scope: list[Attempt], failed: Callable[[CoordinationError], None]
    ) -> dict[str, Any]:
        """The controller's retry of a commit some participant refused or never got; `failed` judges a refusal."""
        try:
            replies = self.controller.commit(checkpoint_id, scope)
        except CoordinationError as error:
            failed(error)
            raise
        self.audits.commit(self.model, checkpoint_id, replies)
        return replies

    def _prepare_again(self, checkpoint_id: str, failed: Callable[[CoordinationError], None]) -> Prepared:
        """The controller's retry of a prepare that one participant failed; `failed` judges a refusal. Judged as
        every prepare: prepared everywhere, and the refusals that follow (P10)."""
        try:
            outcome = self.controller.prepare(checkpoint_id)
        except CoordinationError as error:
            failed(error)
            raise
        self._judge_prepare(checkpoint_id)(outcome)
        self._prepared(checkpoint_id, outcome.replies)
        return outcome

    def _left_incomplete(self, checkpoint_id: str, label: str) -> None:
        """After a commit that did not complete and the controller's resume: the checkpoint stays, incomplete, with
        the shares that were published (each verifies, P9)."""
        published = self.audits.published_after_crash(checkpoint_id)
        model = self.model.commit_failed(published)
        self._advance(model, f"{label}; resume({checkpoint_id}), incomplete with the shares of {sorted(published)}")

    def _stale_commit(
        self,
        name: str,
        others: list[str],
        model: Model,
        checkpoint_id: str,
        judge: Callable[[str, str, CoordinationError | None], None],
    ) -> Model:
        """The controller's commit once `name` alone lapsed (every other lease renewed): `judge` says it refused it
        alone; the `others`' shares are whole (P1, P9), and the controller resumes, the checkpoint incomplete."""
        try:
            self.controller.commit(checkpoint_id, model.scope())
            refused = None
        except CoordinationError as error:
            refused = error
        judge(checkpoint_id, name, refused)
        assert refused is not None
        self.audits.partial_commit(model, checkpoint_id, others, refused.replies)
        self.controller.resume(checkpoint_id)
        return model.commit_failed(self.audits.published_after_crash(checkpoint_id))

    def _one_sided(self) -> list[str]:
        """The calls that can fail on one participant now, by a lost reply or a partition (a commit or a resume
        prepares first when no checkpoint is open). A prepare only without generation cuts: the cut rounds a retried
        prepare must account for are those of its first call, which the journal cannot attribute."""
        allowed = {
            "prepare": self._may_checkpoint() and not self.ledgers.cuts,
            "commit": self._may_commit(),
            "resume": self.model.checkpoint_open or self._may_checkpoint(),
        }
        return [operation for operation in LOSABLE_OPERATIONS if allowed[operation]]

    def _refused_restore(
        self,
        restore_id: str,
        source: Checkpoint,
        refused: Refused,
        copy: Path | None = None,
        code: str = "invalid_checkpoint_state",
    ) -> None:
        """Restore what exactly the participants `refused` names cannot install (and why, from `copy` or the
        checkpoint's own directory), each refusing with `code`; P8 on their refusals and the cleanup."""
        refusers, why = refused
        try:
            self.controller.restore(restore_id, source.checkpoint_id, source.exported, copy)
        except CoordinationError as error:
            self.audits.refused_restore(restore_id, refusers, why, code, error)
        else:
            self.audits.refused_restore(restore_id, refusers, why, code, None)

    def _forget(self, rollouts: list[str]) -> None:
        model, forget_id = self.model.issue_id("forget")
        self.controller.forget(forget_id, rollouts)
        label = f"forget({rollouts})"
        self._advance(model.forget(tuple(rollouts)), label, violation=P7Violation, counts_final=True)

    def _forget_covering(self, checkpoint_id: str, incomplete: bool = False) -> None:
        """Forget the rollouts whose marks would refuse what a restore of `checkpoint_id` continues."""
        covered = self.model.marks_covering(checkpoint_id, incomplete=incomplete)
        if covered:
            self._forget(covered)


def choose(items: list[Any], pick: int) -> Any:
    return items[pick % len(items)]


def only_unanswered(error: CoordinationError, names: list[str]) -> bool:
    """Whether every failure is one of `names` whose answer never came (a transport error: no reply at all)."""
    return all(f.http_status is None and n in names for n, f in error.failures.items())


def only_deadline_missed(error: CoordinationError, names: list[str]) -> bool:
    """Whether every refusal is a deadline_exceeded from one of `names` (a deadline that passed first, which the
    protocol allows and no property judges)."""
    return all(f.code == "deadline_exceeded" and n in names for n, f in error.failures.items())
