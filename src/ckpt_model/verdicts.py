"""Verdicts of a run: what a failure is (violation, harness, checker, refused, unexpected), how it is printed, and
the exit code that says it. Shared by `ckpt-model check` and the fuzz commands."""

from __future__ import annotations

import enum
import traceback

from ckpt_model.errors import CoordinationError


class Exit(enum.IntEnum):
    PASSED = 0
    VIOLATION = 1
    UNJUDGED = 2
    USAGE = 3
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def leaves(error: BaseException) -> list[BaseException]:
    """The failures in what a run raised: Hypothesis raises a group for several (its own groups, such as a
    `FlakyFailure`, stay whole: they are one checker error)."""
    from hypothesis.errors import HypothesisException

    if isinstance(error, BaseExceptionGroup) and not isinstance(error, HypothesisException):
        return [leaf for part in error.exceptions for leaf in leaves(part)]
    return [error]


def kind_of(error: BaseException) -> str:
    """The failure's kind: violation, harness or checker (as `faultsearch.classify` says), refused or unexpected."""
    from ckpt_model.faultsearch import classify

    found = classify(error)
    if found:
        return found[0].kind
    return "refused" if isinstance(error, CoordinationError) else "unexpected"


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
