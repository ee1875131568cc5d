"""`ckpt-model`: the checker's command line (also `python -m ckpt_model`).

    ckpt-model check [--topology T] [--verify-mode M] [--faults a,b] [--token-capture] [--generation-cuts]
                     [--policy-workers N] [--profile P] [--examples N] [--steps N] [--seed N] [--no-minimise]
                     [--replays N] [--swarm] [--keep-artifacts DIR]
                                      run the state machine against the embedded look-alike stack, in the
                                      deployment `DeploymentSpec.for_faults` picks; each failure is then
                                      replayed N times (10) for its reproduction rate ("P5 in 3 of 10
                                      replays"), minimised (1-minimal) by that rate and its regression file
                                      rewritten with it; the run ends with the coverage table (goals and rules
                                      reached, `ckpt_model.steps.goals`); with `--controller collection`, the
                                      collection machine on the same runner (`--faults`: the collector's)
    ckpt-model replay FILE [--keep-artifacts DIR]
                                      replay a regression file the checker wrote, without Hypothesis, on the
                                      machine of the controller it names
    ckpt-model minimise FILE [--keep-artifacts DIR]
                                      make a regression file's steps 1-minimal and rewrite it (only if they fail
                                      as recorded, and the minimal steps fail again the same way)
    ckpt-model stack ARGS...          run the look-alike stack by hand (the arguments of `python -m fakes.stack`)
    ckpt-model faults                 list the planted faults

Exit codes: the three outcomes a run can have (a violation, could not judge, passed) are never confused.

    0    passed
    1    a property violation: the system under test broke the controller contract (also one that replays only
         sometimes, which Hypothesis reports as flaky: it is reported as the property, with its rate)
    2    could not judge: a harness error (a server that did not start, a quiet state that never came, a step
         that is not enabled), a control call refused where the checker did not expect it, or a checker error
         (a Hypothesis error with no failure of the system inside, or an exception nobody expected)
    3    usage: bad arguments, an unknown fault, an unreadable regression file
    130  interrupted by Ctrl-C (143 by SIGTERM); every process and directory the run started is gone

`minimise FILE` exits 0 when it did its job: the file now holds the minimal steps (or the recorded failure no
longer happens, said as PASSED, and the file is left as it was); 1 when a different property fails instead (not
minimised), 2 when it could not judge (a harness error, or minimal steps that did not fail again), 3 for an
unreadable file. It rewrites the file only on a minimal sequence that failed as recorded on its final replay, in
one rename, so a failure, Ctrl-C or a flaky replay leaves the file as it was.

What `check --seed N` does: Hypothesis draws the examples from seed N (`hypothesis.seed` on the machine factory),
which overrides the profile's `derandomize`, and the run keeps no example database (it neither replays failures
saved before nor saves new ones), so the same seed, commit and settings run the same examples. Without `--seed` a
random profile draws a seed itself and prints it in the banner, so `--seed` reruns the draw (the example database
is still in use: failures it holds replay first); a derandomized profile (the `default` profile under `CI=true`)
derives its examples from the machine itself and has no seed.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import signal
import sys
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
from hypothesis import settings

from ckpt_model.deployments import artifacts
from ckpt_model.errors import CoordinationError, PropertyViolation, UsageError
from ckpt_model.interrupts import signal_number, sigterm_unwinds
from ckpt_model.model.spec import OPTIONS, DeploymentSpec, SpecError, flag_keywords
from ckpt_model.model.topologies import EPISODE_OWNERS, TOPOLOGIES, VERIFY_MODES
from ckpt_model.results.regression import TRAINER_CONTROLLER
from ckpt_model.results.reproduction import REPLAYS, Rate
from ckpt_model.results.stats import RoundStat
from ckpt_model.results.verdicts import Exit, exception_text, kind_of, leaves, report_failure
from ckpt_model.search import checking, profiles
from ckpt_model.search.controllers import BY_NAME, TRAINER, ControllerMachine

if TYPE_CHECKING:  # the stateful module is imported only when a check runs
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.search.targets import NamedFault

REAL_GYM_DOC = "docs/real-gym.md"
SEED_BITS = 32
# The examples a search with --max-time and no --examples may run: more than any time limit lets it.
UNTIL_THE_TIME_LIMIT = 10**9


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error exits 3 (argparse's own 2 means "could not judge" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"{self.prog}: error: {message}\n")


# --- argument parsing --------------------------------------------------------------------------------------


def int_at_least(minimum: int, what: str) -> typing.Callable[[str], int]:
    """An argparse type: an integer of at least `minimum`, else an error that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a {what} integer (got {text!r})")
        return value

    return parse


