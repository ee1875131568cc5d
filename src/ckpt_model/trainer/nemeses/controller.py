"""A misbehaving controller: late, repeated, quiet or out-of-turn calls, each of which Gym must refuse or answer
as before.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ckpt_model.model.contract import Attempt
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties.fencing import P10Violation, p10_ledger_removal_refused, p10_retry_answered
from ckpt_model.properties.identifiers import (
    P15Violation,
    p15_rejected_checkpoint_id_changed_nothing,
    p15_rejected_checkpoint_id_refused,
)
from ckpt_model.properties.state import P7Violation, p7_callee_refused, p7_refused
from ckpt_model.steps import checkable
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer import checkpoint_ids
from ckpt_model.trainer.checkpoint_ids import CONTROL_OPERATIONS, REJECTED_CHECKPOINT_IDS
from ckpt_model.trainer.controller import QUIET_PREPARE_DEADLINE_S
from ckpt_model.trainer.pipeline import PICK, MachineBase, choose
from ckpt_model.trainer.rollout_ids import REJECTED_ROLLOUT_IDS, rejection_reason

# A quiet controller's prepare that missed its deadline is tried again with twice the deadline, up to this (where
# the lease is waited out in real time: a real Gym's clocks are not the checker's).
QUIET_PREPARE_DEADLINE_MAX_S = 3.2


def captures_tokens(spec: DeploymentSpec) -> bool:
    return spec.token_capture


CONTROLLER = Family("controller", "a misbehaving controller: late, repeated, quiet or out-of-turn calls", 6)
# Operations a delayed call of an older controller can carry (resume of a resumed ID is idempotent instead).
LATE_OPERATIONS = ("prepare", "renew", "commit", "restore", "retire", "forget")


class MisbehavingController(MachineBase):
    """The rules of the controller family (`CONTROLLER`)."""

    @action(
        lambda self: bool(self.model.late_runs()) or self._may_retire(),
        family=CONTROLLER,
        needs=(checkable.GATE,),
        judges=("P7",),
        pick=PICK,
    )
    def late_run(self, pick: int) -> None:
        """A late `/run` of a retired attempt is refused with stale_attempt until forget (P7); with no checkpoint
        open, so are its calls straight to each callee that holds the mark (a tool call and a verify to the
        resources servers, a generation call to the policy model). With no such attempt, the controller retires
        a live rollout first (given up, as `retire` does): otherwise the rule waits for a retire drawn before it
        and no forget drawn between."""
        if not self.model.late_runs():
            self.retire(pick, again=False)
        attempt = self.model.retired_attempt(choose(self.model.late_runs(), pick))
        outcome = self.controller.late_run(attempt)
        p7_refused(attempt.key, outcome.status_code, outcome.body)
        label = f"late_run({attempt.key}) -> HTTP {outcome.status_code}"
        if not self.model.checkpoint_open:
            callees = self._late_callee_calls(attempt)
            for call, answer in callees.items():
                p7_callee_refused(attempt.key, call, answer.status_code, answer.body)
            label += f"; refused straight by {sorted(callees)}" if callees else ""
        self._advance(self.model, label, violation=P7Violation)

    def _late_callee_calls(self, attempt: Attempt) -> dict[str, Any]:
        """The calls straight to each callee whose kind holds `attempt`'s retire mark (`ckpt_model.trainer.callees`)."""
        marked = [
            m for m in self.controller.members() if self.model.holds_mark(m.kind, attempt.rollout, attempt.attempt)
        ]
        resources = [m for m in marked if m.kind == "resources"]
        tool = self.harness.spec.traits.script[0]
        calls = self.callees.resources_calls(attempt, resources, tool) if resources else {}
        return {**calls, **self.callees.generation_calls(attempt, [m for m in marked if m.kind == "model"])}

    @action(
        lambda self: self.model.may_run_while_open() or self._may_checkpoint(),
        family=CONTROLLER,
    )
    def run_while_open(self) -> None:
        """A new `/run` while a checkpoint is open is refused with admission_closed and owns nothing (P10); with
        none open, the controller prepares one first."""
        self._opened_first()
        model, attempt = self.model.refused_dispatch()
        self.controller.run_refused(attempt)
        self._advance(model, f"run_while_open() -> {attempt.rollout} refused", violation=P10Violation)

    @action(
        lambda self: self.harness.backend is not None and self.model.may_send_rejected_id(),
        family=CONTROLLER,
        needs=(checkable.GATE,),
        judges=("P15",),
        rollout_id=REJECTED_ROLLOUT_IDS,
        reserved_of=st.none() | PICK,
    )
    def run_rejected_id(self, rollout_id: str, reserved_of: int | None = None) -> None:
        """A `/run` naming a rollout ID Gym's rules reject is refused with the protocol's error and changes nothing
        anywhere (P15). With `reserved_of`, the name is the capture key the next attempt of a rollout the model holds
        would have (`Model.reserved_name_of`): on a legacy row's `_ng_rollout_id`, the pair that shares a key where
        the reservation is skipped."""
        name = rollout_id if reserved_of is None else self.model.reserved_name_of(reserved_of)
        model, attempt = self.model.rejected_dispatch(name)
        self.controller.run_rejected(attempt)
        self._advance(model, f"run_rejected_id({name!r}): {rejection_reason(name)}", violation=P15Violation)

    @action(
        lambda self: self.model.may_send_rejected_checkpoint_id(),
        family=CONTROLLER,
        judges=("P15",),
        operation=st.sampled_from(CONTROL_OPERATIONS),
        checkpoint_id=REJECTED_CHECKPOINT_IDS,
    )
    def control_rejected_id(self, operation: str, checkpoint_id: str) -> None:
        """A control call (`operation`, any of the seven) naming a checkpoint ID Gym's rules reject, sent to every
        participant, is refused by each with FastAPI's 422 naming `checkpoint_id`, and every participant's status
        shows the same control state after it as before (P15). The model does not change."""
        control = self.controller.control
        before = control.status_all()
        outcomes = self.controller.probe_rejected_id(operation, checkpoint_id)
        after = control.status_all()
        p15_rejected_checkpoint_id_refused(operation, checkpoint_id, outcomes)
        p15_rejected_checkpoint_id_changed_nothing(operation, checkpoint_id, before, after)
        model = self.model.having_tried(rejected_checkpoint_ids=self.model.tried.rejected_checkpoint_ids + 1)
        reason = checkpoint_ids.rejection_reason(checkpoint_id)
        self._advance(model, f"control_rejected_id({operation} {checkpoint_id!r}): {reason}", violation=P15Violation)

    @action(
        lambda self: self.ledgers.enabled and (self.model.may_remove_ledgers_while_open() or self._may_checkpoint()),
        family=CONTROLLER,
        needs=(checkable.GATE, checkable.TOKEN_CAPTURE),
        applies=captures_tokens,
    )
    def remove_ledgers_while_open(self) -> None:
        """A ledger retire and delete while a checkpoint is open are refused (P10); the ledgers stay (P5). With none
        open, the controller prepares one first."""
        self._opened_first()
        checkpoint_id, keys = self.model.opened, sorted(a.key for a in self.model.live()) or ["probe"]
        p10_ledger_removal_refused(checkpoint_id, self.controller.remove_ledgers(keys))
        model = self.model.having_tried(ledger_removal_in=checkpoint_id)
        self._advance(model, f"remove_ledgers_while_open({keys}) refused", violation=P10Violation)

    @action(lambda self: self.model.may_call_late(), family=CONTROLLER, pick=PICK)
    def late_call(self, pick: int) -> None:
        """Delayed calls of every operation naming a resumed ID are refused where it is remembered (P10)."""
        checkpoint_id = self.model.resumed[pick % len(self.model.resumed)]
        participants = self.controller.control.participants
        remembering = [m.name for m in participants if self.model.remembers(m.kind, checkpoint_id)]
        for operation in LATE_OPERATIONS if remembering else ():
            self._refused(operation, checkpoint_id, "stale_checkpoint", remembering)
        model = self.model.having_tried(late_calls_for=self.model.resumed)
        self._advance(model, f"late_call({checkpoint_id}) refused by {remembering}")

    @action(lambda self: self.controller.can_retry, family=CONTROLLER)
    def retry(self) -> None:
        """The controller retries its last control call with the same arguments: the same answer (P10)."""
        last, outcomes = self.controller.retry()
        label = f"retry({last.operation} {last.checkpoint_id})"
        p10_retry_answered(label, last.operation, last.after_crash, last.replies, outcomes)
        self._advance(self.model, label)

    @action(
        lambda self: not self.model.tried.lease_lapse and self._may_checkpoint() and self.controller.may_lapse,
        family=CONTROLLER,
        needs=(checkable.LEASE_LAPSES,),
    )
    def quiet_controller(self) -> None:
        """The controller prepares and goes quiet: the lease lapses, and its late commit is refused (P10). A prepare
        that missed its short deadline (a slow machine, where the lease is waited out in real time) is resumed, and
        the controller tries again under a new ID with twice the deadline, up to `QUIET_PREPARE_DEADLINE_MAX_S`."""
        model, checkpoint_id = self.model.lease_expired()
        deadline_s, missed = QUIET_PREPARE_DEADLINE_S, []
        while not self.controller.go_quiet(checkpoint_id, deadline_s):
            missed.append(checkpoint_id)
            if deadline_s * 2 > QUIET_PREPARE_DEADLINE_MAX_S:
                self._not_reached("quiet_controller", f"the prepares {missed} missed their deadlines, none lapsed")
                break
            deadline_s *= 2
            model, checkpoint_id = model.lease_expired()
        tried = f" (after {', '.join(missed)} missed their deadlines)" if missed else ""
        self._refused("commit", checkpoint_id, "stale_checkpoint")
        self._advance(model, f"quiet_controller() -> {checkpoint_id} lapsed{tried}; commit({checkpoint_id}) refused")
