"""Run the state machine against a stack with one planted fault, and measure what finding it took.

Used by `tests/stateful/test_finds_faults.py` (the checker must catch every catalogued fault with the property
the catalogue names, in a short shrunk sequence) and by `benchmarks/checker.py` (the published figures).
"""

from __future__ import annotations

import time

import attrs
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from ckpt_model.deployment import Harness
from ckpt_model.errors import HarnessError, PropertyViolation
from ckpt_model.machine import SearchStats, machine_for
from ckpt_model.profiles import BASE
from fakes.faults import BY_NAME

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
    planted = BY_NAME[fault]
    harness = Harness(planted.topology, faults=(fault,), verify_mode=planted.verify_mode)
    harness.regressions_dir = harness.root / "regressions"  # expected failures: kept with the harness, not the user
    return harness


@attrs.frozen
class Finding:
    """What one search produced: the violation, the shrunk steps, and the times."""

    fault: str
    violation: BaseException | None
    shrunk_steps: tuple[str, ...]
    examples: int
    first_failure_s: float | None
    total_s: float

    @property
    def property_id(self) -> str | None:
        return getattr(self.violation, "property_id", None)


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


def search(harness: Harness, search_settings: settings = FAULT_SEARCH) -> Finding:
    """Run the machine until it fails (and shrinks) or runs out of examples."""
    stats = SearchStats()
    violation: PropertyViolation | HarnessError | None = None
    try:
        run_state_machine_as_test(machine_for(harness, stats), settings=search_settings)
    except (PropertyViolation, HarnessError) as error:
        violation = error
    finally:
        machine_for(harness, None)
    return Finding(
        fault=",".join(harness.faults) or "(none)",
        violation=violation,
        shrunk_steps=shrunk_steps(violation) if violation is not None else (),
        examples=stats.examples,
        first_failure_s=stats.first_failure_s,
        total_s=time.monotonic() - stats.started_s,
    )
