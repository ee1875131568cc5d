"""The fair draw (`ckpt_model.steps.draw`) on a tiny machine of hand-built families: a family's share follows its
weight, not its number of rules; a weight of 0 keeps a family out unless nothing else can move; shrinking ends in the
first family; the weights parse or fail with the families named."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ckpt_model.model.contract import Model
from ckpt_model.protocol.history import History
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps import draw
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import StepLog, action

PROTOCOL = Family("protocol", "one rule", 3, protocol=True)
MANY = Family("many", "six rules", 1)
NEVER_ENABLED = Family("never", "a rule never enabled", 50)
STEPS = 40
RUNS = settings(
    max_examples=60,
    stateful_step_count=STEPS,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.generate,),
    suppress_health_check=list(HealthCheck),
)


class Families(RuleBasedStateMachine):
    """One protocol rule of weight 3 against six fault rules sharing a family of weight 1."""

    stats = SearchStats()
    weights: dict[str, int] = {}
    focus = draw.Focus()

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(topology="native")
        self.log = StepLog(harness=None, history=History(), stats=self.stats)  # type: ignore[arg-type]
        draw.install(self, self.weights, focus=self.focus)

    @action(lambda self: True, family=PROTOCOL)
    def step(self) -> None:
        self.log.labels.append("step()")

    @action(lambda self: True, family=MANY)
    def fault_a(self) -> None:
        self.log.labels.append("fault_a()")

    @action(lambda self: True, family=MANY)
    def fault_b(self) -> None:
        self.log.labels.append("fault_b()")

    @action(lambda self: True, family=MANY)
    def fault_c(self) -> None:
        self.log.labels.append("fault_c()")

    @action(lambda self: True, family=MANY)
    def fault_d(self) -> None:
        self.log.labels.append("fault_d()")

    @action(lambda self: True, family=MANY, pick=st.integers(0, 3))
    def fault_e(self, pick: int) -> None:
        self.log.labels.append(f"fault_e({pick})")

    @action(lambda self: True, family=MANY)
    def fault_f(self) -> None:
        self.log.labels.append("fault_f()")

    @action(lambda self: False, family=NEVER_ENABLED)
    def unreachable(self) -> None:
        raise AssertionError("a rule whose precondition never holds was drawn")

    def teardown(self) -> None:
        self.log.finished(crashes=0, crashes_inside=0)


def drawn_by(weights: dict[str, int]) -> Counter[str]:
    Families.stats, Families.weights = SearchStats(), weights
    run_state_machine_as_test(Families, settings=RUNS)
    return Families.stats.drawn


class Labelled(Families):
    """Keeps every label its examples made."""

    labels: list[str] = []

    def teardown(self) -> None:
        Labelled.labels += self.log.labels
        super().teardown()


def test_a_pinned_argument_is_fixed_and_a_focused_rule_drawn_first_in_its_family() -> None:
    """An aimed round (`ckpt_model.search.aim`) fixes `fault_e`'s `pick` and draws `fault_b` first among the family's
    rules: every `fault_e` step has the pick, the family's steps are all `fault_b`'s (it is always enabled), and the
    families still share the steps by weight."""
    Labelled.stats, Labelled.weights, Labelled.labels = SearchStats(), {}, []
    Labelled.focus = draw.Focus(pins={"fault_e": {"pick": 2}})
    run_state_machine_as_test(Labelled, settings=RUNS)
    picks = Counter(label for label in Labelled.labels if label.startswith("fault_e("))
    assert set(picks) == {"fault_e(2)"}, picks
    Labelled.stats, Labelled.labels = SearchStats(), []
    Labelled.focus = draw.Focus(rules=frozenset({"fault_b"}))
    run_state_machine_as_test(Labelled, settings=RUNS)
    drawn = Labelled.stats.drawn
    faults = {rule: count for rule, count in drawn.items() if rule.startswith("fault_") and count}
    assert list(faults) == ["fault_b"], drawn
    assert 0.6 < drawn["step"] / (drawn["step"] + faults["fault_b"]) < 0.9, drawn
    Labelled.stats, Labelled.labels, Labelled.focus = SearchStats(), [], draw.Focus()
    run_state_machine_as_test(Labelled, settings=RUNS)
    assert len({label for label in Labelled.labels if label.startswith("fault_e(")}) > 1  # unpinned: drawn


def test_a_family_share_follows_its_weight_not_its_number_of_rules() -> None:
    drawn = drawn_by({})
    faults = sum(count for rule, count in drawn.items() if rule.startswith("fault_"))
    total = drawn["step"] + faults
    # Weights 3 and 1: the one protocol rule takes about three quarters; Hypothesis's uniform draw over the seven
    # rules would give it one seventh.
    assert 0.6 < drawn["step"] / total < 0.9, drawn
    assert all(drawn[f"fault_{letter}"] for letter in "abcdef"), drawn
    assert drawn["unreachable"] == 0


def test_a_family_of_weight_zero_is_never_drawn_while_another_can_move() -> None:
    drawn = drawn_by({"many": 0})
    assert drawn["step"] > 0
    assert not any(count for rule, count in drawn.items() if rule.startswith("fault_")), drawn


def test_the_weights_change_the_shares() -> None:
    drawn = drawn_by({"protocol": 1, "many": 3})
    faults = sum(count for rule, count in drawn.items() if rule.startswith("fault_"))
    assert 0.6 < faults / (drawn["step"] + faults) < 0.9, drawn


def test_a_failing_example_shrinks_to_the_first_family() -> None:
    """Any two steps fail; the shrunk steps are the protocol's rule, the first family on offer."""

    class FailsOnTwoSteps(Families):
        def teardown(self) -> None:
            if self._rules_strategy.rejected:  # type: ignore[attr-defined]
                return  # Hypothesis's simplest continuation, ended as invalid: not a failure to shrink
            FailsOnTwoSteps.labels = list(self.log.labels)
            assert len(self.log.labels) < 2

    FailsOnTwoSteps.stats, FailsOnTwoSteps.weights = SearchStats(), {}
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            FailsOnTwoSteps, settings=settings(RUNS, phases=(Phase.generate, Phase.shrink), max_examples=50)
        )
    assert FailsOnTwoSteps.labels == ["step()", "step()"]


