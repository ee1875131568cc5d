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
never by a topology's name. `table` is the short report every run ends with (`ckpt-model check`, the nightly).
"""

from __future__ import annotations

import re
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
class Coverage:
    """What a machine's search must reach (`steplog.coverage`): its families' goals, in report order, and each of
    its rules with the deployments it applies to."""

    goals: tuple[Goal, ...]
    rules: Scopes


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


def table(
    stats: SearchStats,
    spec: DeploymentSpec,
    coverage: Coverage,
    undrawable: Collection[str] = (),
    family_of: Mapping[str, str] | None = None,
) -> str:
    """How often each goal and each rule of `coverage` was reached: goals by steps and examples, rules by the
    examples that enabled them and the times and examples they were drawn; NEVER marks an applicable one never
    reached, `n/a` one the deployment cannot reach: by its spec, or (`undrawable`, `checkable.undrawable_rules`)
    because it lacks what the rule needs, which the run's summary lists with why. With `family_of` (each rule's
    family, by name) it first splits the drawn steps by family."""
    lines = [f"coverage over {stats.examples} examples ({spec.label}):"]
    if family_of is not None:
        lines += family_lines(stats, family_of)
    lines.append(f"  {'goal':<40} {'steps':>6} {'examples':>8}")
    for goal in coverage.goals:
        note = "" if not goal.applies(spec) or stats.goals[goal.name] else "  NEVER"
        counts = f"{stats.goals[goal.name]:>6} {stats.goal_examples[goal.name]:>8}" if goal.applies(spec) else "n/a"
        lines.append(f"  {goal.says:<40} {counts}{note}")
    lines.append(f"  {'rule':<40} {'enabled':>7} {'drawn':>6} {'examples':>8} {'ms/draw':>8}")
    for rule, applies in coverage.rules.items():
        if not applies(spec):
            lines.append(f"  {rule:<40} n/a")
            continue
        if rule in undrawable:
            lines.append(f"  {rule:<40} n/a (not drawable here: listed below)")
            continue
        note = "" if stats.enabled[rule] and stats.drawn[rule] else "  NEVER"
        counts = f"{stats.enabled[rule]:>7} {stats.drawn[rule]:>6} {stats.drawn_examples[rule]:>8}"
        if stats.drawn[rule]:
            counts += f" {1000 * stats.rule_seconds[rule] / stats.drawn[rule]:>8.0f}"
        lines.append(f"  {rule:<40} {counts}{note}")
    return "\n".join(lines)


# A coverage row's status: reached, applicable and never reached, or not applicable to the deployment.
REACHED, NEVER, NOT_APPLICABLE = "reached", "NEVER", "n/a"


def document(
    stats: SearchStats, spec: DeploymentSpec, coverage: Coverage, undrawable: Collection[str] = ()
) -> dict[str, Any]:
    """The coverage table as data (`check --json`'s `coverage`): each goal with its steps, examples and status, each
    rule with the examples that enabled it, its draws, the examples that drew it, its milliseconds per draw and
    status (NEVER: applicable and never reached; n/a with why: the spec, or `undrawable` here), and `never`, every
    NEVER by name."""
    goal_rows: list[dict[str, Any]] = []
    for goal in coverage.goals:
        row: dict[str, Any] = {"name": goal.name, "says": goal.says}
        if goal.applies(spec):
            row |= {"steps": stats.goals[goal.name], "examples": stats.goal_examples[goal.name]}
            row["status"] = REACHED if stats.goals[goal.name] else NEVER
        else:
            row |= {"status": NOT_APPLICABLE, "why": "not on this deployment"}
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
    lines = [f"  {'family':<40} {'steps':>6} {'share':>8} {'ms/step':>8}"]
    for family, count in steps.items():
        share = f"{100 * count / total:.0f}%" if total else "-"
        per_step = f"{1000 * seconds[family] / count:.0f}" if count else "-"
        lines.append(f"  {family:<40} {count:>6} {share:>8} {per_step:>8}")
    return lines
