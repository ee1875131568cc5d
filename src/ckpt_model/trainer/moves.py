"""Each rule's model transition, with its arguments made finite: what the explorer enumerates.

A rule of the machine does three things: the model's transition, the controller's calls, the audit. Here is the
first alone, for every rule: `MOVES[rule](machine)` yields, for a machine on which the rule is enabled (a
`stand_in`, whose preconditions read chosen capabilities), each abstractly different way the rule can go as the
rule's arguments (what a regression file would replay, so an explored path is a list of rule calls) and the model
it leaves. Arguments that choose among equals the model cannot tell apart (the policy worker, which participant a
fault hits where the model only knows its kind, the errno of a failed write) take their first value; arguments the
model's next value depends on (which rollout, retry or give up, resume after or not) are enumerated. Where the real
system decides and the checker observes (how many participants published an incomplete checkpoint's shares, which
attempts a killed worker held), each outcome is yielded with the same arguments.

The rule bodies are the truth; this table mirrors them. A run's transition coverage
(`ckpt_model.search.transition_coverage`) counts every executed step that this table did not predict, and the
contract runs of the test suite require none.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ckpt_model.deployments.faults import STORAGE_FAILURES
from ckpt_model.model.contract import Model
from ckpt_model.trainer.machine import CheckpointMachine

Outcome = tuple[Mapping[str, Any], Model]
Move = Callable[[CheckpointMachine], Iterator[Outcome]]


def _prepared_first(model: Model) -> Model:
    return model if model.phase == "prepared" else model.prepare()[0]


def _opened_first(model: Model) -> Model:
    return model if model.checkpoint_open else model.prepare()[0]


def _crashed_unless_fresh(model: Model) -> Model:
    return model if model.fresh else model.crash()


def _forgot_covering(model: Model, checkpoint_id: str, incomplete: bool = False) -> Model:
    covered = model.marks_covering(checkpoint_id, incomplete=incomplete)
    return model.forget(tuple(covered)) if covered else model


def _restored(model: Model, pick: int) -> Model:
    """`restore(pick)`: forget what would refuse it, restore, resume."""
    checkpoint_id = model.committed[pick].checkpoint_id
    return _forgot_covering(model, checkpoint_id).restore(checkpoint_id)[0]


def _retired(model: Model, rollout: str, again: bool) -> Model:
    retired = model.issue_id("retire")[0].retire(rollout)
    return retired.start_over(rollout) if again else retired


# -- the protocol's rules ------------------------------------------------------------------------------------


def dispatch(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {"worker": 0}, machine.model.dispatch()[0]


def dispatch_restart(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {"worker": 0}, machine.model.dispatch(restart=True)[0]


def release(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    for pick, rollout in enumerate(model.releasable()):
        yield {"pick": pick}, model.release(rollout)


def release_to_verification(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    for pick, rollout in enumerate(model.before_verification()):
        released = model
        while not released.current()[rollout].verifying:
            released = released.release(rollout)
        yield {"pick": pick}, released


def prepare(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.prepare()[0]


def prepare_blocked(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    after = model.prepare_blocked()[0]
    for rollout in model.blocking_rollouts():
        after = _retired(after, rollout, again=True)
    yield {}, after


def prepare_waiting(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.prepare_waited()[0]


def commit(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.commit()[0]


def resume(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.resume()


def checkpoint(machine: CheckpointMachine) -> Iterator[Outcome]:
    for then_resume, hold_one in itertools.product((False, True), (False, True)):
        model = machine.model.prepare()[0]
        if hold_one and model.releasable():
            model = model.release(model.releasable()[0])
        model = model.commit()[0]
        yield {"then_resume": then_resume, "hold_one": hold_one}, model.resume() if then_resume else model


def restore(machine: CheckpointMachine) -> Iterator[Outcome]:
    for pick in range(len(machine.model.committed)):
        yield {"pick": pick}, _restored(machine.model, pick)


def recover(machine: CheckpointMachine) -> Iterator[Outcome]:
    for pick in range(len(machine.model.committed)):
        yield {"pick": pick}, _restored(machine.model.crash(), pick)


def recover_again(machine: CheckpointMachine) -> Iterator[Outcome]:
    again = machine.model.last_restored()
    assert again is not None
    yield {}, _restored(machine.model.crash(), again)


def start_replacement(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    for pick, rollout in enumerate(model.rollouts_with_status("pending")):
        yield {"pick": pick, "worker": 0}, model.start_replacement(rollout)


def start_over(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    for pick, rollout in enumerate(model.rollouts_with_status("dead")):
        yield {"pick": pick, "worker": 0}, model.start_over(rollout)


def retire(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    for pick, rollout in enumerate(model.live_rollouts()):
        for again in (False, True):
            yield {"pick": pick, "again": again, "worker": 0}, _retired(model, rollout, again)


def forget(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    yield {}, model.issue_id("forget")[0].forget(model.marked_rollouts())


# -- the misbehaving controller --------------------------------------------------------------------------------


def late_run(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    if model.late_runs():
        yield {"pick": 0}, model
        return
    for pick, rollout in enumerate(model.live_rollouts()):
        yield {"pick": pick}, _retired(model, rollout, again=False)


def run_while_open(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, _opened_first(machine.model).refused_dispatch()[0]


def run_rejected_id(machine: CheckpointMachine) -> Iterator[Outcome]:
    """Refused whatever name it sends: only the `/run` number and the count of such runs change, which the abstract
    state leaves out, so one name stands for them all."""
    yield {"rollout_id": "x-a1", "reserved_of": None}, machine.model.rejected_dispatch("x-a1")[0]


def control_rejected_id(machine: CheckpointMachine) -> Iterator[Outcome]:
    """Refused whatever it sends: only the count of such calls changes, which the abstract state leaves out, so one
    call stands for them all."""
    model = machine.model
    tried = model.having_tried(rejected_checkpoint_ids=model.tried.rejected_checkpoint_ids + 1)
    yield {"operation": "prepare", "checkpoint_id": ""}, tried


def remove_ledgers_while_open(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = _opened_first(machine.model)
    yield {}, model.having_tried(ledger_removal_in=model.opened)


def late_call(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    yield {"pick": 0}, model.having_tried(late_calls_for=model.resumed)


def retry(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model


def quiet_controller(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.lease_expired()[0]


def time_passes(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.lease_expired(time_passed=True)[0]


def skewed_clock(machine: CheckpointMachine) -> Iterator[Outcome]:
    """Ahead, the skewed participant lapses first and refuses the commit; behind, it outholds the others, whose
    leases lapse: either way the controller resumes and the checkpoint is incomplete. On a slow machine the prepare
    missed its deadline first and was resumed (the rule records that it did not reach its situation)."""
    prepared = machine.model.having_tried(clock_skew=True).prepare()[0]
    for behind in (False, True):
        yield {"victim": 0, "behind": behind}, prepared.commit_failed()
        yield {"victim": 0, "behind": behind}, prepared.resume()


# -- crashes ------------------------------------------------------------------------------------------------


def crash(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.crash()


def power_loss(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {}, machine.model.crash()


def crash_in_commit(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield {"committed": 0, "inside": False}, _prepared_first(machine.model).crash_in_commit()


def crash_in_operation(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    for pick, operation in enumerate(model.interruptible()):
        if operation == "restore":
            latest = model.committed[-1].checkpoint_id
            yield {"pick": pick, "reached": 0}, _forgot_covering(model, latest).crash()
        else:
            yield {"pick": pick, "reached": 0}, model.issue_id(operation)[0].crash()


def crash_in_restore(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = _crashed_unless_fresh(machine.model)
    yield {"reached": 0}, _forgot_covering(model, model.committed[-1].checkpoint_id).crash()


def crash_participant(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model
    kinds = [member.kind for member in machine._crashable_alone()]
    for pick, kind in enumerate(kinds):
        if kind in kinds[:pick]:
            continue
        after = model.crash_participant(kind)
        yield {"pick": pick}, after.issue_id("retire")[0] if model.with_status("running") else after


def kill_worker(machine: CheckpointMachine) -> Iterator[Outcome]:
    """The attempts lost are those through the killed server's kind, and any others placed on the killed worker:
    which ones the placement put there is the real system's, so every such set is an outcome."""
    model = machine.model
    kinds = [member.kind for member in machine._killable_workers()]
    running = [a.rollout for a in model.with_status("running")]
    for pick, kind in enumerate(kinds):
        if kind in kinds[:pick]:
            continue
        through = {a.rollout for a in model.ends_alone(kind)}
        others = [rollout for rollout in running if rollout not in through]
        for size in range(len(others) + 1):
            for placed in itertools.combinations(others, size):
                lost = [rollout for rollout in running if rollout in through or rollout in placed]
                after = model.kill_worker(lost)
                after = after.issue_id("retire")[0] if lost else after
                for then_prepare in (False, True):
                    prepared = then_prepare and after.can_prepare()
                    yield (
                        {"pick": pick, "worker": 0, "then_prepare": then_prepare},
                        after.prepare()[0] if prepared else after,
                    )