def test_the_rule_strategy_hypothesis_draws_from_is_the_family_draw() -> None:
    """Hypothesis reads `_rules_strategy` (a private attribute): should it stop, this fails at once."""
    machine = Families()
    assert isinstance(machine._rules_strategy, draw.FamilyDraw)  # type: ignore[attr-defined]
    offered = machine._rules_strategy.on_offer(machine._rules_strategy.rules)  # type: ignore[attr-defined]
    assert [name for name, _weight, _rules in offered] == ["protocol", "never", "many"]


def test_families_are_ordered_protocol_first_then_by_weight() -> None:
    assert draw.ordered([MANY, NEVER_ENABLED, PROTOCOL, MANY]) == [PROTOCOL, NEVER_ENABLED, MANY]


def test_weights_parse_and_bad_weights_name_the_families() -> None:
    families = [PROTOCOL, MANY]
    assert draw.parse_weights("many=0, protocol=7", families) == {"many": 0, "protocol": 7}
    assert draw.parse_weights("", families) == {}
    for bad in ("crashes=2", "many", "many=x", "many=-1", "many=1.5"):
        with pytest.raises(ValueError, match="many") as raised:
            draw.parse_weights(bad, families)
        assert bad.split("=")[0] in str(raised.value)


class Drawn:
    """Stands for Hypothesis's data: every draw gives `value`."""

    def __init__(self, value: int) -> None:
        self.value = value

    def draw(self, _strategy: object) -> int:
        return self.value


def test_the_family_draw_picks_by_weight() -> None:
    """`_family` on a hand-built offer: draws 0-2 are the first family (weight 3), 3 the second (weight 1)."""
    strategy = Families()._rules_strategy  # type: ignore[attr-defined]
    offer = [("protocol", 3, []), ("many", 1, [])]
    assert [strategy._family(Drawn(value), offer) for value in range(4)] == ["protocol"] * 3 + ["many"]


