"""Every failure a search meets, and minimising them, without servers (`test_verdicts` classifies by hand).

The search itself runs tiny state machines defined here: two rules that break two properties (Hypothesis reports
both, as an exception group), a harness error, a failure that never comes back (Hypothesis calls it flaky), a
Hypothesis error about the machine itself, and a plain bug in the checker (which must propagate).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import attrs
import pytest
from hypothesis import Phase, settings
from hypothesis.errors import InvalidDefinition
from hypothesis.stateful import RuleBasedStateMachine, rule

from ckpt_model.errors import QuiescenceTimeout
from ckpt_model.properties.durability import P9Violation
from ckpt_model.properties.scope import P1Violation
from ckpt_model.results import regression
from ckpt_model.results.report import RULE_CALLS
from ckpt_model.results.reproduction import Rate
from ckpt_model.results.stats import SearchStats
from ckpt_model.results.verdicts import Failure, classify
from ckpt_model.search import minimise as mm
from ckpt_model.search.checking import within
from ckpt_model.search.faultsearch import Finding, minimised_failures, run_search
from ckpt_model.search.minimise import Minimised, Steps, minimise_error
from tests.unit.checker.fake_harness import fake_harness

SMALL = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.generate, Phase.shrink),
    print_blob=False,
)


# --- tiny machines --------------------------------------------------------------------------------------------


def p1() -> P1Violation:
    return P1Violation(rollout="r0", expected="replied", observed="silent")


def p9() -> P9Violation:
    return P9Violation(rollout=None, expected="verifies", observed="changed")


class TwoViolations(RuleBasedStateMachine):
    """P1 after exactly one `grow`, P9 after two or more: two distinct bugs, each with its own shortest example."""

    def __init__(self) -> None:
        super().__init__()
        self.grown = 0

    @rule()
    def grow(self) -> None:
        self.grown += 1

    @rule()
    def check_p1(self) -> None:
        if self.grown == 1:
            raise p1()

    @rule()
    def check_p9(self) -> None:
        if self.grown >= 2:
            raise p9()


class HarnessFails(RuleBasedStateMachine):
    @rule()
    def wait_quiet(self) -> None:
        raise QuiescenceTimeout(prediction="idle", observed="busy", pending=["r0"], timeout_s=1.0)


class FailsOnce(RuleBasedStateMachine):
    """Breaks P1 on its very first step and never again: the replay of the same steps passes."""

    steps: ClassVar[int] = 0

    @rule()
    def step(self) -> None:
        type(self).steps += 1
        if type(self).steps == 1:
            raise p1()


class NoRules(RuleBasedStateMachine):
    """Hypothesis refuses a machine without rules (`InvalidDefinition`): an error about the checker."""


class CheckerBug(RuleBasedStateMachine):
    @rule()
    def step(self) -> None:
        raise KeyError("r0")


class ViolationAndCheckerBug(TwoViolations):
    @rule()
    def check_bug(self) -> None:
        if self.grown >= 3:
            raise KeyError("r0")


# --- searching them -------------------------------------------------------------------------------------------


def finding(failures: tuple[Failure, ...]) -> Finding:
    return Finding(fault="(test)", failures=failures, examples=0, first_failure_s=None, total_s=0.0)


def test_two_distinct_violations_are_both_reported_each_with_its_own_steps() -> None:
    failures = run_search(TwoViolations, SMALL)

    assert [(f.kind, f.property_id, type(f.error)) for f in failures] == [
        ("violation", "P1", P1Violation),
        ("violation", "P9", P9Violation),
    ]
    assert failures[0].shrunk_steps == ("state.grow()", "state.check_p1()")
    assert failures[1].shrunk_steps == ("state.grow()", "state.grow()", "state.check_p9()")
    found = finding(failures)
    assert found.property_ids == ("P1", "P9")
    assert (found.property_id, found.shrunk_steps) == ("P1", failures[0].shrunk_steps)
    assert found.violation is failures[0].error


def test_a_harness_error_is_reported_as_harness_without_a_property() -> None:
    failures = run_search(HarnessFails, SMALL)

    assert [(f.kind, f.property_id, type(f.error)) for f in failures] == [("harness", None, QuiescenceTimeout)]
    assert failures[0].shrunk_steps == ("state.wait_quiet()",)
    found = finding(failures)
    assert found.violation is failures[0].error
    assert found.property_id is None
    assert found.property_ids == ()


def test_a_failure_that_does_not_come_back_is_the_violation_it_was_marked_intermittent() -> None:
    """Hypothesis reports it as `FlakyFailure`; the search reports the property it hid."""
    FailsOnce.steps = 0
    failures = run_search(FailsOnce, SMALL)

    assert [(f.kind, f.property_id, f.hidden_by) for f in failures] == [("violation", "P1", "FlakyFailure")]
    assert isinstance(failures[0].error, P1Violation)
    assert finding(failures).property_ids == ("P1",)
    notes = failures[0].error.__notes__
    assert any("Intermittent: Hypothesis reported this failure as FlakyFailure" in note for note in notes)


def test_a_hypothesis_error_about_the_machine_is_a_checker_error() -> None:
    failures = run_search(NoRules, SMALL)

    assert [(f.kind, type(f.error)) for f in failures] == [("checker", InvalidDefinition)]


def test_a_plain_exception_in_the_checker_propagates() -> None:
    with pytest.raises(KeyError, match="r0"):
        run_search(CheckerBug, SMALL)


def test_a_checker_bug_beside_violations_propagates_with_them() -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        run_search(ViolationAndCheckerBug, SMALL)

    assert {type(error) for error in raised.value.exceptions} == {P1Violation, P9Violation, KeyError}


def test_a_passing_machine_has_no_failures() -> None:
    class Passes(RuleBasedStateMachine):
        @rule()
        def step(self) -> None:
            pass

    found = finding(run_search(Passes, SMALL))
    assert found.failures == ()
    assert (found.violation, found.property_id, found.shrunk_steps, found.property_ids) == (None, None, (), ())


# --- minimising what a search found ---------------------------------------------------------------------------


def noted(error: BaseException, *steps: str) -> BaseException:
    for line in ("Failing test case: <state machine>", "state = M()", *steps, "state.teardown()"):
        error.add_note(line)
    return error


def minimised(before: int, after: int) -> Minimised:
    original = tuple(("dispatch", {}) for _ in range(before))
    return Minimised(
        original=original, steps=original[:after], replayed=5, cached=2, pass_removed=0, expanded=(), reproduced=True
    )


def test_a_minimised_failure_reports_the_minimal_steps_and_keeps_hypothesis_steps() -> None:
    long_p1 = noted(p1(), "state.a()", "state.b()", "state.c()", "state.d()")
    short_p9 = noted(p9(), "state.a()", "state.b()")
    flaky = noted(InvalidDefinition("bad"), "state.a()")
    failures = classify(BaseExceptionGroup("three", [long_p1, short_p9, flaky]))
    assert failures is not None
    asked: list[BaseException] = []

    def minimise_one(error: BaseException) -> Minimised | None:
        """As `minimise_error` does: the minimal steps go on the error's notes, in Hypothesis's form."""
        asked.append(error)
        if error is not long_p1:
            return None
        error.add_note("Minimal failing sequence (test):\nstate = CheckpointMachine()\nstate.d()\nstate.teardown()")
        return minimised(4, 1)

    result, figures = minimised_failures(failures, minimise_one)

    assert asked == [short_p9, long_p1]  # a checker error has no run of its own to minimise
    assert [(f.property_id, f.shrunk_steps) for f in result] == [
        ("P1", ("state.d()",)),  # now the shortest violation, so first
        ("P9", ("state.a()", "state.b()")),
        (None, ("state.a()",)),
    ]
    assert result[0].hypothesis_steps == ("state.a()", "state.b()", "state.c()", "state.d()")
    assert figures is not None
    assert figures.steps_after == 1  # the figures of the failure now first
    found = Finding(
        fault="(test)", failures=result, examples=0, first_failure_s=1.0, total_s=2.0, search_s=1.5, minimised=figures
    )
    assert found.shrunk_steps == ("state.d()",)


def test_when_the_first_failure_was_not_minimised_there_are_no_figures() -> None:
    failures = classify(BaseExceptionGroup("two", [noted(p1(), "state.a()"), noted(p9(), "state.a()", "state.b()")]))
    assert failures is not None

    def minimise_p9_only(error: BaseException) -> Minimised | None:
        return minimised(2, 2) if isinstance(error, P9Violation) else None

    result, figures = minimised_failures(failures, minimise_p9_only)

    assert [f.property_id for f in result] == ["P1", "P9"]
    assert figures is None


# --- an intermittent failure, reported with its property and rate ------------------------------------------------


class FailsFirstTime(RuleBasedStateMachine):
    """Breaks P1 on its first step only, carrying its rule calls as the machine's report does (`report.annotate`)."""

    steps: ClassVar[int] = 0

    @rule()
    def step(self) -> None:
        type(self).steps += 1
        if type(self).steps == 1:
            error = p1()
            setattr(error, RULE_CALLS, [("dispatch", {}), ("retire", {})])
            raise error


