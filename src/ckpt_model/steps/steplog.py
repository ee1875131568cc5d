"""What a machine ran: its steps as labels and as rule calls, the failure report attached to what a rule raised,
and the example's statistics and coverage.

The rule calls (outermost only, with their keyword arguments) are what a regression file replays; the labels, with
the model's names (`r0`, `c1`), say what each did, and the report prints one line per rule drawn
(`model_steps`): its labels, led by the rule call wherever they do not name the rule themselves (a fault rule's
labels name the operation it disturbed), so every line says which rule did it. `step` wraps every rule: it records
the call, marks the machine broken while the rule runs (a broken machine is not drained at teardown), and attaches
the report once.
Around each rule it also keeps the coverage (`ckpt_model.steps.goals`): before a drawn rule, which rules were enabled;
after every rule (nested ones too, the drain's not), which of the machine's goals (`goals_of`) it reached. Each
reached goal and drawn rule is also a Hypothesis `event()` (its statistics and observability output), and the
example's counts go to the `SearchStats`. A drawn rule's arguments first pass the example's swarm
(`ckpt_model.steps.swarm`). A machine's goals and rule scopes (`coverage`) are derived from its rules' declarations, as
everything else the checker knows of a rule is.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import attrs
from hypothesis import currently_in_test_context, event
from hypothesis.stateful import precondition, rule
from hypothesis.strategies import SearchStrategy

from ckpt_model import timing
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import observe
from ckpt_model.errors import ControlCallFailed, CoordinationError, HarnessError, PropertyViolation
from ckpt_model.interrupts import reraise_interrupt_behind, unwinding
from ckpt_model.model.abstract import state_digest
from ckpt_model.model.contract import Model
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.protocol.history import History
from ckpt_model.results.regression import DEFAULT_ORIGIN, Origin
from ckpt_model.results.report import annotate
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps import goals
from ckpt_model.steps.checkable import Need
from ckpt_model.steps.families import Family
from ckpt_model.steps.swarm import EVERYTHING, Swarm

F = TypeVar("F", bound=Callable[..., Any])
# What a rule may raise that ends the example with a report: a verdict, the harness, or a refusal.
REPORTED = (PropertyViolation, HarnessError, CoordinationError)
# The attribute `action` puts on a rule: its declaration.
DECLARATION = "ckpt_model_declaration"
Gate = Callable[[Any], bool]


@attrs.frozen
class Declaration:
    """What a rule says of itself beside its arguments, the one source of what the checker derives about it:
    `enabled`, its precondition as the model states it (without the swarm, for the coverage); its `family` (what
    the draw picks first); `needs`, what a deployment must have for the rule ever to be enabled (`checkable`, held
    to the precondition by tests/unit/checker/test_checkable.py); `judges`, the properties the rule itself judges
    (beside the settle's and the audits'); `applies`, the deployments whose coverage counts it (`goals`);
    `mechanisms`, its boolean arguments an example's swarm may switch off (`swarm`)."""

    enabled: Gate
    family: Family
    needs: tuple[Need, ...] = ()
    judges: tuple[str, ...] = ()
    applies: Callable[[DeploymentSpec], bool] = goals.everywhere
    mechanisms: tuple[str, ...] = ()


