"""A fixed scenario must reach the situation it is named for (hand-built values): a rule that took the branch a slow
machine allows records it, and the scenario is then a harness error naming why, never a pass; a deadline the
checker jumps past has room enough that a loaded machine cannot make a prepare miss it."""

from __future__ import annotations

import inspect
import pickle
import types

import pytest

from ckpt_model.deployments.clocks import OWNED_ROOM_S, Clocks
from ckpt_model.errors import HarnessError, SituationNotReached
from ckpt_model.model.contract import Model
from ckpt_model.search.scenarios import check_reached, steps
from ckpt_model.trainer.controller import CONTROL_DEADLINE_S, QUIET_PREPARE_DEADLINE_S
from ckpt_model.trainer.nemeses.controller import QUIET_PREPARE_DEADLINE_MAX_S, MisbehavingController
from ckpt_model.trainer.nemeses.pauses import FROZEN_ROOM_S
from ckpt_model.trainer.pipeline import MachineBase

TIME_PASSES = steps("dispatch", "time_passes", ("release", {"pick": 0}))


def test_a_scenario_whose_steps_reached_their_situations_passes() -> None:
    check_reached(TIME_PASSES, [])  # nothing raised


def test_a_missed_situation_is_a_harness_error_naming_the_rule_and_why() -> None:
    missed = ["time_passes: the prepare missed its deadline, so no time passed while parked"]
    with pytest.raises(SituationNotReached) as caught:
        check_reached(TIME_PASSES, missed)

    assert isinstance(caught.value, HarnessError)
    assert not isinstance(caught.value, AssertionError)  # never read as a property violation
    assert str(caught.value) == (
        "scenario dispatch, time_passes, release did not reach its situation:\n"
        "  - time_passes: the prepare missed its deadline, so no time passed while parked"
    )


def test_a_missed_situation_is_named_over_what_the_run_raised_after_it() -> None:
    cause = RuntimeError("the commit was refused")
    with pytest.raises(SituationNotReached) as caught:
        check_reached(TIME_PASSES, ["paused_lease: no lease lapsed"], cause)
    assert caught.value.__cause__ is cause


def test_a_missed_situation_survives_pickling() -> None:
    """A worker process hands its error back pickled (the fuzz workers, the minimiser's runs)."""
    error = SituationNotReached(scenario="dispatch, quiet_controller", missed=["quiet_controller: no lease lapsed"])
    again = pickle.loads(pickle.dumps(error))
    assert (again.scenario, again.missed, str(again)) == (error.scenario, error.missed, str(error))


def rules_recording_misses() -> MisbehavingController:
    """The misbehaving controller's rules alone, with nothing else built but the record of misses."""
    machine = object.__new__(MisbehavingController)
    machine.missed = []
    return machine


def test_a_rule_that_took_the_slow_branch_records_it() -> None:
    machine = rules_recording_misses()
    MachineBase._not_reached(machine, "quiet_controller", "the prepare missed its deadline, so no lease lapsed")
    assert machine.missed == ["quiet_controller: the prepare missed its deadline, so no lease lapsed"]


def owned_clocks() -> Clocks:
    """Clocks of a deployment that skews its servers' clocks (so the checker owns their time)."""
    deployment = types.SimpleNamespace(skews_clocks=True, skew_clock=lambda name, offset_s: 0.0)
    return Clocks(deployment, label=lambda: "native", participants=lambda: ["agent"])  # type: ignore[arg-type]


def test_a_deadline_the_checker_jumps_past_has_room_a_loaded_machine_cannot_miss() -> None:
    """5 s of room was missed by a staged prepare at load 11-15; the room is now half the control deadline, so a
    lease it lets lapse still lapses before one renewed to that deadline."""
    clocks = owned_clocks()
    assert clocks.owns_time
    assert clocks.room(0.1) == OWNED_ROOM_S == CONTROL_DEADLINE_S / 2
    assert clocks.room(45.0) == 45.0  # a longer deadline keeps its own length
    assert clocks.room(0.5, FROZEN_ROOM_S) == FROZEN_ROOM_S  # a jump that may spend running episodes' budgets


def test_a_deadline_waited_out_in_real_time_keeps_its_length() -> None:
    clocks = Clocks(types.SimpleNamespace(), label=lambda: "real Gym", participants=lambda: None)  # type: ignore[arg-type]
    assert not clocks.owns_time
    assert clocks.room(0.1) == 0.1


def quiet_controller_whose_prepares(*prepared: bool) -> tuple[MisbehavingController, list[float], list[str]]:
    """The `quiet_controller` rule alone, whose controller's quiet prepares end as `prepared` says in turn; the
    deadlines it asked for, and the labels it advanced with."""
    answers, deadlines, labels = iter(prepared), [], []

    def go_quiet(checkpoint_id: str, deadline_s: float) -> bool:
        deadlines.append(deadline_s)
        return next(answers)

    machine = rules_recording_misses()
    machine.model = Model(topology="native")
    machine.controller = types.SimpleNamespace(go_quiet=go_quiet)  # type: ignore[assignment]
    machine._refused = lambda *_args: None  # type: ignore[method-assign]
    machine._advance = lambda _model, label, **_: labels.append(label)  # type: ignore[method-assign]
    inspect.unwrap(MisbehavingController.quiet_controller)(machine)
    return machine, deadlines, labels


def test_a_quiet_prepare_that_missed_its_deadline_is_tried_again_with_twice_the_deadline() -> None:
    """Where the lease is waited out in real time (a real Gym), a slow machine gets a longer deadline under a new
    ID, so the lease still lapses."""
    machine, deadlines, labels = quiet_controller_whose_prepares(False, False, True)
    assert deadlines == [QUIET_PREPARE_DEADLINE_S, 2 * QUIET_PREPARE_DEADLINE_S, 4 * QUIET_PREPARE_DEADLINE_S]
    assert labels == ["quiet_controller() -> c3 lapsed (after c1, c2 missed their deadlines); commit(c3) refused"]
    assert machine.missed == []


def test_quiet_prepares_that_miss_every_deadline_record_the_situation_missed() -> None:
    machine, deadlines, _ = quiet_controller_whose_prepares(*[False] * 10)
    assert deadlines[-1] <= QUIET_PREPARE_DEADLINE_MAX_S < 2 * deadlines[-1]
    assert machine.missed == [
        f"quiet_controller: the prepares {[f'c{n}' for n in range(1, len(deadlines) + 1)]} missed their deadlines, "
        "none lapsed"
    ]