def duration(text: str) -> float:
    """An argparse type: a duration in seconds, or with a unit (90, 90s, 2m, 1h), more than zero."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a duration such as 90, 90s, 2m or 1h (got {text!r})")
    return seconds


positive_int = int_at_least(1, "positive")
seed_int = int_at_least(0, "non-negative")


def build_parser() -> Parser:
    parser = Parser(
        prog="ckpt-model",
        description="A property-based stateful model checker for partial-rollout checkpointing (NeMo Gym's protocol).",
        epilog="exit codes: 0 passed, 1 property violation, 2 could not judge, 3 usage, 130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{check,replay,minimise,audit,stack,faults,fuzz,scale}"
    )

    check = commands.add_parser("check", help="run the state machine against the embedded look-alike stack")
    check.add_argument(
        "--controller",
        choices=tuple(BY_NAME),
        default=TRAINER_CONTROLLER,
        help="the controller the machine plays: the trainer (default), or the cluster around rollout collection "
        "runs (docs/collection.md; --faults then names the collector's faults)",
    )
    check.add_argument(
        "--topology", choices=list(TOPOLOGIES), help="default: the deployment the planted faults show in, else native"
    )
    check.add_argument(
        "--verify-mode",
        choices=VERIFY_MODES,
        help="verify mode, of a topology that runs in several (slow); default: the faults', else wait",
    )
    check.add_argument("--faults", default="", help="comma-separated planted faults (see `ckpt-model faults`)")
    for option in OPTIONS:
        keywords = flag_keywords(option)
        keywords["help"] += "; on when a planted fault needs it"
        check.add_argument(option.flag(), **keywords)
    check.add_argument("--profile", choices=sorted(profiles.PROFILES), default="default", help="default: default")
    check.add_argument("--examples", type=positive_int, help="override the profile's max_examples")
    check.add_argument("--steps", type=positive_int, help="override the profile's stateful_step_count")
    check.add_argument(
        "--max-time",
        type=duration,
        metavar="DURATION",
        help="stop the search cleanly at the first example boundary after DURATION (90, 90s, 2m, 1h) and report "
        "what it covered; without --examples the search runs examples until then, in rounds: the first takes half "
        "the time, each later one is aimed at the coverage goals and rules the ones before it left unreached "
        "(docs/how-it-works.md#aiming)",
    )
    check.add_argument(
        "--seed", type=seed_int, help="draw the examples from this seed, with no example database (reproducible)"
    )
    check.add_argument(
        "--deployment",
        type=Path,
        metavar="FILE",
        help=f"check a real Gym deployment described in this JSON file instead of the embedded stack ({REAL_GYM_DOC})",
    )
    check.add_argument(
        "--weights",
        metavar="FAMILY=N,...",
        help="the families' weights in the draw (each step draws a family by weight, then one of its rules; "
        "0 leaves a family out while another can move): for example crashes=2,pauses=0; `ckpt-model check "
        "--help` lists the families in its banner, docs/how-it-works.md#the-draw says why each weighs what it does",
    )
    check.add_argument(
        "--swarm",
        action="store_true",
        help="swarm testing: each example leaves out a random subset of the rules and mechanisms "
        "(ckpt_model.steps.swarm)",
    )
    check.add_argument(
        "--no-minimise",
        dest="minimise",
        action="store_false",
        help="let Hypothesis shrink the failing example and report it as it is (slower: minutes; by default "
        "Hypothesis stops at the first failure and the checker's own minimiser makes it 1-minimal in seconds)",
    )
    check.add_argument(
        "--replays",
        type=positive_int,
        default=REPLAYS,
        help=f"replays that measure each failure's reproduction rate (default {REPLAYS})",
    )
    check.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the result as JSON: verdict, properties, deployment, seed, minimal steps, timings, statistics",
    )
    check.add_argument(
        "--junit", type=Path, metavar="FILE", help="write the result as JUnit XML: one test case per property"
    )

    replay = commands.add_parser("replay", help="replay a regression file without Hypothesis")
    replay.add_argument("file", type=Path, help="a regression file (.ckpt-model/regressions/*.json)")

    minimise = commands.add_parser(
        "minimise", help="make a regression file's steps 1-minimal and rewrite it (only with steps that fail)"
    )
    minimise.add_argument("file", type=Path, help="a regression file (.ckpt-model/regressions/*.json)")
    for command in (check, replay, minimise):
        command.add_argument(
            "--keep-artifacts",
            type=Path,
            metavar="DIR",
            help="keep the run's artefacts in DIR, a new or empty directory: every server's full log and, on a "
            "failure, its history (history.jsonl), its checkpoint directories and its regression file with the "
            "timeline; the failure report's paths then point there (default: temporary, removed at exit)",
        )

    audit = commands.add_parser(
        "audit",
        help="check checkpoint directories offline, with no live system (P5, P9, P12, P22-P24, P26; docs/audit.md)",
    )
    audit.add_argument(
        "root",
        type=Path,
        help="a checkpoint directory (it holds gym/), a directory of them, or a rollout collection's checkpoint root",
    )
    audit.add_argument(
        "--episode-owner",
        choices=EPISODE_OWNERS,
        help="whose records name the episodes collection.json continues (default: the environment's where a "
        "checkpoint holds an environment directory, as with Gym's native agents, else the agent's, as with legacy "
        "ones)",
    )
    audit.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the audit as JSON: verdict, properties violated, LATEST, every checkpoint and finding",
    )
    audit.add_argument(
        "--telemetry",
        type=Path,
        metavar="PATH",
        help="also judge the spans and metrics the run wrote (P26): a file or a directory of *.jsonl/*.json, the "
        "look-alike's JSON lines or OTLP/JSON as an OpenTelemetry Collector's file exporter writes it",
    )

    # Only for --help: `main` hands everything after `stack` to the stack's own parser, untouched.
    commands.add_parser(
        "stack", help="run the look-alike stack by hand until SIGTERM or Ctrl-C (`ckpt-model stack --help`)"
    )
    commands.add_parser("faults", help="list the planted faults of the embedded stack")
    scale = commands.add_parser(
        "scale", help="Gym's scenario 13: thousands of rollouts checkpointed, crashed and restored (docs/scale.md)"
    )
    scale.add_argument("--rollouts", type=positive_int, help="rollouts to dispatch (default 2000; 16 with --model-url)")
    scale.add_argument(
        "--finished-share",
        type=float,
        help="share that finishes before the checkpoint (default 0: every rollout in flight; not with --model-url)",
    )
    scale.add_argument(
        "--model-url",
        metavar="URL",
        help="an OpenAI-compatible server (vLLM) as the policy's model instead of the gated fake backend: the seed's "
        "real-model test (docs/real-model.md)",
    )
    scale.add_argument(
        "--model-name",
        metavar="ID",
        help="with --model-url: the served model's id (default: $CKPT_MODEL_MODEL_NAME, else the first of /v1/models)",
    )
    commands.add_parser(
        "fuzz",
        help="HypoFuzz workers sharing an example database, replay from it, a throwaway Redis"
        " (`ckpt-model fuzz --help`, docs/parallel.md)",
    )
    return parser


# --- check -------------------------------------------------------------------------------------------------


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
    """The banner's words for how many examples, how long each, and the time limit."""
    steps = f"each of up to {chosen.stateful_step_count} steps"
    max_time = getattr(args, "max_time", None)
    if max_time is None:
        return f"{chosen.max_examples}, {steps}"
    limit = f"the search stops at the first example boundary after {max_time:g} s (--max-time)"
    if chosen.max_examples == UNTIL_THE_TIME_LIMIT:
        return f"until the time limit, {steps}; {limit}"
    return f"{chosen.max_examples} at most, {steps}; {limit}"


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


