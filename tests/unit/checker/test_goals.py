"""Coverage goals on hand-built steps, the goals a machine collects from its families, and the nightly's goal
check on hand-built statistics."""

from __future__ import annotations

import inspect
import re
from collections import Counter

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from ckpt_model.model.contract import Model
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import RoundStat, SearchStats
from ckpt_model.steps import goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.goals import Coverage, Goal, GoalsUnmet, Step
from ckpt_model.steps.steplog import action, declarations, families_in_order, goal_families, goals_of, scopes
from ckpt_model.trainer.machine import CheckpointMachine
from ckpt_model.trainer.nemeses import clocks, crashes, lost_replies, pauses, unreachable

NATIVE = DeploymentSpec("native")
CUTS = DeploymentSpec("native", token_capture=True, generation_cuts=True)
MIXED = DeploymentSpec("mixed")
# Each rule and the deployments it applies to, as the machine declares them; and the machine's goals.
SCOPES = scopes(CheckpointMachine)
RULES = {rule: SCOPES[rule] for rule in ("dispatch", "dispatch_restart", "commit")}
GOALS = goals_of(CheckpointMachine)
BY_NAME = {goal.name: goal for goal in GOALS}
COVERAGE = Coverage(GOALS, RULES)


def prepared(release: bool) -> Model:
    """A rollout waiting at its first call with c1 prepared; its reply released (held by the model) or not."""
    model, rollout = Model(topology="native").dispatch()
    model, _ = model.prepare()
    return model.release(rollout) if release else model


def committed(dispatched: bool = True) -> Model:
    """c1 committed, with a rollout whose first call is undelivered (its generation cut), or with none."""
    model = Model(topology="native")
    if dispatched:
        model, _ = model.dispatch()
    model, _ = model.prepare()
    return model.commit()[0]


def step(rule: str, before: Model, *labels: str, earlier: tuple[str, ...] = ()) -> Step:
    return Step(rule, {}, before, before, labels, earlier)


def test_a_commit_with_a_held_reply_holds_it_across_the_commit() -> None:
    assert goals.held_reply_across_commit(step("commit", prepared(release=True)))
    assert not goals.held_reply_across_commit(step("commit", prepared(release=False)))
    assert not goals.held_reply_across_commit(step("resume", prepared(release=True)))


def test_a_restore_of_a_checkpoint_restored_before_restores_it_twice() -> None:
    model = committed()
    again = step("restore", model, "restore(c1) as c1-restore3", earlier=("restore(c1) as c1-restore2",))
    assert goals.same_checkpoint_restored_twice(again)
    other = step("restore", model, "restore(c1) as c1-restore3", earlier=("restore(c2) as c2-restore2",))
    assert not goals.same_checkpoint_restored_twice(other)
    refused = step("restore", model, "restore(c1) as c1-restore3", earlier=("failed_restore(c1) as c1-restore2",))
    assert not goals.same_checkpoint_restored_twice(refused)


def test_a_crash_inside_an_operation_is_told_by_its_rule_and_label() -> None:
    model = committed()
    inside_forget = step("crash_in_operation", model, "crash_in_operation() inside forget forget4, reached []")
    assert crashes.crash_inside("forget")(inside_forget)
    assert not crashes.crash_inside("retire")(inside_forget)
    assert crashes.crash_inside("commit")(step("crash_in_commit", model, "crash_in_commit() -> c1 committed by []"))
    assert not crashes.crash_inside("commit")(inside_forget)
    inside_restore = step("crash_in_restore", model, "crash_in_operation() inside restore c1-restore2, reached []")
    assert crashes.crash_inside("restore")(inside_restore)
    assert not crashes.crash_inside("restore")(
        step("crash", model, "crash_in_operation() inside restore c1-restore2, x")
    )


def test_a_restore_after_a_refused_restore_is_reached_only_with_one_before_it() -> None:
    model = committed()
    failed = "failed_restore(c1) as c1-restore2, agent damaged (records) refused it"
    assert goals.restore_after_failed_restore(step("restore", model, "restore(c1) as c1-restore3", earlier=(failed,)))
    assert not goals.restore_after_failed_restore(step("restore", model, "restore(c1) as c1-restore3"))
    assert not goals.restore_after_failed_restore(step("recover", model, "crash()", earlier=(failed,)))


