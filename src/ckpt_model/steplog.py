"""What a machine ran: its steps as labels and as rule calls, the failure report attached to what a rule raised,
and the example's statistics.

The rule calls (outermost only, with their keyword arguments) are what a regression file replays; the labels, with
the model's names (`r0`, `c1`), are what the report prints. `step` wraps every rule: it records the call, marks the
machine broken while the rule runs (a broken machine is not drained at teardown), and attaches the report once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from hypothesis.stateful import precondition, rule
from hypothesis.strategies import SearchStrategy

from ckpt_model import timing
from ckpt_model.deployment import Harness
from ckpt_model.errors import CoordinationError, HarnessError, PropertyViolation
from ckpt_model.history import History
from ckpt_model.quiescence import observe
from ckpt_model.report import annotate
from ckpt_model.stats import SearchStats

F = TypeVar("F", bound=Callable[..., Any])
# What a rule may raise that ends the example with a report: a verdict, the harness, or a refusal.
REPORTED = (PropertyViolation, HarnessError, CoordinationError)


class StepLog:
    """The steps of one example, and whether the one running has finished."""

    def __init__(self, harness: Harness, history: History, stats: SearchStats | None) -> None:
        self.harness, self.history, self.stats = harness, history, stats
        self.labels: list[str] = []
        self.rule_calls: list[tuple[str, dict[str, Any]]] = []
        self.depth, self.draining, self.broken = 0, False, False
        self.started_s = time.monotonic()

    def report(self, error: BaseException) -> None:
        """Attach the failure report (steps, history, calls, logs, replay file) once."""
        annotated = annotate(
            error,
            harness=self.harness,
            steps=self.labels,
            history=self.history,
            rule_calls=self.rule_calls,
            backend_calls=lambda: observe(self.harness).calls,
        )
        if annotated and self.stats is not None:
            self.stats.failed(error)

    def drain(self, drain: Callable[[], None]) -> None:
        """Run the teardown's drain, unless a rule broke the machine (its state is unknown), reporting what the
        drain raises."""
        if self.broken:
            return
        self.labels.append("-- teardown: drain --")
        self.broken, self.draining = True, True
        try:
            with timing.span("drain"):
                drain()
        except REPORTED as error:
            self.report(error)
            raise
        self.broken = False

    def finished(self, crashes: int, crashes_inside: int) -> None:
        """The example ended: its rules (drain steps not counted), crashes and time go to the statistics."""
        if self.stats is not None:
            rules = sum(1 for label in self.labels if not label.startswith("-- "))
            elapsed_s = time.monotonic() - self.started_s
            self.stats.example_finished(rules, crashes, elapsed_s, crashes_inside=crashes_inside)


class Logged(Protocol):
    log: StepLog


def step(method: F) -> F:
    """Record the rule call, mark the machine broken while it runs, and report whatever it raises."""

    @functools.wraps(method)
    def wrapper(self: Logged, *args: Any, **kwargs: Any) -> Any:
        log = self.log
        if log.depth == 0 and not log.draining:
            log.rule_calls.append((method.__name__, dict(kwargs)))
        log.broken = True
        log.depth += 1
        try:
            result = method(self, *args, **kwargs)
        except REPORTED as error:
            log.report(error)
            raise
        finally:
            log.depth -= 1
        log.broken = False
        return result

    return wrapper  # type: ignore[return-value]


def action(enabled: Callable[[Any], bool], **arguments: SearchStrategy[Any]) -> Callable[[F], F]:
    """A rule of the machine: `precondition(enabled)`, `rule(**arguments)` and `step`, applied in that order
    (outermost first), as three decorators would be."""

    def decorate(method: F) -> F:
        return precondition(enabled)(rule(**arguments)(step(method)))  # type: ignore[call-overload]

    return decorate