def dies_in_restore(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = _crashed_unless_fresh(machine.model)
    kinds = [member.kind for member in machine._can_die_in_restore()]
    for pick, checkpoint_ in enumerate(model.committed):
        for victim, kind in enumerate(kinds):
            forgot = _forgot_covering(model, checkpoint_.checkpoint_id)
            yield {"pick": pick, "victim": victim}, forgot.died_in_restore(checkpoint_.checkpoint_id, kind)[0]


# -- restores refused ------------------------------------------------------------------------------------------


def _refused_restores(model: Model, arguments: Mapping[str, Any]) -> Iterator[Outcome]:
    """A restore of each committed checkpoint that some participant refuses (`pick` chooses which)."""
    model = _crashed_unless_fresh(model)
    for pick, checkpoint_ in enumerate(model.committed):
        forgot = _forgot_covering(model, checkpoint_.checkpoint_id)
        yield {"pick": pick, **arguments}, forgot.failed_restore(checkpoint_.checkpoint_id)[0]


def failed_restore(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _refused_restores(machine.model, {"victim": 0, "rejected_record": False})


def failing_install(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _refused_restores(machine.model, {"victim": 0})


def restore_incomplete(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = _crashed_unless_fresh(machine.model)
    for pick, checkpoint_ in enumerate(model.incomplete):
        forgot = _forgot_covering(model, checkpoint_.checkpoint_id, incomplete=True)
        yield {"pick": pick}, forgot.failed_restore(checkpoint_.checkpoint_id)[0]


# -- one participant fails a commit, a prepare or a resume ------------------------------------------------------


def _commit_met_a_fault(model: Model, arguments: Mapping[str, Any]) -> Iterator[Outcome]:
    """`_write_fault`: the commit meets a fault on one participant; then retried and committed, or given up."""
    prepared = _prepared_first(model)
    yield {**arguments, "then_retry": True}, prepared.commit()[0]
    # Given up and resumed, the checkpoint is incomplete (which participants published is abstracted away).
    yield {**arguments, "then_retry": False}, prepared.commit_failed()


def failing_export(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _commit_met_a_fault(machine.model, {"victim": 0})


def storage_fault(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _commit_met_a_fault(machine.model, {"victim": 0, "point": 0, "errno": STORAGE_FAILURES[0]})


def stalled_write(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _commit_met_a_fault(machine.model, {"victim": 0, "point": 0})


def paused_commit(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _commit_met_a_fault(machine.model, {"victim": 0})


def _prepare_failed(model: Model, then_retry: bool) -> Model:
    """A prepare one participant failed, resumed; `then_retry`: a new prepare follows."""
    resumed = model.prepare()[0].resume()
    return resumed.prepare()[0] if then_retry else resumed


def failing_close(machine: CheckpointMachine) -> Iterator[Outcome]:
    for then_retry in (False, True):
        yield {"victim": 0, "then_retry": then_retry}, _prepare_failed(machine.model, then_retry)


def paused_prepare(machine: CheckpointMachine) -> Iterator[Outcome]:
    model = machine.model.resume() if machine.model.checkpoint_open else machine.model
    for then_retry in (False, True):
        yield {"victim": 0, "then_retry": then_retry}, _prepare_failed(model, then_retry)


def paused_lease(machine: CheckpointMachine) -> Iterator[Outcome]:
    """The frozen participant's lease lapses and it refuses the commit: resumed, incomplete; on a slow machine the
    prepare missed its deadline first and was resumed."""
    prepared = machine.model.having_tried(pause_lapse=True).prepare()[0]
    yield {"victim": 0}, prepared.commit_failed()
    yield {"victim": 0}, prepared.resume()


def _one_sided(machine: CheckpointMachine, retried_commit_whole: bool) -> Iterator[Outcome]:
    """A prepare, a commit or a resume whose reply one participant lost or never got (`lost_reply`,
    `unreachable`), retried or given up. A lost commit reply given up leaves the checkpoint whole on disk and the
    controller resumes (`retried_commit_whole`: the lost reply's case) or incomplete."""
    model = machine.model
    for operation, name in enumerate(machine._one_sided()):
        for then_retry in (False, True):
            arguments = {"victim": 0, "operation": operation, "then_retry": then_retry}
            if name == "prepare":
                prepared = model.prepare()[0]
                yield arguments, prepared if then_retry else prepared.resume()
            elif name == "commit":
                prepared = _prepared_first(model)
                if then_retry:
                    yield arguments, prepared.commit()[0]
                    continue
                if retried_commit_whole:
                    yield arguments, prepared.resume()
                yield arguments, prepared.commit_failed()
            else:
                yield arguments, _opened_first(model).resume()


def lost_reply(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _one_sided(machine, retried_commit_whole=True)


def unreachable(machine: CheckpointMachine) -> Iterator[Outcome]:
    yield from _one_sided(machine, retried_commit_whole=False)


MOVES: Mapping[str, Move] = {
    # prepare_with_hung_cut prepares as `prepare` does (then renews the lease): the same transition.
    "prepare_with_hung_cut": prepare,
} | {
    move.__name__: move
    for move in (
        dispatch,
        dispatch_restart,
        release,
        release_to_verification,
        prepare,
        prepare_blocked,
        prepare_waiting,
        commit,
        resume,
        checkpoint,
        restore,
        recover,
        recover_again,
        start_replacement,
        start_over,
        retire,
        forget,
        late_run,
        run_while_open,
        run_rejected_id,
        control_rejected_id,
        remove_ledgers_while_open,
        late_call,
        retry,
        quiet_controller,
        time_passes,
        skewed_clock,
        crash,
        power_loss,
        crash_in_commit,
        crash_in_operation,
        crash_in_restore,
        crash_participant,
        kill_worker,
        dies_in_restore,
        failed_restore,
        failing_install,
        restore_incomplete,
        failing_export,
        storage_fault,
        stalled_write,
        paused_commit,
        failing_close,
        paused_prepare,
        paused_lease,
        lost_reply,
        unreachable,
    )
}