# Each storage goal, by whether its write stalled and whether the commit was retried.
STORAGE_GOALS = {
    (False, True): "failed_write_retried",
    (False, False): "failed_write_given_up",
    (True, True): "stalled_write_retried",
    (True, False): "stalled_write_stopped",
}


@pytest.mark.parametrize("stalled", [False, True])
@pytest.mark.parametrize("retried", [False, True])
def test_each_storage_fault_goal_is_reached_by_its_own_kind_and_ending(stalled: bool, retried: bool) -> None:
    model = prepared(release=False)
    goal = BY_NAME[STORAGE_GOALS[stalled, retried]]
    for rule in ("storage_fault", "stalled_write"):
        for then_retry in (False, True):
            drawn = Step(rule, {"victim": 0, "point": 0, "then_retry": then_retry}, model, model, ("...",))
            expected = (rule == "stalled_write") == stalled and then_retry == retried
            assert goal.reached(drawn) is expected
    commit = Step("commit", {"then_retry": retried}, model, model, ("commit() -> c1",))
    assert not goal.reached(commit)


@pytest.mark.parametrize("retried", [False, True])
def test_a_paused_commit_goal_is_reached_by_its_rule_and_ending(retried: bool) -> None:
    model = prepared(release=False)
    goal = BY_NAME["paused_commit_retried" if retried else "paused_commit_given_up"]
    for then_retry in (False, True):
        drawn = Step("paused_commit", {"victim": 1, "then_retry": then_retry}, model, model, ("...",))
        assert goal.reached(drawn) is (then_retry == retried)
    assert not goal.reached(Step("stalled_write", {"then_retry": retried}, model, model, ()))


@pytest.mark.parametrize("operation", ["prepare", "commit", "resume"])
def test_a_lost_reply_goal_is_told_by_the_call_its_label_names(operation: str) -> None:
    model = prepared(release=False)
    for lost in ("prepare", "commit", "resume"):
        for then_retry in (False, True):
            label = f"{lost}(c1), agent's reply lost" + ("; retried" if then_retry else "")
            drawn = Step("lost_reply", {"victim": 1, "operation": 0, "then_retry": then_retry}, model, model, (label,))
            assert lost_replies.lost_reply_reached(operation, then_retry)(drawn) is (lost == operation)
            assert not lost_replies.lost_reply_reached(operation, not then_retry)(drawn)
    plain = Step("lost_reply", {"then_retry": True}, model, model, (f"{operation}(c1)",))
    assert not lost_replies.lost_reply_reached(operation, True)(plain)


@pytest.mark.parametrize("operation", ["prepare", "commit", "resume"])
def test_an_unreachable_goal_is_told_by_the_call_and_its_ending_its_label_names(operation: str) -> None:
    model = prepared(release=False)
    endings = {True: "; prepare retried once it was back", False: "; resume(c1); prepare(c1) refused"}
    for cut_off in ("prepare", "commit", "resume"):
        for retried, ending in endings.items():
            label = f"{cut_off}(c1), agent unreachable{ending}"
            # The rule's own `then_retry` does not decide: a resume is always retried, and the label says so.
            drawn = Step(
                "unreachable", {"victim": 0, "operation": 0, "then_retry": not retried}, model, model, (label,)
            )
            assert unreachable.unreachable_reached(operation, retried)(drawn) is (cut_off == operation)
            assert not unreachable.unreachable_reached(operation, not retried)(drawn)
    lost = Step("lost_reply", {"then_retry": True}, model, model, (f"{operation}(c1), agent unreachable; retried",))
    assert not unreachable.unreachable_reached(operation, True)(lost)


def test_a_lost_prepare_reply_applies_only_without_generation_cuts() -> None:
    assert BY_NAME["lost_prepare_retried"].applies(NATIVE)
    assert not BY_NAME["lost_prepare_retried"].applies(CUTS)
    assert BY_NAME["lost_commit_given_up"].applies(CUTS)


def test_a_cut_is_continued_again_by_a_second_restore_of_its_checkpoint() -> None:
    twice = ("restore(c1) as c1-restore3",), ("restore(c1) as c1-restore2",)
    assert goals.cut_continued_again(step("restore", committed(), *twice[0], earlier=twice[1]))
    assert not goals.cut_continued_again(step("restore", committed(), *twice[0]))
    assert not goals.cut_continued_again(step("restore", committed(dispatched=False), *twice[0], earlier=twice[1]))