def run_check(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `--help` and usage errors need none of the stack.
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results.progress import Progress
    from ckpt_model.results.stats import SearchStats
    from ckpt_model.search.checking import statistics_line
    from ckpt_model.search.targets import TARGETS

    target = TARGETS[args.controller](args)
    spec, gym, controller = target.spec, target.gym, target.controller
    chosen = run_settings(args)
    seed = chosen_seed(args, chosen)
    kept = artifacts_dir(args)
    print(banner(args, spec, target.faults, chosen, seed, target.notes), flush=True)

    stats = SearchStats()
    run = RunRecord(args, spec, chosen, seed, stats, controller)
    with Progress(stats, chosen.max_examples) as progress:
        try:
            harness = Harness(gym, spec=spec, artifacts=kept) if gym else Harness.embedded(spec, artifacts=kept)
            run.harness = harness
            for line in time_lines(harness, controller.machine_type, real_gym=gym is not None):
                print(line, flush=True)
            try:

                def searched() -> None:
                    run.searched()
                    progress.clear()
                    print(statistics_line(stats), flush=True)

                checking.search(
                    harness,
                    chosen,
                    stats,
                    swarm=args.swarm,
                    weights=getattr(args, "family_weights", None),
                    seed=seed,
                    max_time_s=args.max_time,
                    rounds=args.examples is None,
                    minimise=args.minimise,
                    replays=args.replays,
                    progress=progress,
                    searched=searched,
                    round_began=lambda began: progress.say(round_line(began)),
                    controller=controller,
                )
            finally:
                with sigint_ignored():  # a second Ctrl-C must not cut the teardown short
                    harness.close()
        except Exception as error:
            progress.stop()
            code = report_failure(error, stats.seen)
            run.finish(code, leaves(error, stats.seen))
            return code
    run.searched()
    for line in passed_lines(harness, controller, stats, spec):
        print(line, flush=True)
    if kept is not None:
        print(f"kept in {kept}: {artifacts.LOGS}/ (every server's full log)", flush=True)
    note = asked_note(len(stats.finished), chosen.max_examples, stats.stopped_by_time)
    print(
        f"PASSED: {len(stats.finished)} examples{note} in {time.monotonic() - stats.started_s:.1f} s, no property "
        f"violated; {verdict_scope(harness, controller)}",
        flush=True,
    )
    run.finish(Exit.PASSED, ())
    return Exit.PASSED


def time_lines(harness: Harness, machine_type: type, *, real_gym: bool) -> list[str]:
    """The banner's lines on time, for a machine whose rules wait for deadlines, leases or skewed clocks: whether
    the clocks are the checker's (`time_line`), and why a skewed clock is never drawn where none can be."""
    from ckpt_model.steps import checkable
    from ckpt_model.steps.steplog import declarations

    needs = {need for declared in declarations(machine_type).values() for need in declared.needs}
    lines = [time_line(harness)] if needs & {checkable.LEASE_LAPSES, checkable.JUMP_CLOCKS} else []
    if checkable.SKEW_CLOCKS in needs and not real_gym and not harness.clocks.can_skew_clocks:
        lines.append(f"  note: {CLOCKS_NOTE}")
    return lines


def passed_lines(harness: Harness, controller: ControllerMachine, stats: Any, spec: DeploymentSpec) -> list[str]:
    """What a passing run ends with: the coverage table, what this deployment does not check or draw, and the
    statistics."""
    from ckpt_model.search.checking import statistics_line
    from ckpt_model.steps import draw, goals
    from ckpt_model.steps.checkable import Capabilities, summary, undrawable_rules
    from ckpt_model.steps.steplog import coverage, declarations

    machine = controller.machine_type
    capabilities = Capabilities.of(harness)
    rules = declarations(machine)
    undrawable = [rule.name for rule in undrawable_rules(capabilities, rules)]
    table = goals.table(stats, spec, coverage(machine), undrawable, draw.family_by_rule(machine))
    shown = summary(capabilities, rules, lambda rule: rules[rule].applies(spec), controller.judging)
    return [table, *shown, statistics_line(stats)]


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

    def finish(self, code: int, failures: Sequence[BaseException]) -> None:
        """Write the files asked for; a file that cannot be written is said, and never changes the verdict."""
        if self.args.json is None and self.args.junit is None:
            return
        from ckpt_model.results import check_result, regression
        from ckpt_model.results.check_result import CheckResult, Statistics

        def regression_file(error: BaseException) -> str | None:
            if self.harness is None or kind_of(error) not in ("violation", "harness"):
                return None
            path = regression.path_for(self.harness, error, self.controller.origin)
            return str(path) if path.exists() else None

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
            failures=check_result.failure_results(failures, regression_file),
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
        )
        for path, text in ((self.args.json, result.json_text), (self.args.junit, result.junit_text)):
            if path is not None:
                write_output(path, text())


