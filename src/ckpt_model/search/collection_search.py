"""A search of the collection machine that stops at its first failure, then the domain minimiser
(`ckpt_model.search.minimise.minimise`) cuts the failing example's rule calls down to a 1-minimal sequence.

Hypothesis's own shrink of this machine spent over five minutes on one planted fault and stopped, as it does on the
trainer machine (`ckpt_model.search.checking`): every attempt replays the machine with fresh processes. The minimiser
replays rule calls instead (`replay`: a fresh machine on the same harness, each step's preconditions checked, then
the teardown), and learns from each replay as `ckpt_model.search.minimise.Replayer` does: a prefix that failed the
expected way before its last step fails whatever follows it, and a step not enabled after a prefix is not enabled
after it again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from ckpt_model.collection.machine import CollectionMachine, collection_machine_for, enabled
from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import PropertyViolation, StepNotEnabled
from ckpt_model.results.verdicts import leaves
from ckpt_model.search import checking
from ckpt_model.search.minimise import Minimised, Signature, Step, Steps, key_of, minimise, signature


@attrs.frozen
class Replayed:
    """One replay's outcome: what it raised (None: passed) and how many steps ran before it did."""

    error: BaseException | None
    steps_run: int


def replay(harness: Harness, faults: Sequence[str], steps: Sequence[Step]) -> Replayed:
    """The steps once on a fresh collection machine, then its teardown (the collection drained, P25 judged)."""
    machine = collection_machine_for(harness, tuple(faults))()
    index = 0
    try:
        for index, (name, arguments) in enumerate(steps):
            if not enabled(machine, name):
                raise StepNotEnabled(step=name, index=index, rule=name)
            getattr(machine, name)(**arguments)
        index = len(steps)
        machine.teardown()
    except Exception as error:
        return Replayed(error, index)
    finally:
        machine.stop()
    return Replayed(None, len(steps))


@attrs.define
class CollectionReplayer:
    """The minimiser's predicate: does a candidate fail with `expected` (the property and its class)?"""

    harness: Harness
    faults: tuple[str, ...]
    expected: Signature
    replays: int = 0
    last_failure: BaseException | None = None
    disabled: set[object] = attrs.field(factory=set)
    failing: set[object] = attrs.field(factory=set)

    def __call__(self, steps: Steps) -> bool:
        prefixes = {key_of(steps[:length]) for length in range(1, len(steps) + 1)}
        if prefixes & self.disabled:
            return False
        if prefixes & self.failing:
            return True
        return self.confirm(steps)

    def confirm(self, steps: Steps) -> bool:
        """Replay for real, and learn from it."""
        self.replays += 1
        outcome = replay(self.harness, self.faults, steps)
        if isinstance(outcome.error, StepNotEnabled):
            self.disabled.add(key_of(steps[: outcome.steps_run + 1]))
            return False
        failed = signature(outcome.error) == self.expected
        if failed:
            self.last_failure = outcome.error
            if outcome.steps_run < len(steps):  # it failed inside a step: whatever follows it fails too
                self.failing.add(key_of(steps[: outcome.steps_run + 1]))
        return failed


@attrs.frozen
class CollectionFinding:
    """What a search found: the failure it raised, the failing example's rule calls, their minimal form (with the
    violation the minimal sequence raised), and the seconds each part took."""

    error: BaseException | None
    violation: PropertyViolation | None = None
    found: Steps = ()
    minimal: Minimised | None = None
    examples: int = 0
    search_s: float = 0.0
    minimise_s: float = 0.0


def search(harness: Harness, faults: Sequence[str], chosen: settings, seed: int | None = None) -> CollectionFinding:
    """Run the machine with `chosen` (no shrink phase), stop at the first failure, and make a violation's rule calls
    1-minimal. A failure that is not a violation is returned as it is."""
    factory = collection_machine_for(harness, tuple(faults))
    started = time.monotonic()
    try:
        machine = factory if seed is None else checking.seeded(factory, seed)
        run_state_machine_as_test(machine, settings=checking.without_shrink(chosen))
    except Exception as error:
        searched = time.monotonic()
        violations = [leaf for leaf in leaves(error) if isinstance(leaf, PropertyViolation)]
        failing: CollectionMachine | None = factory.last
        found: Steps = tuple((name, dict(arguments)) for name, arguments in failing.steps) if failing else ()
        if not violations or not found:
            violation = violations[0] if violations else None
            return CollectionFinding(error, violation, found, None, factory.examples, searched - started)
        violation = violations[0]
        expected = signature(violation)
        assert expected is not None  # a violation's signature
        replayer = CollectionReplayer(harness, tuple(faults), expected)
        minimal = minimise(found, replayer, confirm=replayer.confirm)
        shown = replayer.last_failure if isinstance(replayer.last_failure, PropertyViolation) else violation
        finding = CollectionFinding(error, shown, found, minimal, factory.examples, searched - started)
        return attrs.evolve(finding, minimise_s=time.monotonic() - searched)
    return CollectionFinding(None, examples=factory.examples, search_s=time.monotonic() - started)
