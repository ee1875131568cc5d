"""Swarm testing (Groce et al., ISSTA 2012): each example leaves out a random subset of the rules and of the
optional mechanisms the rules draw, so some examples go deep into a few rules instead of spreading every example
over all of them.

The subset is drawn from the example's own data (the swarm machine's `@initialize` rule: `machine.machine_for(...,
swarm=True)`, the collection machine's `collection_machine_for(..., swarm=True)`), so it shrinks and replays with
the example; every flag shrinks to "kept", so a shrunk example leaves out as little as it can. A rule left out is
refused by its precondition (`steplog.action`); a mechanism left out is its argument forced to False before the
step runs and is recorded (`steplog.step`), so a regression file replays what ran. Composite rules, the teardown
drain, fixed scenarios and replays call rules directly and never ask the swarm.

Hypothesis already switches rules off per example by itself (its feature flags, drawn lazily as each rule is
first enabled, with a per-example rate, `dispatch` included); this swarm comes on top: drawn up front, never
leaving out the rules every situation starts from (`ALWAYS_KEPT`), and reaching the mechanisms inside rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st

# The trainer machine's rules no example leaves out: every situation starts with a rollout and most need its calls
# released.
ALWAYS_KEPT = frozenset({"dispatch", "dispatch_restart", "release"})
# Each feature is left out with probability 1 / LEAVE_OUT_ONE_IN (a draw of 0 keeps it, so it shrinks to kept).
LEAVE_OUT_ONE_IN = 2


@attrs.frozen
class Swarm:
    """The rules and mechanisms one example leaves out; the empty swarm leaves out nothing."""

    rules_out: frozenset[str] = frozenset()
    mechanisms_out: frozenset[tuple[str, str]] = frozenset()

    def allows(self, rule: str) -> bool:
        return rule not in self.rules_out

    def constrain(self, rule: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The drawn arguments of `rule` with every mechanism left out switched off."""
        return {name: False if (rule, name) in self.mechanisms_out else value for name, value in arguments.items()}

    def describe(self) -> str:
        left_out = sorted(self.rules_out) + [f"{rule}({argument})" for rule, argument in sorted(self.mechanisms_out)]
        return "swarm leaves out " + (", ".join(left_out) if left_out else "nothing")


EVERYTHING = Swarm()


def left_out() -> st.SearchStrategy[bool]:
    """One feature's flag: True (left out) with probability 1 / LEAVE_OUT_ONE_IN, shrinking to False (kept)."""
    return st.integers(min_value=0, max_value=LEAVE_OUT_ONE_IN - 1).map(lambda draw: draw == LEAVE_OUT_ONE_IN - 1)


def swarms(
    rules: Sequence[str], mechanisms: Sequence[tuple[str, str]], kept: frozenset[str] = ALWAYS_KEPT
) -> st.SearchStrategy[Swarm]:
    """Swarms over `rules` and `mechanisms` (the machine's: the optional mechanisms its rules draw, as (rule, its
    boolean argument), `steplog.mechanisms_of`): each optional one left out independently, never one of the rules
    `kept` (those every situation of the machine starts from)."""
    optional = sorted(set(rules) - kept)
    features = len(optional) + len(mechanisms)

    def build(flags: list[bool]) -> Swarm:
        rules_out = frozenset(rule for rule, out in zip(optional, flags, strict=False) if out)
        mechanisms_out = frozenset(m for m, out in zip(mechanisms, flags[len(optional) :], strict=True) if out)
        return Swarm(rules_out, mechanisms_out)

    return st.lists(left_out(), min_size=features, max_size=features).map(build)
