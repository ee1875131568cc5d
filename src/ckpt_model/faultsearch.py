"""Run the state machine against a stack with one planted fault, and measure what finding it took.

Used by `tests/stateful/test_finds_faults.py` (the checker must catch every catalogued fault with the property
the catalogue names, in a short shrunk sequence) and by `benchmarks/checker.py` (the published figures).
"""

from __future__ import annotations

import time
from typing import Literal

import attrs
from hypothesis import HealthCheck, settings
from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ckpt_model.deployment import Harness, planted
from ckpt_model.errors import HarnessError, PropertyViolation
from ckpt_model.machine import machine_for
from ckpt_model.profiles import BASE
from ckpt_model.stats import SearchStats

# Derandomized, so a fault is found by the same examples on every run; no database, so a run stands alone.
FAULT_SEARCH = settings(
    BASE,
    max_examples=200,
    stateful_step_count=12,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)


def harness_for(fault: str) -> Harness:
    """A harness of the deployment the fault shows in (its topology and verify mode), with the fault planted."""
    chosen = planted(fault)
    harness = Harness.embedded(chosen.topology, faults=(fault,), verify_mode=chosen.verify_mode)
    harness.regressions_dir = harness.root / "regressions"  # expected failures: kept with the harness, not the user
    return harness


FailureKind = Literal["violation", "harness", "checker"]
KIND_ORDER: tuple[FailureKind, ...] = ("violation", "harness", "checker")


@attrs.frozen
class Failure:
    """One distinct failure a search met, after Hypothesis shrank it.

    `kind` is "violation" (the system under test broke a property), "harness" (the checker could not decide: a
    `HarnessError`) or "checker" (Hypothesis gave up on the checker itself: a flaky replay, the same steps not
    failing the same way twice, or another Hypothesis error). Only a violation has a `property_id`."""

    error: BaseException
    kind: FailureKind
    property_id: str | None
    shrunk_steps: tuple[str, ...]


@attrs.frozen
class Finding:
    """What one search produced: every distinct failure it met, and the times.

    `failures` lists violations first, then harness errors, then checker errors, each by fewest shrunk steps (the
    order Hypothesis reports them in is most complex first). The single-failure properties read the first one."""

    fault: str
    failures: tuple[Failure, ...]
    examples: int
    first_failure_s: float | None
    total_s: float

    @property
    def first(self) -> Failure | None:
        """The first failure: the simplest property violation if there is one."""
        return self.failures[0] if self.failures else None

    @property
    def violation(self) -> BaseException | None:
        """The first failure's exception (the simplest property violation if there is one); None if none."""
        return self.first.error if self.first is not None else None

    @property
    def property_id(self) -> str | None:
        return self.first.property_id if self.first is not None else None

    @property
    def shrunk_steps(self) -> tuple[str, ...]:
        return self.first.shrunk_steps if self.first is not None else ()

    @property
    def property_ids(self) -> tuple[str, ...]:
        """Every distinct property violated, in the order of `failures`."""
        return tuple(dict.fromkeys(f.property_id for f in self.failures if f.property_id is not None))


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
        return Failure(error=error, kind="checker", property_id=None, shrunk_steps=steps)
    if isinstance(error, PropertyViolation):
        return Failure(error=error, kind="violation", property_id=error.property_id, shrunk_steps=steps)
    if isinstance(error, HarnessError):
        return Failure(error=error, kind="harness", property_id=None, shrunk_steps=steps)
    return None


def classify(error: BaseException) -> tuple[Failure, ...] | None:
    """Every failure in what a search raised, in `Finding` order; None if any part of it is unknown.

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
    return tuple(sorted(failures, key=lambda failure: (KIND_ORDER.index(failure.kind), len(failure.shrunk_steps))))


def run_search(machine: type[RuleBasedStateMachine], search_settings: settings) -> tuple[Failure, ...]:
    """Run a state machine until it fails (and shrinks) or runs out of examples; return every failure it met.

    An exception that is neither a property violation, a harness error nor a Hypothesis error propagates."""
    try:
        run_state_machine_as_test(machine, settings=search_settings)
    except Exception as error:
        failures = classify(error)
        if failures is None:
            raise
        return failures
    return ()


def search(harness: Harness, search_settings: settings = FAULT_SEARCH) -> Finding:
    """Run the machine against the harness until it fails (and shrinks) or runs out of examples."""
    stats = SearchStats()
    failures = run_search(machine_for(harness, stats), search_settings)
    return Finding(
        fault=",".join(harness.faults) or "(none)",
        failures=failures,
        examples=stats.examples,
        first_failure_s=stats.first_failure_s,
        total_s=time.monotonic() - stats.started_s,
    )
