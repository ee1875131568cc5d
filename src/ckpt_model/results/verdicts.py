"""Verdicts of a run: what a failure is (violation, harness, checker, refused, unexpected), how it is printed, and
the exit code that says it. Shared by `ckpt-model check`, the fuzz commands and the fault searches.

It reads only exceptions and their notes, so it sits low: whatever runs the machine (the searches, the minimiser,
the commands) asks it what a failure was, never the other way round."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs
from hypothesis.errors import HypothesisException

from ckpt_model.errors import CoordinationError, HarnessError, PropertyViolation
from ckpt_model.results import notes
from ckpt_model.results.failure_text import failure_text
from ckpt_model.results.reproduction import Rate, rate_of


class Exit(enum.IntEnum):
    PASSED = 0
    VIOLATION = 1
    UNJUDGED = 2
    USAGE = 3
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
    TERMINATED = 143  # 128 + SIGTERM (`kill`, a CI job's timeout), which unwinds as Ctrl-C does


HIDDEN_BY = "_ckpt_hidden_by"


def leaves(error: BaseException, seen: Sequence[BaseException] = ()) -> list[BaseException]:
    """The failures in what a run raised: Hypothesis raises a group for several. A Hypothesis report that holds
    failures (a `FlakyFailure`: the steps failed, then did not fail the same way again) stands for them, marked as
    intermittent (`opened`); one that holds none stands for the violations the machine raised in the run
    (`seen`, for a `FlakyStrategyDefinition`, which Hypothesis raises without the failure), and else for itself,
    a checker error."""
    if isinstance(error, HypothesisException):
        return opened(error, seen) or [error]
    if isinstance(error, BaseExceptionGroup):
        return list(dict.fromkeys(leaf for part in error.exceptions for leaf in leaves(part, seen)))
    return [error]


def opened(report: HypothesisException, seen: Sequence[BaseException] = ()) -> list[BaseException]:
    """The violations and harness errors a Hypothesis report hid (inside its group or its cause and context, else
    the violations in `seen`), each marked with the report's name and given its steps (`hidden_by`)."""
    hidden = hidden_in(report) or [error for error in seen if isinstance(error, PropertyViolation)]
    for failure in hidden:
        if getattr(failure, HIDDEN_BY, None) is None:
            setattr(failure, HIDDEN_BY, type(report).__name__)
            notes.add(failure, notes.Kind.INTERMITTENT, _hidden_note(report))
    return hidden


def hidden_in(report: BaseException) -> list[BaseException]:
    """The violations and harness errors inside a Hypothesis report, each once."""
    parts = list(report.exceptions) if isinstance(report, BaseExceptionGroup) else []
    parts += [linked for linked in (report.__cause__, report.__context__) if linked is not None]
    found: dict[int, BaseException] = {}
    for part in parts:
        if isinstance(part, (PropertyViolation, HarnessError)):
            found.setdefault(id(part), part)
        elif isinstance(part, BaseExceptionGroup | HypothesisException):
            found.update((id(inner), inner) for inner in hidden_in(part))
    return list(found.values())


def hidden_by(error: BaseException) -> str | None:
    """The Hypothesis report that hid this failure ("FlakyFailure"), or None: an intermittent failure."""
    return getattr(error, HIDDEN_BY, None)


