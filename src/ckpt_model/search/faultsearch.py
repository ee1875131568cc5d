"""Run the state machine against a stack with one planted fault, minimise what it finds, and measure both.

Used by `tests/stateful/test_finds_faults.py` (the checker must catch every catalogued fault with the property
the catalogue names, in a short sequence) and by `benchmarks/checker.py` (the published figures). Each failure
the search meets is then replayed `reproduction.REPLAYS` times on the same harness for its reproduction rate ("P5 in
3 of 10 replays": a failure that replays only sometimes is still the property it broke) and minimised by
`ckpt_model.search.minimise`, judging candidates by that rate, so the sequence reported (and written to the regression
file) is 1-minimal, with its own rate.

A search may be bounded by time (`max_time_s`, `pytest -m search --ckpt-max-time`): it stops between two examples once
the time is up, and its finding says the fault was not found within the limit (`Finding.stopped_by_time`), never
that nothing is there to find.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import attrs
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ckpt_model.deployments.catalogue import planted
from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.reproduction import REPLAYS, Rate, rate_of
from ckpt_model.results.stats import SearchStats
from ckpt_model.results.verdicts import Failure, classify, in_order, shrunk_steps
from ckpt_model.search.checking import TimeLimitReached, aim_guide, time_limit_behind, within
from ckpt_model.search.controllers import TRAINER, ControllerMachine
from ckpt_model.search.minimise import Minimised, minimise_error, reproduce_error
from ckpt_model.search.profiles import BASE
from ckpt_model.steps.draw import Focus

# Derandomized, so a fault is found by the same examples on every run; no database, so a run stands alone.
# No shrink phase: the domain minimiser (`ckpt_model.search.minimise`) makes the failing run 1-minimal after the search,
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


@attrs.frozen
class Finding:
    """What one search produced: every distinct failure it met, the times, and how the first was minimised.

    `failures` lists violations first, then harness errors, then checker errors, each by fewest shrunk steps
    (`verdicts.in_order`). The single-failure properties read the first one; `minimised` holds the minimiser's
    figures for it (None if it was not minimised)."""

    fault: str
    failures: tuple[Failure, ...]
    examples: int
    first_failure_s: float | None
    total_s: float
    search_s: float | None = None  # the Hypothesis search alone, before minimising
    minimised: Minimised | None = None
    max_time_s: float | None = None  # the search's time limit, if it had one
    stopped_by_time: bool = False  # the search ended at its time limit, before a failure or its last example

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
    def rate(self) -> Rate | None:
        """How often the first failure's reported steps failed the same way when replayed (None: not measured)."""
        return self.first.rate if self.first is not None else None

    @property
    def headline(self) -> str:
        """The first failure as "P5 in 3 of 10 replays"; "nothing found" when the search met none in all its
        examples, "not found within the time limit (60 s)" when its time ran out first."""
        if self.first is not None:
            return self.first.headline
        if self.stopped_by_time and self.max_time_s is not None:
            return f"not found within the time limit ({self.max_time_s:g} s)"
        return "nothing found"

    @property
    def property_ids(self) -> tuple[str, ...]:
        """Every distinct property violated, in the order of `failures`."""
        return tuple(dict.fromkeys(f.property_id for f in self.failures if f.property_id is not None))


def minimised_failures(
    failures: Iterable[Failure], minimise_one: Callable[[BaseException], Minimised | None]
) -> tuple[tuple[Failure, ...], Minimised | None]:
    """Each violation and harness error minimised (`minimise_one` adds the minimal sequence to the error's notes,
    where `shrunk_steps` reads it, and records its reproduction rate on the error, where `rate_of` reads it); a
    checker error has no run of its own to minimise. Returns them in `in_order` (a minimal sequence may put
    another failure first), and the minimiser's figures for the first."""
    updated = []
    figures: dict[Failure, Minimised] = {}
    for failure in failures:
        if failure.kind == "checker":
            updated.append(failure)
            continue
        result = minimise_one(failure.error)
        steps = shrunk_steps(failure.error) or failure.shrunk_steps  # the minimal ones, or the run's own
        failure = attrs.evolve(failure, shrunk_steps=steps, rate=rate_of(failure.error))
        if result is not None:
            figures[failure] = result
        updated.append(failure)
    ordered = in_order(updated)
    return ordered, figures.get(ordered[0]) if ordered else None


def run_search(
    machine: type[RuleBasedStateMachine],
    search_settings: settings,
    seen: list[BaseException] | None = None,
    stats: SearchStats | None = None,
) -> tuple[Failure, ...]:
    """Run a state machine until it fails (and shrinks) or runs out of examples; return every failure it met (a
    flaky report as the failures it hid, or as those in `seen`, the failures the machine raised: `SearchStats`).
    A machine bounded by time (`checking.within`) that reaches its limit ends the search with none, and
    `stats.stopped_by_time` set.

    An exception that is neither a property violation, a harness error nor a Hypothesis error propagates."""
    try:
        run_state_machine_as_test(machine, settings=search_settings)
    except TimeLimitReached:
        return _stopped_by_time(stats)
    except Exception as error:
        if time_limit_behind(error):
            return _stopped_by_time(stats)
        failures = classify(error, seen or ())
        if failures is None:
            raise
        return failures
    return ()


def _stopped_by_time(stats: SearchStats | None) -> tuple[Failure, ...]:
    if stats is not None:
        stats.stopped_by_time = True
    return ()


def search(
    harness: Harness,
    search_settings: settings = FAULT_SEARCH,
    *,
    minimise: bool = True,
    replays: int = REPLAYS,
    swarm: bool = False,
    controller: ControllerMachine = TRAINER,
    max_time_s: float | None = None,
    aim: bool = False,
) -> Finding:
    """Run `controller`'s machine (the swarm machine with `swarm`; with `aim`, each example walking a tour to the
    model's transitions, `ckpt_model.search.paths`) against the harness until it fails, runs out
    of examples or (with `max_time_s`) of time; then replay every failure `replays` times for its reproduction rate
    and minimise it by that rate on the same harness (unless `minimise` is False: then only the rate, and with
    `replays` 0 not even that). The time limit bounds the search, not the measuring and minimising after it."""
    stats = SearchStats()
    focus = Focus(guide=aim_guide(harness, stats)) if aim and controller is TRAINER else None
    factory = controller.factory(harness, stats, swarm=swarm, focus=focus)
    if max_time_s is not None:
        factory = within(factory, stats, max_time_s)
    failures = run_search(factory, search_settings, stats.seen, stats)
    search_s = time.monotonic() - stats.started_s
    if minimise:
        failures, minimised = minimised_failures(
            failures, lambda error: minimise_error(harness, error, replays, controller)
        )
    elif replays:
        failures, minimised = minimised_failures(
            failures, lambda error: _rate_only(harness, error, replays, controller)
        )
    else:
        minimised = None
    return Finding(
        fault=",".join((*harness.spec.faults, *controller.origin.faults)) or "(none)",
        failures=failures,
        examples=stats.examples,
        first_failure_s=stats.first_failure_s,
        total_s=time.monotonic() - stats.started_s,
        search_s=search_s,
        minimised=minimised,
        max_time_s=max_time_s,
        stopped_by_time=stats.stopped_by_time,
    )


def _rate_only(harness: Harness, error: BaseException, replays: int, controller: ControllerMachine) -> None:
    """Measure the failure's rate (recorded on the error), minimising nothing."""
    reproduce_error(harness, error, replays, controller)
