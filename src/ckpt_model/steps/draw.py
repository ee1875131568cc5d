"""The fair draw: each step draws a family first, by its weight, then one of the family's enabled rules.

Hypothesis draws a step uniformly among the rules whose precondition holds, so every rule added dilutes every
other rule's share, and a family of eight crash rules took a quarter of all steps while a lost reply, one rule,
was never drawn. Here a step draws in two levels (`FamilyDraw`): first a family among those with a rule enabled
now, with the probability of its weight among theirs (`ckpt_model.steps.families`; `--weights` changes them), then one
of that family's enabled rules, uniformly, then the rule's arguments as Hypothesis would. A family's share no longer
depends on how many rules it has, and the protocol's own operations, four families weighing more than half, keep
more than half of the steps wherever they can move.

Both levels are Hypothesis draws: the family is an integer below the total weight of the families on offer, which
shrinks to 0, the first of them (the protocol's families come first), and the rule is `sampled_from` them, which
shrinks to the first. Hypothesis's own feature flags still switch rules off per example (its swarm), within a
family only: a family whose every enabled rule they switched off offers those rules all the same, so no family's
share depends on them. The example's swarm (`ckpt_model.steps.swarm`) still asks each rule's precondition. A regression
file replays rule calls, not draws, so it replays whatever the weights.

A draw's simplest value is 0, and Hypothesis's first examples of a run (a tenth of the examples asked for, at most
50) continue a random start with every later draw at its simplest: the first family on offer, its first rule, to
the example's last step (`dispatch`, `retire`, `forget` over and over). In 30 s on `native` the rollouts took 61%
of the steps, 37% without those examples. `ZERO_RUN_REJECTED` family draws of 0 in a row among two families or
more, which a random draw makes about once in 100^8, end such an example as invalid (`hypothesis.reject`; the
teardown still drains and judges it); after five in a row Hypothesis stops making them. Hypothesis's very first
example is all zeros too, and so ends early: where the deployment allows one example only (a real Gym attached
without crashes) nothing is rejected (`rejects_zero_runs`). The shrinker meets the same limit and uses other values
instead (every value below the first family's weight is the first family): of 30 seeds of a test that fails on any
three steps, all 30 shrink to three steps, as without the limit. Making a run of zeros a round-robin instead left 12
of the 30 stuck at 6 to 38 steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.errors import InvalidDefinition
from hypothesis.stateful import RuleBasedStateMachine, RuleStrategy

from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import families_of

Weights = Mapping[str, int]
# Arguments a round fixes instead of drawing them, by rule name (`ckpt_model.search.aim`).
Pins = Mapping[str, Mapping[str, Any]]


class Tour(Protocol):
    """One example's walk to transitions no example took yet (`ckpt_model.search.paths.Tour`)."""

    def next_call(self, model: Any, choice: int = 0) -> tuple[str, Mapping[str, Any]] | None: ...

    def refused(self) -> None: ...


class Guide(Protocol):
    """The tours an aimed round draws from (`ckpt_model.search.paths.TransitionGuide`)."""

    @property
    def size(self) -> int: ...

    def tour(self, index: int) -> Tour: ...


@attrs.frozen
class Focus:
    """What an aimed round (`ckpt_model.search.aim`) favours beyond the weights: `rules`, each drawn before the other
    rules of its family whenever one of them is enabled, and `pins`, arguments fixed instead of drawn; `guide`, the
    tours to transitions of the model no example took yet (`check --aim`): each example draws one of them, or none,
    and walks it while it can."""

    rules: frozenset[str] = frozenset()
    pins: Pins = attrs.field(factory=dict)
    guide: Guide | None = None


# How many ways a tour's step may choose among the nearest transitions left (a drawn number, hashed with each).
TOUR_CHOICES = 1 << 16
# Family draws of 0 in a row (with two families or more on offer) that end an example as invalid (the module's
# docstring says why).
ZERO_RUN_REJECTED = 8


