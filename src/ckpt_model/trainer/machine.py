"""The Hypothesis state machine: the training controller, played against real server processes.

It only chooses. Every rule reads: the model's transition (`contract`), the controller's call (`controller`, or the
fault: a kill of the `nemesis`'s, or its family's own effect in `nemeses`), the audit (`audits`, the properties'
named checks); then it waits for the quiet state the model predicts. Model calls wait at the backend until
`release` lets one go, so every example replays the same way. docs/how-it-works.md describes each rule in full.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import initialize

from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import CoordinationError
from ckpt_model.interrupts import interrupt_prevails
from ckpt_model.model.contract import Model
from ckpt_model.properties.state import P7Violation
from ckpt_model.protocol.gym_tasks import TaskName
from ckpt_model.protocol.history import History
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps import checkable, draw, goals
from ckpt_model.steps.draw import Focus, Weights
from ckpt_model.steps.families import CALLS, CHECKPOINTS, RESTORES, ROLLOUTS
from ckpt_model.steps.steplog import StepLog, action, mechanisms_of, rule_names
from ckpt_model.steps.swarm import Swarm, swarms
from ckpt_model.trainer import twin
from ckpt_model.trainer.audits import Audits
from ckpt_model.trainer.callees import Callees
from ckpt_model.trainer.checkpoint_ids import CHECKPOINT_STEMS
from ckpt_model.trainer.controller import HUNG_CUT_PREPARE_DEADLINE_S, Controller, episodes_of, run_pool
from ckpt_model.trainer.kills import Nemesis
from ckpt_model.trainer.ledger_watch import LedgerWatch
from ckpt_model.trainer.nemeses.clocks import Clocks
from ckpt_model.trainer.nemeses.controller import MisbehavingController
from ckpt_model.trainer.nemeses.crashes import Crashes
from ckpt_model.trainer.nemeses.damage import Damage
from ckpt_model.trainer.nemeses.hooks import Hooks
from ckpt_model.trainer.nemeses.lost_replies import LostReplies
from ckpt_model.trainer.nemeses.pauses import Pauses
from ckpt_model.trainer.nemeses.storage import Storage
from ckpt_model.trainer.nemeses.unreachable import Unreachable
from ckpt_model.trainer.pipeline import PICK, WORKER, choose
from ckpt_model.trainer.quiescence import SETTLE_TIMEOUT_S, Quiescence
from ckpt_model.trainer.rollout_ids import ROLLOUT_IDS
from ckpt_model.trainer.task_names import TASK_NAMES


class CheckpointMachine(
    Crashes, Storage, Pauses, LostReplies, Unreachable, Hooks, Clocks, MisbehavingController, Damage
):
    """Plays the controller against the deployment `harness` wraps (bound by `machine_for`, one per deployment).

    Its own rules are the protocol's; each nemesis family is mounted as one base (`ckpt_model.trainer.nemeses`), whose
    rules end, as these do, in the one pipeline of `MachineBase._advance`: the model's next value, settle, audit. The
    order of the bases is the order of the families' goals in the coverage table (`steplog.goals_of`); rules are
    collected by name wherever they are declared, so it changes nothing else."""

    def __init__(
        self,
        harness: Harness,
        stats: SearchStats | None = None,
        settle_timeout_s: float = SETTLE_TIMEOUT_S,
        weights: Weights | None = None,
        focus: Focus | None = None,
    ) -> None:
        super().__init__()
        # A family first, then its rule (`ckpt_model.steps.draw`). A deployment that may not be restarted runs one
        # example only, the all-zero one Hypothesis makes first: there a run of zeros must not end it.
        draw.install(self, weights, rejects_zero_runs=harness.can_crash, focus=focus)
        self.harness = harness
        if stats is not None:
            stats.example_started()
        twins = twin.begin_example(harness)  # the example starts; P14's baseline is made first if not cached
        self.model = Model(topology=harness.spec.topology, verify_mode=harness.spec.verify_mode)  # type: ignore[arg-type]
        self.history = History()
        runs = run_pool(harness, self.history)
        traits = harness.spec.traits
        self.quiescence = Quiescence(harness, harness.clocks, runs, traits.reward(traits.script), settle_timeout_s)
        self.ledgers = LedgerWatch(harness)  # P5, P12: the capture ledgers the checker predicts and reads
        self.controller = Controller(harness, self.history, runs, self.quiescence, watchers=[self.ledgers])
        self.nemesis = Nemesis(harness, self.controller)
        self.callees = Callees(harness, self.history, runs, self.quiescence.timeout_s)
        self.audits = Audits(harness, self.ledgers, runs, twins)
        self.log = StepLog(harness, self.history, stats)
        self.missed = []

    # -- rollouts ---------------------------------------------------------------------------------------------

    @action(
        lambda self: self.harness.backend is not None and self.model.can_dispatch(),
        family=ROLLOUTS,
        needs=(checkable.GATE,),
        worker=WORKER,
        rollout_id=ROLLOUT_IDS,
        task=TASK_NAMES,
    )
    def dispatch(self, worker: int = 0, rollout_id: str | None = None, task: TaskName | None = None) -> None:
        """A new rollout starts and stops at its first model call; its calls are served by policy worker `worker`.
        Its rollout ID is `rollout_id` numbered apart (`rollout_names`; None: `r<seq>`); its native `/run` names
        `task` (`task_names`; None: the weather task's own name)."""
        self._dispatch(restart=False, worker=worker, drawn=rollout_id, task=task)

    @action(
        lambda self: self.harness.backend is not None and self.model.can_dispatch_restart(),
        family=ROLLOUTS,
        needs=(checkable.GATE, checkable.RESTART_ENVIRONMENT),
        applies=goals.with_restart_environment,
        worker=WORKER,
        rollout_id=ROLLOUT_IDS,
        task=TASK_NAMES,
    )
    def dispatch_restart(self, worker: int = 0, rollout_id: str | None = None, task: TaskName | None = None) -> None:
        """A new rollout on the restart environment (topology `mixed`): a restart, never exported."""
        self._dispatch(restart=True, worker=worker, drawn=rollout_id, task=task)

    def _dispatch(self, restart: bool, worker: int, drawn: str | None, task: TaskName | None) -> None:
        # A regression file gives the pair back as a JSON list.
        named = None if task is None else (task[0], task[1])
        model, rollout = self.model.dispatch(restart=restart, drawn=drawn, task=named)
        placed = self.controller.run(model.current()[rollout], worker)
        self._advance(model, f"dispatch{'_restart' if restart else ''}() -> {rollout}{placed}")

    @action(lambda self: bool(self.model.releasable()), family=CALLS, needs=(checkable.GATE,), pick=PICK)
    def release(self, pick: int) -> None:
        """Let one rollout's waiting call return: a policy call, or the slow topology's judge call."""
        rollout = choose(self.model.releasable(), pick)
        self.controller.release([self.model.current()[rollout].key])
        self._advance(self.model.release(rollout), f"release({rollout})")

    @action(
        lambda self: bool(self.model.before_verification()),
        family=CALLS,
        needs=(checkable.GATE, checkable.JUDGE),
        applies=goals.asks_a_judge,
        pick=PICK,
    )
    def release_to_verification(self, pick: int) -> None:
        """Release one rollout's policy calls until its judge call waits (slow topology)."""
        rollout = choose(self.model.before_verification(), pick)
        while not self.model.current()[rollout].verifying:
            self.release(self.model.releasable().index(rollout))

    # -- checkpoints ------------------------------------------------------------------------------------------

    @action(lambda self: self._may_checkpoint(), family=CHECKPOINTS, checkpoint_id=CHECKPOINT_STEMS)
    def prepare(self, checkpoint_id: str | None = None) -> None:
        """Prepare a new checkpoint: everything is at a boundary, so every stage becomes prepared (P10). Its ID,
        and the example's next ones, are named with `checkpoint_id` numbered apart (`checkpoint_names`; None: the
        stem drawn last, else `c<seq>`)."""
        model, checkpoint_id = self.model.prepare(checkpoint_id)
        judge = self._judge_prepare(checkpoint_id)
        self._refused_past_deadline("prepare", checkpoint_id)
        outcome = self.controller.prepare(checkpoint_id)
        judge(outcome)
        self._prepared(checkpoint_id, outcome.replies)
        self._advance(model, f"prepare() -> {checkpoint_id}; prepare(other{model.checkpoint_seq}) refused")

    @action(
        lambda self: self.ledgers.cuts and self.model.can_prepare() and bool(self.model.waiting()),
        family=CHECKPOINTS,
        needs=(checkable.GATE, checkable.TOKEN_CAPTURE, checkable.GENERATION_CUTS),
        applies=goals.cuts_generations,
    )
    def prepare_with_hung_cut(self) -> None:
        """A short prepare while the cut endpoint hangs: prepared in time (P10), nothing cut (P12); then renew."""
        model, checkpoint_id = self.model.prepare()
        try:
            outcome = self.controller.prepare_with_hung_cut(checkpoint_id)
        except CoordinationError as error:
            self.audits.hung_cut_refused(checkpoint_id, HUNG_CUT_PREPARE_DEADLINE_S, error)
            raise
        self.audits.prepared_everywhere(checkpoint_id, [], outcome)
        self.controller.renew(checkpoint_id)
        self._prepared(checkpoint_id, outcome.replies)
        self._advance(model, f"prepare_with_hung_cut() -> {checkpoint_id}, its cut hung; renewed")

    @action(
        lambda self: self.model.can_prepare_blocked(),
        family=CHECKPOINTS,
        needs=(checkable.GATE, checkable.JUDGE, checkable.VERIFY_WAIT),
        applies=goals.waits_for_a_judge,
    )
    def prepare_blocked(self) -> None:
        """A short prepare meets `wait` verifications, blocked by exactly them (P11); resume, retire them, again."""
        blockers, blocking = self.model.blockers(), self.model.blocking_rollouts()
        model, checkpoint_id = self.model.prepare_blocked()
        outcome = self.controller.prepare_short(checkpoint_id)
        self.audits.blocked(self.model, checkpoint_id, blockers, outcome)
        self.controller.resume(checkpoint_id)
        self._advance(model, f"prepare_blocked() -> {checkpoint_id} blocked by {blockers}; resume({checkpoint_id})")
        for rollout in blocking:
            self._retire(rollout, again=True)

    @action(
        lambda self: self.model.can_prepare_blocked(),
        family=CHECKPOINTS,
        needs=(checkable.GATE, checkable.JUDGE, checkable.VERIFY_WAIT),
        applies=goals.waits_for_a_judge,
    )
    def prepare_waiting(self) -> None:
        """A prepare left waiting on `wait` verifications whose episodes finish during it (Gym's scenario 10)."""
        blockers = self.model.blockers()
        model, checkpoint_id = self.model.prepare_waited()
        owner = self.model.episode_owner

        def release_blockers(prepare: Any) -> None:
            self.quiescence.wait_preparing(owner, checkpoint_id, blockers, prepare)
            self.controller.release(blockers)

        outcome = self.controller.prepare_waiting(checkpoint_id, release_blockers)
        self.audits.prepared_once_verified(checkpoint_id, blockers, outcome)
        self._prepared(checkpoint_id, outcome.replies)
        self._advance(model, f"prepare_waiting() -> {checkpoint_id}; {blockers} finished during it")

    @action(lambda self: self.model.phase == "prepared", family=CHECKPOINTS)
    def commit(self) -> None:
        """Commit every unfinished attempt; P1 on every reply and share, P9 (it verifies), P6 (exported state)."""
        checkpoint_id, scope = self.model.opened, self.model.scope()
        refusals = self.controller.probe_commit_naming_restarts(checkpoint_id, scope, self.model.restarts())
        self.audits.restart_in_scope_refused(checkpoint_id, refusals)
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

    # -- restores ---------------------------------------------------------------------------------------------

    @action(lambda self: self.model.can_restore(), family=RESTORES, needs=(checkable.FRESH,), pick=PICK)
    def restore(self, pick: int) -> None:
        """Restore the latest or an earlier checkpoint into the fresh processes, then resume (P9, P6)."""
        checkpoint = choose(list(self.model.committed), pick)
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.restore(checkpoint.checkpoint_id)
        try:
            replies = self.controller.restore(restore_id, checkpoint.checkpoint_id, checkpoint.exported)
        except CoordinationError as error:
            self.audits.restore_refused(checkpoint.checkpoint_id, restore_id, error)
            raise
        self.audits.restored(checkpoint.checkpoint_id, restore_id, checkpoint.exported, replies)
        self.controller.resume(restore_id)
        self._advance(model, f"restore({checkpoint.checkpoint_id}) as {restore_id}")

    @action(
        lambda self: self._may_crash_first() and bool(self.model.committed),
        family=RESTORES,
        needs=(checkable.CRASHES,),
        pick=PICK,
    )
    def recover(self, pick: int) -> None:
        """The routine recovery: crash, then restore the latest or an earlier checkpoint and resume."""
        self.crash()
        self.restore(pick)

    @action(
        lambda self: self._may_crash_first() and self.model.last_restored() is not None,
        family=RESTORES,
        needs=(checkable.CRASHES,),
    )
    def recover_again(self) -> None:
        """Crash, then restore the checkpoint the latest restore named once more (Gym's scenario 3; after a refused
        restore, the restore that follows its cleanup)."""
        again = self.model.last_restored()
        assert again is not None
        self.crash()
        self.restore(again)

    # -- the controller's routines as single steps: a bug that needs a checkpoint, a crash and a restore in a row
    # is then four steps deep instead of seven, so a random search reaches it far more often.

    @action(
        lambda self: self._may_checkpoint(),
        family=CHECKPOINTS,
        mechanisms=("hold_one", "then_resume"),
        then_resume=st.booleans(),
        hold_one=st.booleans(),
        checkpoint_id=CHECKPOINT_STEMS,
    )
    def checkpoint(self, then_resume: bool, hold_one: bool = False, checkpoint_id: str | None = None) -> None:
        """Prepare and commit, then resume or not; `hold_one` holds a reply across the commit (Gym's scenario 8).
        `checkpoint_id` names the checkpoint as `prepare`'s does."""
        self.prepare(checkpoint_id)
        if hold_one and self.model.releasable():
            self.release(0)
        self.commit()
        if then_resume:
            self.resume()

    @action(
        lambda self: not self.model.checkpoint_open and bool(self.model.with_status("pending")),
        family=ROLLOUTS,
        needs=(checkable.GATE, checkable.CRASHES),
        pick=PICK,
        worker=WORKER,
    )
    def start_replacement(self, pick: int, worker: int = 0) -> None:
        """Send a restored rollout's next attempt with the same task: it continues from its boundary."""
        rollout = choose(self.model.rollouts_with_status("pending"), pick)
        self._start(self.model.start_replacement(rollout), rollout, "start_replacement", worker, continues=True)

    @action(
        lambda self: not self.model.checkpoint_open and bool(self.model.with_status("dead")),
        pick=PICK,
        worker=WORKER,
        family=ROLLOUTS,
        needs=(checkable.GATE, checkable.CRASHES),
    )
    def start_over(self, pick: int, worker: int = 0) -> None:
        """Start a rollout lost in a crash over from its input as attempt + 1."""
        rollout = choose(self.model.rollouts_with_status("dead"), pick)
        self._start(self.model.start_over(rollout), rollout, "start_over", worker)

    def _start(self, model: Model, rollout: str, rule_name: str, worker: int, continues: bool = False) -> None:
        placed = self.controller.run(model.current()[rollout], worker, continues)
        self._advance(model, f"{rule_name}({rollout}) as {model.current()[rollout].key}{placed}")

    # -- retire and forget ------------------------------------------------------------------------------------

    @action(
        lambda self: self._may_retire(),
        family=ROLLOUTS,
        needs=(checkable.GATE,),
        judges=("P7",),
        mechanisms=("again",),
        pick=PICK,
        again=st.booleans(),
        worker=WORKER,
    )
    def retire(self, pick: int, again: bool, worker: int = 0) -> None:
        """Retire a rollout's attempt everywhere; then start it over as attempt + 1 (on policy worker `worker`), or
        give it up."""
        self._retire(choose(self.model.live_rollouts(), pick), again, worker)

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
        self._advance(model, label, violation=P7Violation, counts_final=True)

    @action(
        lambda self: not self.model.checkpoint_open and bool(self.model.retired_marks),
        family=ROLLOUTS,
        needs=(checkable.GATE,),
        judges=("P7",),
    )
    def forget(self) -> None:
        """Forget every retired rollout: the marks go everywhere."""
        self._forget(list(self.model.marked_rollouts()))

    # -- teardown: drain and the end-of-run properties ---------------------------------------------------------

    def teardown(self) -> None:
        """Drain and judge the end of the run, then stop what runs; after an interrupt only stop, and let the
        interrupt go on whatever stopping raises (`interrupts.interrupt_prevails`)."""
        with interrupt_prevails():
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
            self._release_every_waiting_call()
        if self.model.retired_marks:
            self.forget()
        self.audits.at_end(self.model)

    def _release_every_waiting_call(self) -> None:
        """The drain's releases, every waiting call at once and one settle for them all: no checkpoint is open,
        so each rollout runs on by itself, and the settle judges each one's next call or reply as `release` does."""
        rollouts = self.model.waiting()
        current = self.model.current()
        self.controller.release([current[rollout].key for rollout in rollouts])
        model = self.model
        for rollout in rollouts:
            model = model.release(rollout)
        self._advance(model, f"release({', '.join(rollouts)})")


class SwarmMachine(CheckpointMachine):
    """The same machine, whose every example first draws the rules and mechanisms it leaves out (`swarm`)."""

    @initialize(chosen=swarms(rule_names(CheckpointMachine), mechanisms_of(CheckpointMachine)))
    def choose_swarm(self, chosen: Swarm) -> None:
        self.log.swarm = chosen


def machine_for(
    harness: Harness,
    stats: SearchStats | None = None,
    swarm: bool = False,
    weights: Weights | None = None,
    focus: Focus | None = None,
) -> type[CheckpointMachine]:
    """A factory of machines bound to `harness`, for `run_state_machine_as_test`; with `swarm`, of swarm machines;
    `weights` changes the families' weights in the draw, `focus` favours rules and fixes arguments (an aimed round).
    Hypothesis keys its example database (and, derandomized, its draws) on the factory's source plus this digest,
    so each deployment (and each draw) keeps its own examples: a failure saved by one is not replayed against
    another. The plain and swarm factories' sources are left as they were, so their derandomized draws stay the
    same (an aimed round has a seed of its own: `ckpt_model.search.aim`)."""

    def factory() -> CheckpointMachine:
        return CheckpointMachine(harness, stats, weights=weights)

    def swarm_factory() -> CheckpointMachine:
        return SwarmMachine(harness, stats, weights=weights)

    def aimed_factory() -> CheckpointMachine:
        return (SwarmMachine if swarm else CheckpointMachine)(harness, stats, weights=weights, focus=focus)

    chosen = aimed_factory if focus else swarm_factory if swarm else factory
    chosen._hypothesis_internal_add_digest = harness.spec.key.encode()  # type: ignore[attr-defined]
    # `run_state_machine_as_test` is typed for the class but calls what it gets with no arguments; a factory that
    # closes over the harness is how a machine is bound by composition.
    return cast(type[CheckpointMachine], chosen)
