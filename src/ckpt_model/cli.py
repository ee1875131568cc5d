"""`ckpt-model`: the checker's command line (also `python -m ckpt_model`).

    ckpt-model check [--topology T] [--verify-mode M] [--faults a,b] [--token-capture] [--generation-cuts]
                     [--policy-workers N] [--profile P] [--examples N] [--steps N] [--seed N] [--no-minimise]
                     [--replays N] [--swarm] [--keep-artifacts DIR] [--json FILE] [--junit FILE]
                     [--verbose | --quiet]
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
    ckpt-model explore [--depth N] [--topology T] [--verify-mode M] [--rollouts N] [--max-time D] [--json FILE]
                                      explore the contract model breadth first to depth N (6): states and
                                      transitions per depth, every invariant of the model checked on every state,
                                      each broken one with a shortest path of rule calls (docs/explore.md)

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
import os
import signal
import sys
import time
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ckpt_model.commands.check import package_version, run_check
from ckpt_model.commands.modes import run_audit, run_faults, run_scale, run_stack
from ckpt_model.commands.replay import run_minimise, run_replay
from ckpt_model.durations import duration
from ckpt_model.errors import UsageError
from ckpt_model.interrupts import exit_now, signal_number, sigterm_unwinds
from ckpt_model.model.abstract import COVERAGE_DEPTH, EXPLORED_DEPTH, EXPLORED_ROLLOUTS
from ckpt_model.model.spec import OPTIONS, flag_keywords
from ckpt_model.model.topologies import EPISODE_OWNERS, TOPOLOGIES, VERIFY_MODES
from ckpt_model.results import progress
from ckpt_model.results.regression import TRAINER_CONTROLLER
from ckpt_model.results.reproduction import REPLAYS
from ckpt_model.results.verdicts import Exit
from ckpt_model.search import profiles
from ckpt_model.search.controllers import BY_NAME

if TYPE_CHECKING:  # the stateful module is imported only when a check runs
    pass

REAL_GYM_DOC = "docs/real-gym.md"


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


positive_int = int_at_least(1, "positive")
# Deeper than this the model's transitions number in the millions and take minutes to explore (docs/explore.md).
TRANSITION_DEPTH_MAX = 6


def transition_depth(text: str) -> int:
    """An argparse type: a depth from 1 to `TRANSITION_DEPTH_MAX`."""
    depth = positive_int(text)
    if depth > TRANSITION_DEPTH_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {TRANSITION_DEPTH_MAX} (got {text!r}): deeper takes minutes to explore; "
            "`ckpt-model explore --depth N --max-time D` goes as far as it can"
        )
    return depth


seed_int = int_at_least(0, "non-negative")


def build_parser() -> Parser:
    parser = Parser(
        prog="ckpt-model",
        description="A property-based stateful model checker for partial-rollout checkpointing (NeMo Gym's protocol).",
        epilog="exit codes: 0 passed, 1 property violation, 2 could not judge, 3 usage, 130 Ctrl-C, 143 SIGTERM",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{check,replay,minimise,audit,explore,stack,faults,fuzz,scale}"
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
        help="stop the search cleanly between examples by DURATION (90, 90s, 2m, 1h): no example begins that the "
        "median example so far would not end by then, none is cut short; minimise what it found and report what it "
        "covered; without --examples the search runs examples until then, in rounds "
        "(the trainer's): the first takes half the time, each later one is aimed at the coverage goals and rules "
        "the ones before it left unreached (docs/how-it-works.md#aiming)",
    )
    check.add_argument(
        "--aim",
        action="store_true",
        help="open each example with a path of rule calls to a transition of the contract model no example took yet "
        "(shallowest first; `ckpt-model explore`), then draw at random as any example does (docs/explore.md)",
    )
    check.add_argument(
        "--transition-depth",
        type=transition_depth,
        default=COVERAGE_DEPTH,
        metavar="N",
        help=f"reckon the transition coverage against the contract model explored to depth N (default "
        f"{COVERAGE_DEPTH}; `ckpt-model explore`); explored once per checker version and kept in .ckpt-model/explored",
    )
    check.add_argument(
        "--progress-every",
        type=duration,
        default=progress.EVERY_S,
        metavar="DURATION",
        help=f"without a terminal (piped output, a CI log), print a progress line this often (default "
        f"{progress.EVERY_S:g}s): examples, steps, failures, goals reached; on a terminal the line is redrawn in "
        "place instead",
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
    quietness = check.add_mutually_exclusive_group()
    quietness.add_argument(
        "--quiet",
        action="store_true",
        help="print only one line per verdict (FAILED P9 DEPLOYMENT: what broke, its rate and steps, the replay "
        "command; PASSED ...): no banner, no progress, no coverage table",
    )
    quietness.add_argument(
        "--verbose",
        action="store_true",
        help="the failure report also shows the example the search found before minimising and Hypothesis's "
        "@reproduce_failure line (by default: the minimal failure, then the details)",
    )
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

    explore = commands.add_parser(
        "explore",
        help="explore the contract model breadth first to a depth and check its invariants on every state "
        "(no processes; docs/explore.md)",
    )
    explore.add_argument(
        "--depth",
        type=positive_int,
        default=EXPLORED_DEPTH,
        help=f"rule steps from a fresh example (default {EXPLORED_DEPTH})",
    )
    explore.add_argument("--topology", choices=list(TOPOLOGIES), default="native", help="default: native")
    explore.add_argument("--verify-mode", choices=VERIFY_MODES, help="verify mode of a topology that runs several")
    for option in OPTIONS:
        explore.add_argument(option.flag(), **flag_keywords(option))
    explore.add_argument(
        "--rollouts",
        type=positive_int,
        default=EXPLORED_ROLLOUTS,
        help=f"rollouts live at once (default {EXPLORED_ROLLOUTS}, as the checker's runs keep)",
    )
    explore.add_argument(
        "--max-time", type=duration, metavar="DURATION", help="stop exploring by DURATION (90, 90s, 2m) and say so"
    )
    explore.add_argument(
        "--json", type=Path, metavar="FILE", help="write the levels, totals and violations (with paths) as JSON"
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


# --- entry -------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["stack"]:  # everything after it belongs to the stack's own parser
        return run_stack(arguments[1:])
    if arguments[:1] == ["fuzz"]:  # everything after it belongs to ckpt_model.search.fuzz's own parser
        from ckpt_model.search.fuzz import main as fuzz_main

        return fuzz_main(arguments[1:], prog="ckpt-model fuzz")
    parser = build_parser()
    args = parser.parse_args(arguments)
    # `--max-time` counts from the command's start, its imports included; a caller in-process (argv given) from now.
    args.started_s = time.monotonic() - (process_age_s() if argv is None else 0.0)
    try:
        with sigterm_unwinds():
            return run_command(args)
    except UsageError as error:
        print(f"ckpt-model {args.command}: error: {error}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt as interrupt:
        signum = signal_number(interrupt)
        print(f"\nINTERRUPTED ({signal.Signals(signum).name}): everything the run started is stopped", flush=True)
        for note in getattr(interrupt, "__notes__", ()):  # what the run kept, and where (`commands.check`)
            print(note, flush=True)
        return 128 + signum


def entry() -> NoReturn:
    """The `ckpt-model` command: `main`, then the process's exit, at once after an interrupt (`exit_now`): by then
    everything the run started is stopped and every file it kept is written, and the interpreter's own teardown
    alone takes 1.5 s on a loaded machine (load 16 on 2 cores), most of the 2 s an interrupt may take."""
    code = main()
    if code in (Exit.INTERRUPTED, Exit.TERMINATED):
        exit_now(code)
    raise SystemExit(code)


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc: its start in clock ticks after boot, and the uptime);
    0 where /proc cannot say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


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
    if args.command == "explore":
        from ckpt_model.commands.explore import run_explore

        return run_explore(args)
    return run_faults()


if __name__ == "__main__":
    entry()