class StepLog:
    """The steps of one example, and whether the one running has finished. `origin` is the controller whose machine
    runs them, as its regression files record it."""

    def __init__(
        self, harness: Harness, history: History, stats: SearchStats | None, origin: Origin = DEFAULT_ORIGIN
    ) -> None:
        self.harness, self.history, self.stats, self.origin = harness, history, stats, origin
        self.labels: list[str] = []
        self.rule_calls: list[tuple[str, dict[str, Any]]] = []
        # Where each drawn rule's labels start, and the drain's (None: not drained).
        self.starts: list[int] = []
        self.drain_at: int | None = None
        self.depth, self.draining, self.broken = 0, False, False
        self.started_s = time.monotonic()
        self.swarm: Swarm = EVERYTHING
        # Coverage is kept in a search (or for statistics), not in a replay, a fixed scenario or the minimiser's runs.
        self.counting = stats is not None or currently_in_test_context()
        self.goals: Counter[str] = Counter()
        self.enabled: set[str] = set()
        self.drawn: Counter[str] = Counter()
        # Each drawn rule's time, its settle and audits included.
        self.seconds: defaultdict[str, float] = defaultdict(float)
        # Each drawn rule's abstract transition (`ckpt_model.model.abstract`): state before, rule, state after.
        self.transitions: list[tuple[str, str, str]] = []

    def report(self, error: BaseException) -> None:
        """Attach the failure report (steps, history, calls, logs, replay file) once."""
        steps = model_steps(self.labels, self.rule_calls, self.starts, self.drain_at, failed_in_rule=not self.draining)
        annotated = annotate(
            error,
            harness=self.harness,
            steps=steps,
            history=self.history,
            rule_calls=self.rule_calls,
            backend_calls=lambda: observe(self.harness).calls,
            origin=self.origin,
            under_hypothesis=currently_in_test_context(),
        )
        if annotated and self.stats is not None:
            self.stats.failed(error)

    def rule_named(self, rule: str, arguments: Mapping[str, Any]) -> str:
        """A rule call as a failure names it: `skewed_clock(victim=1, behind=False), step 17` (the drawn step it
        runs in, or the teardown's drain)."""
        called = f"{rule}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
        return f"{called}, in the teardown's drain" if self.draining else f"{called}, step {len(self.rule_calls)}"

    def drain(self, drain: Callable[[], None]) -> None:
        """Run the teardown's drain, unless a rule broke the machine (its state is unknown) or an interrupt
        unwinds (the run ends: the drain would take seconds and judge a run cut short), reporting what the drain
        raises."""
        if self.broken or unwinding() is not None:
            return
        self.drain_at = len(self.labels)
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
        """The example ended: its model steps (every label but the teardown's marker: the rules drawn, those they
        played and the drain's), the rules drawn, crashes and time go to the statistics."""
        if self.stats is not None:
            steps = sum(1 for label in self.labels if not label.startswith("-- "))
            elapsed_s = time.monotonic() - self.started_s
            self.stats.example_finished(
                steps, crashes, elapsed_s, crashes_inside=crashes_inside, drawn=len(self.rule_calls)
            )
            self.stats.example_covered(self.goals, self.enabled, self.drawn, self.seconds)
            self.stats.transitions.update(self.transitions)

    def allows(self, machine: Any, name: str) -> bool:
        """Whether the example's swarm lets Hypothesis draw rule `name` (enabled) now: if it keeps the rule, or
        if it keeps no rule that is enabled now (a swarm must never leave the machine without a step)."""
        if self.swarm.allows(name):
            return True
        return not any(self.swarm.allows(rule) and gate(machine) for rule, gate in gates(machine.__class__).items())

    def drawing(self, machine: Any, name: str) -> None:
        """Hypothesis drew rule `name`: note it and every rule whose precondition held in the state it drew from."""
        if not self.counting:
            return
        self.drawn[name] += 1
        self.enabled.update(rule for rule, gate in gates(machine.__class__).items() if gate(machine))
        _event(f"rule drawn: {name}")

    def stepped(
        self,
        machine_type: type,
        rule: str,
        arguments: Mapping[str, Any],
        before: Any,
        after: Any,
        first_label: int,
    ) -> None:
        """Rule `rule` of `machine_type` finished (its labels start at `first_label`): count the machine's goals it
        reached (a drain step reaches none: the search did not draw it) and, for a drawn rule, keep its abstract
        transition. Nothing is built when coverage is not kept."""
        if self.draining or not self.counting:
            return
        if self.depth == 0 and isinstance(before, Model):  # a drawn rule of a machine on the contract model
            self.transitions.append((state_digest(before), rule, state_digest(after)))
        labels = tuple(self.labels)
        step = goals.Step(rule, arguments, before, after, labels[first_label:], labels[:first_label])
        for name in goals.reached(step, goals_of(machine_type)):
            self.goals[name] += 1
            _event(f"goal reached: {name}")


