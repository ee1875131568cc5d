"""Crashes: processes killed (all of Gym, one participant, one worker), inside a commit, a restore, a
retire or a forget, or with a power cut; and the controller's recovery, a crash and a restore in one step.

The kills themselves are the shared nemesis's (`ckpt_model.trainer.kills`: every process, one server, one worker); what
only this family does is here: a commit held by a failpoint between its files, an operation that reaches some
participants before the crash cuts it short, a participant that dies inside its own restore, and who may die alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import attrs
from hypothesis import strategies as st

from ckpt_model.deployments.faults import FAILPOINT_BEFORE_INSTALL, FAILPOINT_BETWEEN_FILES
from ckpt_model.deployments.observe import poll
from ckpt_model.errors import CoordinationError, QuiescenceTimeout
from ckpt_model.model.contract import Attempt, Model
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.model.topologies import SERVER_WORKER_KINDS
from ckpt_model.properties.state import P7Violation, P8Violation, p8_cleanup_succeeds, p8_died_in_restore
from ckpt_model.protocol.client import Participant
from ckpt_model.protocol.history import Event
from ckpt_model.protocol.wire import RETIRE_ORDER
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.controller import CONTROL_DEADLINE_S, episodes_keyed, episodes_of, outcomes_text
from ckpt_model.trainer.pipeline import PICK, WORKER, MachineBase, choose

# The operations a crash must land inside of, each its own goal.
CRASHED_OPERATIONS = ("commit", "restore", "retire", "forget")


def crash_inside(operation: str) -> Callable[[goals.Step], bool]:
    """A crash that landed inside `operation` (commit, restore, retire or forget) while it was under way."""

    def reached(step: goals.Step) -> bool:
        if operation == "commit":
            return step.rule == "crash_in_commit"
        crashed_inside = step.rule in ("crash_in_operation", "crash_in_restore")
        return crashed_inside and any(f" inside {operation} " in label for label in step.labels)

    reached.__doc__ = f"A crash inside a {operation} under way."
    return reached


def one_per_kind(spec: DeploymentSpec) -> bool:
    """One participant per kind: a participant crashed alone is then the only one of its kind (not topology mixed)."""
    return not spec.traits.restart_environment


def kills_workers_alone(spec: DeploymentSpec) -> bool:
    return spec.server_workers > 1 and not spec.traits.restart_environment


CRASHES = Family(
    "crashes",
    "every Gym process killed: at once, inside an operation, with a power cut",
    8,
    goals=tuple(
        goals.Goal(f"crash_inside_{op}", f"a crash inside a {op}", crash_inside(op)) for op in CRASHED_OPERATIONS
    ),
)


def prepared_short_a_worker(step: goals.Step) -> bool:
    """A prepare sent right after one worker of a server was killed alone, before anything restarted it."""
    return step.rule == "kill_worker" and any(label.startswith("prepare() -> ") for label in step.labels)


# Its own family: among the eight rules that kill everything, the two that kill one process alone were drawn once
# in a hundred steps, and a fault behind a participant crashed alone went unfound in 200 examples.
RESTARTS = Family(
    "restarts",
    "one process killed alone: a participant, or one worker of a server",
    4,
    goals=(
        goals.Goal(
            "prepared_short_a_worker",
            "a prepare while a server is short a worker",
            prepared_short_a_worker,
            applies=kills_workers_alone,
            rule="kill_worker",
            pins=(("then_prepare", True),),
        ),
    ),
)


@attrs.frozen
class HeldCommit:
    """A commit sent to one participant that a failpoint holds between its records file and its manifest."""

    name: str
    invocation: Event
    answer: Future[Any]


class Crashes(MachineBase):
    """The rules of the crashes family (`CRASHES`)."""

    @action(lambda self: self.harness.can_crash and not self.model.fresh, family=CRASHES, needs=(checkable.CRASHES,))
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
        needs=(checkable.CRASHES, checkable.LOSE_UNSYNCED),
    )
    def power_loss(self) -> None:
        """As `crash`, with a power cut: the disk keeps only what was fsynced; every checkpoint must verify (P9)."""
        self.nemesis.crash(power_loss=True)
        self._advance(self.model.crash(), "power_loss()")

    @action(
        lambda self: self.harness.can_crash and self._may_commit(),
        committed=PICK,
        inside=st.booleans(),
        family=CRASHES,
        needs=(checkable.CRASHES,),
        mechanisms=("inside",),
    )
    def crash_in_commit(self, committed: int, inside: bool) -> None:
        """Gym crashes inside a commit reached by `committed` participants (one more held inside with `inside`);
        with no checkpoint open, it prepares one first."""
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        members = self.controller.members()
        done = [m.name for m in members[: committed % len(members)]]
        stopped = members[len(done)].name if inside and self.harness.faults.can_stop_inside_commit else None
        if done:
            replies = self.controller.commit_on(done, checkpoint_id, scope)
            self.audits.partial_commit(self.model, checkpoint_id, done, replies)
        held = None if stopped is None else self._hold_inside_commit(stopped, checkpoint_id, scope)
        self.nemesis.crash(inside=True)
        if held is not None:
            self._ended_by_crash(held)
        published = self.audits.published_after_crash(checkpoint_id)
        where = f", {stopped} stopped between its files" if stopped is not None else ""
        label = f"crash_in_commit() -> {checkpoint_id} committed by {sorted(published)}{where}"
        self._advance(self.model.crash_in_commit(published), label)

    @action(
        lambda self: self.harness.can_crash and bool(self.model.interruptible()),
        family=CRASHES,
        needs=(checkable.CRASHES,),
        pick=PICK,
        reached=PICK,
    )
    def crash_in_operation(self, pick: int, reached: int) -> None:
        """Gym crashes inside a restore, a retire or a forget that reached its first `reached` stages."""
        operation = choose(self.model.interruptible(), pick)
        if operation == "restore":
            self._crash_inside_restore(reached)
            return
        if operation == "retire":
            model, operation_id = self.model.issue_id(operation)
            lost = self.model.with_status("dead", "pending")[0]
            names = self._retire_cut_by_crash(operation_id, lost, reached)
        else:
            model, operation_id = self.model.issue_id(operation)
            names = self._forget_cut_by_crash(operation_id, self.model.marked_rollouts(), reached)
        self._advance(model.crash(), f"crash_in_operation() inside {operation} {operation_id}, reached {names}")

    @action(
        lambda self: self.harness.can_crash and self._may_restore(),
        family=CRASHES,
        needs=(checkable.CRASHES,),
        reached=PICK,
    )
    def crash_in_restore(self, reached: int) -> None:
        """As `crash_in_operation` inside a restore, crashing first when the processes are not fresh: a restore
        otherwise waits for a crash drawn just before it."""
        self._crash_unless_fresh()
        self._crash_inside_restore(reached)

    def _crash_inside_restore(self, reached: int) -> None:
        source = self.model.committed[-1]
        self._forget_covering(source.checkpoint_id)
        operation_id = self.model.restore_id(source.checkpoint_id)
        names = self._restore_cut_by_crash(operation_id, source.checkpoint_id, source.exported, reached)
        label = f"crash_in_operation() inside restore {operation_id}, reached {names}"
        self._advance(self.model.crash(), label)

    @action(
        lambda self: self.harness.can_crash and self.model.worth_crashing_alone() and bool(self._crashable_alone()),
        family=RESTARTS,
        needs=(checkable.CRASHES, checkable.RESTART_ONE, checkable.ONE_PER_KIND),
        judges=("P7",),
        applies=one_per_kind,
        pick=PICK,
    )
    def crash_participant(self, pick: int) -> None:
        """SIGKILL one participant alone and restart it; the controller retires the running work it broke (P7)."""
        member = choose(self._crashable_alone(), pick)
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
        self._advance(model, label, violation=P7Violation, counts_final=bool(running))

    @action(
        lambda self: bool(self._killable_workers()),
        family=RESTARTS,
        needs=(checkable.GATE, checkable.KILL_WORKERS, checkable.ONE_PER_KIND),
        judges=("P7",),
        applies=kills_workers_alone,
        mechanisms=("then_prepare",),
        pick=PICK,
        worker=WORKER,
        then_prepare=st.booleans(),
    )
    def kill_worker(self, pick: int, worker: int, then_prepare: bool = False) -> None:
        """SIGKILL one worker of a multi-worker server alone: what lived on it dies with it, every other attempt runs
        on; the controller retires the running attempts it may have broken (P7). Those are the attempts placed on
        it, and every attempt with a request in flight through that server (`Model.ends_alone`): the kernel chose
        which worker accepted each connection, and a worker relaying a request to its sibling takes the request
        with it, so the checker cannot say which of those were cut, only that none of them may complete.

        `then_prepare` prepares next, while the server is short a worker, instead of waiting for a `prepare` drawn
        before anything restarts it: a worker lost between checkpoints must not keep a prepare from being ready
        (P10). It prepares even when the kill left nothing running (killing an agent or environment worker takes
        every attempt with it), which the `prepare` rule never does: a readiness the lost worker blocks shows all
        the same."""
        member = choose(self._killable_workers(), pick)
        workers = self.harness.spec.server_workers
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
        self._advance(model, label, violation=P7Violation, counts_final=bool(lost))
        if then_prepare and self.model.can_prepare():
            self.prepare()

    def _crashable_alone(self) -> list[Participant]:
        """The participants the model lets crash alone, where the deployment restarts one server."""
        if not self.harness.can_restart_one or self.harness.control is None:
            return []
        return [m for m in self.controller.members() if self.model.can_crash_participant(m.kind)]

    def _killable_workers(self) -> list[Participant]:
        """The participants whose server runs several workers (the environment, agent and resources servers), when
        the model lets one worker die now."""
        harness = self.harness
        if not harness.can_kill_workers or harness.control is None or not self.model.worth_killing_a_worker():
            return []
        return [m for m in self.controller.members() if m.kind in SERVER_WORKER_KINDS]

    def _still_fenced(self, model: Model) -> str:
        """Each participant that remembers the latest resumed ID still refuses it (P10)."""
        if not model.resumed:
            return ""
        latest = model.resumed[-1]
        remembering = [m.name for m in self.controller.control.participants if model.remembers(m.kind, latest)]
        self._refused("prepare", latest, "stale_checkpoint", remembering)
        return f"; prepare({latest}) refused by {remembering}"

    @action(
        lambda self: self.harness.can_crash and self._may_restore() and bool(self._can_die_in_restore()),
        family=CRASHES,
        needs=(checkable.CRASHES, checkable.FAILPOINTS, checkable.RESTART_ONE),
        judges=("P8",),
        pick=PICK,
        victim=PICK,
    )
    def dies_in_restore(self, pick: int, victim: int) -> None:
        """One participant dies inside its own restore while the others finish; the cleanup undoes it all (P8)."""
        self._crash_unless_fresh()
        checkpoint = choose(list(self.model.committed), pick)
        member = choose(self._can_die_in_restore(), victim)
        self._forget_covering(checkpoint.checkpoint_id)
        model, restore_id = self.model.died_in_restore(checkpoint.checkpoint_id, member.kind)
        outcomes = self._die_in_restore(member, restore_id, checkpoint.checkpoint_id, checkpoint.exported)
        p8_died_in_restore(restore_id, member.name, outcomes)
        try:
            self.controller.undo_restore(restore_id, checkpoint.exported)
        except CoordinationError as error:
            p8_cleanup_succeeds(restore_id, error)
            raise
        label = f"dies_in_restore({checkpoint.checkpoint_id}) as {restore_id}: {member.name} died before installing"
        self._advance(model, label, violation=P8Violation, counts_final=True)

    def _can_die_in_restore(self) -> list[Participant]:
        """With failpoints and single restarts: the participants that are the only one of their kind (the model
        says what one participant forgets by its kind)."""
        if (
            not (self.harness.faults.can_stop_inside_commit and self.harness.can_restart_one)
            or self.harness.control is None
        ):
            return []
        members = self.controller.members()
        kinds = [m.kind for m in members]
        return [m for m in members if kinds.count(m.kind) == 1]

    def _die_in_restore(self, member: Participant, restore_id: str, source: str, exported: Iterable[str]) -> Any:
        """Restore `source` as `restore_id` while a failpoint holds `member` just before it installs; once it
        stands there and every other participant restored, kill it and start it again alone. Returns every
        participant's answer to the restore (the dead one's is a transport failure)."""
        scope = episodes_keyed(exported)
        directory = str(self.controller.directory(source))
        body = self.controller.body("restore", restore_id, checkpoint_dir=directory, episode_ids=scope)
        others = [m for m in self.controller.control.participants if m.name != member.name]
        self.harness.faults.arm_failpoint(member.name, FAILPOINT_BEFORE_INSTALL)
        invocation = self.controller.invoke("restore", restore_id, checkpoint_id=restore_id)
        restore = self.controller.runs.submit(self.controller.control.post_each, "restore", body, body["deadline_ts"])

        def others_restored() -> bool:
            statuses = self.harness.statuses()
            return self.harness.faults.failpoint_reached(member.name, FAILPOINT_BEFORE_INSTALL) and all(
                statuses[m.name]["phase"] == "restored" for m in others
            )

        if not poll(others_restored, self.quiescence.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{member.name} stands before its install while {[m.name for m in others]} restored",
                observed=self.harness.statuses(),
                pending=[f"{member.name} at {FAILPOINT_BEFORE_INSTALL}"],
                timeout_s=self.quiescence.timeout_s,
            )
        self.nemesis.restart(member)
        outcomes = restore.result(timeout=CONTROL_DEADLINE_S)
        self.controller.complete(invocation, "fail", outcomes_text(outcomes))
        return outcomes

    # -- a crash inside an operation: what it sends before the crash ---------------------------------------------

    def _hold_inside_commit(self, name: str, checkpoint_id: str, scope: Sequence[Attempt]) -> HeldCommit:
        """Send `name` its commit with a failpoint armed between its two files; return once its work stands there."""
        self.harness.faults.arm_failpoint(name, FAILPOINT_BETWEEN_FILES)
        directory = str(self.controller.directory(checkpoint_id))
        episodes = episodes_of(scope)
        body = self.controller.body("commit", checkpoint_id, checkpoint_dir=directory, episode_ids=episodes)
        invocation = self.controller.invoke("commit", checkpoint_id, checkpoint_id=checkpoint_id)
        post = self.controller.control.post_each
        answer = self.controller.runs.submit(post, "commit", body, body["deadline_ts"], [name])
        timeout_s = self.quiescence.timeout_s
        if not poll(lambda: self.harness.faults.failpoint_reached(name, FAILPOINT_BETWEEN_FILES), timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{name}'s commit stops between its records file and its manifest",
                observed="it never got there" + (f": {answer.result()}" if answer.done() else ""),
                pending=[f"{name} at {FAILPOINT_BETWEEN_FILES}"],
                timeout_s=timeout_s,
            )
        return HeldCommit(name, invocation, answer)

    def _ended_by_crash(self, held: HeldCommit) -> None:
        """The held commit's answer once the crash ended it: indeterminate (`info`)."""
        outcomes = held.answer.result(timeout=CONTROL_DEADLINE_S)
        self.controller.complete(held.invocation, "info", outcomes_text(outcomes))

    def _restore_cut_by_crash(self, restore_id: str, source: str, exported: Iterable[str], reached: int) -> list[str]:
        """A restore of `source` reaches its first `reached` participants (modulo their number, in name order,
        each alone), each of which must answer it; then everything crashes. Returns the names reached."""
        scope = episodes_keyed(exported)
        directory = str(self.controller.directory(source))
        body = self.controller.body("restore", restore_id, checkpoint_dir=directory, episode_ids=scope)
        members = self.controller.members()
        stages = [[m.name] for m in members[: reached % len(members)]]
        return self._cut_by_crash("restore", restore_id, body, stages, source=source, episodes=tuple(scope))

    def _retire_cut_by_crash(self, retire_id: str, lost: Attempt, reached: int) -> list[str]:
        """A retire of `lost` reaches the first `reached` stages of the retire order (callers before callees)."""
        episodes = episodes_of([lost])
        body = self.controller.body("retire", retire_id, episode_ids=episodes)
        stages = self._retire_stages(reached)
        return self._cut_by_crash("retire", retire_id, body, stages, episodes=tuple(episodes))

    def _forget_cut_by_crash(self, forget_id: str, rollouts: Sequence[str], reached: int) -> list[str]:
        """A forget of `rollouts` reaches the first `reached` stages of the retire order."""
        body = self.controller.body("forget", forget_id, rollout_ids=rollouts)
        return self._cut_by_crash("forget", forget_id, body, self._retire_stages(reached))

    def _cut_by_crash(
        self, operation: str, operation_id: str, body: dict[str, Any], stages: list[list[str]], **event: Any
    ) -> list[str]:
        """Send `operation` to each of `stages` in turn (each must answer it), then crash everything."""
        reached: list[str] = []
        for names in stages:
            self.controller.send_each(operation, operation_id, body, names, **event)
            reached += names
        self.nemesis.crash(inside=True)
        return reached

    def _retire_stages(self, reached: int) -> list[list[str]]:
        participants = self.controller.control.participants
        order = [[m.name for m in participants.of_kinds(kinds)] for kinds in RETIRE_ORDER]
        return order[: reached % len(order)]
