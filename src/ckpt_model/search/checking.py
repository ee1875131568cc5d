"""Running the state machine for a user (`ckpt-model check`, the pytest plugin's `ckpt_check`): a search that
stops at the first failure, then each failure's reproduction rate and its 1-minimal sequence from the checker's
own minimiser (`ckpt_model.search.minimise`), as the fault search does. The machine is the controller's
(`ckpt_model.search.controllers`: the trainer's by default, or rollout collection's); the search runs either alike.

Hypothesis's own shrink of a stateful run replays hundreds of candidates, each with fresh processes: minutes (222 s
for one planted fault here) for a sequence the minimiser cuts down in seconds anyway. Without the shrink phase
Hypothesis also stops at the first failure (`should_generate_more`), so a failure is reported as soon as it is
found and made minimal.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
from hypothesis import Phase, settings

from ckpt_model.interrupts import raise_swallowed_since, raised_so_far, reraise_interrupt_behind
from ckpt_model.results.notes import Kind, add
from ckpt_model.results.reproduction import REPLAYS
from ckpt_model.results.stats import RoundStat, SearchStats
from ckpt_model.results.verdicts import kind_of, leaves
from ckpt_model.search import aim
from ckpt_model.search.controllers import TRAINER, ControllerMachine
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.steps.draw import Focus, Guide

if TYPE_CHECKING:
    from hypothesis.stateful import RuleBasedStateMachine

    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results.progress import Progress

# The examples a search with a time limit and no count of examples may run: more than any time limit lets it.
UNTIL_THE_TIME_LIMIT = 10**9


def without_shrink(chosen: settings) -> settings:
    """The settings with no shrink phase: the search stops at the first failure, which the minimiser cuts down."""
    return settings(chosen, phases=tuple(phase for phase in chosen.phases if phase is not Phase.shrink))


def search(
    harness: Harness,
    chosen: settings,
    stats: SearchStats,
    *,
    swarm: bool = False,
    weights: Mapping[str, int] | None = None,
    seed: int | None = None,
    max_time_s: float | None = None,
    rounds: bool = False,
    minimise: bool = True,
    replays: int = REPLAYS,
    progress: Progress | None = None,
    searched: Any = None,
    round_began: Callable[[RoundStat], None] | None = None,
    controller: ControllerMachine = TRAINER,
    tours: bool = False,
) -> None:
    """Run `controller`'s machine on `harness` with `chosen` (and the families' `weights`); on a failure, call
    `searched()` (if given), then measure each failure's rate and (with `minimise`) make it 1-minimal, and re-raise
    what the run raised. `chosen` is used as given: `without_shrink` is the caller's choice (the CLI keeps
    Hypothesis's shrink with `--no-minimise`). With `rounds` and `max_time_s`, the search runs in rounds, each after
    the first aimed at what the ones before it left unreached (`ckpt_model.search.aim`), and tells `round_began` of
    each. With `tours` (`check --aim`), every round's examples walk tours to the model's transitions no example took
    yet (`ckpt_model.search.paths`)."""
    from hypothesis.stateful import run_state_machine_as_test

    deadlines = aim.round_deadlines(max_time_s) if rounds and max_time_s is not None else [max_time_s]
    begun_s: list[float] = []  # when each example began, for `within`
    interrupts_before = raised_so_far()
    for index, deadline in enumerate(deadlines):
        if index and deadline is not None and time.monotonic() - stats.started_s >= deadline:
            continue  # the round before ran past this one's end (an example outlasted it)
        aimed = _aim_after(harness, stats, weights, controller.machine_type) if index else None
        focus = aimed.focus if aimed else None
        if tours and controller is TRAINER:
            focus = attrs.evolve(focus or Focus(), guide=aim_guide(harness, stats))
        if len(deadlines) > 1:
            began = _round_began(stats, index, aimed, focus.guide.size if focus and focus.guide else 0)
            if round_began is not None:
                round_began(began)
        factory = controller.factory(
            harness,
            stats,
            swarm=swarm,
            weights=aimed.weights if aimed else weights,
            focus=focus,
        )
        if deadline is not None:
            factory = within(factory, stats, deadline, begun_s=begun_s)
        round_seed = aim.round_seed(seed, index)
        # A later round's draws mean other rules than the first's: no example database for it.
        round_settings = settings(chosen, database=None) if index else chosen
        try:
            run_state_machine_as_test(
                factory if round_seed is None else seeded(factory, round_seed), settings=round_settings
            )
        except TimeLimitReached:
            stats.stopped_by_time = True
            continue
        except Exception as error:
            reraise_interrupt_behind(error)  # Hypothesis took an interrupted example for a failing one
            raise_swallowed_since(interrupts_before)  # ... or lost the interrupt on its way out
            if time_limit_behind(error):
                stats.stopped_by_time = True
                continue
            if searched is not None:
                searched()
            measure_failures(
                harness,
                error,
                stats.seen,
                minimise=minimise,
                replays=replays,
                progress=progress,
                controller=controller,
            )
            raise
        except BaseExceptionGroup as group:  # holds an interrupt, say, met by Hypothesis's final replay of failures
            reraise_interrupt_behind(group)
            raise_swallowed_since(interrupts_before)
            raise
        raise_swallowed_since(interrupts_before)  # a passing round must not hide one either
        stats.stopped_by_time = False


def _aim_after(
    harness: Harness, stats: SearchStats, weights: Mapping[str, int] | None, machine_type: type
) -> aim.Aim | None:
    """The aim of the next round of `machine_type` on `harness`, after what `stats` reached (`aim.aim_at`)."""
    from ckpt_model.steps import draw
    from ckpt_model.steps.checkable import Capabilities, undrawable_rules
    from ckpt_model.steps.steplog import coverage, declarations, goal_families

    rules = declarations(machine_type)
    undrawable = {rule.name for rule in undrawable_rules(Capabilities.of(harness), rules)}
    return aim.aim_at(
        stats,
        harness.spec,
        coverage(machine_type),
        draw.family_by_rule(machine_type),
        goal_families(machine_type),
        draw.weights_of(machine_type, weights),
        drawable=[rule for rule in rules if rule not in undrawable],
    )


def aim_guide(harness: Harness, stats: SearchStats) -> Guide:
    """The tours to the model's transitions no example of `stats` took yet (`ckpt_model.search.paths`), in the
    model explored to the transition coverage's depth (kept between runs)."""
    from ckpt_model.model.abstract import COVERAGE_DEPTH
    from ckpt_model.search import paths, transition_coverage

    explored = transition_coverage.explored(harness.spec, COVERAGE_DEPTH, Capabilities.of(harness))
    return paths.TransitionGuide(explored, stats.transitions)


