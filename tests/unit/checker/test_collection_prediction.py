"""The collection machine's prediction (`ckpt_model.collection.prediction.Prediction`): a frozen value, each
transition computed on hand-built reads (no processes)."""

from __future__ import annotations

import attrs
import pytest

from ckpt_model.collection.prediction import Prediction

ROWS = ("row-0", "row-1", "row-2")
FRESH = Prediction(ROWS)
NOTHING: dict[str, int] = {}


def first_run() -> Prediction:
    """The first run: every row goes as attempt 0, from its first call, with no call made before."""
    return FRESH.started(finished=(), latest=None, continued=NOTHING, logged=NOTHING, made=NOTHING)


def call(key: str, *, waiting: bool = False, cancelled: bool = False) -> dict[str, object]:
    return {"capture_key": key, "waiting": waiting, "cancelled": cancelled}


def test_the_prediction_is_a_frozen_value() -> None:
    prediction = first_run()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        prediction.runs = 2  # type: ignore[misc]
    assert hash(prediction) == hash(first_run())
    assert prediction == first_run()
    assert FRESH.runs == 0  # a transition returns a new value, never changes the one it started from


def test_the_first_run_sends_every_row_as_attempt_0_from_the_first_call() -> None:
    prediction = first_run()

    assert dict(prediction.attempts) == {"row-0": 0, "row-1": 0, "row-2": 0}
    assert dict(prediction.starts) == {"row-0": 0, "row-1": 0, "row-2": 0}
    assert (prediction.runs, prediction.crashes, prediction.restores) == (1, 0, ())
    assert prediction.unfinished == list(ROWS)


def test_a_rerun_continues_latest_s_rows_from_their_boundary_and_starts_the_logged_ones_over() -> None:
    """row-0 delivered one call before c1 was taken; c1 continues row-0 and row-1; the dispatch log names row-2 at
    attempt 0; nothing finished. The rerun (after a crash of the Gym) sends row-0 and row-1 as attempt 1, row-0
    from call 1, and starts row-2 over as attempt 1 from call 0."""
    taken = first_run().taken("c1", [call("row-0"), call("row-0", waiting=True), call("row-1", waiting=True)])
    made = {"row-0": 2, "row-1": 1, "row-2": 1}

    rerun = taken.started((), "c1", {"row-0": 0, "row-1": 0}, {"row-2": 0}, made)

    assert dict(rerun.attempts) == {"row-0": 1, "row-1": 1, "row-2": 1}
    assert dict(rerun.starts) == {"row-0": 0, "row-1": 0, "row-2": 0, "row-0-a1": 1, "row-1-a1": 0, "row-2-a1": 0}
    assert dict(rerun.made_before)["row-0-a1"] == 0
    assert (rerun.runs, rerun.crashes, rerun.restores) == (2, 1, ("c1",))


def test_a_continuation_of_a_continuation_starts_where_its_checkpoint_left_it() -> None:
    """row-0 continued as attempt 1 from call 1; preempted again before that call returned, c2 records no call
    delivered by row-0-a1, so attempt 2 starts from call 1 too, not from call 0."""
    first = first_run().taken("c1", [call("row-0"), call("row-0", waiting=True)])
    second = first.started((), "c1", {"row-0": 0}, NOTHING, {"row-0": 2})
    second = second.taken("c2", [call("row-0"), call("row-0"), call("row-0-a1", waiting=True)])

    third = second.started((), "c2", {"row-0": 1}, NOTHING, {"row-0": 2, "row-0-a1": 1})

    assert dict(third.starts)["row-0-a2"] == 1


def test_a_checkpoint_restored_twice_counts_each_execution_of_a_key_apart() -> None:
    """Two reruns restore the same c1: the second sends row-0-a1 again, so the call its first execution made is
    left out of what P4 judges now, and c1 is noted as continued twice."""
    taken = first_run().taken("c1", [call("row-0", waiting=True)])
    once = taken.started((), "c1", {"row-0": 0}, NOTHING, {"row-0": 1})
    twice = once.started((), "c1", {"row-0": 0}, NOTHING, {"row-0": 1, "row-0-a1": 1})

    assert dict(twice.made_before)["row-0-a1"] == 1
    assert twice.this_execution({"row-0-a1": (2, 2, 4)}) == {"row-0-a1": (2, 4)}
    assert twice.restores == ("c1", "c1")


def test_p4_expects_each_attempt_s_script_from_where_it_starts() -> None:
    rerun = first_run().taken("c1", [call("row-0")]).started((), "c1", {"row-0": 0}, NOTHING, {"row-0": 1})

    expected = rerun.expected_calls((2, 4, 4))

    assert expected["row-0"] == (2, 4, 4)
    assert expected["row-0-a1"] == (4, 4)


def test_a_checkpoint_keeps_the_boundary_it_first_showed_and_counts_only_this_execution_s_delivered_calls() -> None:
    """A cancelled call and a held one deliver nothing; a call an earlier execution made is not this one's."""
    prediction = attrs.evolve(first_run(), made_before=(("row-0", 1),))
    calls = [call("row-0"), call("row-0"), call("row-1", cancelled=True), call("row-1", waiting=True)]

    taken = prediction.taken("c1", calls)

    assert taken.boundary("c1") == {"row-0": 1}
    assert taken.taken("c1", [*calls, call("row-0")]) is taken
    assert taken.boundary("c9") == {}
    assert taken.boundary(None) == {}


def test_a_crash_of_the_gym_starts_every_unfinished_row_over_as_its_next_attempt() -> None:
    crashed = first_run().finished(["row-1"]).crashed({"row-0": 1, "row-2": 2})

    assert dict(crashed.attempts) == {"row-0": 1, "row-2": 1}
    assert dict(crashed.starts)["row-0-a1"] == 0
    assert dict(crashed.made_before)["row-2-a1"] == 0
    assert crashed.crashes == 1


def test_a_row_finishes_at_the_attempt_predicted_for_its_run() -> None:
    rerun = first_run().started((), None, NOTHING, {"row-0": 0, "row-1": 0}, NOTHING)

    done = rerun.finished(["row-0", "row-0", "row-9"]).finished(["row-2"])

    assert dict(done.finished_as) == {"row-0": 1, "row-2": 0}
    assert dict(done.attempts) == {"row-1": 1}
    assert done.unfinished == ["row-1"]


def test_a_rerun_after_the_last_row_sends_nothing_and_each_exit_is_kept_in_order() -> None:
    done = first_run().finished(ROWS).exited(0)

    rerun = done.started(ROWS, "c1", {"row-0": 0}, NOTHING, NOTHING).exited(0)

    assert rerun.attempts == ()
    assert rerun.exits == (0, 0)
    assert rerun.restores == ("c1",)
