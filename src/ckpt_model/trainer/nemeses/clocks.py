"""Clocks: one participant's clock skewed across a checkpoint whose lease lapses, or time passing for every server
while the controller is quiet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from ckpt_model.deployments.observe import poll
from ckpt_model.errors import ControlCallFailed, CoordinationError, HarnessError
from ckpt_model.model.checkpoint_names import probe_name
from ckpt_model.model.contract import Model
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties.clocks import p18_lapsed_first, p18_refused_on_its_clock, p18_stale_commit_refused
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.controller import Prepared
from ckpt_model.trainer.pipeline import PICK, MachineBase, choose, only_deadline_missed, only_unanswered


def skewed_clock_reached(ahead: bool) -> Callable[[goals.Step], bool]:
    """A clock ahead that lapsed first, or one behind that outheld the others, to the end of the rule (a prepare
    that reached a participant past its deadline judges neither)."""
    told = "lapsed first" if ahead else "the others lapsed"

    def reached(step: goals.Step) -> bool:
        return step.rule == "skewed_clock" and any(told in label for label in step.labels)

    reached.__doc__ = f"A clock {'ahead' if ahead else 'behind'}, judged to the end."
    return reached


def time_passed(step: goals.Step) -> bool:
    """Time passed while a checkpoint held rollouts parked (a prepare that missed its deadline lets none pass)."""
    return step.rule == "time_passes" and any(" s passed" in label for label in step.labels)


def time_jumps(spec: DeploymentSpec) -> bool:
    return spec.time_jumps


def skews_clocks(spec: DeploymentSpec) -> bool:
    """A deployment whose time can pass moves the monotonic clock with the wall clock, so it never skews one."""
    return not spec.time_jumps


CLOCKS = Family(
    "clocks",
    "a participant's clock skewed, or time passing for every server",
    3,
    goals=(
        goals.Goal(
            "skewed_ahead_lapsed_first",
            "a clock ahead that lapsed first, its commit refused",
            skewed_clock_reached(True),
            applies=skews_clocks,
            rule="skewed_clock",
            pins=(("behind", False),),
        ),
        goals.Goal(
            "skewed_behind_outheld",
            "a clock behind that outheld the others, the stale commit refused",
            skewed_clock_reached(False),
            applies=skews_clocks,
            rule="skewed_clock",
            pins=(("behind", True),),
        ),
        goals.Goal(
            "time_passed_while_parked", "time passed while rollouts were parked", time_passed, applies=time_jumps
        ),
    ),
)
# A skewed clock runs this far ahead of the controller's (its lease lapses that much earlier), or behind (far longer
# than any step, so it still holds its lease when the stale commit comes); a prepare under a clock ahead leaves it
# this margin of its own before the deadline; a prepare under a clock behind is due this soon, so the others'
# leases lapse in a second or two. Where the checker owns time both are `Clocks.room` instead (it jumps past them):
# a loaded machine then cannot make the prepare miss them.
SKEW_AHEAD_S = 8.0
SKEW_BEHIND_S = 60.0
SKEWED_PREPARE_MARGIN_S = 0.5
SKEWED_QUIET_DEADLINE_S = 0.25
# While a quiet controller's checkpoint is open this much time passes for the whole system: twice Gym's episode
# budget (600 s), so an episode whose parked time counted would time out whatever it used before.
TIME_PASSES_S = 1200.0
# A skewed clock must read its offset from the true time within this much (the call that reads it takes time).
SKEW_TOLERANCE_S = 5.0


class Clocks(MachineBase):
    """The rules of the clocks family (`CLOCKS`)."""

    @action(
        lambda self: (
            not self.model.tried.clock_skew
            and self.harness.clocks.can_skew_clocks
            and self.controller.may_lapse
            and self._may_checkpoint()
        ),
        family=CLOCKS,
        needs=(checkable.SKEW_CLOCKS, checkable.LEASE_LAPSES),
        judges=("P18",),
        applies=skews_clocks,
        victim=PICK,
        behind=st.booleans(),
    )
    def skewed_clock(self, victim: int, behind: bool) -> None:
        """One participant's clock runs ahead (or, `behind`, behind) of the controller's across a checkpoint whose
        lease lapses (P18): ahead, it refuses a deadline its clock passed, lapses first and refuses the controller's
        commit; behind, it outholds the others, and a stale controller's commit is refused by every one that
        lapsed. (Ahead is the simpler draw, which a derandomized search meets first: it checks more.)"""
        name = choose(self.controller.members(), victim).name
        model, checkpoint_id = self.model.having_tried(clock_skew=True).prepare()
        offset_s = -SKEW_BEHIND_S if behind else SKEW_AHEAD_S
        self._skew_clock(name, offset_s)
        try:
            if behind:
                model, label = self._outholds_the_others(name, model, checkpoint_id)
            else:
                model, label = self._lapses_first(name, model, checkpoint_id)
        except BaseException as error:
            self._put_back_after(error, name)
            raise
        self._skew_clock(name, 0.0)
        self._advance(model, f"skewed_clock({name} {offset_s:+g} s): {label}")

    def _put_back_after(self, error: BaseException, name: str) -> None:
        """Put `name`'s clock back after the rule failed with `error`: if that fails too, `error` is still what is
        reported (a verdict must not be lost to a harness error raised while cleaning up after it), with a note."""
        try:
            self._skew_clock(name, 0.0)
        except ControlCallFailed as put_back:
            error.add_note(f"Putting {name}'s clock back after this failure also failed: {put_back}")

    def _lapses_first(self, name: str, model: Model, checkpoint_id: str) -> tuple[Model, str]:
        others = [m.name for m in self.controller.members() if m.name != name]
        within_skew = self.controller.probe_deadline_ahead(
            "prepare", probe_name("skew", checkpoint_id), SKEW_AHEAD_S / 2, [name]
        )
        p18_refused_on_its_clock("a prepare due in half its skew", name, SKEW_AHEAD_S, within_skew[name])
        deadline_ts = self.harness.clocks.now() + SKEW_AHEAD_S + self.harness.clocks.room(SKEWED_PREPARE_MARGIN_S)
        try:
            self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if only_deadline_missed(error, [name]):  # the margin passed on its clock before the prepare reached it
                self._not_reached("skewed_clock", f"the prepare reached {name} past its deadline, so none lapsed")
                self.controller.resume(checkpoint_id)
                return model.resume(), f"prepare({checkpoint_id}) reached {name} past its deadline; resumed"
            raise
        self.controller.renew_on(others, checkpoint_id)
        self.quiescence.wait_lapsed(name, checkpoint_id, deadline_ts + self.harness.spec.lease_grace_s - SKEW_AHEAD_S)
        model = self._stale_commit(name, others, model, checkpoint_id, p18_lapsed_first)
        return model, f"prepare({checkpoint_id}); {name} lapsed first; commit refused by it; resume, incomplete"

    def _outholds_the_others(self, name: str, model: Model, checkpoint_id: str) -> tuple[Model, str]:
        others = [m.name for m in self.controller.members() if m.name != name]
        deadline_ts = self.harness.clocks.now() + self.harness.clocks.room(SKEWED_QUIET_DEADLINE_S)
        try:
            self.controller.prepare_by(checkpoint_id, deadline_ts)
        except CoordinationError as error:
            if only_deadline_missed(error, others):  # a slow machine: the short deadline passed first
                self._not_reached("skewed_clock", "the prepare reached some past its deadline, so none lapsed")
                self.controller.resume(checkpoint_id)
                return model.resume(), f"prepare({checkpoint_id}) reached some past its deadline; resumed"
            if not only_unanswered(error, [name]):
                raise
            # Behind, the victim may hold a prepare it is not ready for until its own deadline, long after the
            # controller's: whether it becomes ready decides, not how soon it answered (P10).
            self._ready_in_time(name, checkpoint_id)
            self._not_reached("skewed_clock", f"{name}'s answer to the prepare came too late, so none lapsed")
            self.controller.resume(checkpoint_id)
            return model.resume(), f"prepare({checkpoint_id}) unanswered by {name} in time, though ready; resumed"
        for other in others:
            self.quiescence.wait_lapsed(other, checkpoint_id, deadline_ts + self.harness.spec.lease_grace_s)
        try:
            self.controller.commit(checkpoint_id, model.scope())
            refused = None
        except CoordinationError as error:
            refused = error
        p18_stale_commit_refused(checkpoint_id, others, refused)
        self.controller.resume(checkpoint_id)
        published = self.audits.published_after_crash(checkpoint_id)
        label = f"prepare({checkpoint_id}); the others lapsed; the stale commit refused; resume"
        return model.commit_failed(published), label

    def _ready_in_time(self, name: str, checkpoint_id: str) -> None:
        """Participant `name`, whose answer to the prepare of `checkpoint_id` never came, reports itself prepared
        within the settle time (its answer was only slow); still preparing after it, it is judged with the blockers
        its status reports as a prepare that never answers is (`_judge_prepare`: P10, or P11 while a `replay`
        verification runs)."""
        timeout_s = self.quiescence.timeout_s
        judge = self._judge_prepare(checkpoint_id)
        status: dict[str, Any] = {}

        def prepared() -> bool:
            status.update(self.harness.statuses()[name])
            return status.get("phase") == "prepared" and status.get("checkpoint_id") == checkpoint_id

        if not poll(prepared, timeout_s):
            blockers = {name: status.get("report", {}).get("blockers", [])}
            judge(Prepared(prepared=False, replies={}, blockers=blockers, waited_s=timeout_s))

    @action(
        lambda self: (
            not self.model.tried.time_passed
            and self.harness.clocks.can_jump_clocks
            and not self.model.restarts()
            and self._may_checkpoint()
        ),
        family=CLOCKS,
        needs=(checkable.JUMP_CLOCKS,),
        applies=time_jumps,
    )
    def time_passes(self) -> None:
        """The controller prepares and goes quiet while TIME_PASSES_S pass for the whole system (every server's
        clocks jump, monotonic too): longer than an episode's whole budget and than the lease, so every participant
        re-opens on its own (P10) and the late commit is refused; every episode parked meanwhile (or in a replay step)
        goes on with the time it had left, and none times out for it (P20). (Never with restarts running: they are
        never parked, so their time runs out.)"""
        model, checkpoint_id = self.model.lease_expired(time_passed=True)
        parked = [attempt.key for attempt in self.model.with_status("running")]
        if self.controller.go_quiet(checkpoint_id, meanwhile=lambda: self._pass_time(TIME_PASSES_S)):
            self.quiescence.outlasted.update(dict.fromkeys(parked, TIME_PASSES_S))
            label = f"{TIME_PASSES_S:g} s passed; {checkpoint_id} lapsed"
        else:
            label = "the prepare missed its deadline; resumed, and no time passed"
            self._not_reached("time_passes", "the prepare missed its deadline, so no time passed while parked")
        self._refused("commit", checkpoint_id, "stale_checkpoint")
        self._advance(model, f"time_passes() -> {checkpoint_id}: {label}; commit({checkpoint_id}) refused")

    def _skew_clock(self, victim: str, offset_s: float) -> None:
        """Move `victim`'s wall clock `offset_s` from the controller's (0 puts it back); journaled, and confirmed by
        the time its clock reads right after."""
        invocation = self.controller.invoke("skew clock", f"{victim}: {offset_s:+g} s")
        before = self.harness.clocks.now()
        reads = self.harness.clocks.skew_clock(victim, offset_s)
        self.controller.complete(invocation, "ok")
        if not before + offset_s - SKEW_TOLERANCE_S <= reads <= self.harness.clocks.now() + offset_s + SKEW_TOLERANCE_S:
            raise HarnessError(
                f"{victim}'s clock was to run {offset_s:+g} s from the controller's ({before:.3f}) and reads "
                f"{reads:.3f}"
            )

    def _pass_time(self, seconds: float) -> None:
        """Let `seconds` pass for the whole system at once (every server's clocks and the controller's); journaled,
        and confirmed by the time each server's clock reads right after."""
        invocation = self.controller.invoke("time passes", f"{seconds:g} s")
        before = self.harness.clocks.now() + seconds
        reads = self.harness.clocks.pass_time(seconds)
        self.controller.complete(invocation, "ok")
        after = self.harness.clocks.now()
        for name, read in sorted(reads.items()):
            if not before - SKEW_TOLERANCE_S <= read <= after + SKEW_TOLERANCE_S:
                raise HarnessError(
                    f"{seconds:g} s were to pass for {name}, whose clock reads {read:.3f} at {after:.3f}"
                )
