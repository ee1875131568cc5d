"""`ckpt-model check`: the banner, the search of either controller's machine, its failures' rates and minimising, the
coverage table, and the result files (`--json`, `--junit`, checked writable before anything starts). With `--quiet`
only one line per verdict; with `--verbose` the failure report also shows the example found before minimising."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from hypothesis import settings

from ckpt_model.deployments import artifacts
from ckpt_model.errors import UsageError
from ckpt_model.interrupts import interrupts_held
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results import runstore
from ckpt_model.results.stats import RoundStat
from ckpt_model.results.verdicts import Exit, failure_report, kind_of, leaves, quiet_line
from ckpt_model.search import checking, profiles
from ckpt_model.search.checking import UNTIL_THE_TIME_LIMIT
from ckpt_model.search.controllers import TRAINER, ControllerMachine

if TYPE_CHECKING:  # the stateful module is imported only when a check runs
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.search.targets import NamedFault


SEED_BITS = 32


def run_settings(args: argparse.Namespace) -> settings:
    """The profile with the command's overrides (`profile_settings`), without Hypothesis's shrink unless asked."""
    chosen = profile_settings(args)
    # Hypothesis's own shrink only with --no-minimise: the checker's minimiser is quicker
    # (`ckpt_model.search.checking`).
    return checking.without_shrink(chosen) if args.minimise else chosen


def profile_settings(args: argparse.Namespace) -> settings:
    """The profile (as `profiles` builds it for this environment, CI included) with the command's overrides."""
    overrides: dict[str, Any] = {}
    if args.examples is not None:
        overrides["max_examples"] = args.examples
    elif getattr(args, "max_time", None) is not None:
        overrides["max_examples"] = UNTIL_THE_TIME_LIMIT
    if args.steps is not None:
        overrides["stateful_step_count"] = args.steps
    if args.seed is not None:
        overrides["database"] = None  # a seed's run must not depend on what this machine saved before
    return settings(profiles.profile_for(args.profile, profiles.in_ci()), **overrides)


def round_line(began: RoundStat) -> str:
    """How a round of a search bounded by time is announced (`ckpt_model.search.aim`)."""
    return f"{began.says} (at {began.started_s:.0f} s, after {began.examples_before} examples)"


def chosen_seed(args: argparse.Namespace, chosen: settings) -> int | None:
    """`--seed`, else a fresh seed for a random profile (printed, so it can be rerun), else None (derandomized)."""
    if args.seed is not None:
        return args.seed
    return None if chosen.derandomize else secrets.randbits(SEED_BITS)


# Said when the deployment cannot skew a server's clock (the look-alike needs Debian's libfaketime).
CLOCKS_NOTE = (
    "this deployment cannot skew a server's clock, so skewed_clock (P18) is never drawn; for the embedded stack, "
    "install Debian's faketime (apt-get install faketime)"
)


def time_line(harness: Harness) -> str:
    """The banner's line on time: whether a rule's wait for a deadline, a lease or a frozen participant's outlasted
    deadline is a jump of the clocks the checker owns (milliseconds), or a real wait (seconds), and why."""
    if harness.clocks.owns_time:
        return "  time:        owned by the checker (clock jumps: a wait for a deadline or a lease takes no time)"
    return (
        f"  time:        real waits (the {harness.spec.label} deployment cannot move its servers' clocks: "
        "a wait for a deadline or a lease takes its seconds)"
    )


def banner(
    args: argparse.Namespace,
    spec: DeploymentSpec,
    faults: Sequence[NamedFault],
    chosen: settings,
    seed: int | None,
    notes: Sequence[str] = (),
) -> str:
    planted = ", ".join(f"{fault.name} (caught by {fault.caught_by})" for fault in faults) or "none"
    if args.seed is not None:
        seed_line = f"{seed} (from --seed; overrides derandomize; no example database)"
    elif seed is not None:
        seed_line = f"{seed} (drawn for this run; rerun its examples with --seed {seed})"
    else:
        seed_line = "none (derandomized: the examples follow from the machine, the same on every run)"
    lines = [
        "ckpt-model check",
        f"  system:      {system_label(args)}",
        f"  topology:    {spec.topology}",
        f"  verify mode: {spec.verify_mode}",
        f"  faults:      {planted}",
        f"  options:     {spec.options_text}",
        f"  profile:     {args.profile} ({profile_description(chosen, seeded_run=args.seed is not None)})",
        f"  seed:        {seed_line}",
        f"  examples:    {examples_line(args, chosen)}",
        f"  draw:        {draw_line(args)}",
        "  swarm:       "
        + ("yes: each example leaves out some rules and mechanisms" if getattr(args, "swarm", False) else "no"),
        "  minimise:    "
        + (
            "yes: the search stops at the first failure, which the checker's minimiser makes 1-minimal"
            if args.minimise
            else "no (--no-minimise): Hypothesis shrinks the failure itself (minutes)"
        ),
        f"  replays:     {args.replays} per failure, for its reproduction rate",
        "  artifacts:   "
        + (
            f"kept in {args.keep_artifacts} (--keep-artifacts)"
            if args.keep_artifacts is not None
            else "temporary, removed at exit (--keep-artifacts DIR keeps them)"
        ),
    ]
    return "\n".join([*lines, *(f"  note: {note}" for note in notes)])


