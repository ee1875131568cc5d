"""Coverage goals: the protocol situations a search must reach, each a small pure predicate over one step.

A property says what must always hold; a goal says what must sometimes happen (Antithesis's "sometimes"
assertions, Stateright's `sometimes` properties): a search that never holds a reply across a commit, or never
crashes inside a forget, checks nothing there, however many examples pass. The machine's step wrapper
(`steplog.step`) hands every step to `reached`, counts what each example reached in `SearchStats`, and the
nightly fails when a goal that applies to its deployment was never reached (`require`). Beside the situations,
every rule is a goal twice: enabled (its precondition held before some drawn step) and drawn (Hypothesis chose it).

Each family of rules declares its goals, on its `Family`: the protocol's checkpoint and restore families the
protocol's own situations (`CHECKPOINT_GOALS`, `RESTORE_GOALS`, here), each fault family its own with its rules
(`ckpt_model.trainer.nemeses`), the collection machine's families theirs (`ckpt_model.collection.coverage`); a
machine's goals are collected from the families of its rules (`steplog.coverage`, which also gives each rule's
scope). A goal or a rule that only some deployments can reach says
so by the deployment's traits (a goal's `applies`; a rule's `applies`, declared on the rule: `steplog.action`),
never by a topology's name. `table` is the short report every run ends with (`ckpt-model check`, the nightly):
each NEVER in it is one the deployment can reach and the run did not (a goal whose one rule the deployment never
draws is `n/a`, as that rule is), and the table ends with what they mean and what reaches them (a longer run, asked
for as the machine's `Coverage.longer_run` says).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs

from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import SearchStats

# How a successful restore's label names the checkpoint it restored: "restore(c1) as c1-restore3".
RESTORED = re.compile(r"^restore\((?P<checkpoint>[^)]+)\) as ")
# How the labels of a restore that had to fail begin.
FAILED_RESTORES = ("failed_restore(", "restore_incomplete(", "dies_in_restore(")


@attrs.frozen
class Step:
    """What one rule did: its name and arguments, the machine's model before and after (the trainer's `Model`, the
    collection machine's `Prediction`), the labels it added (its nested rules' included), and every label of the
    example before it."""

    rule: str
    arguments: Mapping[str, Any]
    before: Any
    after: Any
    labels: tuple[str, ...]
    earlier: tuple[str, ...] = ()


def everywhere(_spec: DeploymentSpec) -> bool:
    return True


# Each rule of a machine, in name order, and the deployments it applies to (`steplog.scopes`).
Scopes = Mapping[str, Callable[[DeploymentSpec], bool]]


# A rule's arguments an aimed round fixes (`ckpt_model.search.aim`), as (argument, value) pairs.
FixedArguments = tuple[tuple[str, Any], ...]


@attrs.frozen
class Goal:
    """A protocol situation the search must reach, where `applies` says the deployment can reach it. `rule`, where
    one rule reaches it, and `pins`, the arguments that rule needs to, tell an aimed round (`ckpt_model.search.aim`)
    what to favour; a goal without `rule` is aimed at through the family that declares it."""

    name: str
    says: str
    reached: Callable[[Step], bool]
    applies: Callable[[DeploymentSpec], bool] = everywhere
    rule: str | None = None
    pins: FixedArguments = ()


def restored_checkpoints(labels: Iterable[str]) -> list[str]:
    """The checkpoints the successful restores among `labels` restored, in order."""
    return [found["checkpoint"] for label in labels if (found := RESTORED.match(label))]


def held_reply_across_commit(step: Step) -> bool:
    """A commit while a released reply is held by the model (Gym's scenario 8)."""
    return step.rule == "commit" and any(attempt.held for attempt in step.before.attempts)


def same_checkpoint_restored_twice(step: Step) -> bool:
    """A restore of a checkpoint an earlier restore of the example already restored (Gym's scenario 3)."""
    earlier = set(restored_checkpoints(step.earlier))
    return step.rule == "restore" and any(c in earlier for c in restored_checkpoints(step.labels))


def restore_after_failed_restore(step: Step) -> bool:
    """A successful restore after a restore that was refused or died in the same example (P8's cleanup held)."""
    return step.rule == "restore" and any(label.startswith(FAILED_RESTORES) for label in step.earlier)


def cut_continued_again(step: Step) -> bool:
    """A second restore of a checkpoint whose snapshot holds an undelivered call, its generation cut at the
    prepare: the cut is handed on again after the continuation it was first handed to crashed."""
    if step.rule != "restore":
        return False
    earlier = set(restored_checkpoints(step.earlier))
    for checkpoint_id in restored_checkpoints(step.labels):
        cut = any(a.outstanding is not None for a in step.before.checkpoint(checkpoint_id).snapshot)
        if cut and checkpoint_id in earlier:
            return True
    return False


def rule_then_retry(rule: str, retried: bool) -> Callable[[Step], bool]:
    """A step of `rule` (a fault rule with a `then_retry` argument) that then retried what its fault failed
    (`retried`) or gave it up."""

    def reached(step: Step) -> bool:
        return step.rule == rule and bool(step.arguments.get("then_retry")) == retried

    reached.__doc__ = f"A {rule}, then {'retried' if retried else 'given up'}."
    return reached


def retry_goal(
    name: str, says: str, rule: str, retried: bool, applies: Callable[[DeploymentSpec], bool] = everywhere
) -> Goal:
    """The goal of a step of `rule` (a fault rule with a `then_retry` argument) that then retried what its fault
    failed (`retried`) or gave it up: reached, and aimed at, by `then_retry` alone."""
    return Goal(name, says, rule_then_retry(rule, retried), applies, rule=rule, pins=(("then_retry", retried),))


def without_cuts(spec: DeploymentSpec) -> bool:
    """A prepare never fails on one participant alone where generation cuts are on (the machine's `_one_sided`)."""
    return not spec.generation_cuts


def one_sided(operation: str) -> Callable[[DeploymentSpec], bool]:
    """Where `operation` can fail on one participant alone (a lost reply, a partition): a prepare only without
    generation cuts (`without_cuts`), any other call everywhere."""
    return without_cuts if operation == "prepare" else everywhere


def with_restart_environment(spec: DeploymentSpec) -> bool:
    return spec.traits.restart_environment


def asks_a_judge(spec: DeploymentSpec) -> bool:
    return spec.traits.judge


def waits_for_a_judge(spec: DeploymentSpec) -> bool:
    return spec.traits.judge and spec.verify_mode == "wait"


def cuts_generations(spec: DeploymentSpec) -> bool:
    return spec.generation_cuts


# The protocol's own situations, each reached by a commit or a restore whatever faults came before it: the goals of
# the protocol's checkpoint and restore families (`ckpt_model.steps.families`), as each fault family's are its own.
CHECKPOINT_GOALS: tuple[Goal, ...] = (
    Goal("held_reply_across_commit", "a reply held across a commit", held_reply_across_commit, rule="commit"),
)
RESTORE_GOALS: tuple[Goal, ...] = (
    Goal(
        "same_checkpoint_restored_twice",
        "the same checkpoint restored twice",
        same_checkpoint_restored_twice,
        rule="restore",
    ),
    Goal(
        "restore_after_failed_restore", "a restore after a failed restore", restore_after_failed_restore, rule="restore"
    ),
    Goal(
        "cut_continued_again",
        "a cut continued after a second crash",
        cut_continued_again,
        applies=cuts_generations,
        rule="restore",
    ),
)


@attrs.frozen
class LongerRun:
    """How a longer search of a machine is asked for, which is what a goal or rule it never reached needs:
    `suggest`, the summary's short suggestion after a run of these statistics, and `says`, what each way does."""

    suggest: Callable[[SearchStats], str]
    says: str


def aimed_suggestion(stats: SearchStats) -> str:
    """A first time limit, or more time for a search bounded by time that already ran aimed rounds."""
    return "a longer --max-time" if stats.rounds else "--max-time 2m"


# The trainer machine's: a search bounded by time runs aimed rounds (`ckpt_model.search.aim`), `--weights` weighs
# its families.
AIMED_LONGER_RUN = LongerRun(
    aimed_suggestion,
    "--max-time D (without --examples) runs examples for D, each round after the first aimed at what the ones "
    "before it left (docs/how-it-works.md#aiming: what 2 minutes reached); --weights FAMILY=N draws a family more "
    "often (one weighed 0 is drawn only when no other can move); --steps N makes each example longer",
)


@attrs.frozen
class Coverage:
    """What a machine's search must reach (`steplog.coverage`): its families' goals, in report order, and each of
    its rules with the deployments it applies to; and how a longer search of it is asked for."""

    goals: tuple[Goal, ...]
    rules: Scopes
    longer_run: LongerRun = AIMED_LONGER_RUN


def reached(step: Step, goals: Iterable[Goal]) -> list[str]:
    """The `goals` this step reached, by name."""
    return [goal.name for goal in goals if goal.reached(step)]


def left(stats: SearchStats, spec: DeploymentSpec, coverage: Coverage) -> tuple[list[Goal], list[str]]:
    """The goals of `coverage` that apply to `spec` and no example of `stats` reached, and its rules that apply and
    were never enabled or never drawn."""
    goals = [goal for goal in coverage.goals if goal.applies(spec) and not stats.goals[goal.name]]
    rules = [
        rule
        for rule, applies in coverage.rules.items()
        if applies(spec) and not all(counts[rule] for _how, counts in rule_counts(stats))
    ]
    return goals, rules


def unmet(stats: SearchStats, spec: DeploymentSpec, coverage: Coverage) -> list[str]:
    """Every goal and rule of `coverage` that applies to `spec` and no example of `stats` reached, each said in
    words."""
    goals, rules = left(stats, spec, coverage)
    missing = [f"{goal.says} ({goal.name})" for goal in goals]
    for rule in rules:
        missing += [f"rule {rule} never {how}" for how, counts in rule_counts(stats) if not counts[rule]]
    return missing


def rule_counts(stats: SearchStats) -> tuple[tuple[str, Mapping[str, int]], ...]:
    return (("enabled", stats.enabled), ("drawn", stats.drawn))


class GoalsUnmet(AssertionError):
    """The search never reached a situation it must reach: what it checks there went unchecked."""


def require(stats: SearchStats, spec: DeploymentSpec, coverage: Coverage) -> None:
    """Raise `GoalsUnmet` naming every applicable goal and rule of `coverage` no example reached."""
    missing = unmet(stats, spec, coverage)
    if missing:
        raise GoalsUnmet(
            f"coverage: {len(missing)} goal(s) never reached on {spec.label} in {stats.examples} examples, so "
            "what the checker checks there went unchecked: "
            + "; ".join(missing)
            + ". Each must be reached by some example (docs/how-it-works.md, coverage goals): a rule's "
            "precondition, the step count or the swarm keeps the search away from it."
        )


# A name longer than this wraps onto the lines below its row; a shorter column fits the section's longest name.
NAME_WIDTH_MAX = 72
# The width the words after the table wrap at.
WORDS_WIDTH = 110


@attrs.frozen
class Row:
    """One row of a section of the table: its name, its counts (none for `n/a`), and what follows them."""

    name: str
    cells: tuple[str, ...] = ()
    note: str = ""


def aligned(header: tuple[str, ...], rows: Iterable[Row]) -> list[str]:
    """`header` and `rows` as lines whose columns line up whatever the names' lengths: the name column as wide as
    the longest name (at most `NAME_WIDTH_MAX`: a longer name wraps, its counts on its first line), two spaces, then
    each count column right-aligned to its widest value; a row without counts (`n/a ...`) starts where they do."""
    rows = list(rows)
    name_width = min(max([len(header[0]), *(len(row.name) for row in rows)]), NAME_WIDTH_MAX)
    widths = [
        max([len(title), *(len(row.cells[index]) for row in rows if len(row.cells) > index)])
        for index, title in enumerate(header[1:])
    ]

    def line(name: str, cells: tuple[str, ...], note: str) -> str:
        counts = " ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=False))
        after = f"{counts}  {note}" if counts and note else counts or note
        return f"  {name:<{name_width}}  {after}".rstrip()

    lines = [line(header[0], header[1:], "")]
    for row in rows:
        first, *rest = textwrap.wrap(row.name, name_width, subsequent_indent="  ") or [""]
        lines.append(line(first, row.cells, row.note))
        lines += [f"  {more}" for more in rest]
    return lines


def unreachable_because(goal: Goal, spec: DeploymentSpec, coverage: Coverage, undrawable: Collection[str]) -> str:
    """Why no run on `spec` can reach `goal` ("" when one can): the deployment is not one it applies to, or the one
    rule that reaches it is never drawn here."""
    if not goal.applies(spec):
        return "n/a"
    if goal.rule is None:
        return ""
    if goal.rule in undrawable:
        return f"n/a (its rule {goal.rule} is not drawable here: listed below)"
    applies = coverage.rules.get(goal.rule, everywhere)
    return "" if applies(spec) else f"n/a (its rule {goal.rule} does not apply here)"


@attrs.frozen
class Reached:
    """What a run reached of a machine's coverage on one deployment, as the table says it: the goals and rules each
    with its row, and by name those never reached that the deployment can reach (`never_goals`; `never_enabled`,
    `never_drawn`: rules never enabled, and enabled but never drawn) and those it cannot (`cannot`, `n/a`), of which
    `undrawable` are rules it cannot draw and goals only such a rule reaches."""

    goals: tuple[Row, ...]
    rules: tuple[Row, ...]
    never_goals: tuple[str, ...]
    never_enabled: tuple[str, ...]
    never_drawn: tuple[str, ...]
    cannot: tuple[str, ...]
    undrawable: tuple[str, ...] = ()

    @property
    def never(self) -> int:
        return len(self.never_goals) + len(self.never_enabled) + len(self.never_drawn)


def reached_on(stats: SearchStats, spec: DeploymentSpec, coverage: Coverage, undrawable: Collection[str]) -> Reached:
    """The rows of the table's goals and rules, and what was never reached, sorted by whether `spec` can reach it."""
    goal_rows, rule_rows = [], []
    never_goals, never_enabled, never_drawn, cannot, undrawable_here = [], [], [], [], []
    for goal in coverage.goals:
        steps = stats.goals[goal.name]
        # A goal reached is shown reached, whatever is said of its rule; one whose spec rules it out never is.
        why_not = (
            "n/a" if not goal.applies(spec) else "" if steps else unreachable_because(goal, spec, coverage, undrawable)
        )
        if why_not:
            cannot.append(goal.name)
            if why_not != "n/a":
                undrawable_here.append(goal.name)
            goal_rows.append(Row(goal.says, note=why_not))
            continue
        goal_rows.append(Row(goal.says, (str(steps), str(stats.goal_examples[goal.name])), "" if steps else "NEVER"))
        if not steps:
            never_goals.append(goal.name)
    for rule, applies in coverage.rules.items():
        if not applies(spec) or rule in undrawable:
            cannot.append(rule)
            if applies(spec):
                undrawable_here.append(rule)
            rule_rows.append(Row(rule, note="n/a" if not applies(spec) else "n/a (not drawable here: listed below)"))
            continue
        enabled, drawn = stats.enabled[rule], stats.drawn[rule]
        per_draw = [f"{1000 * stats.rule_seconds[rule] / drawn:.0f}"] if drawn else []
        cells = (str(enabled), str(drawn), str(stats.drawn_examples[rule]), *per_draw)
        note = "" if enabled and drawn else "NEVER drawn" if enabled else "NEVER enabled"
        rule_rows.append(Row(rule, cells, note))
        if not enabled:
            never_enabled.append(rule)
        elif not drawn:
            never_drawn.append(rule)
    return Reached(
        tuple(goal_rows),
        tuple(rule_rows),
        tuple(never_goals),
        tuple(never_enabled),
        tuple(never_drawn),
        tuple(cannot),
        tuple(undrawable_here),
    )


def table(
    stats: SearchStats,
    spec: DeploymentSpec,
    coverage: Coverage,
    undrawable: Collection[str] = (),
    family_of: Mapping[str, str] | None = None,
) -> str:
    """How often each goal and each rule of `coverage` was reached: goals by steps and examples, rules by the
    examples that enabled them and the times and examples they were drawn; NEVER marks an applicable one never
    reached (a rule `NEVER enabled` or `NEVER drawn`), `n/a` one the deployment cannot reach: by its spec, or
    (`undrawable`, `checkable.undrawable_rules`) because it lacks what the rule needs, which the run's summary lists
    with why, or because the one rule that reaches a goal is such a rule. With `family_of` (each rule's family, by
    name) it first splits the drawn steps by family. It ends with what the NEVERs mean and what reaches them
    (`never_words`), and a one-line summary (`summary_line`)."""
    reached = reached_on(stats, spec, coverage, undrawable)
    lines = [f"coverage over {stats.examples} examples ({spec.label}):"]
    if family_of is not None:
        lines += family_lines(stats, family_of)
    lines += aligned(("goal", "steps", "examples"), reached.goals)
    lines += aligned(("rule", "enabled", "drawn", "examples", "ms/draw"), reached.rules)
    return "\n".join([*lines, *never_words(reached, coverage.longer_run), summary_line(stats, reached, coverage)])


def counted(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


def wrapped(text: str, indent: str = "") -> list[str]:
    """`text` as lines of at most `WORDS_WIDTH`, the first indented by `indent`, the rest by two spaces more."""
    return textwrap.wrap(text, WORDS_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def never_words(reached: Reached, longer_run: LongerRun) -> list[str]:
    """What the table's NEVERs and n/a's mean, by why, and what reaches the NEVERs; nothing when there is none."""
    lines = []
    if reached.never:
        lines += wrapped(
            f"NEVER: {counted(reached.never, 'goal or rule', 'goals and rules')} this deployment can reach and no "
            "example reached: what the checker judges there went unchecked in this run (its pass says nothing there)"
        )
        if reached.never_goals:
            lines.append(f"  - {counted(len(reached.never_goals), 'goal', 'goals')}: no step reached the situation")
        if reached.never_drawn:
            drawn = len(reached.never_drawn)
            lines.append(
                f"  - {counted(drawn, 'rule', 'rules')} enabled but never drawn: the draw did not pick "
                + ("it" if drawn == 1 else "them")
            )
        if reached.never_enabled:
            enabled = len(reached.never_enabled)
            lines.append(
                f"  - {counted(enabled, 'rule', 'rules')} never enabled: no example reached a state "
                + ("its precondition allows" if enabled == 1 else "their preconditions allow")
            )
        lines += wrapped(f"- what reaches them: a longer run; {longer_run.says}", "  ")
    if reached.cannot:
        by_spec = len(reached.cannot) - len(reached.undrawable)
        why = [f"{by_spec} by its spec"] if by_spec else []
        if reached.undrawable:
            why.append(f"{len(reached.undrawable)} through a rule it cannot draw, listed below")
        lines += wrapped(
            f"n/a: {counted(len(reached.cannot), 'goal or rule', 'goals and rules')} no run on this deployment can "
            f"reach ({'; '.join(why)}): a longer run does not change that"
        )
    return lines


def summary_line(stats: SearchStats, reached: Reached, coverage: Coverage) -> str:
    """The table's last line: how many goals and rules were never reached and what reaches them, and how many this
    deployment cannot reach."""
    cannot = f"{len(reached.cannot)} more this deployment cannot reach (n/a)" if reached.cannot else ""
    if not reached.never:
        return "every goal and rule this deployment can reach was reached" + (f"; {cannot}" if cannot else "")
    never = counted(reached.never, "goal or rule", "goals and rules")
    return f"{never} never reached: a longer run reaches more (try {coverage.longer_run.suggest(stats)})" + (
        f"; {cannot}" if cannot else ""
    )


# A coverage row's status: reached, applicable and never reached, or not applicable to the deployment.
REACHED, NEVER, NOT_APPLICABLE = "reached", "NEVER", "n/a"


def document(
    stats: SearchStats, spec: DeploymentSpec, coverage: Coverage, undrawable: Collection[str] = ()
) -> dict[str, Any]:
    """The coverage table as data (`check --json`'s `coverage`): each goal with its steps, examples and status, each
    rule with the examples that enabled it, its draws, the examples that drew it, its milliseconds per draw and
    status (NEVER: applicable and never reached; n/a with why: the spec, or `undrawable` here, or for a goal the one
    rule that reaches it undrawable, as the table says), and `never`, every NEVER by name."""
    goal_rows: list[dict[str, Any]] = []
    for goal in coverage.goals:
        row: dict[str, Any] = {"name": goal.name, "says": goal.says}
        # n/a as the table says it: by the spec, or a goal only a rule not drawable here reaches
        steps = stats.goals[goal.name]
        why_not = unreachable_because(goal, spec, coverage, undrawable) if not steps or not goal.applies(spec) else ""
        if not why_not:
            row |= {"steps": steps, "examples": stats.goal_examples[goal.name]}
            row["status"] = REACHED if steps else NEVER
        elif why_not == NOT_APPLICABLE:
            row |= {"status": NOT_APPLICABLE, "why": "not on this deployment"}
        else:
            row |= {"status": NOT_APPLICABLE, "why": f"its rule {goal.rule} is not drawable here"}
        goal_rows.append(row)
    rule_rows: list[dict[str, Any]] = []
    for rule, applies in coverage.rules.items():
        if not applies(spec) or rule in undrawable:
            why = "not on this deployment" if not applies(spec) else "not drawable here: lacks what it needs"
            rule_rows.append({"name": rule, "status": NOT_APPLICABLE, "why": why})
            continue
        drawn = stats.drawn[rule]
        rule_rows.append(
            {
                "name": rule,
                "enabled": stats.enabled[rule],
                "drawn": drawn,
                "examples": stats.drawn_examples[rule],
                "ms_per_draw": round(1000 * stats.rule_seconds[rule] / drawn, 1) if drawn else None,
                "status": REACHED if stats.enabled[rule] and drawn else NEVER,
            }
        )
    never = [row["name"] for row in (*goal_rows, *rule_rows) if row["status"] == NEVER]
    return {"examples": stats.examples, "goals": goal_rows, "rules": rule_rows, "never": never}


def family_lines(stats: SearchStats, family_of: Mapping[str, str]) -> list[str]:
    """The drawn steps split by family (in `family_of`'s order of first appearance): each family's steps, share
    of all drawn steps and milliseconds per step."""
    steps: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for rule, family in family_of.items():
        steps[family] = steps.get(family, 0) + stats.drawn[rule]
        seconds[family] = seconds.get(family, 0.0) + stats.rule_seconds[rule]
    total = sum(steps.values())
    rows = [
        Row(
            family,
            (
                str(count),
                f"{100 * count / total:.0f}%" if total else "-",
                f"{1000 * seconds[family] / count:.0f}" if count else "-",
            ),
        )
        for family, count in steps.items()
    ]
    return aligned(("family", "steps", "share", "ms/step"), rows)