FAILED_HERE = "  <- the failure was raised in this step"


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A rule call as the report names it: `unreachable(operation=1, then_retry=False, victim=0)`."""
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"


def step_line(name: str, arguments: Mapping[str, Any], labels: Sequence[str]) -> str:
    """One drawn rule's line in the model's names: its labels, led by the rule call unless every label already
    names the rule (`dispatch() -> r0`); a fault rule's name its effect (`prepare() -> c1`), not the rule."""
    effect = "; ".join(labels) or "nothing recorded"
    if labels and all(label.startswith(f"{name}(") for label in labels):
        return effect
    return f"{call_text(name, arguments)}: {effect}"


def model_steps(
    labels: Sequence[str],
    rule_calls: Sequence[tuple[str, Mapping[str, Any]]],
    starts: Sequence[int],
    drain_at: int | None = None,
    *,
    failed_in_rule: bool = False,
) -> list[str]:
    """One line per drawn rule (`step_line`), its labels those from its start to the next rule's (or the drain's),
    then the drain's labels; with `failed_in_rule`, the last rule's line says the failure was raised in it."""
    ends = [*starts[1:], drain_at if drain_at is not None else len(labels)]
    lines = [
        step_line(name, arguments, labels[start:end])
        for (name, arguments), start, end in zip(rule_calls, starts, ends, strict=False)
    ]
    if failed_in_rule and lines:
        lines[-1] += FAILED_HERE
    if drain_at is not None:
        lines += labels[drain_at:]
    return lines


def _event(text: str) -> None:
    """A Hypothesis event, when a test runs (a replay or a fixed scenario runs rules outside one)."""
    if currently_in_test_context():
        event(text)


@functools.cache
def declarations(machine_type: type) -> Mapping[str, Declaration]:
    """Every rule of the machine class and its declaration, by name (the attribute `action` sets), over its bases
    too (each nemesis family is one)."""
    found: dict[str, Declaration] = {}
    for klass in reversed(machine_type.__mro__):
        found.update(
            (name, declared) for name, value in vars(klass).items() if (declared := getattr(value, DECLARATION, None))
        )
    return dict(sorted(found.items()))


@functools.cache
def gates(machine_type: type) -> Mapping[str, Gate]:
    """Every rule of the machine class and its precondition, by name."""
    return {name: declared.enabled for name, declared in declarations(machine_type).items()}


@functools.cache
def families_of(machine_type: type) -> Mapping[str, Family]:
    """Every rule of the machine class and its family, by name."""
    return {name: declared.family for name, declared in declarations(machine_type).items()}


@functools.cache
def scopes(machine_type: type) -> goals.Scopes:
    """Every rule of the machine class and the deployments it applies to, by name."""
    return {name: declared.applies for name, declared in declarations(machine_type).items()}


@functools.cache
def families_in_order(machine_type: type) -> tuple[Family, ...]:
    """The families of the machine's rules, each once, in the order its classes declare rules: the machine's own
    (the protocol's), then each base in the order the machine mounts it (one nemesis family each)."""
    found: dict[Family, None] = {}
    for klass in machine_type.__mro__:
        for value in vars(klass).values():
            declared = getattr(value, DECLARATION, None)
            if declared is not None:
                found.setdefault(declared.family)
    return tuple(found)


@functools.cache
def goals_of(machine_type: type) -> tuple[goals.Goal, ...]:
    """The machine's coverage goals: each family's (`Family.goals`), in the order the machine mounts its
    families (its own rules' first)."""
    return tuple(goal for family in families_in_order(machine_type) for goal in family.goals)