def examples_line(args: argparse.Namespace, chosen: settings) -> str:
    """The banner's words for how many examples, how long each, and the time limit: what is asked of Hypothesis,
    which counts valid examples only (it also runs, and the statistics count, those it discards as invalid) and
    steps as the rules it draws (a report's model steps add the rules a drawn one plays and the teardown's)."""
    steps = f"each of up to {chosen.stateful_step_count} steps drawn"
    max_time = getattr(args, "max_time", None)
    if max_time is None:
        return f"{chosen.max_examples} valid, {steps}"
    limit = (
        f"no example begins that the median example so far would not end by {max_time:g} s (--max-time), none is cut "
        "short; then the search minimises what it found"
    )
    if chosen.max_examples == UNTIL_THE_TIME_LIMIT:
        return f"until the time limit, {steps}; {limit}"
    return f"{chosen.max_examples} valid at most, {steps}; {limit}"


def draw_line(args: argparse.Namespace) -> str:
    """The banner's words for the draw: the families' weights, and whether `--weights` changed them."""
    from ckpt_model.steps.draw import describe

    weights = getattr(args, "family_weights", None)
    if weights is None:  # a controller whose machine draws as Hypothesis does
        return "a rule among those enabled, uniformly (Hypothesis's draw)"
    return describe(weights) + (" (--weights)" if args.weights else " (the default weights)")


def artifacts_dir(args: argparse.Namespace) -> Path | None:
    """`--keep-artifacts DIR`, made ready before any server starts (`artifacts.prepare`): a DIR that is not empty
    or cannot be created is a usage error. The absolute path is kept on `args`, for the banner."""
    if args.keep_artifacts is None:
        return None
    try:
        args.keep_artifacts = artifacts.prepare(args.keep_artifacts)
    except artifacts.ArtifactsError as error:
        raise UsageError(f"--keep-artifacts: {error}") from None
    return Path(args.keep_artifacts)


def profile_description(chosen: settings, *, seeded_run: bool) -> str:
    exploration = "seeded" if seeded_run else "derandomized" if chosen.derandomize else "random"
    return f"{exploration}, {profiles.database_label(chosen.database)}"


def outputs_writable(paths: dict[str, Path | None]) -> None:
    """Each result file asked for (`--json FILE`: FILE) can be written, checked before anything starts: a run whose
    report CI would find missing at its end is a usage error at its start."""
    from ckpt_model.results.check_result import check_writable

    for option, path in paths.items():
        if path is None:
            continue
        try:
            check_writable(path)
        except OSError as error:
            raise UsageError(f"{option} {path}: cannot be written ({error})") from None


