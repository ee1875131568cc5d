"""Families of rules: what the search draws first.

A step is drawn in two levels (`ckpt_model.steps.draw`): first a family, by its weight among the families that have a
rule enabled now, then one of that family's enabled rules and its arguments. So a family's share of the steps does not
depend on how many rules it has, and a family with many rules (the crashes) no longer crowds out one with few (a
lost reply). The protocol's own operations are four families, declared here, whose weights add up to more than
half; each fault family is declared in its own module of `ckpt_model.trainer.nemeses`, with its rules.

Each rule names its family where it is declared (`steplog.action(..., family=...)`); the weights below are the
defaults, chosen by measurement (docs/how-it-works.md, "The draw") and changed with `ckpt-model check --weights`.
Each family also declares its coverage goals, the situations its rules must reach (`ckpt_model.steps.goals`); a
machine's goals are collected from the families of its rules (`steplog.coverage`). The protocol's own situations
are reached by a commit or a restore, whatever came before (a restore after a failed one), so they are the goals of
the checkpoint and restore families.
"""

from __future__ import annotations

import attrs

from ckpt_model.steps.goals import CHECKPOINT_GOALS, RESTORE_GOALS, Goal


@attrs.frozen
class Family:
    """A family of rules: its name, what it does in words, its default weight in the draw, and the coverage goals
    its rules must reach, in report order."""

    name: str
    says: str
    weight: int
    protocol: bool = False  # the protocol's own operations, not a fault
    goals: tuple[Goal, ...] = attrs.field(default=(), repr=False)


ROLLOUTS = Family("rollouts", "rollouts start, start over, continue, retire and are forgotten", 20, protocol=True)
CALLS = Family("calls", "a waiting model (or judge) call returns", 15, protocol=True)
CHECKPOINTS = Family("checkpoints", "prepare, commit and resume", 15, protocol=True, goals=CHECKPOINT_GOALS)
RESTORES = Family(
    "restores", "a committed checkpoint restored into fresh processes", 10, protocol=True, goals=RESTORE_GOALS
)
