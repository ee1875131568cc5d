"""Aimed tours: examples that walk the model's explored graph to the transitions no example took yet (`check --aim`).

The explorer (`ckpt_model.search.explore`) knows every transition to its depth and the rule call that takes it. An
aimed round hands the draw a `TransitionGuide` built from the transitions the search had not taken when the round
began. Each example draws one of the first of them (shallowest first, taking turns among the depths and, within a
depth, among the rules) as its first target (or none: then it draws at random throughout), walks a
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
from ckpt_model.search.transition_coverage import Explored

Call = tuple[str, Mapping[str, Any]]
# How many transitions a round's examples draw their first target from (`by_turns`' first ones).
FIRST_TARGETS = 64
TransitionKey = tuple[str, str, str]


def untaken(explored: Explored, taken: Iterable[TransitionKey]) -> list[TransitionKey]:
    """The explored transitions not `taken`, shallowest first, taking turns among the rules at each depth (so a
    rule with thousands of transitions left does not crowd out one with a few)."""
    done = set(taken)
    by_depth: dict[int, dict[str, list[TransitionKey]]] = {}
    for key in sorted(explored.transitions, key=lambda key: (key[1], key[0], key[2])):
        if key not in done:
            by_depth.setdefault(explored.transitions[key], {}).setdefault(key[1], []).append(key)
    return [key for depth in sorted(by_depth) for key in taking_turns(list(by_depth[depth].values()))]


def by_turns(ordered: list[TransitionKey], explored: Explored) -> list[TransitionKey]:
    """`ordered` (shallowest first) taking turns among the depths, so a few first targets reach every depth: the
    deepest holds nine tenths of the transitions, and a target drawn among them all would almost always be there."""
    by_depth: dict[int, list[TransitionKey]] = {}
    for key in ordered:
        by_depth.setdefault(explored.transitions[key], []).append(key)
    return taking_turns([by_depth[depth] for depth in sorted(by_depth)])


def taking_turns(queues: list[list[TransitionKey]]) -> list[TransitionKey]:
    """The first of each queue, then the second of each, and so on."""
    turns: list[TransitionKey] = []
    while queues:
        turns += [queue.pop(0) for queue in queues]
        queues = [queue for queue in queues if queue]
    return turns


class TransitionGuide:
    """The explored graph and the transitions a round aims at (see the module); `size` tours to draw from."""

    def __init__(self, explored: Explored, taken: Iterable[TransitionKey]) -> None:
        left = untaken(explored, taken)
        self.left = set(left)
        self.targets = by_turns(left, explored)[:FIRST_TARGETS]
        self.out: dict[str, list[tuple[TransitionKey, Call]]] = {}
        for key in sorted(explored.transitions, key=lambda key: (key[1], key[2])):
            self.out.setdefault(key[0], []).append((key, (key[1], dict(explored.arguments[key]))))

    @property
    def size(self) -> int:
        return len(self.targets)

    def tour(self, index: int) -> Tour:
        """The tour of one example, first to target `index` (`untaken`'s order)."""
        return Tour(self, self.targets[index])

    def first_call_towards(
        self,
        state: str,
        wanted: Callable[[TransitionKey], bool],
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
                for key, call in self.out.get(here, ()):
                    if (here, key[1]) in avoided:
                        continue
                    opening = first[here] or call
                    if wanted(key):
                        found.append(("/".join(key), opening))
                    elif key[2] not in first:
                        first[key[2]] = opening
                        following.append(key[2])
            if found:
                return min(found, key=lambda item: _order(choice, item[0]))[1]
            level = following
        return None


def _order(choice: str, key: str) -> bytes:
    return hashlib.blake2b(f"{choice}|{key}".encode(), digest_size=8).digest()


class Tour:
    """One example's walk: to its first target, then to the nearest transition it has not taken."""

    def __init__(self, guide: TransitionGuide, target: TransitionKey) -> None:
        self.guide = guide
        self.target: TransitionKey | None = target
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
        if target is not None and target not in self.taken:
            call = self.guide.first_call_towards(state, lambda key: key == target, self.avoided)
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

    def _left(self, key: TransitionKey) -> bool:
        return key in self.guide.left and key not in self.taken