@contextlib.contextmanager
def verdict_only(quiet: bool) -> Iterator[None]:
    """With `--quiet`, send what the run prints (banner, measuring, statistics, coverage, report) nowhere: the caller
    prints the verdict lines to the standard output it kept. Errors still go to standard error."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as nowhere, contextlib.redirect_stdout(nowhere):
        yield


def run_check(args: argparse.Namespace) -> int:
    outputs_writable({"--json": args.json, "--junit": args.junit})
    quiet = getattr(args, "quiet", False)
    verdicts = sys.stdout
    with verdict_only(quiet):
        code, lines = checked(args)
    for line in lines:
        print(line, file=verdicts, flush=True)
    return code


def checked(args: argparse.Namespace) -> tuple[int, list[str]]:
    """Run the check; its exit code, and with `--quiet` the verdict lines to print (one per failure, or the pass)."""
    # Imported here, not at the top: `--help` and usage errors need none of the stack.
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results.progress import Progress
    from ckpt_model.results.stats import SearchStats
    from ckpt_model.search.checking import statistics_line
    from ckpt_model.search.targets import TARGETS

    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    target = TARGETS[args.controller](args)
    spec, gym, controller = target.spec, target.gym, target.controller
    chosen = run_settings(args)
    seed = chosen_seed(args, chosen)
    kept = artifacts_dir(args)
    print(banner(args, spec, target.faults, chosen, seed, target.notes), flush=True)

    stats = SearchStats(started_s=getattr(args, "started_s", None) or time.monotonic())
    run = RunRecord(args, spec, chosen, seed, stats, controller)
    goals_total = len(goals_applying(controller, spec))
    every_s = getattr(args, "progress_every", None)
    asked = None if chosen.max_examples == UNTIL_THE_TIME_LIMIT else chosen.max_examples
    # --quiet: no progress at all, neither the redrawn line nor the piped one.
    quiet_or = {"enabled": False, "every_s": None} if quiet else {"every_s": every_s}
    with Progress(stats, asked, goals_total=goals_total, **quiet_or) as progress, kept_when_interrupted(run):
        try:
            progress.now_doing("starting the deployment")
            harness = Harness(gym, spec=spec, artifacts=kept) if gym else Harness.embedded(spec, artifacts=kept)
            runstore.begin(harness)
            run.harness = harness
            progress.now_doing("searching")
            for line in time_lines(harness, controller.machine_type, real_gym=gym is not None):
                print(line, flush=True)
            try:

                def searched() -> None:
                    run.searched()
                    progress.clear()
                    print(statistics_line(stats), flush=True)
                    for line in run.transition_lines():
                        print(line, flush=True)

                checking.search(
                    harness,
                    chosen,
                    stats,
                    swarm=args.swarm,
                    weights=getattr(args, "family_weights", None),
                    seed=seed,
                    max_time_s=args.max_time,
                    rounds=args.examples is None and controller.aims,
                    minimise=args.minimise,
                    replays=args.replays,
                    progress=progress,
                    searched=searched,
                    round_began=lambda began: progress.say(round_line(began)),
                    controller=controller,
                    tours=getattr(args, "aim", False),
                )
            finally:
                progress.now_doing("stopping the deployment")  # not a measuring that ended: it takes seconds
                with interrupts_held():  # an interrupt now waits for the teardown, then ends the run
                    harness.close()
        except Exception as error:
            progress.stop()
            failures = leaves(error, stats.seen)
            code, report = failure_report(error, stats.seen, verbose=verbose)
            runstore.keep_report(run.run_dir, report)
            lines = [quiet_line(leaf, spec.label, run.regression_file(leaf)) for leaf in failures] if quiet else []
            print(report, flush=True)  # with --quiet, stdout goes nowhere (`verdict_only`)
            run.finish(code, failures)
            for line in runstore.kept_lines(run.harness):
                print(line, flush=True)
            return code, lines
    run.searched()
    for line in [*passed_lines(harness, controller, stats, spec), *run.transition_lines()]:
        print(line, flush=True)
    if kept is not None:
        print(f"kept in {kept}: {artifacts.LOGS}/ (every server's full log)", flush=True)
    note = asked_note(len(stats.finished), chosen.max_examples, stats.stopped_by_time)
    took = f"{len(stats.finished)} examples{note} in {time.monotonic() - stats.started_s:.1f} s, no property violated"
    print(f"PASSED: {took}; {verdict_scope(harness, controller)}", flush=True)
    run.finish(Exit.PASSED, ())
    return Exit.PASSED, [f"PASSED {spec.label}: {took}"] if quiet else []


def goals_applying(controller: ControllerMachine, spec: DeploymentSpec) -> list[str]:
    """The coverage goals of `controller`'s machine that apply to `spec`: what the progress line counts toward."""
    from ckpt_model.steps.steplog import coverage

    return [goal.name for goal in coverage(controller.machine_type).goals if goal.applies(spec)]


@contextlib.contextmanager
def kept_when_interrupted(run: RunRecord) -> Iterator[None]:
    """An interrupt (Ctrl-C, SIGTERM) carries what the run kept and where, for the INTERRUPTED message."""
    try:
        yield
    except KeyboardInterrupt as interrupt:
        interrupt.add_note("\n".join(runstore.interrupted_lines(run.harness)))
        raise