def test_a_goal_of_generation_cuts_applies_only_where_generations_are_cut() -> None:
    (cut_goal,) = [goal for goal in GOALS if goal.name == "cut_continued_again"]
    assert cut_goal.applies(CUTS)
    assert not cut_goal.applies(NATIVE)


def test_a_rule_of_the_restart_environment_applies_only_where_there_is_one() -> None:
    assert SCOPES["dispatch_restart"](MIXED)
    assert not SCOPES["dispatch_restart"](NATIVE)
    assert SCOPES["commit"](NATIVE)


def test_time_passing_applies_only_where_time_can_pass_and_a_skew_only_where_it_cannot() -> None:
    jumps = DeploymentSpec("slow", "replay", time_jumps=True)
    assert SCOPES["time_passes"](jumps)
    assert not SCOPES["time_passes"](NATIVE)
    assert SCOPES["skewed_clock"](NATIVE)
    assert not SCOPES["skewed_clock"](jumps)
    (goal,) = [goal for goal in GOALS if goal.name == "time_passed_while_parked"]
    assert goal.applies(jumps)
    assert not goal.applies(NATIVE)


@pytest.mark.parametrize(("ahead", "told"), [(True, "lapsed first"), (False, "the others lapsed")])
def test_a_skewed_clock_goal_is_reached_only_when_judged_to_the_end(ahead: bool, told: str) -> None:
    model = prepared(release=False)
    name = "skewed_ahead_lapsed_first" if ahead else "skewed_behind_outheld"
    (goal,) = [goal for goal in GOALS if goal.name == name]
    assert goal.reached(step("skewed_clock", model, f"prepare(c1); agent {told}; ..."))
    assert not goal.reached(step("skewed_clock", model, "prepare(c1) reached agent past its deadline; resumed"))
    assert goal.applies(NATIVE)
    assert not goal.applies(DeploymentSpec("slow", "replay", time_jumps=True))


def test_time_passing_is_reached_only_when_time_passed() -> None:
    model = prepared(release=False)
    assert clocks.time_passed(step("time_passes", model, "time_passes() -> c1: 1200 s passed; c1 lapsed; ..."))
    missed = step("time_passes", model, "time_passes() -> c1: the prepare missed its deadline; resumed, ...")
    assert not clocks.time_passed(missed)
    assert not clocks.time_passed(step("quiet_controller", model, "quiet_controller() -> c1 lapsed"))


def test_a_paused_prepare_goal_is_reached_by_its_rule_and_ending_and_never_with_cuts() -> None:
    model = Model(topology="native")
    for retried in (True, False):
        reached = Step("paused_prepare", {"victim": 0, "then_retry": retried}, model, model, ("...",))
        assert BY_NAME["paused_prepare_retried"].reached(reached) is retried
        assert BY_NAME["paused_prepare_given_up"].reached(reached) is not retried
    assert not SCOPES["paused_prepare"](CUTS)
    assert SCOPES["paused_prepare"](NATIVE)


def test_a_paused_lease_is_reached_only_once_judged_to_the_end() -> None:
    model = Model(topology="native")
    judged = "prepare(c1); agent frozen past its lease, lapsed on waking; commit refused by it; resume, incomplete"
    assert pauses.paused_lease_reached(Step("paused_lease", {"victim": 0}, model, model, (judged,)))
    missed = "prepare(c1) reached some past its deadline; resumed"
    assert not pauses.paused_lease_reached(Step("paused_lease", {"victim": 0}, model, model, (missed,)))


def test_a_prepare_short_a_worker_is_reached_only_by_a_kill_worker_that_prepared_next() -> None:
    model = Model(topology="native")
    goal = BY_NAME["prepared_short_a_worker"]
    killed = "kill_worker(resources, worker 1); retire(['r0#0'])"
    assert goal.reached(step("kill_worker", model, killed, "prepare() -> c1; prepare(other2) refused"))
    assert not goal.reached(step("kill_worker", model, killed))
    assert not goal.reached(step("prepare", model, "prepare() -> c1; prepare(other2) refused", earlier=(killed,)))
    assert goal.applies(DeploymentSpec("native", server_workers=2))
    assert not goal.applies(NATIVE)
    assert not goal.applies(DeploymentSpec("mixed", server_workers=2))


