"""The domain minimiser: make a failing sequence of rule calls 1-minimal, far cheaper than Hypothesis's shrinker.

Hypothesis shrinks the choice sequence behind an example: every attempt replays the machine (about a second, since
it starts processes), many attempts change nothing a person would call simpler, and its five-minute watchdog often
stops it with 11 or 12 steps where 2 to 4 suffice. This module shrinks the rule calls themselves:

1. ddmin (Zeller and Hildebrandt, "Simplifying and isolating failure-inducing input", 2002) removes large chunks
   first, then smaller ones, keeping the order of the steps;
2. arguments are simplified where the failure stays (`pick` toward 0, booleans toward False), so the report
   reads simply;
3. each composite step (`checkpoint`, `recover`, `kill_worker(then_prepare=True)`) is tried replaced by its
   primitive steps, and those primitives are minimised (the composite stays when all of its primitives are needed:
   it reads shorter);
4. a final pass removes contiguous runs of four, three, two, then single steps until none can go: the result
   is 1-minimal (removing any one step no longer fails the same way), and no two to four adjacent steps can go
   together either (steps that are only removable together, like `crash; start_over`, are common here).

Steps 2 to 4 repeat until nothing changes. Then runs of primitives that are exactly a composite's are written as the
composite (`prepare; commit` as `checkpoint(then_resume=False)`), if that still fails: it reads shorter, and stays
1-minimal, since the last pass already found no run of two to four steps removable. A candidate counts only when it
fails *the same way*: the caller's predicate decides that (same failure class, same property id; a step that is not
enabled, a pass or another failure does not count). Outcomes are cached, so no candidate is asked twice, and the
result is asked once more at the end, uncached: a predicate that answers differently for the same steps (a flaky
system, or a checker that does not own a race) can show as `reproduced=False`.

A failure that replays only sometimes is judged by its reproduction rate (`ckpt_model.results.reproduction`): the I/O
edge measures the failing run's rate over N replays first (`reproduce_error`), gives each candidate as many replays as
that rate needs for a candidate failing as often to count with 99% chance, counting it on its first failure, and
measures the minimal sequence's rate with N final replays. A failure that replayed every time keeps one replay
per candidate.

The core (`ddmin`, `minimise`) is pure: it calls the injected predicate and nothing else. The I/O edge
(`minimise_on`, `minimise_error`) replays candidates on one reused harness, on a fresh machine of the controller the
failure came from (`ckpt_model.search.controllers`: the trainer's, or rollout collection's), which starts fresh Gym
processes for every candidate itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ckpt_model.interrupts import raise_swallowed_since, raised_so_far, reraise_interrupt_behind
from ckpt_model.results.notes import Kind, add, keep_minimal_run, of_kind
from ckpt_model.results.reproduction import REPLAYS, Rate, attempts_for, measure, record
from ckpt_model.search.controllers import TRAINER, ControllerMachine, replay

if TYPE_CHECKING:
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results.progress import FailureWork

# The longest contiguous run of steps the final pass tries to remove at once (then shorter ones, down to one): a
# crash and the start_over of each of the most live rollouts the model allows (`Model.rollouts_max`, 3), which
# only go together.
CHUNK_STEPS_MAX = 4

Step = tuple[str, dict[str, Any]]
Steps = tuple[Step, ...]
Predicate = Callable[[Steps], bool]
StepKey = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
# (exception class name, property id or None): what "fails the same way" compares.
Signature = tuple[str, str | None]


def _checkpoint_primitives(arguments: Mapping[str, Any]) -> Steps:
    held: Steps = (("release", {"pick": 0}),) if arguments.get("hold_one") else ()
    resume: Steps = (("resume", {}),) if arguments.get("then_resume") else ()
    return (("prepare", {}), *held, ("commit", {}), *resume)


def _recover_primitives(arguments: Mapping[str, Any]) -> Steps:
    return (("crash", {}), ("restore", {"pick": arguments.get("pick", 0)}))


# Rules that, with a flag set, play primitive rules after their own step: the flag and what follows. The rule with
# the flag unset is itself a primitive (`kill_worker(pick=2, worker=1, then_prepare=True)` is `kill_worker(pick=2,
# worker=1); prepare`).
THEN_FLAGS: dict[str, tuple[str, Steps]] = {
    "kill_worker": ("then_prepare", (("prepare", {}),)),
}


def _then_primitives(name: str) -> Callable[[Mapping[str, Any]], Steps]:
    flag, following = THEN_FLAGS[name]

    def primitives(arguments: Mapping[str, Any]) -> Steps:
        alone = {key: value for key, value in arguments.items() if key != flag}
        return ((name, alone), *following) if arguments.get(flag) else ((name, dict(arguments)),)

    return primitives


# The machine's composite rules and the primitive rules each one calls, in order (see `CheckpointMachine.checkpoint`
# and `.recover`, and `THEN_FLAGS`): a composite runs exactly its primitives, so replacing it by them keeps the run
# the same.
COMPOSITES: dict[str, Callable[[Mapping[str, Any]], Steps]] = {
    "checkpoint": _checkpoint_primitives,
    "recover": _recover_primitives,
    **{name: _then_primitives(name) for name in THEN_FLAGS},
}


# Every way a composite can be called, for folding primitives back into one (`fold_composites`); `recover`'s pick
# ranges over the machine's `PICK` (0 to 7).
_COMPOSITE_FORMS: tuple[tuple[str, dict[str, Any]], ...] = (
    *(("checkpoint", {"then_resume": resume, "hold_one": True}) for resume in (True, False)),
    ("checkpoint", {"then_resume": True}),
    ("checkpoint", {"then_resume": False}),
    *(("recover", {"pick": pick}) for pick in range(8)),
)


def key_of(steps: Sequence[Step]) -> StepKey:
    """A hashable form of a sequence (arguments are JSON scalars), for the cache."""
    return tuple((name, tuple(sorted(arguments.items()))) for name, arguments in steps)


def as_state(controller: ControllerMachine) -> str:
    """The line Hypothesis prints before an example's steps: the machine they run on."""
    return f"state = {controller.machine_type.__name__}()"


