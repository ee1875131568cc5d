"""Aimed rounds (`ckpt_model.search.aim`) on hand-built statistics: what a round aims at, the weights and pins it draws
with, when each round ends, and each round's seed; and the search's rounds (`checking.search`) with Hypothesis's
run replaced by a recorder."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import RoundStat, SearchStats
from ckpt_model.search import aim, checking
from ckpt_model.steps import draw
from ckpt_model.steps.goals import Coverage, Goal, everywhere, retry_goal

NATIVE = DeploymentSpec("native")
CUTS = DeploymentSpec("native", token_capture=True, generation_cuts=True)
GOALS = (
    Goal("held", "a reply held across a commit", lambda step: False, rule="commit"),
    retry_goal("stall_retried", "a stalled write retried", "stalled_write", True),
    retry_goal("stall_stopped", "a stalled write stopped", "stalled_write", False),
    retry_goal("lost_retried", "a lost reply retried", "lost_reply", True),
    retry_goal("lost_given_up", "a lost reply given up", "lost_reply", False),
    Goal("crash_inside", "a crash inside a forget", lambda step: False),
    Goal("cut", "a cut continued", lambda step: False, applies=lambda spec: spec.generation_cuts),
)
COVERAGE = Coverage(GOALS, {"commit": everywhere, "stalled_write": everywhere, "kill_worker": everywhere})
RULE_FAMILY = {"commit": "checkpoints", "stalled_write": "storage", "kill_worker": "restarts", "lost_reply": "lost"}
GOAL_FAMILY = {
    "held": "checkpoints",
    "stall_retried": "storage",
    "stall_stopped": "storage",
    "lost_retried": "lost",
    "lost_given_up": "lost",
    "crash_inside": "crashes",
    "cut": "restores",
}
WEIGHTS = {"checkpoints": 15, "restores": 10, "storage": 4, "lost": 4, "crashes": 0, "restarts": 4}


def reached(goals: list[str], rules: list[str]) -> SearchStats:
    """Statistics of a search that reached `goals` and enabled and drew `rules`."""
    stats = SearchStats(examples=5)
    stats.example_covered({goal: 1 for goal in goals}, rules, Counter(rules))
    return stats


def aim_after(stats: SearchStats, spec: DeploymentSpec = NATIVE, **kwargs: Any) -> aim.Aim | None:
    return aim.aim_at(stats, spec, COVERAGE, RULE_FAMILY, GOAL_FAMILY, WEIGHTS, **kwargs)


def test_nothing_left_is_nothing_to_aim_at() -> None:
    everything = [goal.name for goal in GOALS if goal.name != "cut"]
    assert aim_after(reached(everything, ["commit", "stalled_write", "kill_worker"])) is None


def test_a_goal_left_favours_its_family_and_pins_the_argument_it_needs() -> None:
    left = aim_after(reached(["held", "stall_stopped", "lost_retried", "lost_given_up", "crash_inside"], ["commit"]))
    assert left is not None
    assert left.goals == ("stall_retried",)
    assert left.rules == ("stalled_write", "kill_worker")
    assert left.favoured == ("storage", "restarts")
    assert left.weights == WEIGHTS | {"storage": 4 * aim.BOOST, "restarts": 4 * aim.BOOST}
    assert left.focus.pins == {"stalled_write": {"then_retry": True}}
    assert left.focus.rules == {"stalled_write", "kill_worker"}
    assert left.words() == (
        f"aimed at 3 left (stall_retried, rule stalled_write, rule kill_worker): storage x{aim.BOOST}, "
        f"restarts x{aim.BOOST}; first kill_worker, stalled_write; fixed stalled_write(then_retry=True)"
    )
    assert left.document()["pins"] == {"stalled_write": {"then_retry": True}}
    assert left.document()["first"] == ["kill_worker", "stalled_write"]


def test_goals_left_that_need_both_values_pin_nothing() -> None:
    left = aim_after(reached(["held", "stall_retried", "stall_stopped", "crash_inside"], ["commit", "stalled_write"]))
    assert left is not None
    assert left.goals == ("lost_retried", "lost_given_up")
    assert left.focus.pins == {}
    assert left.focus.rules == {"lost_reply", "kill_worker"}
    assert left.favoured == ("lost", "restarts")


def test_a_family_weighed_zero_stays_at_zero_and_a_goal_that_does_not_apply_is_not_aimed_at() -> None:
    left = aim_after(reached(["held", "stall_retried", "stall_stopped", "lost_retried", "lost_given_up"], []))
    assert left is not None
    assert "cut" not in left.goals
    assert left.weights["crashes"] == 0
    assert "crashes" in left.favoured
    on_cuts = aim_after(reached([], []), CUTS)
    assert on_cuts is not None
    assert "cut" in on_cuts.goals


def test_a_rule_the_deployment_cannot_draw_is_not_aimed_at() -> None:
    everything = [goal.name for goal in GOALS]
    left = aim_after(reached(everything, ["commit", "stalled_write"]), drawable=["commit", "stalled_write"])
    assert left is None
    left = aim_after(reached(everything, ["commit", "stalled_write"]))
    assert left is not None
    assert left.rules == ("kill_worker",)


@pytest.mark.parametrize(
    ("total_s", "deadlines"),
    [
        (120, [60, 90, 120]),
        (60, [30, 60]),
        (59, [59]),
        (600, [300, 450, 525, 562.5, 600]),
    ],
)
def test_the_first_round_takes_half_the_time_and_each_later_one_half_what_is_left(
    total_s: float, deadlines: list[float]
) -> None:
    assert aim.round_deadlines(total_s) == deadlines


def test_the_first_round_keeps_the_search_seed_and_the_later_ones_derive_theirs() -> None:
    assert aim.round_seed(1, 0) == 1
    assert aim.round_seed(None, 0) is None
    later = [aim.round_seed(1, index) for index in (1, 2)]
    assert later == [aim.round_seed(1, 1), aim.round_seed(1, 2)]  # a rerun draws the same rounds
    assert len({*later, aim.round_seed(2, 1), aim.round_seed(None, 1)}) == 4
    assert all(isinstance(seed, int) for seed in later)


class Recorded:
    """Stands for Hypothesis's run: records each round's settings and whether it was seeded, and ends it at its
    time limit."""

    def __init__(self) -> None:
        self.rounds: list[tuple[Any, bool]] = []

    def run(self, factory: Any, settings: Any) -> None:
        self.rounds.append((settings.database, hasattr(factory, "_hypothesis_internal_use_seed")))
        raise checking.TimeLimitReached


def test_a_search_bounded_by_time_runs_its_rounds_each_aimed_after_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    from hypothesis import settings, stateful
    from hypothesis.database import InMemoryExampleDatabase
    from hypothesis.stateful import RuleBasedStateMachine

    import ckpt_model.trainer.machine

    recorded = Recorded()
    focus = draw.Focus(frozenset({"stalled_write"}), {"stalled_write": {"then_retry": True}})
    aims = iter([aim.Aim(("stall_retried",), (), ("storage",), {"storage": 16}, focus), None])
    built: list[dict[str, Any]] = []

    def machine_for(_harness: Any, _stats: Any, **kwargs: Any) -> type[RuleBasedStateMachine]:
        built.append(kwargs)
        return RuleBasedStateMachine

    monkeypatch.setattr(stateful, "run_state_machine_as_test", recorded.run)
    monkeypatch.setattr(ckpt_model.trainer.machine, "machine_for", machine_for)
    monkeypatch.setattr(checking, "_aim_after", lambda *_args: next(aims))
    stats, began = SearchStats(), list[RoundStat]()
    database = InMemoryExampleDatabase()
    checking.search(
        None,  # the recorder never touches it
        settings(database=database),
        stats,
        weights={"storage": 4},
        seed=7,
        max_time_s=120,
        rounds=True,
        round_began=began.append,
    )
    assert [round_.says.split(":")[0] for round_ in began] == ["round 1", "round 2", "round 3"]
    assert began[1].aim is not None
    assert began[1].aim["pins"] == {"stalled_write": {"then_retry": True}}
    assert "nothing left to aim at" in began[2].says
    assert began[2].aim is None
    assert stats.rounds == began
    assert stats.stopped_by_time
    assert [kwargs["focus"] for kwargs in built] == [None, focus, None]
    assert [kwargs["weights"] for kwargs in built] == [{"storage": 4}, {"storage": 16}, {"storage": 4}]
    assert recorded.rounds == [(database, True), (None, True), (None, True)]


def test_a_search_bounded_by_examples_is_one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    from hypothesis import settings, stateful

    recorded = Recorded()
    monkeypatch.setattr(stateful, "run_state_machine_as_test", recorded.run)
    monkeypatch.setattr("ckpt_model.trainer.machine.machine_for", lambda *_args, **_kwargs: object)
    stats, began = SearchStats(), list[RoundStat]()
    checking.search(None, settings(), stats, max_time_s=120, rounds=False, round_began=began.append)
    assert len(recorded.rounds) == 1
    assert began == []
    assert stats.rounds == []


def test_a_round_whose_time_already_passed_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """An example that outlasts its round's end leaves the next round no time: it is not begun."""
    from hypothesis import settings, stateful

    recorded = Recorded()
    monkeypatch.setattr(stateful, "run_state_machine_as_test", recorded.run)
    monkeypatch.setattr("ckpt_model.trainer.machine.machine_for", lambda *_args, **_kwargs: object)
    monkeypatch.setattr(checking, "_aim_after", lambda *_args: None)
    stats, began = SearchStats(), list[RoundStat]()
    stats.started_s -= 100  # the search began 100 s ago: rounds 1 and 2 (to 60 and 90 s) are past
    checking.search(None, settings(), stats, max_time_s=120, rounds=True, round_began=began.append)
    assert [round_.says.split(":")[0] for round_ in began] == ["round 1", "round 3"]
    assert len(recorded.rounds) == 2
    assert stats.stopped_by_time