class FamilyDraw(RuleStrategy):
    """Hypothesis's rule strategy for one machine, drawing a family first (`Weights` by family name; a family not
    named keeps its declared weight). A family of weight 0 is drawn only when no other family has a rule enabled,
    so a machine never stops for want of a step."""

    def __init__(
        self,
        machine: RuleBasedStateMachine,
        weights: Weights | None = None,
        rejects_zero_runs: bool = True,
        focus: Focus | None = None,
    ) -> None:
        super().__init__(machine)
        self.focus = focus or Focus()
        family_of = families_of(type(machine))
        self.families = ordered(family_of.values())
        self.weights = {family.name: family.weight for family in self.families} | dict(weights or {})
        self.family_of = {rule: family_of[rule.function.__name__].name for rule in self.rules}
        self.zero_run = 0
        self.rejects_zero_runs = rejects_zero_runs
        self.rejected = False
        # The aimed tour this example walks (drawn at its first step), and whether it was drawn yet.
        self.tour: Tour | None = None
        self.tour_drawn = False

    def do_draw(self, data: Any) -> tuple[Any, dict[str, Any]]:
        valid = [rule for rule in self.rules if self.is_valid(rule)]
        if not valid:
            names = ", ".join(rule.function.__name__ for rule in self.rules)
            raise InvalidDefinition(
                f"No progress can be made from state {self.machine!r}: no rule's precondition holds (rules: {names})"
            )
        followed = self._on_the_tour(data, valid)
        if followed is not None:
            return followed
        on_offer = self.on_offer(valid)
        family = on_offer[0][0] if len(on_offer) == 1 else self._family(data, on_offer)
        rules = next(rules for name, _weight, rules in on_offer if name == family)
        # An aimed round's rules come first within their family; Hypothesis's feature flags switch rules off per
        # example within a family, never the family itself (nor the whole of an aimed round's rules).
        rules = [rule for rule in rules if rule.function.__name__ in self.focus.rules] or rules
        self._feature_flags = data.draw(self.enabled_rules_strategy)
        rules = [rule for rule in rules if self._feature_flags.is_enabled(rule.function.__name__)] or rules
        rule = rules[0] if len(rules) == 1 else data.draw(st.sampled_from(rules))
        pinned = self.focus.pins.get(rule.function.__name__, {})
        arguments = {
            name: pinned[name] if name in pinned else data.draw(strategy)
            for name, strategy in rule.arguments_strategies.items()
        }
        return rule, arguments

    def _on_the_tour(self, data: Any, valid: Sequence[Any]) -> tuple[Any, dict[str, Any]] | None:
        """The next call of the example's aimed tour, while it has one and its rule is enabled. The tour is drawn at
        the first step (an index past the last: none), so a stored example replays the same one."""
        guide = self.focus.guide
        if not self.tour_drawn:
            self.tour_drawn = True
            index = data.draw(st.integers(0, guide.size)) if guide is not None and guide.size else 0
            self.tour = guide.tour(index) if guide is not None and index < guide.size else None
        if self.tour is None:
            return None
        choice = data.draw(st.integers(0, TOUR_CHOICES - 1))
        call = self.tour.next_call(self.machine.model, choice)  # type: ignore[attr-defined]
        if call is None:
            return None
        name, arguments = call
        rule = next((rule for rule in valid if rule.function.__name__ == name), None)
        if rule is None:  # the machine would not play it here: draw as any example does
            self.tour.refused()
            return None
        return rule, dict(arguments)

    def on_offer(self, valid: Sequence[Any]) -> list[tuple[str, int, list[Any]]]:
        """The families with a `valid` rule (its precondition holds), in draw order, each with its weight and those
        rules; the families of weight 0 only when no other is on offer."""
        by_family: dict[str, list[Any]] = {}
        for rule in valid:
            by_family.setdefault(self.family_of[rule], []).append(rule)
        offered = [(f.name, self.weights[f.name], by_family[f.name]) for f in self.families if f.name in by_family]
        weighed = [entry for entry in offered if entry[1] > 0]
        return weighed or [(name, 1, rules) for name, _weight, rules in offered]

    def _family(self, data: Any, on_offer: Sequence[tuple[str, int, list[Any]]]) -> str:
        """One family of `on_offer`, each with the probability of its weight among theirs."""
        drawn = data.draw(st.integers(0, sum(weight for _name, weight, _rules in on_offer) - 1))
        self.zero_run = self.zero_run + 1 if drawn == 0 else 0
        if self.rejects_zero_runs and self.zero_run >= ZERO_RUN_REJECTED:
            self.rejected = True
            reject()  # Hypothesis's simplest continuation, not a draw: see the module's docstring
        for name, weight, _rules in on_offer:
            if drawn < weight:
                return name
            drawn -= weight
        raise AssertionError("a draw below the total weight falls in some family")


def ordered(families: Iterable[Family]) -> list[Family]:
    """The distinct families, the protocol's first, each group by weight (heaviest first), then by name."""
    return sorted(set(families), key=lambda family: (not family.protocol, -family.weight, family.name))


def weights_of(machine_type: type, changed: Weights | None = None) -> dict[str, int]:
    """Every family of `machine_type`'s rules with its weight in the draw (its declared one unless `changed`
    names it), in draw order."""
    families = ordered(families_of(machine_type).values())
    return {family.name: family.weight for family in families} | dict(changed or {})


def family_by_rule(machine_type: type) -> dict[str, str]:
    """Each rule of `machine_type` and its family's name, the rules grouped by family in draw order."""
    family_of = families_of(machine_type)
    order = {family.name: index for index, family in enumerate(ordered(family_of.values()))}
    by_rule = {rule: family.name for rule, family in family_of.items()}
    return dict(sorted(by_rule.items(), key=lambda item: (order[item[1]], item[0])))


def describe(weights: Mapping[str, int]) -> str:
    """The banner's words for the draw."""
    return "a family by weight, then one of its rules: " + ", ".join(f"{n} {w}" for n, w in weights.items())


def install(
    machine: RuleBasedStateMachine,
    weights: Weights | None = None,
    rejects_zero_runs: bool = True,
    focus: Focus | None = None,
) -> None:
    """Make `machine` draw its steps family first (as an aimed round's `focus` says, if given:
    `ckpt_model.search.aim`). Hypothesis reads a machine's rule strategy from the attribute
    its constructor sets (`_rules_strategy`, Hypothesis 6.100 on); `tests/unit/checker/test_draw.py` fails at once
    should that change."""
    machine._rules_strategy = FamilyDraw(machine, weights, rejects_zero_runs, focus)


def parse_weights(text: str, families: Iterable[Family]) -> dict[str, int]:
    """`--weights crashes=2,pauses=0`: each named family's weight, a whole number from 0; any other name is an
    error that lists the families."""
    known = {family.name for family in families}
    weights: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, separator, value = item.partition("=")
        name = name.strip()
        if not separator or name not in known:
            raise ValueError(f"{item!r}: expected FAMILY=WEIGHT with FAMILY one of {', '.join(sorted(known))}")
        try:
            weight = int(value)
        except ValueError:
            raise ValueError(f"{item!r}: the weight must be a whole number from 0") from None
        if weight < 0:
            raise ValueError(f"{item!r}: the weight must be a whole number from 0")
        weights[name] = weight
    return weights