FIRST = Family("first", "a fault family", 1, goals=(Goal("first_goal", "the first family's goal", lambda _step: True),))
SECOND = Family(
    "second",
    "another fault family",
    1,
    goals=(
        Goal("second_goal", "the second family's goal", lambda _step: True),
        Goal("second_goal_again", "the second family's other goal", lambda _step: True),
    ),
)


class First(RuleBasedStateMachine):
    @action(lambda self: True, family=FIRST)
    def first(self) -> None: ...


class Second(RuleBasedStateMachine):
    @action(lambda self: True, family=SECOND)
    def another(self) -> None: ...  # sorts before `first`: the mounting orders the families, not the rule names


PROTOCOL = Family(
    "protocol",
    "the protocol's rules",
    2,
    protocol=True,
    goals=(Goal("protocol_goal", "the protocol's own goal", lambda _step: True),),
)


class Mounted(Second, First):
    @action(lambda self: True, family=PROTOCOL)
    def step(self) -> None: ...


def test_a_machine_collects_its_own_familys_goals_then_each_familys_in_the_order_it_mounts_them() -> None:
    assert [family.name for family in families_in_order(Mounted)] == ["protocol", "second", "first"]
    assert goals_of(Mounted) == PROTOCOL.goals + SECOND.goals + FIRST.goals


def test_the_machines_goals_are_the_protocols_then_its_families_each_name_once() -> None:
    """Statistics count goals by name: two goals of one name would be counted as one. The protocol's own goals
    (those of its checkpoint and restore families) come first, as the coverage table has always shown them."""
    names = [goal.name for goal in GOALS]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    protocol = goals.CHECKPOINT_GOALS + goals.RESTORE_GOALS
    assert GOALS[: len(protocol)] == protocol
    families = families_in_order(CheckpointMachine)
    assert tuple(goal for family in families for goal in family.goals) == GOALS


# The fault rules whose goals are reached by how the controller goes on (`goals.retry_goal`).
RETRY_RULES = ("storage_fault", "stalled_write", "paused_commit", "paused_prepare", "failing_close", "failing_export")


def test_a_goals_rule_and_pins_name_a_rule_of_the_machine_and_its_arguments() -> None:
    """What an aimed round fixes (`ckpt_model.search.aim`) must be a rule the machine draws and arguments it takes; a
    goal reached by its arguments alone (`retry_goal`) is reached by a step of its rule with its pins."""
    rules = declarations(CheckpointMachine)
    aimed = [goal for goal in GOALS if goal.rule is not None]
    assert {goal.rule for goal in aimed} >= {"commit", "restore", "stalled_write", "lost_reply", "skewed_clock"}
    for goal in aimed:
        assert goal.rule in rules, goal
        parameters = inspect.signature(getattr(CheckpointMachine, goal.rule)).parameters
        for argument, value in goal.pins:
            assert argument in parameters, goal
            assert isinstance(value, bool), goal
    retried_or_given_up = [goal for goal in aimed if goal.rule in RETRY_RULES]
    assert len(retried_or_given_up) == 11
    for goal in retried_or_given_up:
        ((argument, value),) = goal.pins
        assert goal.reached(Step(goal.rule, {argument: value}, prepared(False), prepared(False), ())), goal
        assert not goal.reached(Step(goal.rule, {argument: not value}, prepared(False), prepared(False), ())), goal


def test_every_goal_has_the_family_an_aimed_round_favours() -> None:
    families = goal_families(CheckpointMachine)
    assert set(families) == set(BY_NAME)
    assert families["held_reply_across_commit"] == "checkpoints"
    assert families["same_checkpoint_restored_twice"] == "restores"
    assert families["stalled_write_retried"] == "storage"
    assert families["lost_commit_retried"] == "lost_replies"
    assert families["crash_inside_forget"] == "crashes"


def covered_everywhere(rules: list[str]) -> SearchStats:
    """Statistics of a search that reached every goal and drew every rule once."""
    stats = SearchStats(examples=3)
    names = {goal.name: 1 for goal in GOALS}
    stats.example_covered(names, rules, Counter(rules))
    return stats