def time_lines(harness: Harness, machine_type: type, *, real_gym: bool) -> list[str]:
    """The banner's lines on time, for a machine whose rules wait for deadlines, leases or skewed clocks: whether
    the clocks are the checker's (`time_line`), and why a skewed clock is never drawn where none can be."""
    from ckpt_model.steps import checkable
    from ckpt_model.steps.steplog import declarations

    needs = {need for declared in declarations(machine_type).values() for need in declared.needs}
    lines = [time_line(harness)] if needs & {checkable.LEASE_LAPSES, checkable.JUMP_CLOCKS} else []
    if not real_gym and not harness.clocks.can_skew_clocks and skews_here(machine_type, harness.spec):
        lines.append(f"  note: {CLOCKS_NOTE}")
    return lines


def skews_here(machine_type: type, spec: DeploymentSpec) -> bool:
    """Whether a rule that skews a clock applies to the deployment `spec` describes: one whose time can pass
    (`--time-jumps`) never skews one, whatever is installed, so the note's advice would not help there."""
    from ckpt_model.steps import checkable
    from ckpt_model.steps.steplog import declarations

    return any(
        checkable.SKEW_CLOCKS in declared.needs and declared.applies(spec)
        for declared in declarations(machine_type).values()
    )


def passed_lines(harness: Harness, controller: ControllerMachine, stats: Any, spec: DeploymentSpec) -> list[str]:
    """What a passing run ends with: the coverage table, what this deployment does not check or draw, and the
    statistics."""
    from ckpt_model.search.checking import statistics_line
    from ckpt_model.steps import draw, goals
    from ckpt_model.steps.checkable import Capabilities, summary
    from ckpt_model.steps.steplog import coverage, declarations

    machine = controller.machine_type
    capabilities = Capabilities.of(harness)
    rules = declarations(machine)
    undrawable = undrawable_here(harness, controller)
    table = goals.table(stats, spec, coverage(machine), undrawable, draw.family_by_rule(machine))
    shown = summary(capabilities, rules, lambda rule: rules[rule].applies(spec), controller.judging)
    return [table, *shown, statistics_line(stats)]


def undrawable_here(harness: Harness, controller: ControllerMachine) -> list[str]:
    """The rules of `controller`'s machine this deployment lacks what they need for (`checkable.undrawable_rules`)."""
    from ckpt_model.steps.checkable import Capabilities, undrawable_rules
    from ckpt_model.steps.steplog import declarations

    rules = declarations(controller.machine_type)
    return [rule.name for rule in undrawable_rules(Capabilities.of(harness), rules)]


def verdict_scope(harness: Harness, controller: ControllerMachine) -> str:
    """What a pass covers on this deployment (`checkable.verdict_scope`)."""
    from ckpt_model.steps import checkable
    from ckpt_model.steps.steplog import declarations

    rules = declarations(controller.machine_type)
    return checkable.verdict_scope(checkable.Capabilities.of(harness), rules, controller.judging)


