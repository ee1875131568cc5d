"""The explorer (`ckpt_model.search.explore`), its abstraction (`ckpt_model.model.abstract`) and the model's
invariants (`ckpt_model.model.invariants`), on hand-built models and small depths."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from ckpt_model.model import contract
from ckpt_model.model.abstract import abstract, state_digest
from ckpt_model.model.contract import Checkpoint, Model
from ckpt_model.model.invariants import INVARIANTS, drained
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import SearchStats
from ckpt_model.search import paths, transition_coverage
from ckpt_model.search.explore import Call, explore, start_model
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.steps.steplog import StepLog, gates
from ckpt_model.trainer.machine import CheckpointMachine
from ckpt_model.trainer.moves import MOVES, Outcome
from ckpt_model.trainer.stand_in import stand_in

NATIVE = DeploymentSpec("native")


def running(model: Model) -> Model:
    return model.dispatch()[0]


# -- the abstraction -------------------------------------------------------------------------------------------


def test_states_that_differ_only_in_names_and_counters_are_one_abstract_state() -> None:
    first = Model(topology="native").dispatch()[0]
    # r0 dispatched after a refused /run used up a name and a run number: r1, run 1
    second = Model(topology="native", tried=attrs.evolve(Model(topology="native").tried)).refused_dispatch()[0]
    second = attrs.evolve(second, tried=first.tried).dispatch()[0]

    assert second.current().keys() == {"r1"}
    assert abstract(first) == abstract(second)


def test_rules_pick_rollouts_in_the_order_the_abstraction_names_them_whatever_their_names() -> None:
    """Drawn rollout IDs sort apart from their dispatch order (`z0` after `a1`): a pick by name would retire
    another rollout than the explorer's in the same abstract state (once an unpredicted `retire` in a run)."""
    plain = Model(topology="native").dispatch()[0].dispatch()[0]
    drawn = Model(topology="native").dispatch(drawn="z")[0].dispatch(drawn="a")[0]
    assert list(drawn.current()) == ["z0", "a1"]
    assert state_digest(plain) == state_digest(drawn)

    assert drawn.live_rollouts() == ["z0", "a1"]
    assert drawn.waiting() == ["z0", "a1"]
    capabilities = Capabilities.of_look_alike(DeploymentSpec("native"))
    for rule in ("retire", "late_run", "release"):
        moved_plain = [state_digest(after) for _, after in MOVES[rule](stand_in(capabilities, plain))]
        moved_drawn = [state_digest(after) for _, after in MOVES[rule](stand_in(capabilities, drawn))]
        assert moved_plain == moved_drawn, rule


def test_rollouts_known_only_by_their_marks_are_named_by_what_the_marks_hold() -> None:
    """The marks are kept sorted by name; two states that differ only by swapping two marked rollouts' names
    are one abstract state."""
    base = attrs.evolve(Model(topology="native"), fresh=False)
    first = attrs.evolve(base, retired_marks=(("a", 0), ("b", 1)))
    swapped = attrs.evolve(base, retired_marks=(("a", 1), ("b", 0)))
    other = attrs.evolve(base, retired_marks=(("a", 1), ("b", 1)))

    assert abstract(first) == abstract(swapped)
    assert abstract(first) != abstract(other)


