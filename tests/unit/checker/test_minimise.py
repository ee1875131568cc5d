"""The domain minimiser's pure core against hand-built predicates, and its edge's idea of "fails the same way".

No servers: a predicate here is a plain function of the steps, so each test knows the minimal answer exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_model.errors import StepNotEnabled
from ckpt_model.properties.continuation import P4Violation
from ckpt_model.properties.state import P7Violation
from ckpt_model.results.progress import MEASURING_MINIMAL, MINIMISING, FailureWork
from ckpt_model.results.reproduction import Rate
from ckpt_model.search import minimise as mm
from ckpt_model.search.minimise import COMPOSITES, CachedPredicate, Steps, ddmin, key_of, minimise
from ckpt_model.trainer.quiescence import SETTLE_TIMEOUT_S
from tests.unit.checker.fake_harness import fake_harness


def named(*names: str) -> Steps:
    return tuple((name, {}) for name in names)


def names(steps: Steps) -> list[str]:
    return [name for name, _ in steps]


def primitives(steps: Steps) -> list[str]:
    """The primitive rules a sequence runs, composites expanded as the machine runs them."""
    out: list[str] = []
    for name, arguments in steps:
        out += names(COMPOSITES[name](arguments)) if name in COMPOSITES else [name]
    return out


def contains_in_order(needed: Sequence[str]) -> Callable[[Steps], bool]:
    """Fails when the primitive rules include `needed` as a subsequence (other steps in between allowed)."""

    def fails(steps: Steps) -> bool:
        run = iter(primitives(steps))
        return all(any(step == want for step in run) for want in needed)

    return fails


def is_one_minimal(steps: Steps, fails: Callable[[Steps], bool]) -> bool:
    return all(not fails(steps[:i] + steps[i + 1 :]) for i in range(len(steps)))


# --- ddmin -------------------------------------------------------------------------------------------------------


def test_ddmin_finds_the_known_minimal_subsequence_in_order() -> None:
    steps = named(*(f"s{i}" for i in range(12)))
    fails = contains_in_order(["s2", "s9"])

    assert names(ddmin(steps, fails)) == ["s2", "s9"]


def test_ddmin_keeps_a_sequence_that_needs_every_step() -> None:
    steps = named("a", "b", "c")
    assert ddmin(steps, contains_in_order(["a", "b", "c"])) == steps


# Monotone failures: a sequence fails when it holds every step of one of the "causes" (each a set of step indices).
causes_strategy = st.lists(
    st.sets(st.integers(min_value=0, max_value=11), min_size=1, max_size=4), min_size=1, max_size=3
)


@settings(max_examples=200, deadline=None)
@given(causes=causes_strategy)
def test_ddmin_and_minimise_return_a_failing_1_minimal_subsequence(causes: list[set[int]]) -> None:
    steps = named(*(f"s{i}" for i in range(12)))

    def fails(candidate: Steps) -> bool:
        present = {int(name[1:]) for name, _ in candidate}
        return any(cause <= present for cause in causes)

    for result in (ddmin(steps, fails), minimise(steps, fails).steps):
        assert fails(result)
        assert is_one_minimal(result, fails)
        indices = [int(name[1:]) for name in names(result)]
        assert indices == sorted(indices)  # a subsequence: the order of the steps is kept
        assert set(indices) in [set(cause) for cause in causes]  # minimal sets of a monotone predicate are causes


# --- the 1-minimality pass ---------------------------------------------------------------------------------------


def test_a_non_monotone_predicate_still_gets_a_1_minimal_result() -> None:
    # Fails with "x" and an even number of other steps: removing one step can stop the failure and removing two
    # bring it back, which ddmin's chunks handle; the result must still fail and be 1-minimal.
    steps = named("x", "a", "b", "c", "d")

    def fails(candidate: Steps) -> bool:
        return "x" in names(candidate) and (len(candidate) - 1) % 2 == 0

    result = minimise(steps, fails)

    assert names(result.steps) == ["x"]
    assert is_one_minimal(result.steps, fails)


def test_the_final_pass_removes_a_step_that_a_simpler_argument_made_redundant() -> None:
    # ddmin leaves both steps (neither fails alone); pick=0 then fails without the dispatch, which the pass drops.
    steps = (("dispatch", {}), ("retire", {"pick": 1}))

    def fails(candidate: Steps) -> bool:
        picks = [arguments["pick"] for name, arguments in candidate if name == "retire"]
        return picks == [0] or (names(candidate) == ["dispatch", "retire"] and picks == [1])

    result = minimise(steps, fails)

    assert result.steps == (("retire", {"pick": 0}),)
    assert result.pass_removed == 1
    assert "1-minimality pass removed 1" in result.summary()


def test_the_final_pass_removes_adjacent_steps_that_only_go_together() -> None:
    # A crash without its start_over (or the reverse) changes what follows, so ddmin, whose chunks split them,
    # keeps both, and the result is already 1-minimal; removing the two at once still fails.
    steps = named("dispatch", "crash", "start_over", "checkpoint", "late_call")

    def fails(candidate: Steps) -> bool:
        present = set(names(candidate))
        return {"dispatch", "checkpoint", "late_call"} <= present and ("crash" in present) == ("start_over" in present)

    assert names(ddmin(steps, fails)) == names(steps)

    result = minimise(steps, fails)

    assert names(result.steps) == ["dispatch", "checkpoint", "late_call"]
    assert result.pass_removed == 2


def test_the_final_pass_removes_a_crash_with_a_start_over_for_each_of_the_most_rollouts() -> None:
    # A crash needs one start_over per live rollout before anything else may run (the model allows three), so the
    # four only go together; ddmin keeps them, and runs of three or fewer cannot take them out.
    steps = named(*["dispatch_restart"] * 3, "crash", *["start_over"] * 3, "checkpoint")

    def fails(candidate: Steps) -> bool:
        rules = names(candidate)
        restarted = rules.count("start_over") == (3 if "crash" in rules else 0)
        return "dispatch_restart" in rules and "checkpoint" in rules and restarted

    result = minimise(steps, fails)

    assert names(result.steps) == ["dispatch_restart", "checkpoint"]
    assert mm.CHUNK_STEPS_MAX == 4


def test_primitives_that_make_a_composite_are_written_as_it() -> None:
    steps = (
        ("dispatch", {}),
        ("prepare", {}),
        ("commit", {}),
        ("resume", {}),
        ("prepare", {}),
        ("commit", {}),
        ("crash", {}),
        ("restore", {"pick": 1}),
        ("restore", {"pick": 0}),
    )

    assert mm.fold_composites(steps) == (
        ("dispatch", {}),
        ("checkpoint", {"then_resume": True}),
        ("checkpoint", {"then_resume": False}),
        ("recover", {"pick": 1}),
        ("restore", {"pick": 0}),
    )


def test_the_result_reads_as_composites_when_they_still_fail() -> None:
    steps = (*named("dispatch", "release", "prepare", "commit", "crash", "late_call"), ("restore", {"pick": 0}))
    fails = contains_in_order(["dispatch", "prepare", "commit", "crash", "restore"])

    result = minimise(steps, fails)

    assert names(result.steps) == ["dispatch", "checkpoint", "recover"]


def test_a_fold_that_no_longer_fails_is_not_taken() -> None:
    steps = named("dispatch", "prepare", "commit")

    def fails(candidate: Steps) -> bool:  # as if `checkpoint`'s precondition did not hold here
        return names(candidate) == ["dispatch", "prepare", "commit"]

    assert names(minimise(steps, fails).steps) == ["dispatch", "prepare", "commit"]


def test_an_empty_sequence_that_fails_is_the_minimum() -> None:
    result = minimise(named("dispatch"), lambda candidate: True)
    assert result.steps == ()
    assert (result.steps_before, result.steps_after) == (1, 0)


# --- composites --------------------------------------------------------------------------------------------------


def test_a_composite_is_replaced_by_the_primitives_it_needs() -> None:
    steps = (("dispatch", {}), ("checkpoint", {"then_resume": True}), ("late_call", {"pick": 0}))

    result = minimise(steps, contains_in_order(["prepare", "late_call"]))

    assert result.steps == (("prepare", {}), ("late_call", {"pick": 0}))
    assert result.expanded == ("checkpoint(then_resume=False)",)
    assert result.reproduced


def test_a_composite_whose_primitives_are_all_needed_stays_as_it_reads_shorter() -> None:
    steps = (("dispatch", {}), ("checkpoint", {"then_resume": True}), ("retire", {"pick": 0, "again": False}))

    result = minimise(steps, contains_in_order(["dispatch", "prepare", "commit", "resume"]))

    assert result.steps == (("dispatch", {}), ("checkpoint", {"then_resume": True}))
    assert result.expanded == ()


def test_recover_becomes_crash_when_the_restore_is_not_needed() -> None:
    steps = (("dispatch", {}), ("checkpoint", {"then_resume": False}), ("recover", {"pick": 3}))

    result = minimise(steps, contains_in_order(["dispatch", "crash"]))

    assert result.steps == (("dispatch", {}), ("crash", {}))


def test_the_primitives_keep_the_composites_arguments() -> None:
    assert COMPOSITES["recover"]({"pick": 2}) == (("crash", {}), ("restore", {"pick": 2}))
    assert names(COMPOSITES["checkpoint"]({"then_resume": False})) == ["prepare", "commit"]
    assert names(COMPOSITES["checkpoint"]({"then_resume": True})) == ["prepare", "commit", "resume"]


def test_a_rule_with_its_then_flag_set_is_itself_then_what_the_flag_adds() -> None:
    killed = {"pick": 2, "worker": 1}

    assert COMPOSITES["kill_worker"]({**killed, "then_prepare": True}) == (("kill_worker", killed), ("prepare", {}))
    assert COMPOSITES["kill_worker"]({**killed, "then_prepare": False}) == (
        ("kill_worker", {**killed, "then_prepare": False}),
    )


def test_a_rule_followed_by_what_its_then_flag_adds_is_written_with_the_flag() -> None:
    steps = (("kill_worker", {"pick": 2, "worker": 1}), ("prepare", {}), ("kill_worker", {"pick": 0}), ("dispatch", {}))

    assert mm.fold_composites(steps) == (
        ("kill_worker", {"pick": 2, "worker": 1, "then_prepare": True}),
        ("kill_worker", {"pick": 0}),
        ("dispatch", {}),
    )


def test_a_then_flag_that_is_needed_stays_and_one_that_is_not_goes() -> None:
    killed = {"pick": 0, "worker": 0, "then_prepare": True}
    steps = (("dispatch", {}), ("kill_worker", killed), ("commit", {}))

    needed = minimise(steps, contains_in_order(["dispatch", "kill_worker", "prepare"]))
    not_needed = minimise(steps, contains_in_order(["dispatch", "kill_worker"]))

    assert needed.steps == (("dispatch", {}), ("kill_worker", killed))
    assert not_needed.steps == (("dispatch", {}), ("kill_worker", {**killed, "then_prepare": False}))


# --- arguments ---------------------------------------------------------------------------------------------------


def test_arguments_move_toward_the_simplest_value_that_keeps_the_failure() -> None:
    steps = (("dispatch", {}), ("dispatch", {}), ("retire", {"pick": 5, "again": True}))

    def fails(candidate: Steps) -> bool:  # two rollouts live: pick selects pick % 2, and r1 is the faulty one
        retires = [arguments for name, arguments in candidate if name == "retire"]
        return names(candidate).count("dispatch") == 2 and any(a["pick"] % 2 == 1 for a in retires)

    result = minimise(steps, fails)

    assert result.steps == (("dispatch", {}), ("dispatch", {}), ("retire", {"pick": 1, "again": False}))


def test_an_argument_that_is_not_a_number_or_a_boolean_is_kept() -> None:
    steps = (("late_call", {"operation": "restore", "pick": 2}),)

    result = minimise(steps, lambda c: bool(c) and c[0][1]["pick"] >= 1)

    assert result.steps == (("late_call", {"operation": "restore", "pick": 1}),)


def test_the_callers_steps_are_not_mutated() -> None:
    steps = [("retire", {"pick": 3, "again": True})]
    minimise(steps, lambda c: bool(c))
    assert steps == [("retire", {"pick": 3, "again": True})]


# --- cost: the cache, and a flaky predicate ------------------------------------------------------------------------


def test_no_candidate_is_replayed_twice_except_the_final_replay() -> None:
    asked: Counter[Any] = Counter()
    fails = contains_in_order(["prepare", "crash"])

    def counted(candidate: Steps) -> bool:
        asked[key_of(candidate)] += 1
        return fails(candidate)

    steps = (
        ("dispatch", {}),
        ("release", {"pick": 2}),
        ("checkpoint", {"then_resume": False}),
        ("dispatch", {}),
        ("recover", {"pick": 1}),
        ("release", {"pick": 0}),
    )
    result = minimise(steps, counted)

    assert names(result.steps) == ["prepare", "crash"]
    repeated = {key: count for key, count in asked.items() if count > 1}
    assert repeated == {key_of(result.steps): 2}  # asked once while minimising, once more uncached at the end
    assert result.replayed == sum(asked.values())
    assert key_of(steps) not in asked  # the caller vouched that the original fails: never replayed
    assert result.cached > 0


def test_the_cache_answers_repeats_and_counts_them() -> None:
    calls: list[Steps] = []
    cached = CachedPredicate(lambda c: calls.append(c) is None)

    assert cached(named("a"))
    assert cached(named("a"))
    assert (len(calls), cached.replayed, cached.cached) == (1, 1, 1)


def test_a_flaky_predicate_is_reported_as_not_reproduced() -> None:
    seen: set[Any] = set()

    def fails_only_the_first_time(candidate: Steps) -> bool:
        key = key_of(candidate)
        first = key not in seen
        seen.add(key)
        return first and "x" in names(candidate)

    result = minimise(named("a", "x", "b"), fails_only_the_first_time)

    assert names(result.steps) == ["x"]
    assert not result.reproduced
    assert "DID NOT fail again" in result.summary()


# --- the edge: "fails the same way" ------------------------------------------------------------------------------


def p7() -> P7Violation:
    return P7Violation(rollout="r0", expected="dropped", observed="kept")


@pytest.mark.parametrize(
    ("outcome", "counts"),
    [
        (p7(), True),
        (P4Violation(rollout="r0", expected=[4], observed=[2]), False),
        (StepNotEnabled(step="commit({})", index=1, rule="commit"), False),
        (None, False),
    ],
    ids=["same-property", "other-property", "step-not-enabled", "passes"],
)
def test_only_the_same_failure_counts(
    monkeypatch: pytest.MonkeyPatch, outcome: BaseException | None, counts: bool
) -> None:
    monkeypatch.setattr(mm, "replay_once", lambda harness, steps, settle_timeout_s, controller: outcome)
    replayer = mm.Replayer(harness=None, expected=("P7Violation", "P7"))  # type: ignore[arg-type]

    assert replayer(named("dispatch")) is counts
    assert replayer.last_error is outcome


def test_candidates_settle_briefly_and_the_confirmation_fully(monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[float] = []
    monkeypatch.setattr(
        mm, "replay_once", lambda harness, steps, settle_timeout_s, controller: timeouts.append(settle_timeout_s)
    )
    replayer = mm.Replayer(harness=None, expected=("P7Violation", "P7"))  # type: ignore[arg-type]

    replayer(named("dispatch"))
    replayer.confirm(named("dispatch"))

    assert timeouts == [mm.CANDIDATE_SETTLE_TIMEOUT_S, SETTLE_TIMEOUT_S]
    assert mm.CANDIDATE_SETTLE_TIMEOUT_S < SETTLE_TIMEOUT_S


def test_a_result_that_fails_only_when_settled_briefly_is_minimised_again_fully(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Settled briefly, every candidate with a `dispatch` fails (as a slow system would seem to); settled fully,
    only those with a `retire` do. The brief search ends at `dispatch` alone, which the full confirmation refutes,
    so the minimisation starts over with full settles and ends at the real cause."""

    def replay(
        harness: object, steps: mm.Steps, settle_timeout_s: float, controller: object = None
    ) -> BaseException | None:
        present = {name for name, _ in steps}
        brief = settle_timeout_s < SETTLE_TIMEOUT_S
        return p7() if ("retire" in present or (brief and "dispatch" in present)) else None

    monkeypatch.setattr(mm, "replay_once", replay)
    harness = fake_harness(tmp_path)

    result, replayer = mm.minimise_on(harness, named("dispatch", "retire"), ("P7Violation", "P7"))  # type: ignore[arg-type]

    assert names(result.steps) == ["retire"]
    assert result.reproduced
    assert replayer.settle_timeout_s == SETTLE_TIMEOUT_S
    assert harness.regressions_dir == tmp_path / "regressions"