def _hidden_note(report: HypothesisException) -> str:
    lines = [
        f"Intermittent: Hypothesis reported this failure as {type(report).__name__} (the same steps did not fail "
        "the same way when replayed); it is the property it broke, with its reproduction rate where measured"
    ]
    steps = shrunk_steps(report)
    if steps:
        machine = [line for line in _note_lines(report) if line.startswith("state = ")][-1]
        lines += ["Failing example Hypothesis reported:", machine, *steps, "state.teardown()"]
    return "\n".join(lines)


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
    `HarnessError`) or "checker" (Hypothesis gave up on the checker itself, with no failure of the system inside).
    Only a violation has a `property_id`. A failure Hypothesis reported as flaky is the violation (or harness
    error) it hid, with `hidden_by` naming the report; `rate` is how often its steps failed the same way when
    replayed, once measured (`ckpt_model.search.minimise.reproduce_error`).
    `shrunk_steps` is the sequence reported: Hypothesis's example (`hypothesis_steps`), or the minimal one once a
    minimiser put it on the error's notes (`faultsearch.minimised_failures`)."""

    error: BaseException
    kind: FailureKind
    property_id: str | None
    shrunk_steps: tuple[str, ...]
    hypothesis_steps: tuple[str, ...] = ()
    hidden_by: str | None = None
    rate: Rate | None = None

    @property
    def headline(self) -> str:
        """What failed and how often: "P5 in 3 of 10 replays", "P5 (intermittent: FlakyFailure)", "P5"."""
        return headline(self.error)


def headline(error: BaseException) -> str:
    """A failure's property (or class name) with its reproduction rate, or its Hypothesis report when the rate was
    not measured."""
    rate = rate_of(error)
    if rate is not None:
        return rate.text
    label = getattr(error, "property_id", None) or type(error).__name__
    reported = hidden_by(error)
    return f"{label} (intermittent: {reported})" if reported else label


def shrunk_steps(error: BaseException) -> tuple[str, ...]:
    """The rule calls of the failing example Hypothesis attached to the exception, teardown excluded.

    Read from the lines after the last `state = ...` line, so it holds whatever header a Hypothesis version
    puts before them ("Falsifying example:", "Failing test case: ...")."""
    lines = _note_lines(error)
    starts = [index for index, line in enumerate(lines) if line.startswith("state = ")]
    if not starts:
        return ()
    return tuple(
        line for line in lines[starts[-1] + 1 :] if line.startswith("state.") and not line.startswith("state.teardown(")
    )


def _note_lines(error: BaseException) -> list[str]:
    return [line.strip() for note in getattr(error, "__notes__", ()) for line in str(note).splitlines()]


def classify_one(error: BaseException) -> Failure | None:
    """The failure one exception stands for, or None if it is none we know (a checker bug).

    Hypothesis errors are checked first: one still whole after `leaves` hid no failure of the system, so it is
    about the checker."""
    steps = shrunk_steps(error)
    if isinstance(error, HypothesisException):
        return Failure(error=error, kind="checker", property_id=None, shrunk_steps=steps, hypothesis_steps=steps)
    found: dict[str, Any] = {"shrunk_steps": steps, "hypothesis_steps": steps}
    found.update(hidden_by=hidden_by(error), rate=rate_of(error))
    if isinstance(error, PropertyViolation):
        return Failure(error=error, kind="violation", property_id=error.property_id, **found)
    if isinstance(error, HarnessError):
        return Failure(error=error, kind="harness", property_id=None, **found)
    return None


def classify(error: BaseException, seen: Sequence[BaseException] = ()) -> tuple[Failure, ...] | None:
    """Every failure in what a run raised (`leaves`: a flaky report counts as the failures it hid, or as those
    in `seen`, the failures the machine raised in the run), in `in_order`; None if any part of it is unknown.

    Hypothesis raises one exception for one distinct failure, and an exception group of them (each shrunk, with its
    own notes) for several. None tells the caller to re-raise the whole error: an exception the checker did not
    expect is a bug in the checker, and the violations beside it stay visible in the group."""
    failures = [classify_one(leaf) for leaf in leaves(error, seen)]
    if any(failure is None for failure in failures):
        return None
    return in_order(failure for failure in failures if failure is not None)


def in_order(failures: Iterable[Failure]) -> tuple[Failure, ...]:
    """Violations first, then harness errors, then checker errors, each by fewest reported steps (Hypothesis
    reports the most complex first)."""
    return tuple(sorted(failures, key=lambda failure: (KIND_ORDER.index(failure.kind), len(failure.shrunk_steps))))


