"""Aimed tours: examples that walk the model's explored graph to the transitions no example took yet (`check --aim`).

The explorer (`ckpt_model.search.explore`) knows every transition to its depth and the rule call that takes it. An
aimed round hands the draw a `TransitionGuide` built from the transitions the search had not taken when the round
began. Each example draws one of them as its first target (or none: then it draws at random throughout), walks a
shortest path of rule calls to it, then on to one of the nearest transitions it has not taken yet (a number it
draws picks which), and so on; where none is within reach (a state deeper than the exploration) it draws at random
as any example does. The first target and every choice are drawn, and the rest is a function of the model's state
and the round's fixed set, so a stored example replays the same tour. Where the real system goes another way than
the model's path (a killed worker held other attempts), the next step starts from where it went; where the machine
would not play the next call (the once-per-example limits the explorer lifts, `Tried`), the example draws at random
for that step and the tour avoids that rule there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from ckpt_model.model.abstract import state_digest
from ckpt_model.search.explore import Exploration, Transition

# The depth the tours' graph is explored to (a few seconds at most on 2 cores).
AIM_DEPTH = 5
Call = tuple[str, Mapping[str, Any]]
TransitionKey = tuple[str, str, str]


def untaken(found: Exploration, taken: Iterable[TransitionKey]) -> list[Transition]:
    """The explored transitions not `taken`, shallowest first, taking turns among the rules at each depth (so a
    rule with thousands of transitions left does not crowd out one with a few)."""
    done = set(taken)
    by_depth: dict[int, dict[str, list[Transition]]] = {}
    for transition in sorted(found.transitions, key=lambda t: (t.rule, t.source, t.target)):
        if (transition.source, transition.rule, transition.target) in done:
            continue
        by_depth.setdefault(found.depths[transition.source] + 1, {}).setdefault(transition.rule, []).append(transition)
    ordered: list[Transition] = []
    for depth in sorted(by_depth):
        queues = list(by_depth[depth].values())
        while queues:
            ordered += [queue.pop(0) for queue in queues]
            queues = [queue for queue in queues if queue]
    return ordered


class TransitionGuide:
    """The explored graph and the transitions a round aims at (see the module); `size` tours to draw from."""

    def __init__(self, found: Exploration, taken: Iterable[TransitionKey]) -> None:
        self.targets = untaken(found, taken)
        self.left = {(t.source, t.rule, t.target) for t in self.targets}
        self.out: dict[str, list[tuple[Transition, Call]]] = {}
        for transition in sorted(found.transitions, key=lambda t: (t.rule, t.target)):
            call = found.calls[transition]
            self.out.setdefault(transition.source, []).append((transition, (call.rule, dict(call.arguments))))

    @property
    def size(self) -> int:
        return len(self.targets)

    def tour(self, index: int) -> Tour:
        """The tour of one example, first to target `index` (`untaken`'s order)."""
        return Tour(self, self.targets[index])

    def first_call_towards(
        self,
        state: str,
        wanted: Callable[[Transition], bool],
        avoided: AbstractSet[tuple[str, str]] = frozenset(),
        choice: str = "",
    ) -> Call | None:
        """The first rule call of a shortest path from `state` that ends in a transition `wanted` and takes no rule
        `avoided` where it is (None if none is within the explored graph). Of the wanted transitions nearest,
        `choice` picks one (a digest of it and each candidate orders them), so tours that meet in one state go on
        to different transitions."""
        first: dict[str, Call | None] = {state: None}
        level = [state]
        while level:
            found: list[tuple[str, Call]] = []
            following: list[str] = []
            for here in level:
                for transition, call in self.out.get(here, ()):
                    if (here, transition.rule) in avoided:
                        continue
                    opening = first[here] or call
                    if wanted(transition):
                        found.append((f"{transition.source}/{transition.rule}/{transition.target}", opening))
                    elif transition.target not in first:
                        first[transition.target] = opening
                        following.append(transition.target)
            if found:
                return min(found, key=lambda item: _order(choice, item[0]))[1]
            level = following
        return None


def _order(choice: str, key: str) -> bytes:
    return hashlib.blake2b(f"{choice}|{key}".encode(), digest_size=8).digest()


class Tour:
    """One example's walk: to its first target, then to the nearest transition it has not taken."""

    def __init__(self, guide: TransitionGuide, target: Transition) -> None:
        self.guide = guide
        self.target: Transition | None = target
        self.taken: set[TransitionKey] = set()
        self.avoided: set[tuple[str, str]] = set()
        self.last: tuple[str, str] | None = None  # the state and rule of the call it last made

    def next_call(self, model: Any, choice: int = 0) -> Call | None:
        """The next rule call of the tour from the model's state (None: draw at random); `choice`, a number the
        example drew, picks among the nearest transitions left."""
        state = state_digest(model)
        if self.last is not None:
            self.taken.add((*self.last, state))
            self.last = None
        call = None
        target = self.target
        if target is not None and (target.source, target.rule, target.target) not in self.taken:
            call = self.guide.first_call_towards(state, lambda t: t == target, self.avoided)
        if call is None:
            self.target = None
            call = self.guide.first_call_towards(state, self._left, self.avoided, str(choice))
        if call is not None:
            self.last = (state, call[0])
        return call

    def refused(self) -> None:
        """The machine would not play the call just made where it is: the tour avoids that rule there."""
        if self.last is not None:
            self.avoided.add(self.last)
            self.target = None
            self.last = None

    def _left(self, transition: Transition) -> bool:
        key = (transition.source, transition.rule, transition.target)
        return key in self.guide.left and key not in self.taken
