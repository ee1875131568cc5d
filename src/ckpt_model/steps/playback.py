"""Rule calls played on a machine outside Hypothesis: a fixed scenario, a regression file, a minimiser's candidate.

A step runs only if the machine would draw it there (every precondition of its rule holds, as Hypothesis requires);
one it would not is a harness error (`StepNotEnabled`), since what the steps show then no longer means what they
say. The teardown runs whatever a step raised, as Hypothesis runs it. Every machine plays the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hypothesis.stateful import RULE_MARKER, RuleBasedStateMachine

from ckpt_model.errors import StepNotEnabled


def play(machine: RuleBasedStateMachine, steps: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """Run the rule calls in order on `machine`, each only if enabled, then its teardown; raises what they raise."""
    try:
        for index, (rule, arguments) in enumerate(steps, start=1):
            check_enabled(machine, rule, arguments, index)
            getattr(machine, rule)(**arguments)
    finally:
        machine.teardown()


def check_enabled(machine: RuleBasedStateMachine, rule: str, arguments: Mapping[str, Any], index: int) -> None:
    """Raise `StepNotEnabled` unless every precondition of `rule` holds now, as Hypothesis would require."""
    declared = getattr(getattr(type(machine), rule, None), RULE_MARKER, None)
    if declared is None:
        raise StepNotEnabled(step=f"{rule}({arguments})", index=index, rule=f"{rule} (no such rule)")
    if not all(precondition(machine) for precondition in declared.preconditions):
        raise StepNotEnabled(step=f"{rule}({dict(arguments)})", index=index, rule=rule)