def as_code(steps: Sequence[Step]) -> tuple[str, ...]:
    """The steps as Hypothesis prints them (`state.retire(pick=0, again=False)`), teardown excluded."""
    return tuple(
        f"state.{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
        for name, arguments in steps
    )


# --- the cache ------------------------------------------------------------------------------------------------


@attrs.define
class CachedPredicate:
    """The injected predicate, asked at most once per distinct sequence; counts what it cost."""

    fails: Predicate
    outcomes: dict[StepKey, bool] = attrs.field(factory=dict)
    replayed: int = 0
    cached: int = 0

    def __call__(self, steps: Steps) -> bool:
        key = key_of(steps)
        if key in self.outcomes:
            self.cached += 1
            return self.outcomes[key]
        self.replayed += 1
        outcome = self.outcomes[key] = bool(self.fails(steps))
        return outcome

    def known(self, steps: Steps, outcome: bool) -> None:
        """Record an outcome the caller already observed (the failing example a search found)."""
        self.outcomes[key_of(steps)] = outcome


# --- ddmin ----------------------------------------------------------------------------------------------------


def split(steps: Steps, parts: int) -> list[Steps]:
    """`parts` contiguous chunks of near-equal size, in order."""
    size, extra = divmod(len(steps), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(steps[start:end])
        start = end
    return chunks


def ddmin(steps: Steps, fails: Predicate) -> Steps:
    """Zeller's ddmin: the caller vouches that `steps` fails; returns a failing subsequence that is 1-minimal.

    At granularity n it tries each of n chunks on its own, then each complement (the sequence without one chunk);
    a failing one becomes the new sequence, otherwise n doubles. It stops when n reaches the length and no
    complement fails, i.e. when removing any single step no longer fails."""
    granularity = 2
    while len(steps) >= 2:
        chunks = split(steps, min(granularity, len(steps)))
        reduced = _first_failing(chunks, fails)
        if reduced is not None:
            steps, granularity = reduced, 2
            continue
        complements = [tuple(s for j, chunk in enumerate(chunks) if j != i for s in chunk) for i in range(len(chunks))]
        reduced = _first_failing(complements, fails)
        if reduced is not None:
            steps, granularity = reduced, max(granularity - 1, 2)
            continue
        if granularity >= len(steps):
            break
        granularity = min(granularity * 2, len(steps))
    return steps


def _first_failing(candidates: Sequence[Steps], fails: Predicate) -> Steps | None:
    return next((candidate for candidate in candidates if fails(candidate)), None)


# --- the domain passes ----------------------------------------------------------------------------------------


def remove_chunks(steps: Steps, fails: Predicate, largest: int = CHUNK_STEPS_MAX) -> tuple[Steps, int]:
    """The 1-minimality pass: remove any contiguous run of up to `largest` steps whose removal still fails,
    largest first, until none can go; returns the sequence and how many steps it removed.

    It ends with a sweep of single steps that removes nothing, so the result is 1-minimal. The runs of two to
    four catch what 1-minimality allows to stay: steps that are only removable together, such as `crash;
    start_over` (without the crash there is nothing to start over; without the start over a later checkpoint has
    nothing in flight), which ddmin removes only when they happen to share a chunk."""
    removed = 0
    size = min(largest, len(steps))
    while size >= 1:
        candidates = (steps[:start] + steps[start + size :] for start in range(len(steps) - size + 1))
        reduced = next((candidate for candidate in candidates if fails(candidate)), None)
        if reduced is None:
            size -= 1
            continue
        removed += len(steps) - len(reduced)
        steps = reduced
        size = min(largest, len(steps))  # a removal can make a longer run removable again
    return steps, removed


def simpler_values(value: Any) -> list[Any]:
    """Values simpler than `value`, simplest first: False for True, smaller integers from 0."""
    if isinstance(value, bool):
        return [False] if value else []
    if isinstance(value, int):
        return list(range(value)) if value > 0 else []
    return []


def simplify_arguments(steps: Steps, fails: Predicate) -> Steps:
    """Each argument of each step replaced by the simplest value that keeps the failure: first every argument at
    once (a kept failure costs one failing run, however many arguments changed), then one argument at a time."""
    simplest = tuple((name, _simplest(arguments)) for name, arguments in steps)
    if key_of(simplest) == key_of(steps):
        return steps
    if fails(simplest):
        return simplest
    for index in range(len(steps)):
        name, arguments = steps[index]
        for argument in list(arguments):
            for simpler in simpler_values(arguments[argument]):
                candidate_arguments = {**arguments, argument: simpler}
                candidate = (*steps[:index], (name, candidate_arguments), *steps[index + 1 :])
                if fails(candidate):
                    steps, arguments = candidate, candidate_arguments
                    break
    return steps


def _simplest(arguments: Mapping[str, Any]) -> dict[str, Any]:
    simplest = {}
    for argument, value in arguments.items():
        simpler = simpler_values(value)
        simplest[argument] = simpler[0] if simpler else value
    return simplest


def expand_composites(steps: Steps, fails: Predicate) -> tuple[Steps, tuple[str, ...]]:
    """Each composite tried replaced by the fewest of its primitives that still fail in its place. Returns the
    sequence and the composites replaced.

    The whole expansion is not replayed: a composite runs exactly its primitives (`COMPOSITES`), so it fails
    as the composite does, and a failing run can cost the settle timeout. A composite that needs every primitive
    stays: it reads shorter."""
    expanded: list[str] = []
    index = 0
    while index < len(steps):
        name, arguments = steps[index]
        kept = _fewest_primitives(steps, index, COMPOSITES[name](arguments), fails) if name in COMPOSITES else None
        if kept is None:
            index += 1
            continue
        steps = (*steps[:index], *kept, *steps[index + 1 :])
        expanded.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")
        index += len(kept)
    return steps, tuple(expanded)


def fold_composites(steps: Steps) -> Steps:
    """Each run of primitives that is exactly a composite's, written as that composite: `prepare; commit` reads
    `checkpoint(then_resume=False)`, `crash; restore(pick=1)` reads `recover(pick=1)`, `kill_worker(pick=2,
    worker=1); prepare` reads `kill_worker(pick=2, worker=1, then_prepare=True)`. The longest expansion is tried
    first at each position, so `prepare; commit; resume` becomes `checkpoint(then_resume=True)`."""
    forms = sorted(
        ((COMPOSITES[name](arguments), (name, arguments)) for name, arguments in _COMPOSITE_FORMS),
        key=lambda form: -len(form[0]),
    )
    folded: list[Step] = []
    index = 0
    while index < len(steps):
        for primitives, composite in [*_then_form(steps[index]), *forms]:
            if key_of(steps[index : index + len(primitives)]) == key_of(primitives):
                folded.append((composite[0], dict(composite[1])))
                index += len(primitives)
                break
        else:
            folded.append(steps[index])
            index += 1
    return tuple(folded)


def _then_form(step: Step) -> list[tuple[Steps, Step]]:
    """A `THEN_FLAGS` rule with its flag unset, as the composite its flag makes with the steps that follow it."""
    name, arguments = step
    if name not in THEN_FLAGS or arguments.get(THEN_FLAGS[name][0]):
        return []
    composite = (name, {**arguments, THEN_FLAGS[name][0]: True})
    return [(COMPOSITES[name](composite[1]), composite)]


def _fewest_primitives(steps: Steps, index: int, primitives: Steps, fails: Predicate) -> Steps | None:
    """The smallest proper, order-keeping, non-empty subset of the composite's primitives that fails in its place
    (small subsets first: they rarely fail, and a run that does not fail is cheap); None if there is none."""
    for size in range(1, len(primitives)):
        for kept in combinations(primitives, size):
            if fails((*steps[:index], *kept, *steps[index + 1 :])):
                return tuple(kept)
    return None


# --- the whole minimiser --------------------------------------------------------------------------------------


@attrs.frozen
class Minimised:
    """A minimised failing sequence, and what it cost.

    `replayed` counts candidates replayed (the final replay included), `cached` those answered without a replay
    (repeats, and at the I/O edge candidates that earlier runs decided); `pass_removed` the steps the
    1-minimality passes removed after ddmin and the other passes; `reproduced` whether the minimal sequence
    failed the same way once more, uncached. The I/O edge adds `seconds` and `final_outcome` (what the final
    replay showed)."""

    original: Steps
    steps: Steps
    replayed: int
    cached: int
    pass_removed: int
    expanded: tuple[str, ...]
    reproduced: bool
    seconds: float = 0.0
    final_outcome: str = ""
    failing_replays: int | None = None  # replays that failed the expected way (the I/O edge counts them)
    rate: Rate | None = None  # the I/O edge: the minimal sequence's rate, measured by the final replays
    found_rate: Rate | None = None  # the I/O edge: the rate of the sequence found, which judged the candidates

    @property
    def steps_before(self) -> int:
        return len(self.original)

    @property
    def steps_after(self) -> int:
        return len(self.steps)

    @property
    def code(self) -> tuple[str, ...]:
        return as_code(self.steps)

    def summary(self) -> str:
        """One line of figures: steps before and after, candidates replayed, time, the final pass, reproduced."""
        removed = f"removed {self.pass_removed}" if self.pass_removed else "removed nothing"
        verdict = "fails the same way on replay" if self.reproduced else f"DID NOT fail again ({self.final_outcome})"
        if self.rate is not None:
            verdict += f" ({self.rate.text})"
        failing = f", {self.failing_replays} of them failing" if self.failing_replays is not None else ""
        return (
            f"{self.steps_before} -> {self.steps_after} steps, {self.replayed} candidates replayed{failing} "
            f"({self.cached} answered without a replay) in {self.seconds:.1f} s; 1-minimality pass {removed}; "
            f"{verdict}"
        )


def minimise(
    steps: Sequence[Step],
    fails: Predicate,
    confirm: Predicate | None = None,
) -> Minimised:
    """The 1-minimal failing sequence under `fails`; the caller vouches that `steps` itself fails.

    ddmin first, then argument simplification, composite expansion and the 1-minimality pass, repeated until
    nothing changes (each accepted candidate is strictly simpler, so this ends); then one uncached replay of the
    result by `confirm` (default `fails`; a caller whose predicate answers some candidates from what it learnt
    passes one that always replays)."""
    original: Steps = tuple((name, dict(arguments)) for name, arguments in steps)
    test = CachedPredicate(fails)
    test.known(original, True)
    current = ddmin(original, test)
    pass_removed = 0
    expanded: tuple[str, ...] = ()
    while True:
        before = key_of(current)
        current = simplify_arguments(current, test)
        current, replaced = expand_composites(current, test)
        current, removed = remove_chunks(current, test)
        expanded, pass_removed = expanded + replaced, pass_removed + removed
        if key_of(current) == before:
            break
    folded = fold_composites(current)
    if key_of(folded) != key_of(current) and test(folded):  # a composite's precondition may be stricter
        current = folded
    reproduced = bool((confirm or fails)(current))
    return Minimised(
        original=original,
        steps=current,
        replayed=test.replayed + 1,
        cached=test.cached,
        pass_removed=pass_removed,
        expanded=expanded,
        reproduced=reproduced,
    )


# --- the I/O edge: candidates replayed on one harness -----------------------------------------------------------


def signature(error: BaseException | None) -> Signature | None:
    """What "the same way" compares: the exception's class name and property id; None for a pass."""
    if error is None:
        return None
    return (type(error).__name__, getattr(error, "property_id", None))


def describe(error: BaseException | None) -> str:
    """An outcome in a few words: "passed", "P4Violation (P4)", "StepNotEnabled"."""
    found = signature(error)
    if found is None:
        return "passed"
    name, property_id = found
    return f"{name} ({property_id})" if property_id else name


# The trainer machine's candidates settle within this, not the full settle timeout (a machine whose waits are for
# processes to start keeps its full one: `ControllerMachine.candidates_settle_briefly`): a candidate that fails on a
# participant's count is
# confirmed only when the mismatch outlives the settle, so at 10 s those dominated a minimisation (11 of 46 replays
# of one fault cost 110 s). The final replay settles with the full timeout, and if the sequence found does not fail
# then, the minimisation starts over with full-timeout candidates: slowness still never decides the result.
CANDIDATE_SETTLE_TIMEOUT_S = 2.0


@attrs.define
class Replayer:
    """The predicate of the I/O edge: replays a candidate on a fresh machine of `controller` on one reused harness
    (each run starts fresh Gym processes) and answers whether it failed with `expected`; keeps the last error.

    The machine owns every race, so a run is decided by its steps, and what happens up to step k depends only on
    the first k steps. Two facts learnt from one replay therefore answer later candidates without replaying them:
    a step that was not enabled after some prefix is not enabled after it again (the model decides that), and a
    run that failed the expected way at step k (before its last step) fails the same way whatever follows (for
    an intermittent failure: it did fail so once, which is what a candidate needs).

    A failure that replays only sometimes gives each candidate `attempts` replays (`reproduction.attempts_for`)
    and counts it as failing on the first that fails the expected way; one that failed every time gets one.
    Each replay is told to `work` (the progress line's counters), if given."""

    harness: Harness
    expected: Signature
    settle_timeout_s: float = CANDIDATE_SETTLE_TIMEOUT_S
    attempts: int = 1
    controller: ControllerMachine = TRAINER
    work: FailureWork | None = None
    last_error: BaseException | None = None
    last_failure: BaseException | None = None  # the last replay's error that failed the expected way
    replays: int = 0
    failing_replays: int = 0
    by_prefix: int = 0
    disabled: set[StepKey] = attrs.field(factory=set)
    failing: set[StepKey] = attrs.field(factory=set)

    def __call__(self, steps: Steps) -> bool:
        prefixes = {key_of(steps[:length]) for length in range(1, len(steps) + 1)}
        if prefixes & self.disabled:
            self.by_prefix += 1
            return False
        if prefixes & self.failing:
            self.by_prefix += 1
            return True
        return self.replay(steps)

    def replay(self, steps: Steps) -> bool:
        """Replay for real with the candidates' settle timeout, up to `attempts` times until one fails the
        expected way; a step that is not enabled ends the tries (chance does not enable it)."""
        from ckpt_model.errors import StepNotEnabled

        for _ in range(self.attempts):
            if self._replay(steps, self.settle_timeout_s):
                return True
            if isinstance(self.last_error, StepNotEnabled):
                return False
        return False

    def confirm(self, steps: Steps) -> bool:
        """Replay for real with the full settle timeout: the final confirmation must not be answered from what was
        learnt, nor decided by a short wait."""
        return self._replay(steps, self.controller.settle_timeout_s)

    def rate(self, steps: Sequence[Step], replays: int) -> Rate:
        """How many of `replays` full replays fail the expected way."""
        label = self.expected[1] or self.expected[0]
        return measure(label, replays, lambda: self.confirm(tuple(steps)))

    def _replay(self, steps: Steps, settle_timeout_s: float) -> bool:
        self.replays += 1
        self.last_error = replay_once(self.harness, steps, settle_timeout_s, controller=self.controller)
        self._learn(steps, self.last_error)
        failed = signature(self.last_error) == self.expected
        self.failing_replays += failed
        if self.work is not None:
            self.work.replayed(failed)
        if failed:
            self.last_failure = self.last_error
        return failed

    def _learn(self, steps: Steps, error: BaseException | None) -> None:
        from ckpt_model.errors import StepNotEnabled
        from ckpt_model.results.report import rule_calls_of

        if isinstance(error, StepNotEnabled):
            self.disabled.add(key_of(steps[: error.index]))
        elif error is not None and signature(error) == self.expected:
            ran = rule_calls_of(error)
            if ran is not None and len(ran) < len(steps) and key_of(ran) == key_of(steps[: len(ran)]):
                self.failing.add(key_of(ran))


def replay_once(
    harness: Harness,
    steps: Sequence[Step],
    settle_timeout_s: float | None = None,
    controller: ControllerMachine = TRAINER,
) -> BaseException | None:
    """Run the steps once on a fresh machine of `controller` (preconditions checked, drained, end properties); the
    exception, or None if it passed.

    A `StepNotEnabled`, a control call refused (`CoordinationError`) or a bug surfaces as its exception, which
    never matches a property violation's signature; Ctrl-C and SIGTERM propagate, also when an error raised while
    they unwound hides them: an interrupted replay is never counted as one that passed or failed."""
    interrupts_before = raised_so_far()
    try:
        replay(controller, harness, [(name, dict(arguments)) for name, arguments in steps], settle_timeout_s)
    except Exception as error:
        reraise_interrupt_behind(error)
        raise_swallowed_since(interrupts_before)
        return error
    raise_swallowed_since(interrupts_before)
    return None


@contextlib.contextmanager
def regressions_to(harness: Harness, directory: Path) -> Iterator[None]:
    """Send the regression files the candidates' failures write to `directory`, then back: a candidate's failure
    keeps nothing in the user's files or the run store, and names nothing the run's own failures are named by."""
    previous = harness.regressions_dir, harness.run_store, harness.failure_files
    harness.regressions_dir, harness.run_store, harness.failure_files = directory, None, {}
    try:
        yield
    finally:
        harness.regressions_dir, harness.run_store, harness.failure_files = previous


def minimise_on(
    harness: Harness,
    steps: Sequence[Step],
    expected: Signature,
    found: Rate | None = None,
    replays: int = REPLAYS,
    controller: ControllerMachine = TRAINER,
    work: FailureWork | None = None,
) -> tuple[Minimised, Replayer]:
    """Minimise a sequence known to fail with `expected` (as often as `found` says; None: every time), replaying
    candidates on `harness` with `controller`'s machine, then measure the minimal sequence's rate over `replays`
    full replays; also returns the replayer, whose `last_failure` is the last replay's exception that failed as
    expected (with the minimal run's own report). `work` is told each stage, replay and shorter failing sequence."""
    from ckpt_model.results import progress

    started_s = time.monotonic()
    attempts = attempts_for(found)
    full_s = controller.settle_timeout_s
    candidate_s = CANDIDATE_SETTLE_TIMEOUT_S if controller.candidates_settle_briefly else full_s
    replayers = [Replayer(harness, expected, candidate_s, attempts=attempts, controller=controller, work=work)]
    rates: list[Rate] = []

    def measured(replayer: Replayer) -> Predicate:
        def confirm(candidate: Steps) -> bool:
            if work is not None:
                work.begin(progress.MEASURING_MINIMAL, replays)
            rates.append(replayer.rate(candidate, replays))
            return rates[-1].failing > 0

        return confirm

    def told(replayer: Replayer, stage: str) -> Predicate:
        """The replayer as the minimiser's predicate, telling `work` the stage and each shorter failing sequence."""
        if work is None:
            return replayer
        work.begin(stage, steps_found=len(steps))

        def fails(candidate: Steps) -> bool:
            failed = replayer(candidate)
            if failed:
                work.shortened(len(candidate))
            return failed

        return fails

    with regressions_to(harness, harness.root / "minimise-candidates"):
        result = minimise(steps, told(replayers[0], progress.MINIMISING), confirm=measured(replayers[0]))
        if not result.reproduced:  # perhaps accepted a candidate that only failed for being slow: start over
            replayers.append(Replayer(harness, expected, full_s, attempts=attempts, controller=controller, work=work))
            again = told(replayers[1], progress.MINIMISING_AGAIN)
            result = minimise(steps, again, confirm=measured(replayers[1]))
    replayer = replayers[-1]
    finished = attrs.evolve(
        result,
        replayed=sum(r.replays for r in replayers),
        failing_replays=sum(r.failing_replays for r in replayers),
        cached=result.cached + sum(r.by_prefix for r in replayers),
        seconds=time.monotonic() - started_s,
        final_outcome=describe(replayer.last_error),
        rate=rates[-1],
        found_rate=found,
    )
    return finished, replayer


def reproduce_error(
    harness: Harness,
    error: BaseException,
    replays: int = REPLAYS,
    controller: ControllerMachine = TRAINER,
    work: FailureWork | None = None,
) -> Rate | None:
    """Replay the failing run `error` came from `replays` times on its harness, with the machine of `controller`
    that ran it, and record how often it failed the same way: on the error (`reproduction.rate_of`), in its report,
    and in its regression file, telling `work` each replay. None when the error carries no rule calls (Hypothesis's
    own errors)."""
    from ckpt_model.results import progress, regression, runstore
    from ckpt_model.results.report import rule_calls_of
    from ckpt_model.results.verdicts import shrunk_steps

    rule_calls = rule_calls_of(error)
    expected = signature(error)
    if rule_calls is None or expected is None:
        return None
    if work is not None:
        work.begin(progress.MEASURING, replays, steps_found=len(rule_calls))
    with regressions_to(harness, harness.root / "minimise-candidates"):
        rate = Replayer(harness, expected, controller=controller, work=work).rate(rule_calls, replays)
    record(error, rate)
    lines = [f"Reproduction: {rate.text} of the run the search found (each with fresh processes and the full settle)"]
    if not shrunk_steps(error):  # Hypothesis printed no example (a flaky report): the run's own rule calls
        lines += ["Failing run:", as_state(controller), *as_code(rule_calls), "state.teardown()"]
    add(error, Kind.FOUND_RATE, "\n".join(lines))
    try:
        document = regression.document(
            harness.spec, rule_calls, error, origin=controller.origin, reproduction=rate.document()
        )
        runstore.keep(harness, error, document, kept_name(harness, error, rule_calls, controller))
    except OSError as write_error:
        add(error, Kind.REPLAY, f"Regression file not rewritten with the rate: {write_error}")
    return rate


def kept_name(harness: Harness, error: BaseException, rule_calls: Sequence[Step], controller: ControllerMachine) -> str:
    """The name the failure's regression file was kept under (`runstore.kept_of`), or the one the run gives it."""
    from ckpt_model.results import runstore

    kept = runstore.kept_of(error)
    return kept.name if kept is not None else runstore.name_for(harness, error, controller.origin, rule_calls)


def minimise_error(
    harness: Harness,
    error: BaseException,
    replays: int = REPLAYS,
    controller: ControllerMachine = TRAINER,
    work: FailureWork | None = None,
) -> Minimised | None:
    """Measure how often the failing run `error` came from fails (`reproduce_error`), then minimise it (its rule
    calls, attached by `ckpt_model.results.report.annotate`) on the harness and the controller's machine it ran on,
    judging candidates by that rate;
    put the minimal sequence and its rate on the error's report and, when it failed again, rewrite the regression
    file with it. None when the error carries no rule calls (Hypothesis's own errors), or its run never failed
    again (nothing to judge candidates by)."""
    from ckpt_model.results.report import rule_calls_of

    found = reproduce_error(harness, error, replays, controller, work)
    rule_calls = rule_calls_of(error)
    expected = signature(error)
    if found is None or rule_calls is None or expected is None:
        return None
    if found.failing == 0:
        add(error, Kind.NOT_MINIMISED, f"Not minimised: the failing run did not fail again in {replays} replays")
        return None
    result, replayer = minimise_on(harness, rule_calls, expected, found, replays, controller, work)
    if result.reproduced and result.rate is not None:
        record(error, result.rate)  # the steps reported now are the minimal ones
        add_minimal_notes(harness, error, result, replayer.last_failure, controller)
    else:
        # Not in `state.` form, so `verdicts.shrunk_steps` keeps reading Hypothesis's example, which did fail.
        add(
            error,
            Kind.NOT_MINIMISED,
            f"Minimising did not keep the failure ({result.summary()}): the candidate "
            f"{'; '.join(result.code)} did not fail again; the regression file keeps the steps that failed",
        )
    return result


def add_minimal_notes(
    harness: Harness,
    error: BaseException,
    result: Minimised,
    final_error: BaseException | None,
    controller: ControllerMachine,
) -> None:
    """Put on `error`'s report the minimal sequence as Hypothesis prints an example (so `verdicts.shrunk_steps` reads
    it), the minimal run's steps with the model's names, and the regression file, rewritten with the minimal
    sequence, with the timeline of the minimal run beside it; keep the minimal run's own exception beside it (what
    it expected and saw, its history and logs: `notes.keep_minimal_run`). Not where `--keep-artifacts` keeps the
    run found (its checkpoints and history): there the report's paths must stay those of what is kept. A copy of
    the file that already held a minimal sequence as short is left as it was (`runstore.keep`), and said."""
    from ckpt_model.results import regression, runstore
    from ckpt_model.results.report import draw_timelines, rule_calls_of, temporary_note

    if harness.artifacts is None:
        keep_minimal_run(error, final_error)
    code = [f"Minimal failing sequence (ckpt_model.search.minimise: {result.summary()}):", as_state(controller)]
    add(error, Kind.MINIMAL, "\n".join([*code, *result.code, "state.teardown()"]))
    for steps in of_kind(final_error, Kind.STEPS):
        add(error, Kind.MINIMAL_STEPS, steps.replace("Steps (model names)", "Minimal steps (model names)", 1))
    try:
        document = regression.document(
            harness.spec,
            list(result.steps),
            error,
            origin=controller.origin,
            minimised=provenance(result),
            reproduction=result.rate.document() if result.rate is not None else None,
        )
        found = rule_calls_of(error) or list(result.original)
        kept = runstore.keep(harness, error, document, kept_name(harness, error, found, controller))
    except OSError as write_error:
        add(error, Kind.MINIMAL_REPLAY, f"Regression file not rewritten: {write_error}")
        return
    temporary = temporary_note(harness, kept.shown)
    add(
        error,
        Kind.MINIMAL_REPLAY,
        f"Replay without Hypothesis (survives code edits): ckpt-model replay {kept.shown}{temporary}",
    )
    held = runstore.held_note(kept)
    if held is not None:
        add(error, Kind.RUN_STORE, held)
    if final_error is not None:  # the picture beside it shows the minimal run, as the file holds
        picture = draw_timelines(final_error, harness, kept).replace("failing history", "minimal run", 1)
        add(error, Kind.MINIMAL_TIMELINE, picture + (temporary if picture.startswith("Timeline of") else ""))


def provenance(result: Minimised) -> dict[str, Any]:
    """What a regression file records about how its steps were minimised."""
    return {
        "steps_before": result.steps_before,
        "candidates_replayed": result.replayed,
        "failing_replays": result.failing_replays,
        "seconds": round(result.seconds, 1),
        "one_minimal_pass_removed": result.pass_removed,
        "expanded": list(result.expanded),
        "found_reproduction": result.found_rate.document() if result.found_rate is not None else None,
        "steps_found": [[name, dict(arguments)] for name, arguments in result.original],
    }
