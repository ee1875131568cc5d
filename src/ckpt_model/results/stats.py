"""Search statistics: examples, their steps and crashes, when the first failure came (benchmarks, tests), and
what the examples reached: coverage goals and rules (`ckpt_model.steps.goals`)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import attrs


@attrs.frozen
class ExampleStat:
    """One finished example. `steps` are its model steps: the rules Hypothesis drew (`drawn`, at most the profile's
    `stateful_step_count`), the rules a drawn rule plays inside it (a crash before a restore) and its teardown's
    drain steps; so `steps` can exceed the count asked for, `drawn` never does."""

    steps: int
    crashes: int
    seconds: float
    # Crashes that landed inside an operation (a commit, restore, retire or forget under way).
    crashes_inside: int = 0
    drawn: int = 0


@attrs.frozen
class RoundStat:
    """One round of a search bounded by time (`ckpt_model.search.aim`): when it began (seconds from the search's start),
    the examples before it, its aim in words, and its aim as data (None: the weights' own draw)."""

    started_s: float
    examples_before: int
    says: str
    aim: Mapping[str, Any] | None = None


@attrs.define
class SearchStats:
    """Counts examples, their steps and crashes, times the first failure, counts what they reached, and keeps the
    failures the machine raised (`seen`: Hypothesis's `FlakyStrategyDefinition` does not carry the failure it
    hid, `verdicts.leaves`).

    `goals` and `drawn` count steps, `goal_examples`, `enabled` and `drawn_examples` examples."""

    started_s: float = attrs.field(factory=time.monotonic)
    examples: int = 0
    first_failure_s: float | None = None
    finished: list[ExampleStat] = attrs.field(factory=list)
    seen: list[BaseException] = attrs.field(factory=list)
    goals: Counter[str] = attrs.field(factory=Counter)
    goal_examples: Counter[str] = attrs.field(factory=Counter)
    enabled: Counter[str] = attrs.field(factory=Counter)
    drawn: Counter[str] = attrs.field(factory=Counter)
    drawn_examples: Counter[str] = attrs.field(factory=Counter)
    # Whether the search stopped at its time limit (`--max-time`) rather than after its examples.
    stopped_by_time: bool = False
    # Each rule's seconds over the steps it was drawn (its nested rules, settles and audits included).
    rule_seconds: defaultdict[str, float] = attrs.field(factory=lambda: defaultdict(float))
    # The rounds of a search bounded by time, in order (none for a search of one round).
    rounds: list[RoundStat] = attrs.field(factory=list)
    # Every abstract transition a drawn rule took (state digest, rule, state digest: `ckpt_model.model.abstract`).
    transitions: set[tuple[str, str, str]] = attrs.field(factory=set)

    def example_started(self) -> None:
        self.examples += 1

    def failed(self, error: BaseException) -> None:
        if self.first_failure_s is None:
            self.first_failure_s = time.monotonic() - self.started_s
        kinds = {(type(kept), getattr(kept, "property_id", None)) for kept in self.seen}
        if (type(error), getattr(error, "property_id", None)) not in kinds:  # the first of each kind
            self.seen.append(error)

    def example_finished(
        self, steps: int, crashes: int, seconds: float, crashes_inside: int = 0, drawn: int = 0
    ) -> None:
        self.finished.append(
            ExampleStat(steps=steps, crashes=crashes, seconds=seconds, crashes_inside=crashes_inside, drawn=drawn)
        )

    @property
    def steps(self) -> int:
        """The finished examples' model steps (`ExampleStat.steps`)."""
        return sum(example.steps for example in self.finished)

    @property
    def drawn_steps(self) -> int:
        """The rules Hypothesis drew over the finished examples: the steps `stateful_step_count` bounds."""
        return sum(example.drawn for example in self.finished)

    def goals_reached(self) -> int:
        """How many distinct coverage goals some example reached."""
        return sum(1 for count in self.goals.values() if count)

    def example_covered(
        self,
        goals: Mapping[str, int],
        enabled: Iterable[str],
        drawn: Mapping[str, int],
        seconds: Mapping[str, float] | None = None,
    ) -> None:
        """One example's goals reached and rules drawn (each with its count of steps and its seconds) and rules
        enabled."""
        self.goals.update(goals)
        self.goal_examples.update(name for name, count in goals.items() if count)
        self.enabled.update(set(enabled))
        self.drawn.update(drawn)
        self.drawn_examples.update(name for name, count in drawn.items() if count)
        for name, spent_s in (seconds or {}).items():
            self.rule_seconds[name] += spent_s