def three_in_ten() -> Callable[[object, Steps, float], BaseException | None]:
    """A hand-built flaky system: a run with a `retire` fails P1 on the 1st, 4th and 7th of every 10 such runs."""
    runs = itertools.count()

    def replay(
        harness: object, steps: Steps, settle_timeout_s: float, controller: object = None
    ) -> BaseException | None:
        if "retire" not in [name for name, _ in steps]:
            return None
        return p1() if next(runs) % 10 in (0, 3, 6) else None

    return replay


def test_an_intermittent_failure_is_reported_with_its_property_and_rate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    FailsFirstTime.steps = 0
    monkeypatch.setattr(mm, "replay_once", three_in_ten())
    harness = fake_harness(tmp_path)

    failures = run_search(FailsFirstTime, SMALL)
    result, figures = minimised_failures(failures, lambda error: minimise_error(harness, error, 10))  # type: ignore[arg-type]

    found = finding(result)
    assert [(f.kind, f.property_id, f.hidden_by) for f in result] == [("violation", "P1", "FlakyFailure")]
    assert found.headline == "P1 in 3 of 10 replays"  # the minimal sequence's rate
    assert found.shrunk_steps == ("state.retire()",)
    assert figures is not None
    assert figures.found_rate == Rate(label="P1", failing=3, replays=10)
    (written,) = (tmp_path / "regressions").glob("P1-native-*.json")  # named by the steps found
    document = regression.load(written)
    assert document["steps"] == [["retire", {}]]
    assert document["reproduction"]["text"] == "P1 in 3 of 10 replays"
    assert document["minimised"]["found_reproduction"]["text"] == "P1 in 3 of 10 replays"


