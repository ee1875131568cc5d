"""What a failure is: the steps read off its notes, its kind, and the order failures are reported in; on hand-built
exceptions, without a search (`test_faultsearch` runs tiny machines)."""

from __future__ import annotations

import pytest
from hypothesis.errors import FlakyFailure, FlakyStrategyDefinition, InvalidDefinition

from ckpt_model.errors import CoordinationError, ParticipantFailure, QuiescenceTimeout
from ckpt_model.properties.durability import P9Violation
from ckpt_model.properties.scope import P1Violation
from ckpt_model.results.reproduction import Rate, record
from ckpt_model.results.verdicts import (
    Exit,
    classify,
    failure_report,
    headline,
    kind_of,
    leaves,
    report_failure,
    shrunk_steps,
)


def p1() -> P1Violation:
    return P1Violation(rollout="r0", expected="replied", observed="silent")


def p9() -> P9Violation:
    return P9Violation(rollout=None, expected="verifies", observed="changed")


# --- the steps a failure reports ------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Falsifying example:", "Failing test case: <state machine>"])
def test_shrunk_steps_are_the_rule_calls_after_the_machine(header: str) -> None:
    error = AssertionError("P9")
    error.add_note("Steps (model names):\n  1. prepare() -> c1")
    for line in [header, "state = CheckpointMachine()", "state.prepare()", "state.commit()", "state.teardown()"]:
        error.add_note(line)
    assert shrunk_steps(error) == ("state.prepare()", "state.commit()")


def test_no_example_means_no_steps() -> None:
    assert shrunk_steps(AssertionError("no notes")) == ()


# --- classifying ----------------------------------------------------------------------------------------------


def noted(error: BaseException, *steps: str) -> BaseException:
    for line in ("Failing test case: <state machine>", "state = M()", *steps, "state.teardown()"):
        error.add_note(line)
    return error


def test_violations_come_first_then_harness_then_checker_each_by_fewest_steps() -> None:
    group = BaseExceptionGroup(
        "Hypothesis found 4 distinct failures.",
        [
            noted(InvalidDefinition("bad"), "state.a()"),
            noted(QuiescenceTimeout(prediction="p", observed="o", pending=()), "state.a()"),
            noted(p9(), "state.a()", "state.b()", "state.c()"),
            noted(p1(), "state.a()"),
        ],
    )

    failures = classify(group)

    assert failures is not None
    assert [(f.kind, f.property_id, len(f.shrunk_steps)) for f in failures] == [
        ("violation", "P1", 1),
        ("violation", "P9", 3),
        ("harness", None, 1),
        ("checker", None, 1),
    ]


def test_a_flaky_failure_is_the_violation_it_hid_marked_intermittent_with_hypothesis_steps() -> None:
    hidden = p1()
    flaky = noted(FlakyFailure("Inconsistent results", [hidden]), "state.a()", "state.b()")

    failures = classify(flaky)

    assert failures is not None
    assert [(f.kind, f.property_id, f.hidden_by, f.error) for f in failures] == [
        ("violation", "P1", "FlakyFailure", hidden)
    ]
    assert failures[0].shrunk_steps == ("state.a()", "state.b()")  # Hypothesis's steps, given to the violation
    assert failures[0].headline == "P1 (intermittent: FlakyFailure)"
    assert kind_of(hidden) == "violation"
    # The note names the machine Hypothesis ran (either controller's), not the trainer's always.
    assert "state = M()\nstate.a()\nstate.b()\nstate.teardown()" in hidden.__notes__[-1]


def test_a_flaky_failure_opened_twice_notes_its_report_once() -> None:
    hidden = p1()
    flaky = FlakyFailure("Inconsistent results", [hidden])

    assert leaves(flaky) == leaves(flaky) == [hidden]
    assert sum("Intermittent" in note for note in hidden.__notes__) == 1


def test_a_flaky_failure_holding_a_harness_error_is_that_harness_error() -> None:
    timeout = QuiescenceTimeout(prediction="p", observed="o", pending=())
    failures = classify(FlakyFailure("Inconsistent results", [timeout]))

    assert failures is not None
    assert [(f.kind, f.hidden_by) for f in failures] == [("harness", "FlakyFailure")]