def test_the_nightly_goal_check_passes_when_every_applicable_goal_was_reached() -> None:
    stats = covered_everywhere(["dispatch", "commit"])
    goals.require(stats, NATIVE, COVERAGE)  # dispatch_restart does not apply to native: never drawn, not missing
    assert goals.unmet(stats, NATIVE, COVERAGE) == []


def test_the_nightly_goal_check_fails_naming_a_goal_never_reached() -> None:
    stats = covered_everywhere(["dispatch", "commit"])
    stats.goals["crash_inside_forget"] = 0
    with pytest.raises(GoalsUnmet) as raised:
        goals.require(stats, NATIVE, COVERAGE)
    assert "a crash inside a forget (crash_inside_forget)" in str(raised.value)
    assert "1 goal(s) never reached on native in 3 examples" in str(raised.value)


def test_the_nightly_goal_check_fails_naming_a_rule_never_enabled_or_drawn() -> None:
    stats = covered_everywhere(["dispatch", "commit"])
    with pytest.raises(GoalsUnmet, match="rule dispatch_restart never enabled; rule dispatch_restart never drawn"):
        goals.require(stats, MIXED, COVERAGE)


def test_the_table_marks_what_was_never_reached_and_what_cannot_be() -> None:
    stats = covered_everywhere(["dispatch"])
    text = goals.table(stats, NATIVE, COVERAGE)
    assert "coverage over 3 examples (native):" in text
    assert "a cut continued after a second crash" in text
    assert "n/a" in text
    (commit_line,) = [line for line in text.splitlines() if line.strip().startswith("commit ")]
    assert commit_line.endswith("NEVER enabled")
    (dispatch_line,) = [line for line in text.splitlines() if line.strip().startswith("dispatch ")]
    assert dispatch_line.split()[1:] == ["1", "1", "1", "0"]  # enabled, drawn, examples, ms per draw


def test_a_rule_the_deployment_cannot_draw_is_n_a_not_never() -> None:
    stats = covered_everywhere(["dispatch"])  # `commit` never drawn
    text = goals.table(stats, NATIVE, COVERAGE, undrawable=["commit"])
    (commit_line,) = [line for line in text.splitlines() if line.strip().startswith("commit ")]
    assert commit_line.split()[1:] == ["n/a", "(not", "drawable", "here:", "listed", "below)"]
    assert "NEVER" not in commit_line


def test_the_table_splits_the_drawn_steps_by_family() -> None:
    stats = SearchStats(examples=2)
    stats.example_covered({}, ["dispatch", "crash"], {"dispatch": 3, "release": 1, "crash": 4}, {"crash": 0.2})
    family_of = {"dispatch": "rollouts", "release": "rollouts", "crash": "crashes", "commit": "checkpoints"}
    lines = goals.family_lines(stats, family_of)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows == {"rollouts": ["4", "50%", "0"], "crashes": ["4", "50%", "50"], "checkpoints": ["0", "0%", "-"]}
    assert lines[0].split() == ["family", "steps", "share", "ms/step"]
    assert "\n".join(lines) in goals.table(stats, NATIVE, COVERAGE, family_of=family_of)


def test_the_table_as_data_gives_each_goal_and_rule_its_counts_and_status() -> None:
    """`check --json`'s `coverage`: what the table prints, with NEVER, n/a and why, and every NEVER by name."""
    stats = covered_everywhere(["dispatch"])  # `commit` never drawn
    stats.goals["held_reply_across_commit"] = 0
    stats.rule_seconds["dispatch"] = 0.25

    document = goals.document(stats, NATIVE, COVERAGE)

    rows = {row["name"]: row for row in [*document["goals"], *document["rules"]]}
    assert document["examples"] == 3
    assert rows["held_reply_across_commit"] == {
        "name": "held_reply_across_commit",
        "says": "a reply held across a commit",
        "steps": 0,
        "examples": 1,
        "status": "NEVER",
    }
    assert rows["same_checkpoint_restored_twice"]["status"] == "reached"
    assert rows["cut_continued_again"] == {
        "name": "cut_continued_again",
        "says": "a cut continued after a second crash",
        "status": "n/a",
        "why": "not on this deployment",
    }
    assert rows["dispatch"] == {
        "name": "dispatch",
        "enabled": 1,
        "drawn": 1,
        "examples": 1,
        "ms_per_draw": 250.0,
        "status": "reached",
    }
    assert (rows["commit"]["status"], rows["commit"]["ms_per_draw"]) == ("NEVER", None)
    assert rows["dispatch_restart"]["status"] == "n/a"
    assert document["never"] == ["held_reply_across_commit", "commit"]