def test_outcomes_are_described_in_a_few_words() -> None:
    assert mm.describe(None) == "passed"
    assert mm.describe(p7()) == "P7Violation (P7)"
    assert mm.describe(StepNotEnabled(step="commit({})", index=1, rule="commit")) == "StepNotEnabled"


def test_steps_print_as_hypothesis_prints_them() -> None:
    steps = (("dispatch", {}), ("retire", {"pick": 0, "again": False}), ("late_call", {"pick": 0}))
    assert mm.as_code(steps) == (
        "state.dispatch()",
        "state.retire(pick=0, again=False)",
        "state.late_call(pick=0)",
    )


# --- the edge: a failure that replays only sometimes ---------------------------------------------------------------


class Sometimes:
    """A hand-built flaky system: a run whose steps include `retire` fails P7 on the replays the pattern marks
    (3 of every 10 such runs, in a fixed order, so the test knows every count); any other run passes."""

    def __init__(self, pattern: Sequence[bool] = (True, False, False, True, False, False, True, False, False, False)):
        self.pattern, self.retire_runs, self.runs = tuple(pattern), 0, 0

    def __call__(
        self, harness: object, steps: Steps, settle_timeout_s: float, controller: object = None
    ) -> BaseException | None:
        self.runs += 1
        if "retire" not in names(steps):
            return None
        self.retire_runs += 1
        return p7() if self.pattern[(self.retire_runs - 1) % len(self.pattern)] else None