def test_a_flaky_strategy_definition_is_the_violation_in_its_context() -> None:
    hidden = p9()
    try:
        try:
            raise hidden
        except P9Violation:
            raise FlakyStrategyDefinition("Inconsistent data generation!") from None
    except FlakyStrategyDefinition as flaky:
        flaky.__context__ = hidden  # `from None` only hides it from the traceback; Hypothesis may keep it
        failures = classify(flaky)

    assert failures is not None
    assert [(f.kind, f.property_id, f.hidden_by) for f in failures] == [("violation", "P9", "FlakyStrategyDefinition")]


def test_a_flaky_report_with_nothing_inside_is_the_violation_the_machine_raised() -> None:
    seen_p9 = p9()
    flaky = FlakyStrategyDefinition("Inconsistent data generation!")

    failures = classify(flaky, seen=[seen_p9])

    assert failures is not None
    assert [(f.kind, f.property_id, f.hidden_by, f.error) for f in failures] == [
        ("violation", "P9", "FlakyStrategyDefinition", seen_p9)
    ]


def test_a_flaky_report_with_nothing_inside_and_nothing_seen_stays_a_checker_error() -> None:
    flaky = FlakyStrategyDefinition("Inconsistent data generation!")
    harness_seen = QuiescenceTimeout(prediction="p", observed="o", pending=())

    failures = classify(flaky, seen=[harness_seen])  # only a violation the machine raised counts

    assert failures is not None
    assert [(f.kind, f.property_id, f.error) for f in failures] == [("checker", None, flaky)]


def test_a_measured_rate_heads_the_failure() -> None:
    violation = p9()
    record(violation, Rate(label="P9", failing=3, replays=10))

    failures = classify(FlakyFailure("Inconsistent results", [violation]))

    assert failures is not None
    assert failures[0].rate == Rate(label="P9", failing=3, replays=10)
    assert failures[0].headline == headline(violation) == "P9 in 3 of 10 replays"


def test_a_report_of_an_intermittent_violation_is_a_violation_with_its_rate(capsys: pytest.CaptureFixture[str]) -> None:
    violation = p9()
    record(violation, Rate(label="P9", failing=3, replays=10))

    code = report_failure(FlakyFailure("Inconsistent results", [violation]))

    out = capsys.readouterr().out
    assert code == Exit.VIOLATION
    assert "=== property violation 1 of 1: P9 in 3 of 10 replays ===" in out
    assert "FAILED: property violation (P9 in 3 of 10 replays)" in out
    assert "could not judge" not in out


def test_the_report_as_text_is_what_report_failure_prints(capsys: pytest.CaptureFixture[str]) -> None:
    violation, harness_error = p9(), QuiescenceTimeout(prediction="p", observed="o", pending=())

    code, text = failure_report(ExceptionGroup("two", [violation, harness_error]))
    printed = report_failure(ExceptionGroup("two", [violation, harness_error]))

    assert (code, printed) == (Exit.VIOLATION, Exit.VIOLATION)
    assert capsys.readouterr().out == text + "\n"
    assert text.index("=== property violation 1 of 1") < text.index("=== could not judge") < text.index("FAILED")


def test_a_report_with_no_violation_could_not_judge() -> None:
    code, text = failure_report(QuiescenceTimeout(prediction="p", observed="o", pending=()))

    assert code == Exit.UNJUDGED
    assert text.endswith("COULD NOT JUDGE: harness")


def test_an_unknown_exception_is_not_classified() -> None:
    assert classify(RuntimeError("bug")) is None
    assert classify(ExceptionGroup("two", [p1(), RuntimeError("bug")])) is None


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (p1(), "violation"),
        (QuiescenceTimeout(prediction="p", observed="o", pending=()), "harness"),
        (InvalidDefinition("bad"), "checker"),
        (CoordinationError("commit", {"agent": ParticipantFailure("agent", 409, "invalid_phase", "x")}), "refused"),
        (RuntimeError("bug"), "unexpected"),
    ],
    ids=["violation", "harness", "checker", "refused", "unexpected"],
)
def test_kind_of_names_every_kind_of_failure(error: BaseException, kind: str) -> None:
    assert kind_of(error) == kind