def test_a_rule_the_deployment_cannot_draw_is_n_a_in_the_data_too() -> None:
    document = goals.document(covered_everywhere(["dispatch"]), NATIVE, COVERAGE, undrawable=["commit"])

    (commit,) = [row for row in document["rules"] if row["name"] == "commit"]
    assert commit == {"name": "commit", "status": "n/a", "why": "not drawable here: lacks what it needs"}
    assert "commit" not in document["never"]


def test_a_goal_only_an_undrawable_rule_reaches_is_n_a_in_the_data_as_in_the_table() -> None:
    stats = SearchStats(examples=2)
    coverage = Coverage((BY_NAME["skewed_ahead_lapsed_first"],), {"skewed_clock": goals.everywhere})
    document = goals.document(stats, NATIVE, coverage, undrawable=["skewed_clock"])
    (goal,) = document["goals"]
    assert (goal["status"], goal["why"]) == ("n/a", "its rule skewed_clock is not drawable here")
    assert document["never"] == []
    assert "NEVER" not in goals.table(stats, NATIVE, coverage, ["skewed_clock"])


LONG = "a goal whose name runs on " + "and on " * 20 + "to the end"
LONG_RULE = "a_rule_with_a_name_far_longer_than_any_column_of_the_old_table_allowed_for_it"


def long_named(*names: str) -> Coverage:
    """A coverage of hand-built goals with the given names, and of `dispatch` and a rule with a long name."""
    built = tuple(Goal(f"goal{index}", says, lambda _step: False) for index, says in enumerate(names))
    return Coverage(built, {"dispatch": goals.everywhere, LONG_RULE: goals.everywhere})


@pytest.mark.parametrize("names", [("short",), ("short", "x" * 45), ("short", LONG, "a mid-length goal name here")])
def test_the_tables_columns_line_up_whatever_the_names_lengths(names: tuple[str, ...]) -> None:
    stats = SearchStats(examples=12)
    stats.example_covered({"goal0": 123456}, ["dispatch"], {"dispatch": 7, LONG_RULE: 1}, {"dispatch": 0.07})
    lines = goals.table(stats, NATIVE, long_named(*names)).splitlines()
    goal_section = lines[lines.index(next(line for line in lines if line.split()[:1] == ["goal"])) :]
    goal_section = goal_section[: next(i for i, line in enumerate(goal_section) if line.split()[:1] == ["rule"])]
    rule_section = lines[lines.index(goal_section[-1]) + 1 :]
    rule_section = rule_section[: next(i for i, line in enumerate(rule_section) if not line.startswith("  "))]
    for section in (goal_section, rule_section):
        header_end = len(section[0])
        counted = [line.split("  NEVER")[0] for line in section[1:] if re.search(r"\d  NEVER|\d$", line)]
        # every row's last count ends where its header's last title does: the columns line up
        assert counted, "\n".join(section)
        assert {len(line) for line in counted} == {header_end}, "\n".join(section)
        # every count column starts after the widest name (or the widest a name may be), two spaces after it
        rows = [line for line in section[1:] if not line.startswith("    ")]
        name_width = max(min(len(line.split("  ")[1]), goals.NAME_WIDTH_MAX) for line in rows)
        assert all(line[2 + name_width : 4 + name_width] == "  " for line in rows), "\n".join(section)
    # a name longer than the column wraps onto the lines below its row, indented under it
    if LONG in names:
        (first,) = [line for line in goal_section if line.startswith("  a goal whose name runs on")]
        assert first.split()[-2:] == ["0", "0"] or first.endswith("NEVER")
        continued = goal_section[goal_section.index(first) + 1 :]
        assert continued[0].startswith("    ")
        assert not continued[0].startswith("     ")
        assert (
            " ".join([first[2 : 2 + goals.NAME_WIDTH_MAX].strip(), *(line.strip() for line in continued[:2])]) == LONG
        )


