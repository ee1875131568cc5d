"""Run the state machine against a stack with one planted fault, minimise what it finds, and measure both.

Used by `tests/stateful/test_finds_faults.py` (the checker must catch every catalogued fault with the property
the catalogue names, in a short sequence) and by `benchmarks/checker.py` (the published figures). Each failure
the search meets is then minimised by `ckpt_model.minimise` on the same harness, so the sequence reported (and
written to the regression file) is 1-minimal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Literal

import attrs
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ckpt_model.deployment import Harness, planted
from ckpt_model.errors import HarnessError, PropertyViolation
from ckpt_model.machine import machine_for
from ckpt_model.minimise import Minimised, minimise_error
from ckpt_model.profiles import BASE
from ckpt_model.spec import DeploymentSpec
from ckpt_model.stats import SearchStats

# Derandomized, so a fault is found by the same examples on every run; no database, so a run stands alone.
# No shrink phase: the domain minimiser (`ckpt_model.minimise`) makes the failing run 1-minimal after the search,
# replaying far fewer candidates than Hypothesis's shrinker, which often hit its five-minute watchdog with 11 or
# 12 steps left. Without a shrink phase Hypothesis also stops at the first failure instead of searching on for
# other bugs (up to twice the examples it took), so one distinct failure is reported per search (figures in
# docs/faults.md). Up to 24 steps, not 12: Hypothesis stops most examples early (13 steps on average at 24, 8 at 12),
# and a fault behind a release, a checkpoint, a crash and a restore was drawn 4 times as often per second at 24.
FAULT_SEARCH = settings(
    BASE,
    max_examples=200,
    stateful_step_count=24,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
    phases=(Phase.explicit, Phase.generate),
)
# The same search with Hypothesis's shrinker (and its hunt for more distinct failures) before the minimiser:
# `benchmarks/checker.py --hypothesis-shrink` measures it against the default.
FAULT_SEARCH_WITH_SHRINK = settings(FAULT_SEARCH, phases=(Phase.explicit, Phase.generate, Phase.shrink))


def harness_for(fault: str) -> Harness:
    """A harness of the deployment the fault shows in (its topology, verify mode, token capture, generation cuts
    and policy model workers), with the fault planted."""
    harness = Harness.embedded(DeploymentSpec.for_faults([planted(fault)]))
    harness.regressions_dir = harness.root / "regressions"  # expected failures: kept with the harness, not the user
    return harness


FailureKind = Literal["violation", "harness", "checker"]
KIND_ORDER: tuple[FailureKind, ...] = ("violation", "harness", "checker")


@attrs.frozen
class Failure:
    """One distinct failure a search met, as Hypothesis reported it (shrunk if the settings shrink), then minimised.

    `kind` is "violation" (the system under test broke a property), "harness" (the checker could not decide: a
    `HarnessError`) or "checker" (Hypothesis gave up on the checker itself: a flaky replay, the same steps not
    failing the same way twice, or another Hypothesis error). Only a violation has a `property_id`.
    `shrunk_steps` is the sequence reported: the minimal one when minimising kept the failure, else Hypothesis's
    example (`hypothesis_steps`); `minimised` holds the minimiser's figures."""

    error: BaseException
    kind: FailureKind
    property_id: str | None
    shrunk_steps: tuple[str, ...]
    hypothesis_steps: tuple[str, ...] = ()
    minimised: Minimised | None = None


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
    search_s: float | None = None  # the Hypothesis search alone, before minimising

    @property
    def minimised(self) -> Minimised | None:
        """The first failure's minimiser figures; None if it was not minimised."""
        return self.first.minimised if self.first is not None else None

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
        return Failure(error=error, kind="checker", property_id=None, shrunk_steps=steps, hypothesis_steps=steps)
    if isinstance(error, PropertyViolation):
        return Failure(
            error=error, kind="violation", property_id=error.property_id, shrunk_steps=steps, hypothesis_steps=steps
        )
    if isinstance(error, HarnessError):
        return Failure(error=error, kind="harness", property_id=None, shrunk_steps=steps, hypothesis_steps=steps)
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
    return in_order(failures)


def in_order(failures: Iterable[Failure]) -> tuple[Failure, ...]:
    """Violations first, then harness errors, then checker errors, each by fewest reported steps."""
    return tuple(sorted(failures, key=lambda failure: (KIND_ORDER.index(failure.kind), len(failure.shrunk_steps))))


def minimised_failures(
    failures: Iterable[Failure], minimise_one: Callable[[BaseException], Minimised | None]
) -> tuple[Failure, ...]:
    """Each violation and harness error minimised (`minimise_one` adds the minimal sequence to the error's notes,
    where `shrunk_steps` reads it); a checker error has no run of its own to minimise."""
    updated = []
    for failure in failures:
        result = minimise_one(failure.error) if failure.kind != "checker" else None
        if result is not None:
            failure = attrs.evolve(failure, shrunk_steps=shrunk_steps(failure.error), minimised=result)
        updated.append(failure)
    return in_order(updated)


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


def search(harness: Harness, search_settings: settings = FAULT_SEARCH, *, minimise: bool = True) -> Finding:
    """Run the machine against the harness until it fails or runs out of examples; then minimise every failure
    on the same harness (unless `minimise` is False)."""
    stats = SearchStats()
    failures = run_search(machine_for(harness, stats), search_settings)
    search_s = time.monotonic() - stats.started_s
    if minimise:
        failures = minimised_failures(failures, lambda error: minimise_error(harness, error))
    return Finding(
        fault=",".join(harness.faults) or "(none)",
        failures=failures,
        examples=stats.examples,
        first_failure_s=stats.first_failure_s,
        total_s=time.monotonic() - stats.started_s,
        search_s=search_s,
    )
