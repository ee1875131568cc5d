"""What a failure is: the steps read off its notes, its kind, and the order failures are reported in; on hand-built
exceptions, without a search (`test_faultsearch` runs tiny machines)."""

from __future__ import annotations

import pytest
from hypothesis.errors import FlakyFailure, InvalidDefinition

from ckpt_model.errors import CoordinationError, ParticipantFailure, QuiescenceTimeout
from ckpt_model.properties import P1Violation, P9Violation
from ckpt_model.verdicts import classify, kind_of, shrunk_steps


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


def test_a_flaky_failure_group_is_one_checker_error_whatever_it_holds() -> None:
    failures = classify(FlakyFailure("Inconsistent results", [p1()]))

    assert failures is not None
    assert [(f.kind, f.property_id) for f in failures] == [("checker", None)]


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