def test_a_name_that_fits_sets_the_width_of_its_column() -> None:
    stats = SearchStats(examples=1)
    lines = goals.table(stats, NATIVE, long_named("x" * 45)).splitlines()
    (header,) = [line for line in lines if line.split()[:1] == ["goal"]]
    assert header == "  goal" + " " * 43 + "steps examples"  # 45 for the name, two spaces, then the counts


def test_every_never_is_one_the_deployment_can_reach_and_the_table_says_why_and_what_reaches_it() -> None:
    """A goal not reached whose rule is drawable, a rule enabled and never drawn, a rule never enabled: NEVER, and
    the words after the table count them and say what reaches them; a goal whose one rule this deployment cannot
    draw is n/a, counted with what no run here can reach."""
    says = {goal.name: goal.says for goal in GOALS}
    coverage = Coverage(
        (BY_NAME["held_reply_across_commit"], BY_NAME["skewed_ahead_lapsed_first"], BY_NAME["crash_inside_forget"]),
        {"dispatch": goals.everywhere, "commit": goals.everywhere, "retire": goals.everywhere},
    )
    stats = SearchStats(examples=9)
    stats.example_covered({"crash_inside_forget": 1}, ["dispatch", "commit"], {"dispatch": 4})

    text = goals.table(stats, NATIVE, coverage, undrawable=["skewed_clock"])
    rows = {line.strip().split("  ")[0]: line for line in text.splitlines()}

    assert rows[says["held_reply_across_commit"]].endswith(" 0        0  NEVER")
    assert rows[says["skewed_ahead_lapsed_first"]].split("  ")[-1].strip() == (
        "n/a (its rule skewed_clock is not drawable here: listed below)"
    )
    assert rows["commit"].endswith("NEVER drawn")
    assert rows["retire"].endswith("NEVER enabled")
    assert "NEVER" not in rows["dispatch"]
    assert "NEVER" not in rows[says["crash_inside_forget"]]
    words = text.split("\nNEVER: ")[1]
    assert words.startswith("3 goals and rules this deployment can reach and no example reached")
    assert "went unchecked in this run" in " ".join(words.split())
    assert "  - 1 goal: no step reached the situation" in words
    assert "  - 1 rule enabled but never drawn: the draw did not pick it" in words
    assert "  - 1 rule never enabled: no example reached a state its precondition allows" in words
    assert "--max-time D (without --examples)" in words
    assert (
        "\nn/a: 1 goal or rule no run on this deployment can reach (1 through a rule it cannot draw, listed below)"
        in (text)
    )
    assert text.splitlines()[-1] == (
        "3 goals and rules never reached: a longer run reaches more (try --max-time 2m); 1 more this deployment "
        "cannot reach (n/a)"
    )


def test_a_run_that_reached_everything_it_can_says_so_in_one_line() -> None:
    stats = covered_everywhere(["dispatch", "commit"])
    text = goals.table(stats, NATIVE, COVERAGE)
    assert "NEVER" not in text
    applicable_not = [goal for goal in GOALS if not goal.applies(NATIVE)]
    assert f"n/a: {len(applicable_not) + 1} goals and rules no run on this deployment can reach " in text
    assert f"({len(applicable_not) + 1} by its spec): a longer run does not change that" in " ".join(text.split())
    assert text.splitlines()[-1] == (
        f"every goal and rule this deployment can reach was reached; {len(applicable_not) + 1} more this deployment "
        "cannot reach (n/a)"  # the goals that do not apply to native, and dispatch_restart
    )


def test_a_search_that_already_ran_aimed_rounds_is_told_to_take_longer() -> None:
    stats = SearchStats(examples=40)
    assert goals.aimed_suggestion(stats) == "--max-time 2m"
    stats.rounds.append(RoundStat(0.0, 0, "round 1: the weights' own draw"))
    assert goals.aimed_suggestion(stats) == "a longer --max-time"
    assert "(try a longer --max-time)" in goals.table(stats, NATIVE, COVERAGE)


def test_a_goal_reached_counts_even_where_its_rule_is_said_not_drawable() -> None:
    stats = SearchStats(examples=1)
    stats.example_covered({"skewed_ahead_lapsed_first": 2}, [], {})
    coverage = Coverage((BY_NAME["skewed_ahead_lapsed_first"],), {})
    (row,) = [line for line in goals.table(stats, NATIVE, coverage, ["skewed_clock"]).splitlines() if "ahead" in line]
    assert row.split()[-2:] == ["2", "1"]