WHY_UNJUDGED = {
    "harness": "the harness could not do its job (the outcome is unknown)",
    "refused": "a participant refused a control call where the checker did not expect it (the outcome is unknown)",
    "checker": "Hypothesis gave up on the checker itself, with no failure of the system inside: a bug in the checker "
    "(the outcome is unknown)",
    "unexpected": "an exception the checker did not expect: a bug in the checker (the outcome is unknown)",
}


def report_failure(
    error: BaseException,
    seen: Sequence[BaseException] = (),
    *,
    verbose: bool = False,
    replay_command: str | None = None,
) -> int:
    """Print every failure the run raised (`failure_report`); exit 1 if any is a violation, else 2."""
    code, text = failure_report(error, seen, verbose=verbose, replay_command=replay_command)
    print(text, flush=True)
    return code


def failure_report(
    error: BaseException,
    seen: Sequence[BaseException] = (),
    *,
    verbose: bool = False,
    replay_command: str | None = None,
) -> tuple[Exit, str]:
    """Every failure the run raised, violations first (each with its reproduction rate where measured), and the
    exit code that says it: 1 if any is a violation, else 2. `seen`: the failures the machine raised in the run
    (`leaves`); `verbose`: with the example found before minimising and Hypothesis's blob; `replay_command`: the
    command that replays it where the failure came from a regression file already (`failure_text`). The CLI prints
    it; the pytest plugin's `ckpt_check` fails its test with it."""
    failures = [(kind_of(leaf), leaf) for leaf in leaves(error, seen)]
    violations = [leaf for kind, leaf in failures if kind == "violation"]
    others = [(kind, leaf) for kind, leaf in failures if kind != "violation"]
    lines: list[str] = []
    for number, violation in enumerate(violations, 1):
        lines += [f"\n=== property violation {number} of {len(violations)}: {headline(violation)} ==="]
        lines += [exception_text(violation, verbose=verbose, replay_command=replay_command)]
    for kind, leaf in others:
        lines += [f"\n=== could not judge: {WHY_UNJUDGED[kind]} ==="]
        traced = kind in ("checker", "unexpected")
        lines += [exception_text(leaf, with_traceback=traced, verbose=verbose, replay_command=replay_command)]
    if violations:
        ids = ", ".join(dict.fromkeys(headline(violation) for violation in violations))
        return Exit.VIOLATION, "\n".join([*lines, f"\nFAILED: property violation ({ids})"])
    kinds = ", ".join(dict.fromkeys(kind for kind, _ in others))
    return Exit.UNJUDGED, "\n".join([*lines, f"\nCOULD NOT JUDGE: {kinds}"])


def exception_text(
    error: BaseException, *, with_traceback: bool = False, verbose: bool = False, replay_command: str | None = None
) -> str:
    """The exception's type, message and notes, minimal failure first (`failure_text`)."""
    return failure_text(error, verbose=verbose, with_traceback=with_traceback, replay_command=replay_command)


def quiet_line(error: BaseException, deployment: str, regression_file: str | None = None) -> str:
    """One failure in one line (`--quiet`): its verdict, property, deployment, what broke, its rate and steps, and
    the command that replays it."""
    kind = kind_of(error)
    steps = len(shrunk_steps(error))
    if kind == "violation":
        what = getattr(error, "title", None) or str(error).partition("\n")[0]
        verdict = f"FAILED {getattr(error, 'property_id', None) or type(error).__name__}"
    else:
        what = str(error).partition("\n")[0] or type(error).__name__
        verdict = f"COULD NOT JUDGE {type(error).__name__}"
    counted = f"{steps} step{'' if steps == 1 else 's'}" if steps else ""
    figures = ", ".join(part for part in (headline(error), counted) if part)
    replay = f" replay: ckpt-model replay {regression_file}" if regression_file else ""
    return f"{verdict} {deployment}: {what} ({figures}){replay}"