@attrs.define
class RunRecord:
    """What `check` learns as it goes (timings, the harness), and the `--json`/`--junit` files at its end."""

    args: argparse.Namespace
    spec: DeploymentSpec
    chosen: settings
    seed: int | None
    stats: Any
    controller: ControllerMachine = TRAINER
    harness: Any = None
    search_s: float | None = None
    _transitions: Any = None

    @property
    def run_dir(self) -> Path | None:
        """The run store's directory of this run, once a failure was kept (`ckpt_model.results.runstore`)."""
        return self.harness.run_dir if self.harness is not None else None

    def unchecked(self) -> dict[str, str]:
        """The properties this deployment cannot judge, each with why (`ckpt_model.steps.checkable`)."""
        if self.harness is None:
            return {}
        from ckpt_model.steps.checkable import Capabilities, unchecked_properties
        from ckpt_model.steps.steplog import declarations

        rules = declarations(self.controller.machine_type)
        capabilities = Capabilities.of(self.harness)
        return {item.name: item.why for item in unchecked_properties(capabilities, rules, self.controller.judging)}

    def searched(self) -> None:
        if self.search_s is None:
            self.search_s = time.monotonic() - self.stats.started_s

    def unmet(self) -> list[str]:
        """Every goal and rule that applies to this deployment and no example reached."""
        from ckpt_model.steps import goals
        from ckpt_model.steps.steplog import coverage

        return goals.unmet(self.stats, self.spec, coverage(self.controller.machine_type))

    def coverage(self) -> dict[str, Any] | None:
        """The coverage table as data (`goals.document`), once a deployment started."""
        if self.harness is None:
            return None
        from ckpt_model.steps import goals
        from ckpt_model.steps.steplog import coverage

        machine = self.controller.machine_type
        return goals.document(self.stats, self.spec, coverage(machine), undrawable_here(self.harness, self.controller))

    def transition_coverage(self) -> Any:
        """The share of the model's explored transitions the run took, to `--transition-depth`; None for a machine
        that does not play the contract model (the collection controller's) or a run that took no step."""
        if self.controller is not TRAINER or not self.stats.transitions:
            return None
        if self._transitions is None:
            from ckpt_model.search import transition_coverage
            from ckpt_model.steps.checkable import Capabilities

            capabilities = Capabilities.of(self.harness) if self.harness is not None else None
            explored = transition_coverage.explored(self.spec, self.args.transition_depth, capabilities)
            self._transitions = transition_coverage.coverage_of(explored, self.stats.transitions)
        return self._transitions

    def transition_lines(self) -> list[str]:
        coverage = self.transition_coverage()
        return [] if coverage is None else coverage.lines()

    def regression_file(self, error: BaseException) -> str | None:
        """The regression file the failure left, if it did (a violation's or a harness error's)."""
        return kept_files(error)[0]

    def finish(self, code: int, failures: Sequence[BaseException]) -> None:
        """Write the files asked for; a file that cannot be written is said, and never changes the verdict."""
        if self.args.json is None and self.args.junit is None:
            return
        from ckpt_model.results import check_result
        from ckpt_model.results.check_result import CheckResult, Statistics

        total_s = time.monotonic() - self.stats.started_s
        result = CheckResult(
            verdict=check_result.VERDICT_OF_EXIT.get(code, "unjudged"),
            exit_code=int(code),
            system=system_label(self.args),
            deployment=self.spec.label,
            seed=self.seed,
            profile=self.args.profile,
            examples_asked=self.chosen.max_examples,
            steps_asked=self.chosen.stateful_step_count,
            failures=check_result.failure_results(failures, kept_files),
            run_dir=str(self.run_dir) if self.run_dir is not None else None,
            timings={
                "total": total_s,
                "search": self.search_s,
                "first_failure": self.stats.first_failure_s,
                "measuring": None if self.search_s is None or not failures else total_s - self.search_s,
            },
            statistics=Statistics.of(self.stats, self.unmet()),
            skipped=self.unchecked(),
            version=package_version(),
            controller=self.controller.origin.controller,
            properties=self.controller.judging.titles,
            coverage=self.coverage(),
            transitions=None if (taken := self.transition_coverage()) is None else taken.document(),
        )
        for path, text in ((self.args.json, result.json_text), (self.args.junit, result.junit_text)):
            if path is not None:
                write_output(path, text())
        if self.args.json is not None:
            runstore.keep_text(self.run_dir, runstore.RESULT, result.json_text())


def kept_files(error: BaseException) -> tuple[str | None, str | None]:
    """The failure's regression file and its timeline, as the report names them, each if it exists (a violation's
    or a harness error's, kept by the run: `runstore.kept_of`)."""
    kept = runstore.kept_of(error)
    if kept is None or kind_of(error) not in ("violation", "harness"):
        return None, None
    return existing(kept.shown), existing(kept.timeline)


def existing(path: Path) -> str | None:
    return str(path) if path.exists() else None


def asked_note(ran: int, asked: int, stopped_by_time: bool = False) -> str:
    """Why a run's count of examples differs from the count asked for, when it does."""
    if stopped_by_time:
        return (
            " (as many as its time allowed: --max-time)"
            if asked == UNTIL_THE_TIME_LIMIT
            else f" ({asked} asked; its time ran out first: --max-time)"
        )
    if ran > asked:
        return (
            f" ({asked} asked: Hypothesis counts valid examples only, and ran {ran - asked} more it discarded as "
            "invalid, such as its first, of only the simplest draws)"
        )
    if ran < asked:
        return f" ({asked} asked; Hypothesis stops early when it has tried every distinct example)"
    return ""


def system_label(args: argparse.Namespace) -> str:
    """What the banner names as the system under test (a real Gym's label is set from its deployment)."""
    return getattr(args, "system", None) or "embedded look-alike stack"


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ckpt-model")
    except PackageNotFoundError:
        return "unknown (not installed)"


def write_output(path: Path, text: str) -> None:
    """A result file written whole; one that cannot be written is a note, never a change of verdict."""
    from ckpt_model.results import check_result

    try:
        check_result.write(path, text)
    except OSError as error:
        print(f"note: could not write {path}: {error}", file=sys.stderr, flush=True)
    else:
        print(f"wrote {path}", flush=True)