def test_an_intermittent_candidate_counts_on_its_first_failure_within_its_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    system = Sometimes()
    monkeypatch.setattr(mm, "replay_once", system)
    replayer = mm.Replayer(harness=None, expected=("P7Violation", "P7"), attempts=13)  # type: ignore[arg-type]

    assert replayer(named("retire"))  # fails on the first try
    assert replayer(named("dispatch", "retire"))  # passes twice, then fails: three tries
    assert not replayer(named("dispatch"))  # never fails: all 13 tries
    assert system.runs == 1 + 3 + 13


def test_a_step_that_is_not_enabled_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[Steps] = []

    def not_enabled(harness: object, steps: Steps, settle_timeout_s: float, controller: object = None) -> BaseException:
        tries.append(steps)
        return StepNotEnabled(step="commit({})", index=1, rule="commit")

    monkeypatch.setattr(mm, "replay_once", not_enabled)
    replayer = mm.Replayer(harness=None, expected=("P7Violation", "P7"), attempts=13)  # type: ignore[arg-type]

    assert not replayer(named("commit"))
    assert len(tries) == 1


def test_an_intermittent_failure_is_minimised_by_its_rate_and_the_minimal_rate_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    system = Sometimes()
    monkeypatch.setattr(mm, "replay_once", system)
    harness = fake_harness(tmp_path)
    found = Rate(label="P7", failing=3, replays=10)

    result, replayer = mm.minimise_on(harness, named("dispatch", "retire", "crash"), ("P7Violation", "P7"), found)  # type: ignore[arg-type]

    assert names(result.steps) == ["retire"]  # with one try per candidate, most candidates with it would pass
    assert replayer.attempts == 13
    assert result.found_rate == found
    assert result.rate == Rate(label="P7", failing=3, replays=10)  # the final ten replays of `retire`
    assert result.reproduced
    assert "P7 in 3 of 10 replays" in result.summary()
    assert isinstance(replayer.last_failure, P7Violation)


