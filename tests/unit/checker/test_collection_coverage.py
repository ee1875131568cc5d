"""The collection machine's coverage goals on hand-built steps, the goals and families it collects from its rules,
and where it judges what (`ckpt_model.collection.coverage`); no processes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ckpt_model.collection import coverage
from ckpt_model.collection.machine import CollectionMachine
from ckpt_model.collection.prediction import Prediction
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps import checkable, goals
from ckpt_model.steps.goals import Step
from ckpt_model.steps.steplog import coverage as coverage_of
from ckpt_model.steps.steplog import declarations, families_in_order, goals_of

ROWS = ("row-0", "row-1", "row-2")
NOTHING: dict[str, int] = {}
FIRST = Prediction(ROWS).started((), None, NOTHING, NOTHING, NOTHING)
TAKEN = FIRST.taken("c1", [{"capture_key": "row-0", "waiting": False, "cancelled": False}])
BY_NAME = {goal.name: goal for goal in goals_of(CollectionMachine)}


def reached(rule: str, before: Prediction, after: Prediction, **arguments: Any) -> list[str]:
    return goals.reached(Step(rule, arguments, before, after, ()), goals_of(CollectionMachine))


def test_a_rerun_that_continues_past_a_delivered_call_reaches_its_goals() -> None:
    rerun = TAKEN.started((), "c1", {"row-0": 0}, NOTHING, NOTHING)
    assert reached("start_run", TAKEN, rerun) == ["rerun_continues", "continued_past_a_call"]

    again = rerun.started((), "c1", {"row-0": 0}, NOTHING, NOTHING)
    assert "same_checkpoint_continued_twice" in reached("start_run", rerun, again)
    assert reached("start_run", FIRST, FIRST.started((), None, NOTHING, {"row-0": 0}, NOTHING)) == []


def test_a_run_that_finished_and_a_rerun_after_the_last_row() -> None:
    done = FIRST.finished(ROWS).exited(0)
    assert reached("release", FIRST, done, pick=0) == ["run_finished"]

    rerun = done.started(ROWS, None, NOTHING, NOTHING, NOTHING)
    assert "rerun_after_the_last_row" in reached("start_run", done, rerun)


def test_a_stop_with_exit_75_and_the_failing_saves_by_their_argument() -> None:
    assert reached("preempt", FIRST, FIRST.exited(75)) == ["preempted_with_checkpoint"]
    assert reached("preempt", FIRST, FIRST.exited(1)) == []
    assert reached("failing_save", FIRST, FIRST, stop=False) == ["failed_save_resumed"]
    assert reached("failing_save", FIRST, FIRST.exited(1), stop=True) == ["failed_save_stopped"]


def test_every_goal_names_a_rule_of_the_machine_and_arguments_it_takes() -> None:
    rules = declarations(CollectionMachine)
    names = [goal.name for goal in goals_of(CollectionMachine)]
    assert len(names) == len(set(names))
    for goal in BY_NAME.values():
        assert goal.rule is None or goal.rule in rules, goal
    assert BY_NAME["failed_save_resumed"].pins == (("stop", False),)


def test_the_machine_s_families_carry_its_goals_and_cover_every_rule() -> None:
    families = families_in_order(CollectionMachine)
    assert [family.name for family in families] == ["runs", "calls", "requests", "stops", "saves", "crashes"]
    assert goals_of(CollectionMachine) == tuple(goal for family in families for goal in family.goals)
    assert set(coverage_of(CollectionMachine).rules) == set(declarations(CollectionMachine))


def test_an_unreached_goal_is_reported_by_the_shared_coverage_table() -> None:
    stats = SearchStats()
    stats.example_started()
    stats.example_covered(Counter({"rerun_continues": 2}), ["start_run"], {"start_run": 3}, {"start_run": 1.5})

    table = goals.table(stats, DeploymentSpec("native"), coverage_of(CollectionMachine), ["crash_gym"])

    lines = table.splitlines()
    assert any(line.split() == ["a", "rerun", "that", "continues", "LATEST", "2", "1"] for line in lines), table
    assert any(line.startswith("  a stop with exit 75") and line.endswith("NEVER") for line in lines), table
    (crash_gym,) = [line for line in lines if line.split()[:1] == ["crash_gym"]]
    assert crash_gym.split(None, 1)[1] == "n/a (not drawable here: listed below)"
    # What reaches more here: more examples, a longer time in one round, never the trainer's aimed rounds or weights.
    assert lines[-1].endswith(
        "a longer run reaches more (try more --examples than this run's 1, or a longer --max-time); 1 more this "
        "deployment cannot reach (n/a)"
    )
    words = " ".join(table.split())
    assert "--max-time D runs examples until D (in one round: the collection machine draws as Hypothesis does" in words
    assert "aimed at what the ones before it left" not in words
    assert "--weights" not in table
    missing = goals.unmet(stats, DeploymentSpec("native"), coverage_of(CollectionMachine))
    assert "a stop with exit 75 (preempted_with_checkpoint)" in missing
    assert "rule kill_run never enabled" in missing


def test_the_collection_machine_judges_the_servers_properties_and_its_own_and_says_why_not_the_others() -> None:
    rules = declarations(CollectionMachine)
    everything = checkable.Capabilities(break_storage=True, telemetry=True)
    judging = coverage.JUDGING

    scope = checkable.verdict_scope(everything, rules, judging)
    without_telemetry = checkable.unchecked_properties(checkable.Capabilities(), rules, judging)

    assert (
        scope == "checked: P1-P4, P9-P10, P13, P15, P22-P26; not checked: P5-P8, P11-P12, P14, P16-P21 (listed above)"
    )
    assert list(judging.titles)[-5:] == ["P22", "P23", "P24", "P25", "P26"]
    assert {item.name for item in without_telemetry} == {*judging.never, "P26"}
    assert set(judging.judged_at) | set(judging.never) == set(judging.titles)
