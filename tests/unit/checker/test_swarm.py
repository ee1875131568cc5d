"""Swarm testing without servers: the swarm value, its draw, and a tiny machine whose rules `steplog.action`
builds, run by Hypothesis with a swarm left out and without one; what it counts in `SearchStats`."""

from __future__ import annotations

from typing import Any

from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RULE_MARKER, RuleBasedStateMachine, initialize, run_state_machine_as_test

from ckpt_model.model.contract import Model
from ckpt_model.protocol.history import History
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps.families import ROLLOUTS
from ckpt_model.steps.steplog import StepLog, action, gates, mechanisms_of, rule_names
from ckpt_model.steps.swarm import ALWAYS_KEPT, EVERYTHING, Swarm, swarms
from ckpt_model.trainer.machine import CheckpointMachine

RULES = ["checkpoint", "commit", "dispatch", "release", "retry"]
MECHANISMS = (("checkpoint", "hold_one"), ("checkpoint", "then_resume"))
SMALL = settings(max_examples=30, derandomize=True, database=None, deadline=None, phases=(Phase.generate,))


def test_the_empty_swarm_allows_every_rule_and_leaves_arguments_as_drawn() -> None:
    assert all(EVERYTHING.allows(rule) for rule in RULES)
    assert EVERYTHING.constrain("checkpoint", {"hold_one": True}) == {"hold_one": True}


def test_a_swarm_refuses_the_rules_it_leaves_out_and_switches_off_its_mechanisms() -> None:
    swarm = Swarm(frozenset({"retry"}), frozenset({("checkpoint", "hold_one")}))
    assert not swarm.allows("retry")
    assert swarm.allows("commit")
    assert swarm.constrain("checkpoint", {"hold_one": True, "then_resume": True}) == {
        "hold_one": False,
        "then_resume": True,
    }
    assert swarm.constrain("retire", {"hold_one": True}) == {"hold_one": True}
    assert swarm.describe() == "swarm leaves out retry, checkpoint(hold_one)"


@given(swarms(RULES, MECHANISMS))
def test_no_swarm_leaves_out_a_rule_every_situation_starts_from(swarm: Swarm) -> None:
    assert not swarm.rules_out & ALWAYS_KEPT
    assert swarm.mechanisms_out <= set(MECHANISMS)


def test_a_swarm_shrinks_to_leaving_out_nothing() -> None:
    assert find(swarms(RULES, MECHANISMS), lambda swarm: True) == EVERYTHING
    left_out = find(swarms(RULES, MECHANISMS), lambda swarm: "retry" in swarm.rules_out)
    assert left_out.rules_out == {"retry"}
    assert not left_out.mechanisms_out


class Tiny(RuleBasedStateMachine):
    """Two rules built by `action`: `grow` always enabled, `shrink` once something grew; `grow` nests `note`."""

    stats: SearchStats
    left_out: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(topology="native")
        self.log = StepLog(harness=None, history=History(), stats=self.stats)  # type: ignore[arg-type]
        self.size = 0

    @initialize()
    def choose(self) -> None:
        self.log.swarm = Swarm(self.left_out, frozenset({("grow", "big")}))

    @action(lambda self: True, family=ROLLOUTS, big=st.booleans())
    def grow(self, big: bool) -> None:
        self.size += 2 if big else 1
        self.log.labels.append(f"grow({big})")
        self.note()

    @action(lambda self: self.size > 0, family=ROLLOUTS)
    def shrink(self) -> None:
        self.size -= 1
        self.log.labels.append("shrink()")

    @action(lambda self: False, family=ROLLOUTS)
    def note(self) -> None:
        self.log.labels.append("note()")

    def teardown(self) -> None:
        self.log.finished(crashes=0, crashes_inside=0)


def run_tiny(left_out: frozenset[str]) -> tuple[SearchStats, list[Any]]:
    calls: list[Any] = []

    class Machine(Tiny):
        def teardown(self) -> None:
            calls.extend(self.log.rule_calls)
            super().teardown()

    Machine.stats, Machine.left_out = SearchStats(), left_out
    run_state_machine_as_test(Machine, settings=SMALL)
    return Machine.stats, calls


def test_the_machine_rules_and_their_model_preconditions_are_known_by_name() -> None:
    assert rule_names(Tiny) == ["grow", "note", "shrink"]
    assert not gates(Tiny)["note"](object())


def test_a_rule_the_swarm_leaves_out_is_never_drawn_but_still_counts_as_enabled() -> None:
    stats, calls = run_tiny(frozenset({"shrink"}))
    assert stats.drawn["grow"] > 0
    assert stats.drawn["shrink"] == 0
    assert stats.enabled["shrink"] > 0  # its model precondition held; only the swarm refused it
    assert not [call for call in calls if call[0] == "shrink"]


def test_a_mechanism_the_swarm_leaves_out_runs_and_is_recorded_switched_off() -> None:
    _, calls = run_tiny(frozenset())
    assert calls
    assert all(arguments == {"big": False} for name, arguments in calls if name == "grow")


def test_nested_rules_are_stepped_but_only_drawn_rules_count_as_drawn() -> None:
    stats, calls = run_tiny(frozenset())
    assert stats.drawn["note"] == 0
    assert not [call for call in calls if call[0] == "note"]
    assert stats.enabled["note"] == 0
    assert sum(stats.drawn.values()) == len(calls)


def test_a_swarm_that_keeps_no_enabled_rule_lets_every_enabled_rule_be_drawn() -> None:
    stats, calls = run_tiny(frozenset({"grow"}))  # only `shrink` is kept, and it needs something grown first
    assert calls[0][0] == "grow"
    assert stats.drawn["grow"] > 0


def test_the_machines_mechanisms_are_boolean_arguments_its_rules_declare() -> None:
    mechanisms = mechanisms_of(CheckpointMachine)
    assert ("checkpoint", "hold_one") in mechanisms
    assert list(mechanisms) == sorted(mechanisms)
    for rule, argument in mechanisms:
        strategy = getattr(getattr(CheckpointMachine, rule), RULE_MARKER).arguments[argument]
        assert repr(strategy) == "booleans()", (rule, argument)