def test_a_failure_that_always_replays_costs_one_replay_per_candidate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    system = Sometimes(pattern=(True,))
    replayed: list[Steps] = []

    def replay(
        harness: object, steps: Steps, settle_timeout_s: float, controller: object = None
    ) -> BaseException | None:
        replayed.append(steps)
        return system(harness, steps, settle_timeout_s)

    monkeypatch.setattr(mm, "replay_once", replay)
    harness = fake_harness(tmp_path)
    always = Rate(label="P7", failing=10, replays=10)

    result, replayer = mm.minimise_on(harness, named("dispatch", "retire", "crash"), ("P7Violation", "P7"), always)  # type: ignore[arg-type]

    assert replayer.attempts == 1
    candidates, final = replayed[:-10], replayed[-10:]
    assert len({key_of(candidate) for candidate in candidates}) == len(candidates)  # each replayed once
    assert [names(steps) for steps in final] == [["retire"]] * 10
    assert result.rate == Rate(label="P7", failing=10, replays=10)
    assert "fails the same way on replay (P7 in 10 of 10 replays)" in result.summary()


class StagesKept(FailureWork):
    """The progress line's counters, keeping each stage begun."""

    stages: list[str]

    def begin(self, stage: str, replays_asked: int | None = None, steps_found: int | None = None) -> None:
        self.stages = [*getattr(self, "stages", []), stage]
        super().begin(stage, replays_asked, steps_found)


def test_the_progress_line_is_told_each_stage_replay_and_shorter_failing_sequence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only runs with `retire` fail: the minimiser goes from three steps to one, and the work's counters follow it
    through the stages, ending with the minimal sequence's measured rate."""
    monkeypatch.setattr(
        mm,
        "replay_once",
        lambda harness, steps, settle_timeout_s, controller: p7() if "retire" in names(steps) else None,
    )
    harness = fake_harness(tmp_path)
    work = StagesKept("P7", started_s=0.0)

    result, _ = mm.minimise_on(
        harness,  # type: ignore[arg-type]
        named("dispatch", "dispatch", "retire"),
        ("P7Violation", "P7"),
        replays=4,
        work=work,
    )

    assert names(result.steps) == ["retire"]
    assert work.stages == [MINIMISING, MEASURING_MINIMAL]
    assert (work.steps_found, work.steps_now) == (3, 1)
    assert (work.replays, work.replays_asked, work.failing) == (4, 4, 4)  # the minimal sequence's rate
    assert work.text(9.0) == "measuring the minimal sequence of P7: replay 4 of 4 (4 failing), 3 -> 1 steps, 9 s"