def asked_note(ran: int, asked: int, stopped_by_time: bool = False) -> str:
    """Why a run's count of examples differs from the count asked for, when it does."""
    if stopped_by_time:
        return (
            " (as many as its time allowed: --max-time)"
            if asked == UNTIL_THE_TIME_LIMIT
            else f" ({asked} asked; its time ran out first: --max-time)"
        )
    if ran > asked:
        return f" ({asked} asked; Hypothesis also runs examples it then discards as incomplete)"
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


# --- replay, stack, faults ---------------------------------------------------------------------------------


def load_regression(path: Path) -> tuple[dict[str, Any], DeploymentSpec, ControllerMachine]:
    """The file, its deployment and the machine of the controller it names; every problem with it at once, as a
    usage error."""
    from ckpt_model.deployments.catalogue import fault_catalogue
    from ckpt_model.results import regression
    from ckpt_model.search.controllers import UnknownController, for_origin

    try:
        document = regression.load(path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    known = {fault.name for fault in fault_catalogue()}
    failure = document.get("failure")
    problems: list[str] = []
    try:
        spec = DeploymentSpec.from_document(document)
    except SpecError as error:
        problems.extend(error.problems)
    else:
        if not set(spec.faults) <= known:
            problems.append(f"'faults' must be known fault names (got {document['faults']!r}; see `ckpt-model faults`)")
    if not isinstance(failure, dict) or not isinstance(failure.get("type"), str):
        problems.append(f"'failure' must be {{'type': ..., 'property': ...}} (got {failure!r})")
    origin = regression.Origin.from_document(document)
    controller: ControllerMachine = TRAINER
    try:
        controller = for_origin(origin)
    except UnknownController as error:
        problems.append(str(error))
    else:
        if not set(origin.faults) <= controller.program_faults():
            problems.append(
                f"'controller_faults' must be faults of the {origin.controller} controller's program "
                f"(got {list(origin.faults)!r}; see `ckpt-model faults`)"
            )
        problems += unknown_rules(document.get("steps"), controller.machine_type)
    if problems:
        raise UsageError(f"{path}: not a replayable regression file:\n" + "\n".join(f"  - {p}" for p in problems))
    return document, spec, controller


def unknown_rules(steps: Any, machine: type) -> list[str]:
    """Each step that names no rule of the machine, or arguments its rule does not take, said as a problem of the
    file: found before any server starts (a replay would start the stack, then stop at it)."""
    import inspect

    if not isinstance(steps, list):
        return []  # `regression.load` already refused a file without a list of steps
    problems: list[str] = []
    for index, (name, arguments) in enumerate(steps, start=1):
        function = getattr(machine, name, None)
        if function is None or getattr(function, "hypothesis_stateful_rule", None) is None:
            problems.append(f"step {index} names {name!r}, which is no rule of the machine")
            continue
        try:
            inspect.signature(function).bind(None, **arguments)
        except TypeError as error:
            problems.append(f"step {index} ({name}) has arguments its rule does not take: {error}")
    return problems


def run_replay(args: argparse.Namespace) -> int:
    from ckpt_model.results import regression
    from ckpt_model.search.scenarios import replay

    document, _, _ = load_regression(args.file)
    kept = artifacts_dir(args)
    recorded_type = document["failure"]["type"]
    recorded = document["failure"].get("property") or recorded_type
    print(f"replaying {args.file} (recorded: {recorded})\n  {regression.describe(document)}", flush=True)
    try:
        replay(document, artifacts=kept)
    except PropertyViolation as violation:
        if document["failure"].get("property"):
            same = violation.property_id == document["failure"]["property"]
        else:
            same = type(violation).__name__ == recorded_type
        verdict = "as recorded" if same else f"with a different property than recorded ({recorded})"
        print(exception_text(violation), flush=True)
        print(f"\nFAILED {verdict}: {violation.property_id} {violation.title}", flush=True)
        return Exit.VIOLATION
    except Exception as error:
        return report_failure(error)
    print(f"PASSED: the recorded {recorded} no longer happens", flush=True)
    return Exit.PASSED


def run_minimise(args: argparse.Namespace) -> int:
    """Replay the file; only if it fails as recorded, minimise it and rewrite it with the minimal steps, once
    they failed as recorded on their final replay. Anything else leaves the file as it was."""
    from ckpt_model.results import regression
    from ckpt_model.search.minimise import as_state, describe, minimise_on, provenance, replay_once, signature

    document, spec, controller = load_regression(args.file)
    kept = artifacts_dir(args)
    recorded = (document["failure"]["type"], document["failure"].get("property"))
    steps = [(name, arguments) for name, arguments in document["steps"]]
    print(f"minimising {args.file} (recorded: {recorded[1] or recorded[0]})\n  {regression.describe(document)}")
    try:
        with regression_harness(spec, kept) as harness:
            first = replay_once(harness, steps, controller=controller)
            if signature(first) != recorded:
                return not_minimised(args.file, first, recorded)
            found = Rate.from_document(document.get("reproduction"))  # judges the candidates, if recorded
            print(f"fails as recorded; minimising {len(steps)} steps (each candidate replays)...", flush=True)
            result, replayer = minimise_on(harness, steps, recorded, found, controller=controller)
    except Exception as error:  # the deployment did not start, or a bug: nothing was written
        code = report_failure(error)
        print(f"not minimised; {args.file} left as it was", flush=True)
        return code
    if not result.reproduced:
        print(f"\nCOULD NOT JUDGE: {result.summary()}; {args.file} left as it was", flush=True)
        return Exit.UNJUDGED
    try:
        reproduction = result.rate.document() if result.rate is not None else None
        regression.rewrite(args.file, document, list(result.steps), provenance(result), reproduction)
    except OSError as error:
        raise UsageError(f"{args.file}: could not rewrite it ({error}); it is as it was") from None
    print("\n".join(["", as_state(controller), *result.code, "state.teardown()"]))
    print(f"\nMINIMISED ({result.summary()}); {args.file} now holds these steps", flush=True)
    print(f"the minimal run fails with {describe(replayer.last_failure)}: `ckpt-model replay {args.file}` shows it")
    return Exit.PASSED


@contextlib.contextmanager
def regression_harness(spec: DeploymentSpec, kept: Path | None = None) -> Iterator[Any]:
    """A fresh embedded deployment of the file's deployment, whose failures write their regression files under
    its own root, or in the artefacts' directory `kept` (never over the file being minimised)."""
    from ckpt_model.deployments.harness import Harness

    harness = Harness.embedded(spec, artifacts=kept)
    if kept is None:
        harness.regressions_dir = harness.root / "regressions"
    try:
        yield harness
    finally:
        with sigint_ignored():  # a second Ctrl-C must not cut the teardown short
            harness.close()


def not_minimised(path: Path, error: BaseException | None, recorded: tuple[str, str | None]) -> int:
    """The steps did not fail as recorded: say what they did, leave the file as it was."""
    what = recorded[1] or recorded[0]
    if error is None:
        print(f"PASSED: the recorded {what} no longer happens; {path} left as it was", flush=True)
        return Exit.PASSED
    if isinstance(error, PropertyViolation):
        print(exception_text(error), flush=True)
        print(
            f"\nFAILED with a different property than recorded ({what}): {error.property_id} {error.title}; "
            f"not minimised, {path} left as it was",
            flush=True,
        )
        return Exit.VIOLATION
    code = report_failure(error)
    print(f"not minimised: the steps did not fail as recorded ({what}); {path} left as it was", flush=True)
    return code


def run_stack(argv: list[str]) -> int:
    from ckpt_model.deployments.seam import system

    try:
        return system().launch(argv, prog="ckpt-model stack")
    except SystemExit as stop:  # the stack's own argparse: --help exits 0, a usage error 2, which is our 3
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        return Exit.USAGE if code == 2 else code


def run_scale(args: argparse.Namespace) -> int:
    """Scale mode: the stage table, then the verdict (exit 0, 1 on a violated property, 2 if not judged)."""
    from ckpt_model.modes.scale import FINISHED_SHARE
    from ckpt_model.modes.scale import run_scale as scale_run

    if args.model_url is not None:
        return run_real_model(args)
    if args.model_name is not None:
        raise UsageError("'--model-name' needs '--model-url' (the gated fake backend serves one model)")
    finished_share = FINISHED_SHARE if args.finished_share is None else args.finished_share
    if not 0.0 <= finished_share < 1.0:
        raise UsageError(f"'--finished-share' must be in [0, 1) (got {finished_share})")
    return _stage_table_run(
        lambda: scale_run(args.rollouts or 2000, finished_share=finished_share, progress=print),
        lambda result: "PASSED: every verdict holds",
    )


def _stage_table_run(run: Callable[[], Any], passed: Callable[[Any], str]) -> int:
    """A scale-style run: its table and the line `passed` makes of its result (exit 0), or the violated property
    (1), or why it could not be judged (2)."""
    from ckpt_model.errors import HarnessError, PropertyViolation

    try:
        result = run()
    except PropertyViolation as violation:
        print(f"{type(violation).__name__}: {violation}\nFAILED: property violation ({violation.property_id})")
        return Exit.VIOLATION
    except (HarnessError, CoordinationError) as error:
        print(f"{type(error).__name__}: {error}\nCOULD NOT JUDGE: harness")
        return Exit.UNJUDGED
    print(result.table())
    print(passed(result))
    return Exit.PASSED


def run_real_model(args: argparse.Namespace) -> int:
    """Scale mode with a real model: the seed's real-model test, its table, what was and was not checked."""
    from ckpt_model.modes.real_model import model_base_url, model_name_from_env
    from ckpt_model.modes.real_model import run_real_model as real_run

    if args.finished_share is not None:
        raise UsageError("'--finished-share' does not apply with '--model-url': a real model finishes what it finishes")
    try:
        model_base_url(args.model_url)
    except ValueError as error:
        raise UsageError(str(error).replace("'CKPT_MODEL_MODEL_URL'", "'--model-url'")) from error
    return _stage_table_run(
        lambda: real_run(
            args.model_url,
            model_name=args.model_name or model_name_from_env(),
            rollouts=args.rollouts or 16,
            progress=print,
        ),
        lambda result: (
            f"PASSED: every verdict holds ({len(result.not_checked)} checks not made with a real model, listed above)"
        ),
    )


def run_faults() -> int:
    from ckpt_model.deployments.catalogue import collection_fault_catalogue, fault_catalogue

    rows = [
        (
            fault.name,
            attrs.evolve(DeploymentSpec.for_faults([fault]), faults=()).label,
            "/".join(fault.shows_as),
            f"{fault.server}: {fault.description}",
        )
        for fault in fault_catalogue()
    ]
    header = ("fault", "deployment", "property", "server: description")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[3])
    collector = [(fault.name, fault.caught_by, fault.description) for fault in collection_fault_catalogue()]
    if collector:
        print("\nthe collector's (check --controller collection --faults ...):")
        titles = ("fault", "property", "description")
        widths = [max(len(row[column]) for row in [titles, *collector]) for column in range(2)]
        for line in [titles, *collector]:
            print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[2])
    return Exit.PASSED


