"""Verdicts of a run: what a failure is (violation, harness, checker, refused, unexpected), how it is printed, and
the exit code that says it. Shared by `ckpt-model check`, the fuzz commands and the fault searches.

It reads only exceptions and their notes, so it sits low: whatever runs the machine (the searches, the minimiser,
the commands) asks it what a failure was, never the other way round."""

from __future__ import annotations

import enum
import traceback
from collections.abc import Iterable
from typing import Literal

import attrs
from hypothesis.errors import HypothesisException

from ckpt_model.errors import CoordinationError, HarnessError, PropertyViolation


class Exit(enum.IntEnum):
    PASSED = 0
    VIOLATION = 1
    UNJUDGED = 2
    USAGE = 3
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def leaves(error: BaseException) -> list[BaseException]:
    """The failures in what a run raised: Hypothesis raises a group for several (its own groups, such as a
    `FlakyFailure`, stay whole: they are one checker error)."""
    if isinstance(error, BaseExceptionGroup) and not isinstance(error, HypothesisException):
        return [leaf for part in error.exceptions for leaf in leaves(part)]
    return [error]


def kind_of(error: BaseException) -> str:
    """The failure's kind: violation, harness or checker (as `classify` says), refused or unexpected."""
    found = classify(error)
    if found:
        return found[0].kind
    return "refused" if isinstance(error, CoordinationError) else "unexpected"


FailureKind = Literal["violation", "harness", "checker"]
KIND_ORDER: tuple[FailureKind, ...] = ("violation", "harness", "checker")


@attrs.frozen
class Failure:
    """One distinct failure a run raised, as Hypothesis reported it (shrunk if the settings shrink).

    `kind` is "violation" (the system under test broke a property), "harness" (the checker could not decide: a
    `HarnessError`) or "checker" (Hypothesis gave up on the checker itself: a flaky replay, the same steps not
    failing the same way twice, or another Hypothesis error). Only a violation has a `property_id`.
    `shrunk_steps` is the sequence reported: Hypothesis's example (`hypothesis_steps`), or the minimal one once a
    minimiser put it on the error's notes (`faultsearch.minimised_failures`)."""

    error: BaseException
    kind: FailureKind
    property_id: str | None
    shrunk_steps: tuple[str, ...]
    hypothesis_steps: tuple[str, ...] = ()


def shrunk_steps(error: BaseException) -> tuple[str, ...]:
    """The rule calls of the failing example Hypothesis attached to the exception, teardown excluded.

    Read from the lines after the last `state = ...` line, so it holds whatever header a Hypothesis version
    puts before them ("Falsifying example:", "Failing test case: ...")."""
    lines = [line.strip() for note in getattr(error, "__notes__", ()) for line in str(note).splitlines()]
    starts = [index for index, line in enumerate(lines) if line.startswith("state = ")]
    if not starts:
        return ()
    return tuple(
        line for line in lines[starts[-1] + 1 :] if line.startswith("state.") and not line.startswith("state.teardown(")
    )


def classify_one(error: BaseException) -> Failure | None:
    """The failure one exception Hypothesis raised stands for, or None if it is none we know (a checker bug).

    Hypothesis errors are checked first: a `FlakyFailure` is an exception group that holds the violation which did
    not fail again, and that violation must not count as found."""
    steps = shrunk_steps(error)
    if isinstance(error, HypothesisException):
        return Failure(error=error, kind="checker", property_id=None, shrunk_steps=steps, hypothesis_steps=steps)
    if isinstance(error, PropertyViolation):
        return Failure(
            error=error, kind="violation", property_id=error.property_id, shrunk_steps=steps, hypothesis_steps=steps
        )
    if isinstance(error, HarnessError):
        return Failure(error=error, kind="harness", property_id=None, shrunk_steps=steps, hypothesis_steps=steps)
    return None


def classify(error: BaseException) -> tuple[Failure, ...] | None:
    """Every failure in what a run raised, in `in_order`; None if any part of it is unknown.

    Hypothesis raises one exception for one distinct failure, and an exception group of them (each shrunk, with its
    own notes) for several. None tells the caller to re-raise the whole error: an exception the checker did not
    expect is a bug in the checker, and the violations beside it stay visible in the group."""
    if isinstance(error, BaseExceptionGroup) and not isinstance(error, HypothesisException):
        parts = [classify(part) for part in error.exceptions]
        if any(part is None for part in parts):
            return None
        failures = [failure for part in parts if part is not None for failure in part]
    else:
        one = classify_one(error)
        if one is None:
            return None
        failures = [one]
    return in_order(failures)


def in_order(failures: Iterable[Failure]) -> tuple[Failure, ...]:
    """Violations first, then harness errors, then checker errors, each by fewest reported steps (Hypothesis
    reports the most complex first)."""
    return tuple(sorted(failures, key=lambda failure: (KIND_ORDER.index(failure.kind), len(failure.shrunk_steps))))


WHY_UNJUDGED = {
    "harness": "the harness could not do its job (the outcome is unknown)",
    "refused": "a participant refused a control call where the checker did not expect it (the outcome is unknown)",
    "checker": "Hypothesis gave up on the checker itself: a bug in the checker (the outcome is unknown)",
    "unexpected": "an exception the checker did not expect: a bug in the checker (the outcome is unknown)",
}


def report_failure(error: BaseException) -> int:
    """Print every failure the run raised, violations first; exit 1 if any is a violation, else 2."""
    failures = [(kind_of(leaf), leaf) for leaf in leaves(error)]
    violations = [leaf for kind, leaf in failures if kind == "violation"]
    others = [(kind, leaf) for kind, leaf in failures if kind != "violation"]
    for number, violation in enumerate(violations, 1):
        print(f"\n=== property violation {number} of {len(violations)} ===", flush=True)
        print(exception_text(violation), flush=True)
    for kind, leaf in others:
        print(f"\n=== could not judge: {WHY_UNJUDGED[kind]} ===", flush=True)
        print(exception_text(leaf, with_traceback=kind in ("checker", "unexpected")), flush=True)
    if violations:
        ids = ", ".join(dict.fromkeys(getattr(v, "property_id", "P?") for v in violations))
        print(f"\nFAILED: property violation ({ids})", flush=True)
        return Exit.VIOLATION
    print(f"\nCOULD NOT JUDGE: {', '.join(dict.fromkeys(kind for kind, _ in others))}", flush=True)
    return Exit.UNJUDGED


def exception_text(error: BaseException, *, with_traceback: bool = False) -> str:
    """The exception's type, message and notes (Hypothesis's steps, the failure report, how to replay)."""
    lines = traceback.format_exception(error) if with_traceback else traceback.format_exception_only(error)
    return "".join(lines).rstrip()
