"""The Hypothesis state machine: the training controller, played against real server processes.

It only chooses. Every rule reads: the model's transition (`contract`), the controller's call (`controller`, or the
`nemesis`'s fault), the audit (`audits`, the properties' named checks); then it waits for the quiet state the model
predicts. Model calls wait at the backend until `release` lets one go, so every example replays the same way.
docs/how-it-works.md describes each rule in full.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize

from ckpt_model import draw, twin
from ckpt_model import properties as props
from ckpt_model.audits import Audits
from ckpt_model.callees import Callees
from ckpt_model.contract import Attempt, Checkpoint, Model
from ckpt_model.controller import HUNG_CUT_PREPARE_DEADLINE_S, Controller, Prepared, episodes_of, run_pool
from ckpt_model.deployment import (
    EXPORT_HOOK,
    LOSABLE_OPERATIONS,
    PAUSE,
    STALL,
    STALL_POINTS,
    STORAGE_FAILURES,
    STORAGE_POINTS,
    Harness,
)
from ckpt_model.draw import Weights
from ckpt_model.errors import CoordinationError, HarnessError, PropertyViolation
from ckpt_model.families import (
    CALLS,
    CHECKPOINTS,
    CLOCKS,
    CONTROLLER,
    CRASHES,
    DAMAGE,
    HOOKS,
    LOST_REPLIES,
    PAUSES,
    RESTORES,
    ROLLOUTS,
    STORAGE,
    UNREACHABLE,
)
from ckpt_model.history import History
from ckpt_model.ledger_watch import LedgerWatch
from ckpt_model.nemesis import Nemesis, WriteFault
from ckpt_model.quiescence import SETTLE_TIMEOUT_S, Quiescence
from ckpt_model.stats import SearchStats
from ckpt_model.steplog import StepLog, action, rule_names
from ckpt_model.swarm import Swarm, swarms

# Who must refuse a restore, and why; the property a step's settle judges by.
Refused = tuple[list[str], str]
Violation = type[PropertyViolation]
PICK = st.integers(min_value=0, max_value=7)


def _worker_choice(machine: CheckpointMachine) -> st.SearchStrategy[int]:
    """A worker to serve a new attempt's requests on every multi-worker server; with nothing to place, 0, drawn
    from nothing. (The argument itself still reorders Hypothesis's draws on every deployment: the same seed plays
    other examples than before.)"""
    harness = machine.harness
    return st.integers(0, harness.workers - 1) if harness.places_calls else st.just(0)


# The worker is drawn from the machine itself (Hypothesis hands a stateful test's runner to `st.runner()`).
WORKER = st.runner().flatmap(_worker_choice)
# A skewed clock runs this far ahead of the controller's (its lease lapses that much earlier), or behind (far longer
# than any step, so it still holds its lease when the stale commit comes); a prepare under a clock ahead leaves it
# this margin of its own before the deadline; a prepare under a clock behind is due this soon, so the others'
# leases lapse in a second or two.
SKEW_AHEAD_S = 8.0
SKEW_BEHIND_S = 60.0
SKEWED_PREPARE_MARGIN_S = 0.5
SKEWED_QUIET_DEADLINE_S = 0.25
# A prepare whose lease a frozen participant outsleeps is due this soon (its lease then lapses a grace later): room
# for the prepare and the renewal of the others' leases that follows it, on a loaded machine too.
PAUSED_LEASE_DEADLINE_S = 2.0
# ... and it stays frozen this long past its lease, as a GC pause or a frozen VM outlasts it.
PAUSED_PAST_LEASE_S = 1.0
# While a quiet controller's checkpoint is open this much time passes for the whole system: twice Gym's episode
# budget (600 s), so an episode whose parked time counted would time out whatever it used before.
TIME_PASSES_S = 1200.0
# Operations a delayed call of an older controller can carry (resume of a resumed ID is idempotent instead).
LATE_OPERATIONS = ("prepare", "renew", "commit", "restore", "retire", "forget")


class CheckpointMachine(RuleBasedStateMachine):
    """Plays the controller against the deployment `harness` wraps (bound by `machine_for`, one per deployment)."""

    def __init__(
        self,
        harness: Harness,
        stats: SearchStats | None = None,
        settle_timeout_s: float = SETTLE_TIMEOUT_S,
        weights: Weights | None = None,
    ) -> None:
        super().__init__()
        draw.install(self, weights)  # a family first, then its rule (`ckpt_model.draw`)
        self.harness = harness
        if stats is not None:
            stats.example_started()
        twins = twin.begin_example(harness)  # the example starts; P14's baseline is made first if not cached
        self.model = Model(topology=harness.topology, verify_mode=harness.verify_mode)  # type: ignore[arg-type]
        self.history = History()
        runs = run_pool(harness, self.history)
        traits = harness.spec.traits
        self.quiescence = Quiescence(harness, runs, traits.reward(traits.script), settle_timeout_s)
        self.ledgers = LedgerWatch(harness)  # P5, P12: the capture ledgers the checker predicts and reads
        self.controller = Controller(harness, self.history, runs, self.quiescence, watchers=[self.ledgers])
        self.nemesis = Nemesis(harness, self.controller)
        self.callees = Callees(harness, self.history, runs, self.quiescence.timeout_s)
        self.audits = Audits(harness, self.ledgers, runs, twins)
        self.log = StepLog(harness, self.history, stats)

    # -- rollouts ---------------------------------------------------------------------------------------------

    @action(lambda self: self.harness.backend is not None and self.model.can_dispatch(), family=ROLLOUTS, worker=WORKER)
    def dispatch(self, worker: int = 0) -> None:
        """A new rollout starts and stops at its first model call; its calls are served by policy worker `worker`."""
        self._dispatch(restart=False, worker=worker)

    @action(
        lambda self: self.harness.backend is not None and self.model.can_dispatch_restart(),
        family=ROLLOUTS,
        worker=WORKER,
    )
    def dispatch_restart(self, worker: int = 0) -> None:
        """A new rollout on the restart environment (topology `mixed`): a restart, never exported."""
        self._dispatch(restart=True, worker=worker)

    def _dispatch(self, restart: bool, worker: int) -> None:
        model, rollout = self.model.dispatch(restart=restart)
        placed = self.controller.run(model.current()[rollout], worker)
        self._advance(model, f"dispatch{'_restart' if restart else ''}() -> {rollout}{placed}")

    @action(lambda self: bool(self.model.releasable()), family=CALLS, pick=PICK)
    def release(self, pick: int) -> None:
        """Let one rollout's waiting call return: a policy call, or the slow topology's judge call."""
        rollout = _pick(self.model.releasable(), pick)
        self.controller.release([self.model.current()[rollout].key])
        self._advance(self.model.release(rollout), f"release({rollout})")

    @action(lambda self: bool(self.model.before_verification()), family=CALLS, pick=PICK)
    def release_to_verification(self, pick: int) -> None:
        """Release one rollout's policy calls until its judge call waits (slow topology)."""
        rollout = _pick(self.model.before_verification(), pick)
        while not self.model.current()[rollout].verifying:
            self.release(self.model.releasable().index(rollout))

    # -- checkpoints ------------------------------------------------------------------------------------------

    @action(lambda self: self._may_checkpoint(), family=CHECKPOINTS)
    def prepare(self) -> None:
        """Prepare a new checkpoint: everything is at a boundary, so every stage becomes prepared (P10)."""
        model, checkpoint_id = self.model.prepare()
        verifying = [a.key for a in self.model.with_status("running") if a.verifying]
        self._refused_past_deadline("prepare", checkpoint_id)
        outcome = self.controller.prepare(checkpoint_id)
        props.p10_prepared_everywhere(checkpoint_id, outcome.prepared, outcome.blockers, verifying, outcome.waited_s)
        self._prepared(checkpoint_id, outcome.replies)
        self._advance(model, f"prepare() -> {checkpoint_id}; prepare(other{model.checkpoint_seq}) refused")

    @action(
        lambda self: self.ledgers.cuts and self.model.can_prepare() and bool(self.model.waiting()), family=CHECKPOINTS
    )
    def prepare_with_hung_cut(self) -> None:
        """A short prepare while the cut endpoint hangs: prepared in time (P10), nothing cut (P12); then renew."""
        model, checkpoint_id = self.model.prepare()
        try:
            outcome = self.controller.prepare_with_hung_cut(checkpoint_id)
        except CoordinationError as error:
            props.p10_prepared_despite_hung_cut(checkpoint_id, HUNG_CUT_PREPARE_DEADLINE_S, error)
            raise
        props.p10_prepared_everywhere(checkpoint_id, outcome.prepared, outcome.blockers, [])
        self.controller.renew(checkpoint_id)
        self._prepared(checkpoint_id, outcome.replies)
        self._advance(model, f"prepare_with_hung_cut() -> {checkpoint_id}, its cut hung; renewed")

    @action(lambda self: self.model.can_prepare_blocked(), family=CHECKPOINTS)
    def prepare_blocked(self) -> None:
        """A short prepare meets `wait` verifications, blocked by exactly them (P11); resume, retire them, again."""
        blockers = self.model.blockers()
        model, checkpoint_id = self.model.prepare_blocked()
        outcome = self.controller.prepare_short(checkpoint_id)
        props.p11_blocked(checkpoint_id, self.model.episode_owner, blockers, outcome.prepared, outcome.blockers)
        self.controller.resume(checkpoint_id)
        self._advance(model, f"prepare_blocked() -> {checkpoint_id} blocked by {blockers}; resume({checkpoint_id})")
        for key in blockers:
            self._retire(self.model.attempt(key).rollout, again=True)

    @action(lambda self: self.model.can_prepare_blocked(), family=CHECKPOINTS)
    def prepare_waiting(self) -> None:
        """A prepare left waiting on `wait` verifications whose episodes finish during it (Gym's scenario 10)."""
        blockers = self.model.blockers()
        model, checkpoint_id = self.model.prepare_waited()
        owner = self.model.episode_owner

        def release_blockers(prepare: Any) -> None:
            self.quiescence.wait_preparing(owner, checkpoint_id, blockers, prepare)
            self.controller.release(blockers)

        outcome = self.controller.prepare_waiting(checkpoint_id, release_blockers)
        props.p11_prepared_once_verified(checkpoint_id, blockers, outcome.prepared, outcome.blockers)
        self._prepared(checkpoint_id, outcome.replies)
        self._advance(model, f"prepare_waiting() -> {checkpoint_id}; {blockers} finished during it")

    def _prepared(self, checkpoint_id: str, replies: dict[str, Any]) -> None:
        """P1: the restarts are reported; P10: every participant refuses a prepare of another ID."""
        props.p1_restarts_reported(checkpoint_id, self.model.restarts(), replies)
        self._refused("prepare", f"other{self.model.checkpoint_seq + 1}", "checkpoint_conflict")

    @action(lambda self: self.model.phase == "prepared", family=CHECKPOINTS)
    def commit(self) -> None:
        """Commit every unfinished attempt; P1 on every reply and share, P9 (it verifies), P6 (exported state)."""
        checkpoint_id, scope = self.model.opened, self.model.scope()
        refusals = self.controller.probe_commit_naming_restarts(checkpoint_id, scope, self.model.restarts())
        props.p1_restart_in_scope_refused(checkpoint_id, refusals)
        directory, episodes = str(self.controller.directory(checkpoint_id)), episodes_of(scope)
        self._refused_past_deadline("commit", checkpoint_id, checkpoint_dir=directory, episode_ids=episodes)
        replies = self.controller.commit(checkpoint_id, scope)
        self.audits.commit(self.model, checkpoint_id, replies)
        model, _ = self.model.commit()
        self._advance(model, f"commit() -> {checkpoint_id} exports {sorted(a.key for a in scope)}")

    @action(lambda self: self.model.checkpoint_open, family=CHECKPOINTS)
    def resume(self) -> None:
        """End the open checkpoint; every participant then refuses a prepare naming the resumed ID (P10)."""
        checkpoint_id = self.model.opened
        self.controller.resume(checkpoint_id)
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(self.model.resume(), f"resume({checkpoint_id}); prepare({checkpoint_id}) refused")

    # -- crashes ----------------------------------------------------------------------------------------------

    @action(lambda self: self.harness.can_crash and not self.model.fresh, family=CRASHES)
    def crash(self) -> None:
        """SIGKILL every Gym process group and start fresh processes; the backend and the disk survive."""
        self.nemesis.crash()
        self._advance(self.model.crash(), "crash()")

    @action(
        lambda self: (
            self.harness.can_crash
            and not self.model.fresh
            and self.harness.can_lose_unsynced
            and bool(self.model.committed)
        ),
        family=CRASHES,
    )
    def power_loss(self) -> None:
        """As `crash`, with a power cut: the disk keeps only what was fsynced; every checkpoint must verify (P9)."""
        self.nemesis.crash(power_loss=True)
        self._advance(self.model.crash(), "power_loss()")

    @action(
        lambda self: self.harness.can_crash and self.model.phase == "prepared",
        committed=PICK,
        inside=st.booleans(),
        family=CRASHES,
    )
    def crash_in_commit(self, committed: int, inside: bool) -> None:
        """Gym crashes inside a commit reached by `committed` participants (one more held inside with `inside`)."""
        checkpoint_id, scope = self.model.opened, self.model.scope()
        members = self.controller.members()
        done = [m.name for m in members[: committed % len(members)]]
        stopped = members[len(done)].name if inside and self.harness.can_stop_inside_commit else None
        if done:
            replies = self.controller.commit_on(done, checkpoint_id, scope)
            self.audits.partial_commit(self.model, checkpoint_id, done, replies)
        held = None if stopped is None else self.nemesis.hold_inside_commit(stopped, checkpoint_id, scope)
        self.nemesis.crash(inside=True)
        if held is not None:
            self.nemesis.ended_by_crash(held)
        published = self.audits.published_after_crash(checkpoint_id)
        where = f", {stopped} stopped between its files" if stopped is not None else ""
        label = f"crash_in_commit() -> {checkpoint_id} committed by {sorted(published)}{where}"
        self._advance(self.model.crash_in_commit(published), label)

    @action(
        lambda self: self.harness.can_crash and bool(self.model.interruptible()),
        family=CRASHES,
        pick=PICK,
        reached=PICK,
    )
    def crash_in_operation(self, pick: int, reached: int) -> None:
        """Gym crashes inside a restore, a retire or a forget that reached its first `reached` stages."""
        operation = _pick(self.model.interruptible(), pick)
        if operation == "restore":
            source = self.model.committed[-1]
            self._forget_covering(source.checkpoint_id)
            model, operation_id = self.model, self.model.restore_id(source.checkpoint_id)
            names = self.nemesis.crash_inside_restore(operation_id, source.checkpoint_id, source.exported, reached)
        elif operation == "retire":
            model, operation_id = self.model.issue_id(operation)
            lost = self.model.with_status("dead", "pending")[0]
            names = self.nemesis.crash_inside_retire(operation_id, lost, reached)
        else:
            model, operation_id = self.model.issue_id(operation)
            names = self.nemesis.crash_inside_forget(operation_id, self.model.marked_rollouts(), reached)
        self._advance(model.crash(), f"crash_in_operation() inside {operation} {operation_id}, reached {names}")

    @action(
        lambda self: self.harness.can_crash and self.model.worth_crashing_alone() and bool(self._crashable_alone()),
        family=CRASHES,
        pick=PICK,
    )
    def crash_participant(self, pick: int) -> None:
        """SIGKILL one participant alone and restart it; the controller retires the running work it broke (P7)."""
        member = _pick(self._crashable_alone(), pick)
        running = self.model.with_status("running")
        self.nemesis.restart(member)
        model = self.model.crash_participant(member.kind)
        label = f"crash_participant({member.name})" + self._still_fenced(model)
        if running:
            ending = [a.run for a in self.model.ends_alone(member.kind)]
            self.controller.runs.wait_ended(self.quiescence.timeout_s, ending, f"{member.name} crashed alone")
            model, retire_id = model.issue_id("retire")
            self.controller.retire_lost(retire_id, running)
            self.controller.runs.wait_ended(self.quiescence.timeout_s)
            label += f"; retire({sorted(a.key for a in running)})"
        self._advance(model, label, violation=props.P7Violation, counts_final=bool(running))

    @action(lambda self: bool(self.nemesis.killable_workers(self.model)), family=CRASHES, pick=PICK, worker=WORKER)
    def kill_worker(self, pick: int, worker: int) -> None:
        """SIGKILL one worker of a multi-worker server alone: what lived on it dies with it, every other attempt runs
        on; the controller retires the running attempts it may have broken (P7). Those are the attempts placed on
        it, and every attempt with a request in flight through that server (`Model.ends_alone`): the kernel chose
        which worker accepted each connection, and a worker relaying a request to its sibling takes the request
        with it, so the checker cannot say which of those were cut, only that none of them may complete."""
        member = _pick(self.nemesis.killable_workers(self.model), pick)
        workers = self.harness.server_workers
        index = worker % workers
        through = {a.key for a in self.model.ends_alone(member.kind)}
        placement = self.controller.placement
        lost = [
            a
            for a in self.model.with_status("running")
            if a.key in through or placement.on_worker(a.key, index, workers)
        ]
        self.nemesis.kill_worker(member, index)
        model = self.model.kill_worker([a.rollout for a in lost])
        label = f"kill_worker({member.name}, worker {index})"
        if lost:
            model, retire_id = model.issue_id("retire")
            self.controller.retire_lost(retire_id, lost)
            why = f"worker {index} of {member.name} is killed and its attempts retired"
            self.controller.runs.wait_ended(self.quiescence.timeout_s, [a.run for a in lost], why)
            label += f"; retire({sorted(a.key for a in lost)})"
        self._advance(model, label, violation=props.P7Violation, counts_final=bool(lost))

    def _crashable_alone(self) -> list[Any]:
        return self.nemesis.crashable_alone(self.model)

    def _still_fenced(self, model: Model) -> str:
        """Each participant that remembers the latest resumed ID still refuses it (P10)."""
        if not model.resumed:
            return ""
        latest = model.resumed[-1]
        remembering = [m.name for m in self.controller.control.participants if model.remembers(m.kind, latest)]
        self._refused("prepare", latest, "stale_checkpoint", remembering)
        return f"; prepare({latest}) refused by {remembering}"

    # -- storage that fails or stalls -------------------------------------------------------------------------

    @action(
        lambda self: self._may_commit() and self.harness.can_break_storage,
        family=STORAGE,
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
        victim=PICK,
        point=PICK,
        then_retry=st.booleans(),
    )
    def stalled_write(self, victim: int, point: int, then_retry: bool) -> None:
        """The commit's write stalls past its deadline on one participant (P16); the controller retries once the
        write went on and ended, or resumes while it stalls, and the stopped write must never publish."""
        self._write_fault(victim, STALL_POINTS, point, STALL, then_retry)

    @action(
        lambda self: self._may_commit() and self.harness.can_pause, family=PAUSES, victim=PICK, then_retry=st.booleans()
    )
    def paused_commit(self, victim: int, then_retry: bool) -> None:
        """One participant is frozen (SIGSTOP) while the others commit and its own commit's deadline passes; woken
        (SIGCONT), it must refuse that commit and stay prepared (P16); the controller retries or resumes."""
        self._write_fault(victim, (PAUSE,), 0, PAUSE, then_retry)

    @action(
        lambda self: self._may_commit() and self.harness.can_fail_hooks,
        family=HOOKS,
        victim=PICK,
        then_retry=st.booleans(),
    )
    def failing_export(self, victim: int, then_retry: bool) -> None:
        """As `storage_fault`, with the victim's export hook raising instead (P16: 500 checkpoint_error); the
        retry must export afresh, since the first export never returned."""
        self._write_fault(victim, (EXPORT_HOOK,), 0, EXPORT_HOOK, then_retry)

    def _may_commit(self) -> bool:
        """A checkpoint is prepared, or one may be: a rule that commits prepares first when none is open, as the
        controller's routine does (`checkpoint`), so its fault is one step deep instead of two."""
        return self.model.phase == "prepared" or self._may_checkpoint()

    def _prepared_first(self) -> None:
        if self.model.phase != "prepared":
            self.prepare()

    def _write_fault(self, victim: int, points: tuple[str, ...], point: int, how: str, then_retry: bool) -> None:
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        members = self.controller.members()
        name = _pick(members, victim).name
        others = [m.name for m in members if m.name != name]
        fault = WriteFault(name, _pick(list(points), point), how)
        replies = self.controller.commit_on(others, checkpoint_id, scope) if others else {}
        self.audits.partial_commit(self.model, checkpoint_id, others, replies)
        refusal = self.nemesis.commit_meeting(fault, checkpoint_id, scope)
        try:
            props.p16_write_refused(checkpoint_id, name, fault.label, how, {} if refusal is None else {name: refusal})
            when = f"after its write met {fault.label}"
            props.p16_no_manifest(checkpoint_id, name, when, self.audits.has_manifest(checkpoint_id, name))
            props.p16_still_prepared(checkpoint_id, name, self.harness.statuses()[name])
        except PropertyViolation:
            if how == STALL:  # a write left stalled would hold up the teardown's resume: the violation is the verdict
                with contextlib.suppress(HarnessError):
                    self.nemesis.release_write(fault)
            raise
        label = f"{name} meets a {fault.label} in commit {checkpoint_id}"
        if then_retry:
            if how == STALL:
                self.nemesis.release_write(fault)
            self._commit_again(
                checkpoint_id, scope, lambda error: props.p16_retry_commits(checkpoint_id, fault.label, error)
            )
            self._advance(self.model.commit()[0], label + "; commit retried")
            return
        self.controller.resume(checkpoint_id)
        if how == STALL:
            self.nemesis.release_write(fault)
            when = "after a resume stopped its stalled write"
            props.p16_no_manifest(checkpoint_id, name, when, self.audits.has_manifest(checkpoint_id, name))
        self._left_incomplete(checkpoint_id, label)

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
        verifying = [a.key for a in self.model.with_status("running") if a.verifying]
        props.p10_prepared_everywhere(checkpoint_id, outcome.prepared, outcome.blockers, verifying, outcome.waited_s)
        self._prepared(checkpoint_id, outcome.replies)
        return outcome

    def _left_incomplete(self, checkpoint_id: str, label: str) -> None:
        """After a commit that did not complete and the controller's resume: the checkpoint stays, incomplete, with
        the shares that were published (each verifies, P9)."""
        published = self.audits.published_after_crash(checkpoint_id)
        model = self.model.commit_failed(published)
        self._advance(model, f"{label}; resume({checkpoint_id}), incomplete with the shares of {sorted(published)}")

    # -- clocks ---------------------------------------------------------------------------------------------------

    @action(
        lambda self: (
            not self.model.tried.clock_skew
            and self.harness.can_skew_clocks
            and self.controller.may_lapse
            and self._may_checkpoint()
        ),
        family=CLOCKS,
        victim=PICK,
        behind=st.booleans(),
    )
    def skewed_clock(self, victim: int, behind: bool) -> None:
        """One participant's clock runs ahead (or, `behind`, behind) of the controller's across a checkpoint whose
        lease lapses (P18): ahead, it refuses a deadline its clock passed, lapses first and refuses the controller's
        commit; behind, it outholds the others, and a stale controller's commit is refused by every one that
        lapsed. (Ahead is the simpler draw, which a derandomized search meets first: it checks more.)"""
        name = _pick(self.controller.members(), victim).name
        model, checkpoint_id = self.model.having_tried(clock_skew=True).prepare()
        offset_s = -SKEW_BEHIND_S if behind else SKEW_AHEAD_S
        self.nemesis.skew(name, offset_s)
        try:
            if behind:
                model, label = self._outholds_the_others(name, model, checkpoint_id)
            else:
                model, label = self._lapses_first(name, model, checkpoint_id)
        finally:
            self.nemesis.skew(name, 0.0)
        self._advance(model, f"skewed_clock({name} {offset_s:+g} s): {label}")

    def _lapses_first(self, name: str, model: Model, checkpoint_id: str) -> tuple[Model, str]:
        others = [m.name for m in self.controller.members() if m.name != name]
        within_skew = self.controller.probe_deadline_ahead("prepare", f"skew-{checkpoint_id}", SKEW_AHEAD_S / 2, [name])
        props.p18_refused_on_its_clock("a prepare due in half its skew", name, SKEW_AHEAD_S, within_skew[name])
        deadline_ts = self.harness.now() + SKEW_AHEAD_S + SKEWED_PREPARE_MARGIN_S
        try:
            self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if _only_deadline_missed(error, [name]):  # the margin passed on its clock before the prepare reached it
                self.controller.resume(checkpoint_id)
                return model.resume(), f"prepare({checkpoint_id}) reached {name} past its deadline; resumed"
            raise
        self.controller.renew_on(others, checkpoint_id)
        self.quiescence.wait_lapsed(name, checkpoint_id, deadline_ts + self.harness.lease_grace_s - SKEW_AHEAD_S)
        model = self._stale_commit(name, others, model, checkpoint_id, props.p18_lapsed_first)
        return model, f"prepare({checkpoint_id}); {name} lapsed first; commit refused by it; resume, incomplete"

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

    def _outholds_the_others(self, name: str, model: Model, checkpoint_id: str) -> tuple[Model, str]:
        others = [m.name for m in self.controller.members() if m.name != name]
        deadline_ts = self.harness.now() + SKEWED_QUIET_DEADLINE_S
        try:
            self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if _only_deadline_missed(error, others):  # a slow machine: the short deadline passed first
                self.controller.resume(checkpoint_id)
                return model.resume(), f"prepare({checkpoint_id}) reached some past its deadline; resumed"
            raise
        for other in others:
            self.quiescence.wait_lapsed(other, checkpoint_id, deadline_ts + self.harness.lease_grace_s)
        try:
            self.controller.commit(checkpoint_id, model.scope())
            refused = None
        except CoordinationError as error:
            refused = error
        props.p18_stale_commit_refused(checkpoint_id, others, refused)
        self.controller.resume(checkpoint_id)
        published = self.audits.published_after_crash(checkpoint_id)
        label = f"prepare({checkpoint_id}); the others lapsed; the stale commit refused; resume"
        return model.commit_failed(published), label

    @action(
        lambda self: (
            not self.model.tried.time_passed
            and self.harness.can_jump_clocks
            and not self.model.restarts()
            and self._may_checkpoint()
        ),
        family=CLOCKS,
    )
    def time_passes(self) -> None:
        """The controller prepares and goes quiet while TIME_PASSES_S pass for the whole system (every server's
        clocks jump, monotonic too): longer than an episode's whole budget and than the lease, so every participant
        re-opens on its own (P10) and the late commit is refused; every episode parked meanwhile (or in a replay step)
        goes on with the time it had left, and none times out for it (P20). (Never with restarts running: they are
        never parked, so their time runs out.)"""
        model, checkpoint_id = self.model.lease_expired(time_passed=True)
        parked = [attempt.key for attempt in self.model.with_status("running")]
        if self.controller.go_quiet(checkpoint_id, meanwhile=lambda: self.nemesis.pass_time(TIME_PASSES_S)):
            self.quiescence.outlasted.update(dict.fromkeys(parked, TIME_PASSES_S))
            label = f"{TIME_PASSES_S:g} s passed; {checkpoint_id} lapsed"
        else:
            label = "the prepare missed its deadline; resumed, and no time passed"
        self._refused("commit", checkpoint_id, "stale_checkpoint")
        self._advance(model, f"time_passes() -> {checkpoint_id}: {label}; commit({checkpoint_id}) refused")

    # -- pauses -------------------------------------------------------------------------------------------------

    @action(
        lambda self: self.harness.can_pause and self._may_checkpoint() and not self.ledgers.cuts,
        family=PAUSES,
        victim=PICK,
        then_retry=st.booleans(),
    )
    def paused_prepare(self, victim: int, then_retry: bool) -> None:
        """One participant is frozen (SIGSTOP) while a prepare reaches it, until the prepare's deadline passed; woken
        (SIGCONT), it refuses it with deadline_exceeded and stays idle (P21). The participants that took the prepare
        hold a lease of its short deadline, which may lapse before a retry of the same ID could reach them, so the
        controller gives the ID up: it resumes, which fences the ID everywhere (P10), and with `then_retry` prepares
        anew under a new ID, as after a failed close. (Never with generation cuts, as for a failed close.)"""
        name = _pick(self.controller.members(), victim).name
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
        victim=PICK,
    )
    def paused_lease(self, victim: int) -> None:
        """One participant is frozen (SIGSTOP) across its lease while the controller renews the others'; woken
        (SIGCONT), it lapses at once, so the controller's commit is refused by it alone and never published (P21);
        the controller resumes, and the checkpoint stays incomplete."""
        name = _pick(self.controller.members(), victim).name
        others = [m.name for m in self.controller.members() if m.name != name]
        model, checkpoint_id = self.model.having_tried(pause_lapse=True).prepare()
        deadline_ts = self.harness.now() + PAUSED_LEASE_DEADLINE_S
        try:
            self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if _only_deadline_missed(error, [name, *others]):  # a slow machine: the short deadline passed first
                self.controller.resume(checkpoint_id)
                self._advance(model.resume(), f"prepare({checkpoint_id}) reached some past its deadline; resumed")
                return
            raise
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

    # -- hooks that fail ---------------------------------------------------------------------------------------

    @action(
        lambda self: self.harness.can_fail_hooks and self._may_checkpoint() and not self.ledgers.cuts,
        family=HOOKS,
        victim=PICK,
        then_retry=st.booleans(),
    )
    def failing_close(self, victim: int, then_retry: bool) -> None:
        """A prepare in which one participant's close of admission fails after it closed: that participant alone
        refuses (500), idle with admission open again (P10); the controller resumes, and with `then_retry` prepares
        again under a new ID. (Never with generation cuts: a cut round of the failed prepare would be judged as the
        next one's.)"""
        name = _pick(self.controller.members(), victim).name
        model, checkpoint_id = self.model.prepare()
        self.nemesis.fail_hook(name, "close")
        try:
            self.controller.prepare(checkpoint_id)
            refused = None
        except CoordinationError as error:
            refused = error
        props.p10_failed_close_refused(checkpoint_id, name, refused)
        props.p10_reopened_after_failed_close(checkpoint_id, name, self.harness.statuses()[name])
        self.controller.resume(checkpoint_id)
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(model.resume(), f"prepare({checkpoint_id}), {name}'s close failed; resume({checkpoint_id})")
        if then_retry:
            self.prepare()

    @action(lambda self: self.model.can_restore() and self.harness.can_fail_hooks, family=HOOKS, pick=PICK, victim=PICK)
    def failing_install(self, pick: int, victim: int) -> None:
        """Restore a committed checkpoint while one participant's install hook fails having installed nothing: it
        alone refuses (500 checkpoint_error), and the cleanup leaves nothing behind (P8)."""
        checkpoint = _pick(list(self.model.committed), pick)
        name = _pick(self.controller.members(), victim).name
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        self.nemesis.fail_hook(name, "install")
        self._refused_restore(restore_id, checkpoint, ([name], "its install hook failed"), code="checkpoint_error")
        label = f"failing_install({checkpoint.checkpoint_id}) as {restore_id}, {name}'s install hook failed"
        self._advance(model, label, violation=props.P8Violation, counts_final=True)

    # -- lost replies -----------------------------------------------------------------------------------------

    @action(
        lambda self: self.harness.can_lose_replies and bool(self._one_sided()),
        family=LOST_REPLIES,
        victim=PICK,
        operation=PICK,
        then_retry=st.booleans(),
    )
    def lost_reply(self, victim: int, operation: int, then_retry: bool) -> None:
        """One participant runs a prepare, commit or resume in full and its reply is lost on the wire (an `info`
        outcome); the call took effect there (P17), and the controller then retries it (answered from the record)
        or resumes."""
        name = _pick(self.controller.members(), victim).name
        lost = _pick(self._one_sided(), operation)
        {"prepare": self._lost_prepare, "commit": self._lost_commit, "resume": self._lost_resume}[lost](
            name, then_retry
        )

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

    def _lost_prepare(self, name: str, then_retry: bool) -> None:
        model, checkpoint_id = self.model.prepare()
        self.nemesis.reply_lost(name, "prepare", checkpoint_id)
        props.p17_took_effect("prepare", checkpoint_id, name, self.harness.statuses()[name])
        label = f"prepare({checkpoint_id}), {name}'s reply lost"
        if not then_retry:
            self.controller.resume(checkpoint_id)
            self._refused("prepare", checkpoint_id, "stale_checkpoint")
            self._advance(model.resume(), f"{label}; resume({checkpoint_id})")
            return
        self._prepare_again(checkpoint_id, lambda error: props.p17_retry_answered("prepare", checkpoint_id, error))
        self._advance(model, f"{label}; prepare retried")

    def _lost_commit(self, name: str, then_retry: bool) -> None:
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        self.nemesis.reply_lost(name, "commit", checkpoint_id, scope)
        published = self.audits.has_manifest(checkpoint_id, name)
        props.p17_took_effect("commit", checkpoint_id, name, self.harness.statuses()[name], published)
        label = f"commit({checkpoint_id}), {name}'s reply lost"
        if then_retry:
            try:
                replies = self.controller.commit(checkpoint_id, scope)
            except CoordinationError as error:
                props.p17_retry_answered("commit", checkpoint_id, error)
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
        self.nemesis.reply_lost(name, "resume", checkpoint_id)
        props.p17_took_effect("resume", checkpoint_id, name, self.harness.statuses()[name])
        label = f"resume({checkpoint_id}), {name}'s reply lost"
        if then_retry:
            replies = self.controller.resume(checkpoint_id)
            props.p17_resume_replayed(checkpoint_id, name, replies[name])
            label += "; resume retried"
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        self._advance(self.model.resume(), f"{label}; prepare({checkpoint_id}) refused")

    # -- a participant the controller cannot reach --------------------------------------------------------------

    @action(
        lambda self: bool(self._one_sided()), family=UNREACHABLE, victim=PICK, operation=PICK, then_retry=st.booleans()
    )
    def unreachable(self, victim: int, operation: int, then_retry: bool) -> None:
        """One participant is cut off from the controller (its connections refused) while the controller sends a
        prepare, commit or resume; it runs on, untouched (P19). Once it is back, the controller retries the call
        (each participant that took it answers from its record), or, after a prepare or a commit, resumes."""
        name = _pick(self.controller.members(), victim).name
        cut_off = _pick(self._one_sided(), operation)
        {"prepare": self._unreached_prepare, "commit": self._unreached_commit, "resume": self._unreached_resume}[
            cut_off
        ](name, then_retry)

    def _unreached(
        self, name: str, operation: str, checkpoint_id: str, scope: Sequence[Attempt] = ()
    ) -> CoordinationError:
        """`operation` sent while `name` is cut off; its error, once `name` showed it never saw the call (P19)."""
        before = self.harness.statuses()[name]
        error = self.nemesis.unreached(name, operation, checkpoint_id, scope)
        published = operation == "commit" and self.audits.has_manifest(checkpoint_id, name)
        props.p19_untouched(operation, checkpoint_id, name, before, self.harness.statuses()[name], published)
        return error

    def _unreached_prepare(self, name: str, then_retry: bool) -> None:
        model, checkpoint_id = self.model.prepare()
        first = self._unreached(name, "prepare", checkpoint_id)
        label = f"prepare({checkpoint_id}), {name} unreachable"
        if not then_retry:
            # Some participants never saw this prepare: the resume must fence the ID on them too.
            self.controller.resume(checkpoint_id)
            self._refused("prepare", checkpoint_id, "stale_checkpoint")
            self._advance(model.resume(), f"{label}; resume({checkpoint_id}); prepare({checkpoint_id}) refused")
            return
        outcome = self._prepare_again(
            checkpoint_id, lambda error: props.p19_retry_completes("prepare", checkpoint_id, error)
        )
        props.p19_answered_from_record("prepare", checkpoint_id, first.replies, outcome.replies)
        self._advance(model, f"{label}; prepare retried once it was back")

    def _unreached_commit(self, name: str, then_retry: bool) -> None:
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        first = self._unreached(name, "commit", checkpoint_id, scope)
        self.audits.partial_commit(self.model, checkpoint_id, sorted(first.replies), first.replies)
        label = f"commit({checkpoint_id}), {name} unreachable"
        if then_retry:
            replies = self._commit_again(
                checkpoint_id, scope, lambda error: props.p19_retry_completes("commit", checkpoint_id, error)
            )
            props.p19_answered_from_record("commit", checkpoint_id, first.replies, replies)
            self._advance(self.model.commit()[0], f"{label}; commit retried once it was back")
            return
        self.controller.resume(checkpoint_id)
        self._left_incomplete(checkpoint_id, label)

    def _unreached_resume(self, name: str, _then_retry: bool) -> None:
        """A resume is always retried: short of its lease lapsing, nothing else re-opens the participant."""
        if not self.model.checkpoint_open:
            self.prepare()
        checkpoint_id = self.model.opened
        self._unreached(name, "resume", checkpoint_id)
        replies = self.controller.resume(checkpoint_id)
        props.p19_first_resume(checkpoint_id, name, replies[name])
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        label = f"resume({checkpoint_id}), {name} unreachable; resume retried once it was back"
        self._advance(self.model.resume(), f"{label}; prepare({checkpoint_id}) refused")

    # -- restores ---------------------------------------------------------------------------------------------

    @action(lambda self: self.model.can_restore(), family=RESTORES, pick=PICK)
    def restore(self, pick: int) -> None:
        """Restore the latest or an earlier checkpoint into the fresh processes, then resume (P9, P6)."""
        checkpoint = _pick(list(self.model.committed), pick)
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.restore(checkpoint.checkpoint_id)
        try:
            replies = self.controller.restore(restore_id, checkpoint.checkpoint_id, checkpoint.exported)
        except CoordinationError as error:
            props.p9_restores(checkpoint.checkpoint_id, restore_id, error)
            raise
        self.audits.restored(checkpoint.checkpoint_id, restore_id, checkpoint.exported, replies)
        self.controller.resume(restore_id)
        self._advance(model, f"restore({checkpoint.checkpoint_id}) as {restore_id}")

    @action(lambda self: self.model.can_restore(), family=DAMAGE, pick=PICK, victim=PICK, rejected_record=st.booleans())
    def failed_restore(self, pick: int, victim: int, rejected_record: bool) -> None:
        """Restore a copy of a committed checkpoint with one participant's share damaged: it alone refuses (P8)."""
        checkpoint = _pick(list(self.model.committed), pick)
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        member, how, copy = self.nemesis.damaged_copy(checkpoint, restore_id, rejected_record, victim)
        self._refused_restore(restore_id, checkpoint, ([member], f"damaged: {how}"), copy)
        label = f"failed_restore({checkpoint.checkpoint_id}) as {restore_id}, {member} damaged ({how}) refused it"
        self._advance(model, label, violation=props.P8Violation, counts_final=True)

    @action(lambda self: self.model.can_restore_incomplete(), family=DAMAGE, pick=PICK)
    def restore_incomplete(self, pick: int) -> None:
        """Restore a checkpoint whose commit a crash cut short: those without a share refuse it (P8)."""
        checkpoint = _pick(list(self.model.incomplete), pick)
        missing = [m.name for m in self.controller.control.participants if m.name not in checkpoint.shares]
        self._forget_covering(checkpoint.checkpoint_id, incomplete=True)
        model, restore_id = self.model.failed_restore(checkpoint.checkpoint_id)
        self._refused_restore(restore_id, checkpoint, (missing, "no share: the crash came first"))
        label = f"restore_incomplete({checkpoint.checkpoint_id}) as {restore_id}, refused by {missing}"
        self._advance(model, label, violation=props.P8Violation, counts_final=True)

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
            notes = getattr(error, "__notes__", [])
            props.p8_refused_by(restore_id, refusers, why, error.failures, notes, code)
        else:
            props.p8_not_refused(restore_id, refusers, why)

    @action(
        lambda self: self.harness.can_crash and self.model.can_restore() and bool(self.nemesis.can_die_in_restore()),
        family=CRASHES,
        pick=PICK,
        victim=PICK,
    )
    def dies_in_restore(self, pick: int, victim: int) -> None:
        """One participant dies inside its own restore while the others finish; the cleanup undoes it all (P8)."""
        checkpoint = _pick(list(self.model.committed), pick)
        member = _pick(self.nemesis.can_die_in_restore(), victim)
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.died_in_restore(checkpoint.checkpoint_id, member.kind)
        outcomes = self.nemesis.die_in_restore(member, restore_id, checkpoint.checkpoint_id, checkpoint.exported)
        props.p8_died_in_restore(restore_id, member.name, outcomes)
        try:
            self.controller.undo_restore(restore_id, checkpoint.exported)
        except CoordinationError as error:
            props.p8_cleanup_succeeds(restore_id, error)
            raise
        label = f"dies_in_restore({checkpoint.checkpoint_id}) as {restore_id}: {member.name} died before installing"
        self._advance(model, label, violation=props.P8Violation, counts_final=True)

    # -- the controller's routines as single steps: a bug that needs a checkpoint, a crash and a restore in a row
    # is then four steps deep instead of seven, so a random search reaches it far more often.

    @action(lambda self: self._may_checkpoint(), family=CHECKPOINTS, then_resume=st.booleans(), hold_one=st.booleans())
    def checkpoint(self, then_resume: bool, hold_one: bool = False) -> None:
        """Prepare and commit, then resume or not; `hold_one` holds a reply across the commit (Gym's scenario 8)."""
        self.prepare()
        if hold_one and self.model.releasable():
            self.release(0)
        self.commit()
        if then_resume:
            self.resume()

    @action(
        lambda self: self.harness.can_crash and not self.model.fresh and bool(self.model.committed),
        family=CRASHES,
        pick=PICK,
    )
    def recover(self, pick: int) -> None:
        """The routine recovery: crash, then restore the latest or an earlier checkpoint and resume."""
        self.crash()
        self.restore(pick)

    @action(
        lambda self: not self.model.checkpoint_open and bool(self.model.with_status("pending")),
        family=ROLLOUTS,
        pick=PICK,
        worker=WORKER,
    )
    def start_replacement(self, pick: int, worker: int = 0) -> None:
        """Send a restored rollout's next attempt with the same task: it continues from its boundary."""
        rollout = _pick(sorted(a.rollout for a in self.model.with_status("pending")), pick)
        self._start(self.model.start_replacement(rollout), rollout, "start_replacement", worker, continues=True)

    @action(
        lambda self: not self.model.checkpoint_open and bool(self.model.with_status("dead")),
        pick=PICK,
        worker=WORKER,
        family=ROLLOUTS,
    )
    def start_over(self, pick: int, worker: int = 0) -> None:
        """Start a rollout lost in a crash over from its input as attempt + 1."""
        rollout = _pick(sorted(a.rollout for a in self.model.with_status("dead")), pick)
        self._start(self.model.start_over(rollout), rollout, "start_over", worker)

    def _start(self, model: Model, rollout: str, rule_name: str, worker: int, continues: bool = False) -> None:
        placed = self.controller.run(model.current()[rollout], worker, continues)
        self._advance(model, f"{rule_name}({rollout}) as {model.current()[rollout].key}{placed}")

    # -- retire and forget ------------------------------------------------------------------------------------

    @action(
        lambda self: not self.model.checkpoint_open and bool(self.model.live()),
        family=ROLLOUTS,
        pick=PICK,
        again=st.booleans(),
        worker=WORKER,
    )
    def retire(self, pick: int, again: bool, worker: int = 0) -> None:
        """Retire a rollout's attempt everywhere; then start it over as attempt + 1 (on policy worker `worker`), or
        give it up."""
        self._retire(_pick(sorted(a.rollout for a in self.model.live()), pick), again, worker)

    def _retire(self, rollout: str, again: bool, worker: int = 0) -> None:
        attempt = self.model.current()[rollout]
        model, retire_id = self.model.issue_id("retire")
        self.controller.retire(retire_id, [attempt])
        model = model.retire(rollout)
        label = f"retire({rollout}) of {attempt.key}"
        if again:
            model = model.start_over(rollout)
            placed = self.controller.run(model.current()[rollout], worker)
            label += f", then start_over as {model.current()[rollout].key}{placed}"
        self._advance(model, label, violation=props.P7Violation, counts_final=True)

    @action(lambda self: not self.model.checkpoint_open and bool(self.model.retired_marks), family=ROLLOUTS)
    def forget(self) -> None:
        """Forget every retired rollout: the marks go everywhere."""
        self._forget(list(self.model.marked_rollouts()))

    def _forget(self, rollouts: list[str]) -> None:
        model, forget_id = self.model.issue_id("forget")
        self.controller.forget(forget_id, rollouts)
        label = f"forget({rollouts})"
        self._advance(model.forget(tuple(rollouts)), label, violation=props.P7Violation, counts_final=True)

    def _forget_covering(self, checkpoint_id: str, incomplete: bool = False) -> None:
        """Forget the rollouts whose marks would refuse what a restore of `checkpoint_id` continues."""
        covered = self.model.marks_covering(checkpoint_id, incomplete=incomplete)
        if covered:
            self._forget(covered)

    # -- a misbehaving controller -----------------------------------------------------------------------------

    @action(lambda self: bool(self.model.late_runs()), family=CONTROLLER, pick=PICK)
    def late_run(self, pick: int) -> None:
        """A late `/run` of a retired attempt is refused with stale_attempt until forget (P7); with no checkpoint
        open, so are its calls straight to each callee that holds the mark (a tool call and a verify to the
        resources servers, a generation call to the policy model)."""
        attempt = self.model.retired_attempt(_pick(self.model.late_runs(), pick))
        outcome = self.controller.late_run(attempt)
        props.p7_refused(attempt.key, outcome.status_code, outcome.body)
        label = f"late_run({attempt.key}) -> HTTP {outcome.status_code}"
        if not self.model.checkpoint_open:
            callees = self._late_callee_calls(attempt)
            for call, answer in callees.items():
                props.p7_callee_refused(attempt.key, call, answer.status_code, answer.body)
            label += f"; refused straight by {sorted(callees)}" if callees else ""
        self._advance(self.model, label, violation=props.P7Violation)

    def _late_callee_calls(self, attempt: Attempt) -> dict[str, Any]:
        """The calls straight to each callee whose kind holds `attempt`'s retire mark (`ckpt_model.callees`)."""
        marked = [
            m for m in self.controller.members() if self.model.holds_mark(m.kind, attempt.rollout, attempt.attempt)
        ]
        resources = [m for m in marked if m.kind == "resources"]
        tool = self.harness.spec.traits.script[0]
        calls = self.callees.resources_calls(attempt, resources, tool) if resources else {}
        return {**calls, **self.callees.generation_calls(attempt, [m for m in marked if m.kind == "model"])}

    @action(lambda self: self.model.may_run_while_open(), family=CONTROLLER)
    def run_while_open(self) -> None:
        """A new `/run` while a checkpoint is open is refused with admission_closed and owns nothing (P10)."""
        model, attempt = self.model.refused_dispatch()
        self.controller.run_refused(attempt)
        self._advance(model, f"run_while_open() -> {attempt.rollout} refused", violation=props.P10Violation)

    @action(lambda self: self.ledgers.enabled and self.model.may_remove_ledgers_while_open(), family=CONTROLLER)
    def remove_ledgers_while_open(self) -> None:
        """A ledger retire and delete while a checkpoint is open are refused (P10); the ledgers stay (P5)."""
        checkpoint_id, keys = self.model.opened, sorted(a.key for a in self.model.live()) or ["probe"]
        props.p10_ledger_removal_refused(checkpoint_id, self.controller.remove_ledgers(keys))
        model = self.model.having_tried(ledger_removal_in=checkpoint_id)
        self._advance(model, f"remove_ledgers_while_open({keys}) refused", violation=props.P10Violation)

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
        props.p10_retry_answered(label, last.operation, last.after_crash, last.replies, outcomes)
        self._advance(self.model, label)

    @action(
        lambda self: not self.model.tried.lease_lapse and self._may_checkpoint() and self.controller.may_lapse,
        family=CONTROLLER,
    )
    def quiet_controller(self) -> None:
        """The controller prepares and goes quiet: the lease lapses, and its late commit is refused (P10)."""
        model, checkpoint_id = self.model.lease_expired()
        self.controller.go_quiet(checkpoint_id)
        self._refused("commit", checkpoint_id, "stale_checkpoint")
        self._advance(model, f"quiet_controller() -> {checkpoint_id} lapsed; commit({checkpoint_id}) refused")

    # -- teardown: drain and the end-of-run properties ---------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.log.drain(self._drain)
        finally:
            self.controller.runs.shutdown()
            self.log.finished(self.nemesis.crashes, self.nemesis.crashes_inside)

    def _drain(self) -> None:
        """Resume; after a crash, recover as the controller does (restore the latest checkpoint when it continues
        something); start everything unfinished, release every call, forget; then P3, P4, P5, P7, P9 and P13."""
        if self.model.checkpoint_open:
            self.resume()
        if self.model.can_restore() and self.model.committed[-1].exported:
            self.restore(len(self.model.committed) - 1)
        while self.model.with_status("pending"):
            self.start_replacement(0)
        while self.model.with_status("dead"):
            self.start_over(0)
        while self.model.waiting():
            self.release(0)
        if self.model.retired_marks:
            self.forget()
        self.audits.at_end(self.model)

    # -- the machinery ----------------------------------------------------------------------------------------

    def _may_checkpoint(self) -> bool:
        """With a gated backend a checkpoint needs some rollout unfinished (one with nothing in flight checks
        little beyond fencing); without a gate checkpoints are all that is left to check."""
        return self.model.can_prepare() and (self.harness.backend is None or bool(self.model.live()))

    def _refused(self, operation: str, checkpoint_id: str, code: str, names: list[str] | None = None) -> None:
        """`operation` naming `checkpoint_id`, sent to each participant (or those `names`), is refused with `code`."""
        outcomes = self.controller.probe(operation, checkpoint_id, names)
        props.p10_each_refused(f"{operation}({checkpoint_id})", code, outcomes)

    def _refused_past_deadline(self, operation: str, checkpoint_id: str, **arguments: Any) -> None:
        """`operation` of `checkpoint_id` (with the arguments the controller is about to send), its deadline passed
        a second ago, is refused by every participant with `deadline_exceeded` (P10); the call that follows sees
        nothing of it."""
        outcomes = self.controller.probe_past_deadline(operation, checkpoint_id, **arguments)
        props.p10_each_refused(f"{operation}({checkpoint_id}) past its deadline", "deadline_exceeded", outcomes)

    def _advance(
        self, model: Model, label: str, violation: Violation | None = None, counts_final: bool = False
    ) -> None:
        """Adopt the model's next value, then wait for the quiet state it predicts and audit the step."""
        self.model = model
        self.log.labels.append(label)
        self.quiescence.settle(self.model, violation, counts_final)
        self.controller.placement.audit()
        self.audits.after_step(self.model, self.history)


