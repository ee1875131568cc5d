"""Bounded-exhaustive exploration of the contract model: every abstract state the rules reach within a depth.

Breadth first from a fresh example's model, each state's enabled rules (the machine's own preconditions, asked of a
`stand_in` with the deployment's capabilities) take each of their model transitions (`ckpt_model.trainer.moves`),
and each state reached is counted once by its abstract form (`ckpt_model.model.abstract`: bookkeeping dropped,
names renamed by order of appearance). Every new state is held to the model's invariants
(`ckpt_model.model.invariants`), the drain's clean end among them; breadth first, the first violation of each
invariant found comes with a shortest path to it, as the rule calls that reach it (each one a step a regression
file could replay).

A transition is (abstract state, rule, abstract state): several argument values that lead to the same state are one
transition. `transitions` holds every one leaving a state within depth - 1, that is every transition a run of at
most `depth` steps can take; a run's transition coverage is the share of these it exercised (`coverage`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ckpt_model.model.abstract import EXPLORED_ROLLOUTS, abstract, digest
from ckpt_model.model.contract import Model, Tried
from ckpt_model.model.invariants import INVARIANTS, Invariant
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.steps.steplog import Gate, families_of, gates
from ckpt_model.trainer.machine import CheckpointMachine
from ckpt_model.trainer.moves import MOVES, Move
from ckpt_model.trainer.stand_in import stand_in


@attrs.frozen
class Call:
    """One rule call of a path: the rule and its arguments."""

    rule: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)

    def words(self) -> str:
        return f"{self.rule}({', '.join(f'{name}={value!r}' for name, value in self.arguments.items())})"


@attrs.frozen
class Transition:
    """From one abstract state (by digest), by one rule, to another."""

    source: str
    rule: str
    target: str


@attrs.frozen
class Level:
    """What one depth added: the states first reached there, the transitions leaving the depth before it."""

    depth: int
    states: int
    transitions: int
    seconds: float


@attrs.frozen
class Violation:
    """An invariant a reachable state breaks, what it found, and a shortest path of rule calls to that state."""

    invariant: str
    problems: tuple[str, ...]
    path: tuple[Call, ...]

    def words(self) -> str:
        steps = "\n".join(f"  {index}. {call.words()}" for index, call in enumerate(self.path, start=1))
        return f"{self.invariant}: {'; '.join(self.problems)}\n  shortest path ({len(self.path)} steps):\n{steps}"


@attrs.define
class Exploration:
    """The explored states and transitions to `depth`, level by level, and what broke an invariant."""

    label: str
    depth: int
    levels: list[Level] = attrs.Factory(list)
    # Abstract state digest -> the state it was reached from and the call (None for the start).
    parents: dict[str, tuple[str, Call] | None] = attrs.Factory(dict)
    # Abstract state digest -> the depth it was first reached at (the start: 0).
    depths: dict[str, int] = attrs.Factory(dict)
    transitions: set[Transition] = attrs.Factory(set)
    # Each transition and the first rule call that took it (its arguments: what a path replays).
    calls: dict[Transition, Call] = attrs.Factory(dict)
    violations: list[Violation] = attrs.Factory(list)
    invariants: tuple[str, ...] = ()
    rules_without_a_move: tuple[str, ...] = ()
    # Whether the depth limit cut the exploration short (states at the last depth had successors unexplored).
    bounded: bool = True
    # Whether the time limit stopped it before the depth was reached.
    timed_out: bool = False

    @property
    def states(self) -> int:
        return len(self.parents)

    @property
    def seconds(self) -> float:
        return sum(level.seconds for level in self.levels)

    def path_to(self, state: str) -> tuple[Call, ...]:
        """The rule calls of a shortest path from the start to `state`."""
        calls: list[Call] = []
        parent = self.parents[state]
        while parent is not None:
            state, call = parent
            calls.append(call)
            parent = self.parents[state]
        return tuple(reversed(calls))

    def path_of(self, transition: Transition) -> tuple[Call, ...]:
        """The rule calls of a shortest path that ends by taking `transition`."""
        return (*self.path_to(transition.source), self.calls[transition])

    def by_rule(self) -> dict[str, int]:
        """How many explored transitions each rule takes."""
        counts: dict[str, int] = {}
        for transition in self.transitions:
            counts[transition.rule] = counts.get(transition.rule, 0) + 1
        return dict(sorted(counts.items()))


def start_model(spec: DeploymentSpec, rollouts_max: int = EXPLORED_ROLLOUTS) -> Model:
    return Model(topology=spec.topology, verify_mode=spec.verify_mode, rollouts_max=rollouts_max)  # type: ignore[arg-type]


def explore(
    spec: DeploymentSpec,
    depth: int,
    *,
    capabilities: Capabilities | None = None,
    rollouts_max: int = EXPLORED_ROLLOUTS,
    moves: Mapping[str, Move] = MOVES,
    invariants: Mapping[str, Invariant] = INVARIANTS,
    time_limit_s: float | None = None,
    on_level: Callable[[Level], None] | None = None,
) -> Exploration:
    """Explore the model of `spec`'s deployment (the look-alike stack's capabilities unless `capabilities` are
    given) breadth first to `depth` rule steps."""
    capabilities = capabilities or Capabilities.of_look_alike(spec)
    rule_gates = gates(CheckpointMachine)
    enabled_rules = _enabled_rules(rule_gates, moves)
    start = start_model(spec, rollouts_max)
    found = Exploration(
        label=spec.label,
        depth=depth,
        invariants=tuple(invariants),
        rules_without_a_move=tuple(sorted(set(rule_gates) - set(moves))),
    )
    start_digest = digest(abstract(start))
    found.parents[start_digest] = None
    found.depths[start_digest] = 0
    broken: set[str] = set()
    _check(found, start, start_digest, invariants, broken)
    frontier = [(start_digest, start)]
    began = time.monotonic()
    for level in range(1, depth + 1):
        level_began = time.monotonic()
        following: list[tuple[str, Model]] = []
        transitions_before = len(found.transitions)
        for source, model in frontier:
            if time_limit_s is not None and time.monotonic() - began > time_limit_s:
                found.timed_out = True
                break
            machine = stand_in(capabilities, model, spec.server_workers)
            for rule in enabled_rules(machine):
                for arguments, moved in moves[rule](machine):
                    successor = attrs.evolve(moved, tried=Tried())
                    state = abstract(successor)
                    target = digest(state)
                    transition = Transition(source, rule, target)
                    if transition not in found.transitions:
                        found.transitions.add(transition)
                        found.calls[transition] = Call(rule, arguments)
                    if target in found.parents:
                        continue
                    found.parents[target] = (source, Call(rule, arguments))
                    found.depths[target] = level
                    _check(found, successor, target, invariants, broken)
                    following.append((target, successor))
        done = Level(level, len(following), len(found.transitions) - transitions_before, time.monotonic() - level_began)
        found.levels.append(done)
        if on_level is not None:
            on_level(done)
        frontier = following
        if found.timed_out or not frontier:
            found.bounded = bool(frontier) and not found.timed_out
            break
    return found


def _enabled_rules(rule_gates: Mapping[str, Gate], moves: Mapping[str, Move]) -> Callable[[Any], list[str]]:
    """The rules enabled on a stand-in machine that have a move (a rule without one is listed, never explored)."""
    explored = [(rule, gate) for rule, gate in rule_gates.items() if rule in moves]

    def enabled(machine: Any) -> list[str]:
        return [rule for rule, gate in explored if gate(machine)]

    return enabled


def _check(found: Exploration, model: Model, state: str, invariants: Mapping[str, Invariant], broken: set[str]) -> None:
    """Hold a new state to every invariant; the first state breaking each one is kept with its path."""
    for name, invariant in invariants.items():
        if name in broken:
            continue
        problems = invariant(model)
        if problems:
            broken.add(name)
            found.violations.append(Violation(name, tuple(problems), found.path_to(state)))


def families(rules: Iterable[str]) -> dict[str, str]:
    """Each rule's family name (how coverage groups the transitions left)."""
    family_of = families_of(CheckpointMachine)
    return {rule: family_of[rule].name for rule in rules}