@functools.cache
def goal_families(machine_type: type) -> Mapping[str, str]:
    """Each of the machine's goals and the family an aimed round favours for it (`ckpt_model.search.aim`): the family of
    the rule that reaches it where it names one, else the family that declares it."""
    rule_family = {rule: family.name for rule, family in families_of(machine_type).items()}
    return {
        goal.name: rule_family.get(goal.rule or "", family.name)
        for family in families_in_order(machine_type)
        for goal in family.goals
    }


@functools.cache
def coverage(machine_type: type) -> goals.Coverage:
    """What a search of the machine must reach: its goals and its rules, each rule with its scope; and how a longer
    search of it is asked for (a machine's `LONGER_RUN`, if it has one: the trainer's aimed rounds otherwise)."""
    longer_run = getattr(machine_type, "LONGER_RUN", goals.AIMED_LONGER_RUN)
    return goals.Coverage(goals_of(machine_type), scopes(machine_type), longer_run)


@functools.cache
def mechanisms_of(machine_type: type) -> tuple[tuple[str, str], ...]:
    """Every optional mechanism the machine's rules draw, as (rule, its boolean argument), in name order."""
    return tuple(
        (name, mechanism) for name, declared in declarations(machine_type).items() for mechanism in declared.mechanisms
    )


def rule_names(machine_type: type) -> list[str]:
    """The machine's rules, sorted by name."""
    return list(gates(machine_type))


class Logged(Protocol):
    """What `step` needs of a machine: its step log, and its model (the value its goals compare before and after)."""

    log: StepLog
    model: Any


def step(method: F) -> F:
    """Record the rule call, mark the machine broken while it runs, and report whatever it raises."""

    @functools.wraps(method)
    def wrapper(self: Logged, *args: Any, **kwargs: Any) -> Any:
        log, name = self.log, method.__name__
        drawn = log.depth == 0 and not log.draining
        if drawn:
            kwargs = log.swarm.constrain(name, kwargs)
            log.drawing(self, name)
            log.rule_calls.append((name, dict(kwargs)))
            log.starts.append(len(log.labels))
        before, first_label, started_s = self.model, len(log.labels), time.monotonic()
        log.broken = True
        log.depth += 1
        try:
            result = method(self, *args, **kwargs)
        except Exception as error:
            # An interrupt that a failing cleanup hid ends the run: it is never reported as the step's failure.
            reraise_interrupt_behind(error)
            if isinstance(error, ControlCallFailed):
                error.during(log.rule_named(name, kwargs))
            if isinstance(error, REPORTED):
                log.report(error)
            raise
        finally:
            log.depth -= 1
            if drawn and log.counting:
                log.seconds[name] += time.monotonic() - started_s
        # Only the rule drawn mends the machine: a rule it plays inside it (a crash before a restore) finishing
        # says nothing of the rest of the outer rule, which may still fail and must then not be drained.
        if drawn:
            log.broken = False
        log.stepped(type(self), name, kwargs, before, self.model, first_label)
        return result

    return wrapper  # type: ignore[return-value]


def action(
    enabled: Callable[[Any], bool],
    *,
    family: Family,
    needs: tuple[Need, ...] = (),
    judges: tuple[str, ...] = (),
    applies: Callable[[DeploymentSpec], bool] = goals.everywhere,
    mechanisms: tuple[str, ...] = (),
    **arguments: SearchStrategy[Any],
) -> Callable[[F], F]:
    """A rule of the machine: `precondition(enabled)`, `rule(**arguments)` and `step`, applied in that order
    (outermost first), as three decorators would be. The precondition also asks the example's swarm; `enabled`
    alone, the family, needs, judges, applies and mechanisms are kept on the rule as its `Declaration`."""

    def decorate(method: F) -> F:
        name = method.__name__

        def gate(machine: Any) -> bool:
            return enabled(machine) and machine.log.allows(machine, name)

        gate.__doc__ = enabled.__doc__
        decorated = precondition(gate)(rule(**arguments)(step(method)))  # type: ignore[call-overload]
        setattr(decorated, DECLARATION, Declaration(enabled, family, needs, judges, applies, mechanisms))
        return decorated

    return decorate