def _pick(items: list[Any], pick: int) -> Any:
    return items[pick % len(items)]


def _only_deadline_missed(error: CoordinationError, names: list[str]) -> bool:
    """Whether every refusal is a deadline_exceeded from one of `names` (a deadline that passed first, which the
    protocol allows and no property judges)."""
    return all(f.code == "deadline_exceeded" and n in names for n, f in error.failures.items())


class SwarmMachine(CheckpointMachine):
    """The same machine, whose every example first draws the rules and mechanisms it leaves out (`swarm`)."""

    @initialize(chosen=swarms(rule_names(CheckpointMachine)))
    def choose_swarm(self, chosen: Swarm) -> None:
        self.log.swarm = chosen


def machine_for(
    harness: Harness, stats: SearchStats | None = None, swarm: bool = False, weights: Weights | None = None
) -> type[CheckpointMachine]:
    """A factory of machines bound to `harness`, for `run_state_machine_as_test`; with `swarm`, of swarm machines;
    `weights` changes the families' weights in the draw.
    Hypothesis keys its example database (and, derandomized, its draws) on the factory's source plus this digest,
    so each deployment (and each draw) keeps its own examples: a failure saved by one is not replayed against
    another. The plain factory's source is left as it was, so its derandomized draws stay the same."""

    def factory() -> CheckpointMachine:
        return CheckpointMachine(harness, stats, weights=weights)

    def swarm_factory() -> CheckpointMachine:
        return SwarmMachine(harness, stats, weights=weights)

    chosen = swarm_factory if swarm else factory
    chosen._hypothesis_internal_add_digest = harness.spec.key.encode()  # type: ignore[attr-defined]
    # `run_state_machine_as_test` is typed for the class but calls what it gets with no arguments; a factory that
    # closes over the harness is how a machine is bound by composition.
    return cast(type[CheckpointMachine], chosen)
