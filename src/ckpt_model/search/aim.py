"""Aimed rounds: a search bounded by time spends its later part on what its earlier part left unreached.

A rule whose goals hang on one argument (`stalled_write` retried or given up) is drawn a few times a run, and
Hypothesis's generation copies a step's choices within and between examples: in 120 s on `native` with seed 1,
`stalled_write` was drawn 14 times with five distinct arguments, none of them `then_retry=True`, so "a stalled
write retried" stayed unreached in three runs of three. The family draw cannot adapt within a Hypothesis run: a
step must be a function of the example's own choices, or a stored example replays other rules and Hypothesis's
replay of a failure is flaky (docs/how-it-works.md, "Aiming").

So a search bounded by time alone (`--max-time` without `--examples`) runs in rounds (`round_deadlines`), each one
Hypothesis run with a draw fixed for its whole length. The first takes half the time and draws as the weights say.
Each later one takes half of what is left (the last all of it, once half would be under `SHORTEST_ROUND_S`), and is
aimed by what the rounds before it left (`aim_at`): the family of every goal and rule not yet reached weighs `BOOST`
times its weight; within its family, a rule left (or the rule a goal left names, `Goal.rule`) is drawn before the
family's other rules whenever it is enabled; and where the goals left of one rule all need the same value of an
argument (`Goal.pins`, as `then_retry=True`), the round fixes that argument (`draw.Focus`). A round with nothing
left to aim at draws as the first did, from a new seed (`round_seed`). A failure found in any round is measured and
minimised through its rule calls, as any other, and its regression file replays it whatever the round's draw. A
search bounded by examples is one round: `--seed S --examples N` runs the examples it always ran.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps.draw import Focus, Pins
from ckpt_model.steps.goals import Coverage, Goal, left

# How many times its weight a family weighs in a round aimed at one of its goals or rules.
BOOST = 4
# A round after the first takes half the time left, unless that is shorter than this: then it takes all of it.
SHORTEST_ROUND_S = 30.0


@attrs.frozen
class Aim:
    """What one round favours: the goals and rules left unreached when it began, their families (`favoured`),
    the families' weights in its draw, and its `focus`: the rules it draws first within their families (the rules
    left, and the rule of each goal left that names one) and the arguments it fixes."""

    goals: tuple[str, ...]
    rules: tuple[str, ...]
    favoured: tuple[str, ...]
    weights: Mapping[str, int]
    focus: Focus

    def words(self) -> str:
        """The progress line's words for the round."""
        left = [*self.goals, *(f"rule {rule}" for rule in self.rules)]
        pins = self.focus.pins
        pinned = [f"{rule}({', '.join(f'{k}={v}' for k, v in args.items())})" for rule, args in pins.items()]
        favoured = ", ".join(f"{family} x{BOOST}" for family in self.favoured)
        return (
            f"aimed at {len(left)} left ({', '.join(left)}): {favoured}; first {', '.join(sorted(self.focus.rules))}"
            + (f"; fixed {', '.join(pinned)}" if pinned else "")
        )

    def document(self) -> dict[str, Any]:
        return {
            "goals": list(self.goals),
            "rules": list(self.rules),
            "favoured": list(self.favoured),
            "weights": dict(self.weights),
            "first": sorted(self.focus.rules),
            "pins": {rule: dict(args) for rule, args in self.focus.pins.items()},
        }


def aim_at(
    stats: SearchStats,
    spec: DeploymentSpec,
    coverage: Coverage,
    rule_family: Mapping[str, str],
    goal_family: Mapping[str, str],
    weights: Mapping[str, int],
    drawable: Sequence[str] | None = None,
) -> Aim | None:
    """The aim of a round after `stats`: None when every goal and rule of `coverage` that applies to `spec` (and,
    for rules, is in `drawable`, when given) was reached. A family the user weighed 0 stays at 0."""
    goals_left, rules_left = left(stats, spec, coverage)
    rules_left = [rule for rule in rules_left if drawable is None or rule in drawable]
    if not goals_left and not rules_left:
        return None
    families = [goal_family[goal.name] for goal in goals_left] + [rule_family[rule] for rule in rules_left]
    favoured = list(dict.fromkeys(families))
    return Aim(
        goals=tuple(goal.name for goal in goals_left),
        rules=tuple(rules_left),
        favoured=tuple(favoured),
        weights={name: weight * BOOST if name in favoured else weight for name, weight in weights.items()},
        focus=Focus(
            rules=frozenset([goal.rule for goal in goals_left if goal.rule is not None] + rules_left),
            pins=pins_for(goals_left),
        ),
    )


def pins_for(goals_left: Sequence[Goal]) -> Pins:
    """The arguments to fix for `goals_left`: of each rule, every argument its goals left all need the same value
    of (goals that need both values of an argument fix nothing)."""
    wanted: dict[str, dict[str, set[Any]]] = {}
    for goal in goals_left:
        if goal.rule is not None:
            for argument, value in goal.pins:
                wanted.setdefault(goal.rule, {}).setdefault(argument, set()).add(value)
    pins = {
        rule: {argument: next(iter(values)) for argument, values in arguments.items() if len(values) == 1}
        for rule, arguments in wanted.items()
    }
    return {rule: arguments for rule, arguments in pins.items() if arguments}


def round_deadlines(total_s: float, shortest_s: float = SHORTEST_ROUND_S) -> list[float]:
    """When each round ends, in seconds from the search's start: half of `total_s`, then half of what is left
    while that half is at least `shortest_s`, then `total_s` (one round when half of it is shorter)."""
    deadlines: list[float] = []
    start = 0.0
    while (total_s - start) / 2 >= shortest_s:
        start += (total_s - start) / 2
        deadlines.append(start)
    return [*deadlines, total_s]


def round_seed(seed: int | None, index: int) -> int | None:
    """The seed of round `index` (from 0): the search's own for the first, so a search bounded by time starts with
    the examples it always drew; for each later one a seed derived from it (from the round alone for a derandomized
    search), so a rerun with the same seed draws the same rounds."""
    if index == 0:
        return seed
    text = f"{'derandomized' if seed is None else seed}/round {index}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