@pytest.mark.parametrize(
    "spec",
    [NATIVE, DeploymentSpec("slow", "wait"), DeploymentSpec("counter", token_capture=True)],
    ids=lambda spec: spec.label,
)
def test_no_renaming_of_the_rollouts_changes_a_path_s_abstract_states(
    spec: DeploymentSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random walks of the move table, each taken twice: once with the rollouts named `r<seq>`, once with names
    that sort in no particular order; every state along the way is the same abstract state in both."""
    randomness = random.Random(47)
    capabilities = Capabilities.of_look_alike(spec)
    rule_gates = gates(CheckpointMachine)
    plain_names = contract.rollout_name
    drawn: dict[int, str] = {}

    def shuffled_name(_drawn: str | None, seq: int) -> str:
        return drawn.setdefault(seq, f"{randomness.choice('abxz')}{randomness.randrange(1000)}q{seq}")

    for _ in range(40):
        drawn.clear()

        plain = renamed = start_model(spec)
        for _ in range(12):
            machine = stand_in(capabilities, plain, spec.server_workers)
            rules = [rule for rule, gate in rule_gates.items() if gate(machine)]
            rule = randomness.choice(rules)
            outcomes = list(MOVES[rule](machine))
            choice = randomness.randrange(len(outcomes))
            monkeypatch.setattr(contract, "rollout_name", shuffled_name)
            renamed_outcomes = list(MOVES[rule](stand_in(capabilities, renamed, spec.server_workers)))
            monkeypatch.setattr(contract, "rollout_name", plain_names)
            plain, renamed = outcomes[choice][1], renamed_outcomes[choice][1]
            assert state_digest(plain) == state_digest(renamed), (rule, outcomes[choice][0], drawn)


def test_a_rollout_that_replied_and_no_checkpoint_holds_is_done() -> None:
    model = Model(topology="native").dispatch()[0]
    done = model.release("r0").release("r0")
    assert done.current()["r0"].status == "replied"

    assert abstract(done) == abstract(attrs.evolve(Model(topology="native"), fresh=False))
    assert abstract(done.dispatch()[0]) == abstract(model)


def test_states_the_rules_tell_apart_stay_apart() -> None:
    model = running(Model(topology="native"))
    prepared = model.prepare()[0]

    assert abstract(prepared) != abstract(model)
    assert abstract(prepared.commit()[0]) != abstract(prepared)
    assert abstract(model.release("r0")) != abstract(model)
    assert abstract(model.crash()) != abstract(model)


# -- the invariants, each seen to fail -------------------------------------------------------------------------


def broken_models() -> dict[str, Model]:
    model = running(Model(topology="native"))
    attempt = model.current()["r0"]
    replied = attrs.evolve(attempt, status="replied")
    checkpoint = Checkpoint("c1", exported=("r0", "ghost"), snapshot=(replied,))
    return {
        "replied_means_finished": model._replace(replied),
        "checkpoints_name_held_attempts": attrs.evolve(model, committed=(checkpoint,)),
        "one_live_attempt_per_rollout": attrs.evolve(model, attempts=(attempt, attempt)),
        "calls_add_up": model._replace(attrs.evolve(attempt, calls_made=3, delivered=0)),
        "phase_names_the_open_checkpoint": attrs.evolve(model, phase="prepared"),
        "within_capacity": attrs.evolve(model, rollouts_max=0),
        "retired_attempts_marked": attrs.evolve(model, retired_attempts=(attempt,)),
        "drain_reaches_a_clean_end": model._replace(attrs.evolve(attempt, status="pending", held=False)),
    }


@pytest.mark.parametrize("name", list(INVARIANTS))
def test_each_invariant_finds_its_own_breakage_and_holds_on_a_sound_model(name: str) -> None:
    invariant = INVARIANTS[name]

    assert invariant(broken_models()[name]), f"{name} missed what breaks it"
    assert invariant(running(Model(topology="native"))) == []


def test_the_drain_ends_every_rollout() -> None:
    model = running(running(Model(topology="native"))).prepare()[0].commit()[0].crash()

    end = drained(model)

    assert {a.status for a in end.current().values()} == {"replied"}
    assert not end.checkpoint_open


# -- the explorer ----------------------------------------------------------------------------------------------


def test_every_rule_has_a_move() -> None:
    assert set(MOVES) == set(gates(CheckpointMachine))


def test_the_model_keeps_its_invariants_to_depth_four_on_native() -> None:
    found = explore(NATIVE, 4)

    assert found.violations == []
    assert [level.states for level in found.levels] == [1, 18, 157, 1277]
    assert found.states == 1 + 1 + 18 + 157 + 1277
    assert found.bounded
    assert not found.timed_out


def test_a_deliberately_broken_transition_is_found_with_its_shortest_path() -> None:
    """A resume that forgets to deliver the responses the model server held: the first state it reaches breaks
    `calls_add_up`, and the path is the fewest rule calls that get there (a rollout, a checkpoint holding its
    response, the broken resume)."""

    def forgets_held(machine: CheckpointMachine) -> Iterator[Outcome]:
        model = machine.model
        yield {}, attrs.evolve(model, phase="idle", open_checkpoint=None, resumed=(*model.resumed, model.opened))

    found = explore(NATIVE, 4, moves={**MOVES, "resume": forgets_held})

    violation = next(v for v in found.violations if v.invariant == "calls_add_up")
    assert violation.path == (
        Call("dispatch", {"worker": 0}),
        Call("checkpoint", {"then_resume": False, "hold_one": True}),
        Call("resume"),
    )
    assert violation.problems == ("r0 has a held response while running, with no checkpoint open or no call out",)
    assert "shortest path (3 steps)" in violation.words()


def test_a_time_limit_stops_the_exploration_and_says_so() -> None:
    found = explore(NATIVE, 8, time_limit_s=0.0)

    assert found.timed_out
    assert not found.bounded


# -- transition coverage ---------------------------------------------------------------------------------------


def small_explored() -> transition_coverage.Explored:
    return transition_coverage.Explored(
        depth=2,
        transitions={("s0", "dispatch", "s1"): 1, ("s1", "release", "s2"): 2, ("s1", "retire", "s0"): 2},
        families={"dispatch": "rollouts", "release": "calls", "retire": "rollouts"},
    )


def test_transition_coverage_counts_per_depth_and_names_what_was_left() -> None:
    taken = [("s0", "dispatch", "s1"), ("s1", "release", "s2"), ("s2", "release", "s3")]

    coverage = transition_coverage.coverage_of(small_explored(), taken)

    assert [(share.depth, share.taken, share.explored) for share in coverage.shares] == [(1, 1, 1), (2, 1, 2)]
    assert coverage.beyond == 1  # from s2, which the exploration did not expand
    assert coverage.unmodelled == ()
    assert coverage.left_by_family == {"rollouts": 1}
    assert coverage.lines()[0].startswith("transitions: to depth 2: 2 of 3 (66.7%); depth 1: 1 of 1 (100.0%)")
    assert "never taken, by family: rollouts 1 (retire)" in coverage.lines()[1]


def test_a_transition_the_explorer_did_not_predict_is_named() -> None:
    coverage = transition_coverage.coverage_of(small_explored(), [("s1", "dispatch", "s9")])

    assert coverage.unmodelled == (("s1", "dispatch", "s9"),)
    assert "did not predict" in "\n".join(coverage.lines())


def test_explored_transitions_are_kept_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(transition_coverage.EXPLORED_ENV, str(tmp_path))

    first = transition_coverage.explored(NATIVE, 3)
    [kept] = tmp_path.iterdir()
    again = transition_coverage.explored(NATIVE, 3)

    assert first == again
    assert first.arguments == again.arguments
    assert first.arguments[next(key for key in first.transitions if key[1] == "retire")].keys() == {
        "pick",
        "again",
        "worker",
    }
    # 20 of them control_rejected_id's self-loops, one from every state within depth 2 (it changes no abstract state)
    assert len(first.transitions) == 558
    assert sum(1 for key in first.transitions if key[1] == "control_rejected_id" and key[0] == key[2]) == 20
    assert max(first.transitions.values()) == 3
    kept.write_text("not json")
    assert transition_coverage.explored(NATIVE, 3) == first  # a damaged cache is explored again


def test_a_drawn_rule_keeps_its_abstract_transition() -> None:
    """The step log keeps (state before, rule, state after) for drawn rules only: a rule played inside another
    (a crash before a restore) is part of the outer rule's transition."""
    log = StepLog(harness=None, history=None, stats=SearchStats())  # type: ignore[arg-type]
    before = Model(topology="native")
    after = before.dispatch()[0]

    log.depth = 1
    log.stepped(CheckpointMachine, "crash", {}, after, after.crash(), 0)
    log.depth = 0
    log.stepped(CheckpointMachine, "dispatch", {"worker": 0}, before, after, 0)

    assert log.transitions == [(state_digest(before), "dispatch", state_digest(after))]


# -- aimed tours -------------------------------------------------------------------------------------------------


def test_untaken_transitions_come_shallowest_first_taking_turns_among_rules() -> None:
    explored = transition_coverage.explored(NATIVE, 3)
    taken = {key for key in explored.transitions if key[1] == "retry"}

    ordered = paths.untaken(explored, taken)

    depths = [explored.transitions[key] for key in ordered]
    assert depths == sorted(depths)
    assert len(ordered) == len(explored.transitions) - len(taken)
    assert "retry" not in {key[1] for key in ordered}
    at_depth_three = [key[1] for key in ordered if explored.transitions[key] == 3]
    first_round = at_depth_three[: len(set(at_depth_three))]
    assert len(set(first_round)) == len(first_round)  # every rule once before any rule twice


def test_a_tour_walks_the_shortest_path_to_its_target_then_on_to_what_is_left() -> None:
    found = explore(NATIVE, 4)
    guide = paths.TransitionGuide(transition_coverage.explored(NATIVE, 4), taken=())
    target = next(t for t in found.transitions if found.depths[t.source] == 2 and t.rule == "failed_restore")
    tour = paths.Tour(guide, (target.source, target.rule, target.target))
    model = start_model(NATIVE)
    machine = stand_in(Capabilities.of_look_alike(NATIVE), model)

    for expected in found.path_of(target):
        call = tour.next_call(model)
        assert call == (expected.rule, dict(expected.arguments))
        machine.model = model
        model = next(after for arguments, after in MOVES[expected.rule](machine) if arguments == expected.arguments)

    assert state_digest(model) == target.target
    following = tour.next_call(model)
    assert following is not None  # on to the nearest transition left from there
    tour.refused()
    assert tour.next_call(model) != following


def test_a_guide_with_everything_taken_offers_no_tour() -> None:
    explored = transition_coverage.explored(NATIVE, 2)

    guide = paths.TransitionGuide(explored, set(explored.transitions))

    assert guide.size == 0
    assert guide.first_call_towards(next(iter(explored.transitions))[0], lambda key: True) is not None