def test_a_failure_that_never_replays_is_still_its_property_with_a_rate_of_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    FailsFirstTime.steps = 0
    monkeypatch.setattr(mm, "replay_once", lambda harness, steps, settle_timeout_s, controller: None)
    harness = fake_harness(tmp_path)

    failures = run_search(FailsFirstTime, SMALL)
    result, figures = minimised_failures(failures, lambda error: minimise_error(harness, error, 10))  # type: ignore[arg-type]

    assert figures is None  # nothing to judge candidates by
    assert finding(result).headline == "P1 in 0 of 10 replays"
    assert finding(result).shrunk_steps == ("state.dispatch()", "state.retire()")  # the run's own rule calls


# --- a search bounded by time ---------------------------------------------------------------------------------


class Counts(RuleBasedStateMachine):
    """Passes; counts the examples begun, and tells `stats` (when set) of each one finished, as a real machine's
    teardown does."""

    begun = 0
    stats: SearchStats | None = None

    def __init__(self) -> None:
        super().__init__()
        Counts.begun += 1

    @rule()
    def step(self) -> None:
        pass

    def teardown(self) -> None:
        if Counts.stats is not None:
            Counts.stats.example_finished(steps=1, crashes=0, seconds=10.0)


def test_a_search_bounded_by_time_stops_between_examples_and_says_so() -> None:
    """A fake clock that moves 10 s per example asked: with a limit of 35 s the third example begins at 20 s, and
    a fourth, at 30 s, would end past it; the search ends with no failure and `stopped_by_time` set."""
    Counts.begun = 0
    stats = SearchStats(started_s=0.0)
    ticks = itertools.count(0.0, 10.0)
    bounded = within(Counts, stats, 35.0, clock=lambda: next(ticks))

    Counts.stats = stats
    try:
        assert run_search(bounded, SMALL, stats.seen, stats) == ()
    finally:
        Counts.stats = None
    assert stats.stopped_by_time
    assert Counts.begun == 3


def test_a_search_that_ran_all_its_examples_was_not_stopped_by_time() -> None:
    stats = SearchStats(started_s=0.0)
    assert run_search(within(Counts, stats, 35.0, clock=lambda: 0.0), SMALL, stats.seen, stats) == ()
    assert not stats.stopped_by_time


def test_a_fault_not_found_within_the_time_limit_is_never_reported_as_nothing_found() -> None:
    stopped = Finding(
        fault="f", failures=(), examples=4, first_failure_s=None, total_s=61.0, max_time_s=60.0, stopped_by_time=True
    )
    assert stopped.violation is None
    assert stopped.headline == "not found within the time limit (60 s)"
    unbounded = attrs.evolve(stopped, max_time_s=None, stopped_by_time=False)
    assert unbounded.headline == "nothing found"