def _round_began(stats: SearchStats, index: int, aimed: aim.Aim | None, paths: int = 0) -> RoundStat:
    """Record round `index` in `stats` as it begins."""
    if index == 0:
        says = "the weights' own draw"
    elif aimed is None:
        says = "nothing left to aim at: the weights' own draw, from a new seed"
    else:
        says = aimed.words()
    if paths:
        says += f"; each example walks to transitions not taken yet, first one of {paths}"
    began = RoundStat(
        started_s=round(time.monotonic() - stats.started_s, 3),
        examples_before=stats.examples,
        says=f"round {index + 1}: {says}",
        aim=aimed.document() if aimed else None,
    )
    stats.rounds.append(began)
    return began


class TimeLimitReached(BaseException):
    """The search's time ran out (`--max-time`), between two examples. A BaseException, as KeyboardInterrupt is:
    Hypothesis hands it straight back instead of taking it for a failure to shrink."""


def time_limit_behind(error: BaseException) -> bool:
    """Whether `error` was raised while Hypothesis handled `TimeLimitReached`: an example that stops before its
    first draw, where an earlier one with the same start drew on, is one Hypothesis calls inconsistent
    (`FlakyStrategyDefinition`), the time limit in its context."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, TimeLimitReached):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def within(
    factory: type[RuleBasedStateMachine],
    stats: SearchStats,
    max_time_s: float,
    clock: Callable[[], float] = time.monotonic,
    begun_s: list[float] | None = None,
) -> type[RuleBasedStateMachine]:
    """The machine factory, stopping the search at its time limit: an example begins only if `another_fits` in
    the time left of `max_time_s` since `stats` started (on `clock`); otherwise the call raises `TimeLimitReached`
    before it starts anything, so no example is cut short and the examples run so far keep their statistics.
    `begun_s` keeps when each example began (shared by a search's rounds, so a round's first example is judged by
    the ones before it). Never stops once a failure was seen (Hypothesis may still be replaying or shrinking it),
    nor before an example has finished: a search bounded by time judges at least one, however short its limit or
    slow the machine (the start of the deployment alone can outlast a limit of a second on a loaded machine)."""
    begun = begun_s if begun_s is not None else []

    def machine() -> Any:
        now_s = clock() - stats.started_s
        judged_one = bool(stats.finished)
        if stats.first_failure_s is None and judged_one and not another_fits(now_s, max_time_s, begun):
            raise TimeLimitReached
        begun.append(now_s)
        return factory()

    machine.__wrapped__ = factory  # type: ignore[attr-defined]  # as in `seeded`: the same database key
    digest = getattr(factory, "_hypothesis_internal_add_digest", None)
    if digest is not None:
        machine._hypothesis_internal_add_digest = digest  # type: ignore[attr-defined]
    return cast("type[RuleBasedStateMachine]", machine)


def another_fits(now_s: float, max_time_s: float, begun_s: Sequence[float]) -> bool:
    """Whether another example may begin at `now_s` (seconds into the search), the examples so far having begun at
    `begun_s`: before `max_time_s`, and, once an example's length is known (from one beginning to the next: the
    whole cost of an example, its processes' start and its teardown included), when the median example so far
    ends by `max_time_s`. So a search ends before its limit as often as past it, and past it by the example that
    ran longer than most, rather than by a whole example begun with seconds left."""
    if now_s >= max_time_s:
        return False
    ends_s = [*begun_s[1:], now_s]  # each example ended when the next began; the last, now
    lengths_s = [ended - began for began, ended in zip(begun_s, ends_s, strict=False)]
    return not lengths_s or now_s + statistics.median(lengths_s) <= max_time_s


def seeded(factory: type[RuleBasedStateMachine], seed: int) -> type[RuleBasedStateMachine]:
    """The machine factory, with Hypothesis's `@seed` on a thin wrapper (the factory itself is left untouched).

    `run_state_machine_as_test` reads the seed from the factory. `__wrapped__` keeps the database key and the
    derandomization digest those of the machine (inspect follows it to the machine's source)."""
    from hypothesis import seed as hypothesis_seed

    def machine() -> Any:
        return factory()

    machine.__wrapped__ = factory  # type: ignore[attr-defined]  # see the docstring
    digest = getattr(factory, "_hypothesis_internal_add_digest", None)
    if digest is not None:
        machine._hypothesis_internal_add_digest = digest  # type: ignore[attr-defined]
    # Typed as the class `run_state_machine_as_test` asks for; like `machine_for`'s factory, it is called bare.
    return cast("type[RuleBasedStateMachine]", hypothesis_seed(seed)(machine))


def measure_failures(
    harness: Harness,
    error: BaseException,
    seen: Sequence[BaseException],
    *,
    minimise: bool,
    replays: int,
    progress: Progress | None = None,
    controller: ControllerMachine = TRAINER,
) -> None:
    """Replay each violation's and harness error's failing run `replays` times (on `controller`'s machine, which
    ran it) for its reproduction rate, then
    (with `minimise`) make it 1-minimal by that rate on the same harness (`ckpt_model.search.minimise` puts the rate and
    the minimal steps on the error's report and rewrites its regression file). A flaky report from Hypothesis
    counts as the failures it hid (`verdicts.leaves`). A bug in the minimiser is noted on the error and never
    hides the failure itself."""
    from ckpt_model.results.progress import FailureWork
    from ckpt_model.results.reproduction import rate_of
    from ckpt_model.search.minimise import minimise_error, reproduce_error

    if not harness.can_crash:  # every replay needs Gym started afresh, which this deployment forbids
        print("not measured or minimised: the deployment may not be restarted, so the run cannot be replayed")
        return
    for leaf in leaves(error, seen):
        if kind_of(leaf) not in ("violation", "harness"):
            continue
        doing = "measuring and minimising" if minimise else "measuring"
        then = ", then candidates" if minimise else ""
        print(f"{doing} the failing run of {describe_failure(leaf)} ({replays} replays{then})...", flush=True)
        work = FailureWork(getattr(leaf, "property_id", None) or type(leaf).__name__, time.monotonic())
        if progress is not None:
            progress.now_doing(f"{doing} {describe_failure(leaf)}")
            progress.now_working_on(work)
        try:
            if minimise:
                result = minimise_error(harness, leaf, replays, controller, work)
            else:
                result = None
                reproduce_error(harness, leaf, replays, controller, work)
        except Exception as bug:
            reraise_interrupt_behind(bug)
            if progress is not None:
                progress.clear()
            add(leaf, Kind.NOT_MINIMISED, f"Measuring or minimising failed (the steps shown are Hypothesis's): {bug!r}")
            continue
        if progress is not None:
            progress.clear()
        found = result.found_rate if result is not None else rate_of(leaf)
        print(f"  found: {found.text if found else 'no rate (no rule calls)'}", flush=True)
        if result is not None:
            print(f"  minimised: {result.summary()}", flush=True)


def describe_failure(error: BaseException) -> str:
    property_id = getattr(error, "property_id", None)
    return f"{type(error).__name__} ({property_id})" if property_id else type(error).__name__


def statistics_line(stats: SearchStats, clock: Callable[[], float] = time.monotonic) -> str:
    """The run's figures in one line: examples run and finished, the steps Hypothesis drew (the count `--steps`
    bounds) and the model steps they made (with the rules a drawn rule plays, as a crash before a restore, and each
    teardown's drain: why they outnumber the steps asked for), crashes, examples per second, milliseconds per model
    step (all of the search's time over all of them, the drains included), and whether the time limit ended it."""
    finished = stats.finished
    elapsed_s = max(clock() - stats.started_s, 1e-9)
    steps = stats.steps
    crashes = sum(example.crashes for example in finished)
    inside = sum(example.crashes_inside for example in finished)
    cut = stats.examples - len(finished)
    cut_text = f" ({cut} more cut short: a failure, or Hypothesis's own replays)" if cut > 0 else ""
    per_step = f", {1000 * elapsed_s / steps:.0f} ms/model step" if steps else ""
    limit = "; stopped at its time limit (--max-time)" if stats.stopped_by_time else ""
    return (
        f"statistics: {len(finished)} examples finished{cut_text}, {stats.drawn_steps} steps drawn, {steps} model "
        f"steps (with the rules a drawn one played and the teardowns' drains), {crashes} crashes "
        f"({inside} inside an operation), {len(finished) / elapsed_s:.2f} examples/s{per_step}{limit}"
    )