# --- entry -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["stack"]:  # everything after it belongs to the stack's own parser
        return run_stack(arguments[1:])
    if arguments[:1] == ["fuzz"]:  # everything after it belongs to ckpt_model.search.fuzz's own parser
        from ckpt_model.search.fuzz import main as fuzz_main

        return fuzz_main(arguments[1:], prog="ckpt-model fuzz")
    parser = build_parser()
    args = parser.parse_args(arguments)
    try:
        with sigterm_unwinds():
            return run_command(args)
    except UsageError as error:
        print(f"ckpt-model {args.command}: error: {error}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt as interrupt:
        signum = signal_number(interrupt)
        print(f"\nINTERRUPTED ({signal.Signals(signum).name}): everything the run started is stopped", flush=True)
        return 128 + signum


def run_command(args: argparse.Namespace) -> int:
    if args.command == "check":
        return run_check(args)
    if args.command == "replay":
        return run_replay(args)
    if args.command == "minimise":
        return run_minimise(args)
    if args.command == "scale":
        return run_scale(args)
    if args.command == "audit":
        return run_audit(args)
    return run_faults()


def run_audit(args: argparse.Namespace) -> int:
    """Every finding, then the verdict; a ROOT with no checkpoint is a usage error."""
    from ckpt_model.modes.audit import NothingToAudit, audit
    from ckpt_model.modes.audit_telemetry import NoTelemetry

    try:
        result = audit(args.root, args.episode_owner, args.telemetry)
    except (NothingToAudit, NoTelemetry) as error:
        raise UsageError(str(error)) from None
    print(result.report())
    if args.json is not None:
        write_output(args.json, result.json_text())
    return Exit.PASSED if result.passed else Exit.VIOLATION


def write_output(path: Path, text: str) -> None:
    """A result file written whole; one that cannot be written is a note, never a change of verdict."""
    from ckpt_model.results import check_result

    try:
        check_result.write(path, text)
    except OSError as error:
        print(f"note: could not write {path}: {error}", file=sys.stderr, flush=True)
    else:
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