def test_a_run_of_zero_family_draws_is_rejected_and_a_shorter_one_is_not() -> None:
    """Hypothesis's simplest continuation draws 0 at every step: the eighth family draw of 0 in a row rejects the
    example; a draw of another value starts the count again. (Within a test: `reject` is for tests only.)"""

    @settings(max_examples=1, database=None)
    @given(st.none())
    def within_a_test(_: None) -> None:
        strategy = Families()._rules_strategy  # type: ignore[attr-defined]
        offer = [("protocol", 3, []), ("many", 1, [])]
        for _ in range(draw.ZERO_RUN_REJECTED - 1):
            assert strategy._family(Drawn(0), offer) == "protocol"
        assert strategy._family(Drawn(1), offer) == "protocol"
        for _ in range(draw.ZERO_RUN_REJECTED - 1):
            strategy._family(Drawn(0), offer)
        assert not strategy.rejected
        with pytest.raises(UnsatisfiedAssumption):
            strategy._family(Drawn(0), offer)
        assert strategy.rejected

    within_a_test()


def test_a_run_of_zeros_is_kept_where_the_deployment_allows_one_example_only() -> None:
    machine = Families()
    draw.install(machine, rejects_zero_runs=False)
    strategy = machine._rules_strategy  # type: ignore[attr-defined]
    offer = [("protocol", 3, []), ("many", 1, [])]
    assert {strategy._family(Drawn(0), offer) for _ in range(3 * draw.ZERO_RUN_REJECTED)} == {"protocol"}
    assert not strategy.rejected


def test_every_rule_of_the_machine_has_a_family_and_the_protocol_weighs_more_than_half() -> None:
    from ckpt_model.steps.steplog import families_of, rule_names
    from ckpt_model.trainer.machine import CheckpointMachine

    family_of = families_of(CheckpointMachine)
    assert sorted(family_of) == rule_names(CheckpointMachine)
    families = set(family_of.values())
    protocol = sum(family.weight for family in families if family.protocol)
    assert protocol > sum(family.weight for family in families) / 2
    assert len({family.name for family in families}) == len(families)  # one declaration per name
    assert list(draw.weights_of(CheckpointMachine))[:4] == ["rollouts", "calls", "checkpoints", "restores"]


class ScriptedTour:
    """A tour that asks for `fault_e(pick=3)` twice, then `unreachable` (never enabled), then nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, int]]] = [("fault_e", {"pick": 3})] * 2 + [("unreachable", {})]
        self.refusals = 0

    def next_call(self, model: object, choice: int = 0) -> tuple[str, dict[str, int]] | None:
        return self.calls.pop(0) if self.calls else None

    def refused(self) -> None:
        self.refusals += 1


class OneTour:
    """A guide of one tour, which every example draws (or none)."""

    size = 1
    made: list[ScriptedTour] = []

    def tour(self, index: int) -> ScriptedTour:
        OneTour.made.append(ScriptedTour())
        return OneTour.made[-1]


def test_an_example_that_draws_a_tour_walks_it_then_draws_as_any_example() -> None:
    """With a guide, an example drawing its one tour opens with the tour's calls; a call the machine would not play
    (its rule not enabled) is refused and drawn at random instead; after the tour, the draw is the family draw."""
    Labelled.stats, Labelled.weights, Labelled.labels = SearchStats(), {}, []
    Labelled.focus, OneTour.made = draw.Focus(guide=OneTour()), []
    run_state_machine_as_test(Labelled, settings=RUNS)
    Labelled.focus = draw.Focus()

    assert OneTour.made, "no example drew the tour"
    assert all(tour.refusals == 1 for tour in OneTour.made if not tour.calls)
    assert Labelled.labels.count("fault_e(3)") >= 2 * len(OneTour.made)
    assert {label for label in Labelled.labels if not label.startswith("fault_e(")} >= {"step()", "fault_a()"}
