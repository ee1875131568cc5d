"""Searching on many cores and many machines: HypoFuzz workers over the state machine, sharing one example database.

    python -m ckpt_model.search.fuzz worker [--redis URL] [-n N] [--topology T] [--verify-mode M] [--faults a,b]
                                     [--profile P] [--dashboard] [--max-time DURATION]
        HypoFuzz (`hypothesis fuzz`) with N processes (default: one per core) over the state machine, until Ctrl-C
        or SIGTERM, or for DURATION (then stopped as by Ctrl-C, saying what each deployment covered and found, from
        the reports and failures HypoFuzz saved in the database; exit 0 if it saved no new failing example, else 1
        and the `replay` command that reports it): the deployment the faults need (`DeploymentSpec.for_faults`), or
        every fault-free one (`ckpt_model.model.spec.FAULT_FREE`) when neither faults nor a topology are named.
        Failures and the corpus go to the Redis example database at URL (`CKPT_MODEL_REDIS_URL` for the workers),
        else to .hypothesis/examples here.
    python -m ckpt_model.search.fuzz replay [--redis URL] [--topology T] [--verify-mode M] [--faults a,b] [--profile P]
        replays what the database holds for the deployment and generates nothing: exit 1 with the report if a
        saved example breaks a property (the exit codes are `ckpt-model check`'s).
    python -m ckpt_model.search.fuzz redis [--port P] [--bind ADDR]
        a throwaway Redis server in a temporary directory, until Ctrl-C or SIGTERM; prints its URL.

How a HypoFuzz failure replays under plain Hypothesis: both key the example database on the digest of the
`@given` test `get_state_machine_test` builds, which hashes the machine factory's source, signature and
`_hypothesis_internal_add_digest`. HypoFuzz saves a failure unshrunk under `<key>.secondary` as soon as it finds it
and shrunk under `<key>`, exactly where Hypothesis's reuse phase reads. So each fuzz target's factory carries the
digest of `machine_for(harness)`'s factory for its deployment (`lazy_machine`): `tests/stateful`, `ckpt-model
check` and `replay` with the same database replay what a worker found. The steps per example come from the
profile, so replay with the profile the workers used (both default to `ci`).

HypoFuzz fuzzes collected pytest tests, so the targets are `unittest.TestCase` classes in this module, one per
deployment named in `CKPT_MODEL_FUZZ_TARGETS` (which `worker` sets: `DeploymentSpec.words`, whitespace-separated),
marked as Hypothesis state machine tests;
without that variable this module defines none and loads no profile. A target's harness lives from its class
set-up to its tear-down (HypoFuzz sets a class up whenever it switches to it), and dies with its process:
the backend and the fork server stop when their parent does, and `worker` removes the temporary directory the
HypoFuzz processes write in.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import multiprocessing.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import attrs

from ckpt_model.durations import duration
from ckpt_model.errors import UsageError
from ckpt_model.interrupts import signal_number, sigterm_unwinds
from ckpt_model.model.spec import FAULT_FREE, DeploymentSpec, SpecError
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.search import profiles

if TYPE_CHECKING:
    from hypothesis import settings
    from hypothesis.database import ExampleDatabase

    from ckpt_model.deployments.harness import Harness
    from ckpt_model.trainer.machine import CheckpointMachine

TARGETS_ENV = "CKPT_MODEL_FUZZ_TARGETS"
DEFAULT_PROFILE = "ci"

# `hypothesis fuzz` (HypoFuzz adds the command), started with this interpreter rather than a console script.
HYPOFUZZ = "import sys; from hypothesis.extra.cli import main; sys.exit(main())"
STOP_TIMEOUT_S = 30.0
REDIS_START_TIMEOUT_S = 30.0
REDIS_PORT_TRIES = 5
POLL_S_MIN, POLL_S_MAX = 0.001, 0.02
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Where HypoFuzz keeps its reports of a target, after the target's key (`hypofuzz.database`), and the statuses of
# an example its reports count (Hypothesis's `Status`: overrun 0, invalid 1, valid 2, interesting 3).
REPORTS_SUFFIX = b".hypofuzz.reports"
VALID_STATUS, INTERESTING_STATUS = "2", "3"


class RedisUnavailable(RuntimeError):
    """No Redis server could be started here (none installed, or it did not come up)."""


# --- fuzz targets ------------------------------------------------------------------------------------------


def case_name(spec: DeploymentSpec) -> str:
    """The class name pytest and HypoFuzz show: `FuzzSlowReplay`, `FuzzNative_resume_deletes_records`."""
    words = (spec.topology, *spec.verify_words, *spec.option_words)
    return "Fuzz" + "".join(word.capitalize() for word in words) + "".join("_" + fault for fault in spec.faults)


def start(spec: DeploymentSpec) -> Harness:
    """A harness of a fuzz target's deployment. With planted faults its failures are expected, so their regression
    files stay with the harness (as `faultsearch.harness_for` does); without, they go where the user keeps them."""
    from ckpt_model.deployments.harness import Harness

    harness = Harness.embedded(spec)
    if spec.faults:
        harness.regressions_dir = harness.root / "regressions"
    return harness


def targets_of(environ: Mapping[str, str] = os.environ) -> tuple[DeploymentSpec, ...]:
    """The deployments `CKPT_MODEL_FUZZ_TARGETS` names (whitespace-separated `DeploymentSpec.words`)."""
    return tuple(DeploymentSpec.from_words(word) for word in environ.get(TARGETS_ENV, "").split())


def lazy_machine(target: DeploymentSpec, harness_of: Callable[[], Harness]) -> type[CheckpointMachine]:
    """A machine factory for `target` that HypoFuzz can collect before any harness exists.

    `harness_of()` gives the harness when an example starts. The factory keys the example database exactly as
    `machine_for(harness)` does for a harness of this deployment: `__wrapped__` points `inspect` at
    `machine_for`'s factory (its source and signature), and the deployment digest is copied over (what
    `ckpt-model check --seed` does too). `tests/fuzz` holds the two keys equal."""
    from ckpt_model.trainer.machine import CheckpointMachine, machine_for

    # Only its digest is used, which reads the harness's spec: a stand-in that holds only the spec; never called.
    template = machine_for(cast("Harness", SimpleNamespace(spec=target)))

    def machine() -> CheckpointMachine:
        return CheckpointMachine(harness_of())

    functools.update_wrapper(machine, template)  # __wrapped__, and __dict__ with the deployment digest
    return cast("type[CheckpointMachine]", machine)


def fuzz_case(target: DeploymentSpec, target_settings: settings) -> type[unittest.TestCase]:
    """A `unittest.TestCase` that runs the machine against `target`, marked as the state machine test HypoFuzz
    fuzzes (as `RuleBasedStateMachine.TestCase` is); plain pytest runs it like `tests/stateful` does."""
    from hypothesis.stateful import run_state_machine_as_test

    class Case(unittest.TestCase):
        settings: ClassVar[Any] = target_settings
        harness: ClassVar[Harness | None] = None
        close_harness: ClassVar[Any] = None

        @classmethod
        def setUpClass(cls) -> None:
            harness = cls.harness = start(target)
            # Runs once: at tear-down, or when the process ends without one. A HypoFuzz worker is a
            # multiprocessing child, which runs these finalizers when it is interrupted but not atexit's.
            cls.close_harness = multiprocessing.util.Finalize(harness, harness.close, exitpriority=10)

        @classmethod
        def tearDownClass(cls) -> None:
            cls.harness = None
            if cls.close_harness is not None:
                cls.close_harness()

        def runTest(self) -> None:
            run_state_machine_as_test(factory, settings=self.settings)

    def harness_of() -> Harness:
        assert Case.harness is not None, "a fuzz target's harness starts in its class set-up"
        return Case.harness

    factory = lazy_machine(target, harness_of)
    Case.runTest.is_hypothesis_test = True  # type: ignore[attr-defined]  # pytest marks it `hypothesis`
    Case.runTest._hypothesis_state_machine_class = factory  # type: ignore[attr-defined]  # HypoFuzz's hook
    Case.__name__ = Case.__qualname__ = case_name(target)
    return Case


def define_targets(namespace: dict[str, Any], targets: Sequence[DeploymentSpec], target_settings: settings) -> None:
    """Put one test class per deployment in `namespace`, for pytest (and so HypoFuzz) to collect."""
    for target in targets:
        namespace[case_name(target)] = fuzz_case(target, target_settings)


if targets_of():  # only in the processes `worker` starts, which need the shared database in the loaded profile
    define_targets(globals(), targets_of(), profiles.profile_for(profiles.load(), profiles.in_ci()))


# --- Redis -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(port: int | None = None, bind: str = "127.0.0.1") -> Iterator[str]:
    """A Redis server of our own, in a temporary directory, persisting nothing; yields its URL.

    Stopped and its directory removed on the way out, interrupted or not; it also gets SIGTERM if this process dies
    first. Without `port`, a port the kernel reports free, tried again if another process takes it meanwhile."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise RedisUnavailable("redis-server is not installed: apt-get install -y redis-server")
    with tempfile.TemporaryDirectory(prefix="ckpt-model-redis-") as directory:
        for _ in range(1 if port is not None else REDIS_PORT_TRIES):
            chosen = port if port is not None else unused_port(bind)
            process = start_redis(executable, chosen, bind, Path(directory))
            try:
                if wait_redis_ready(process, bind, chosen):
                    yield f"redis://{bind}:{chosen}/0"
                    return
            finally:
                stop(process)
        log_path = Path(directory) / "redis.log"
        log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
        raise RedisUnavailable(f"redis-server did not start on {bind}; its log:\n{log}")


def unused_port(bind: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as probe:
        probe.bind((bind, 0))
        return int(probe.getsockname()[1])


def start_redis(executable: str, port: int, bind: str, directory: Path) -> subprocess.Popen[bytes]:
    argv = [executable, "--port", str(port), "--bind", bind, "--dir", str(directory), "--save", ""]
    argv += ["--appendonly", "no", "--daemonize", "no", "--logfile", str(directory / "redis.log")]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent())


def die_with_parent() -> Callable[[], None]:
    """A `preexec_fn`: SIGTERM to the child when the process that started it dies (Linux), so none is orphaned.

    `prctl` is looked up here, in the parent: the child, forked from a process with threads, only calls it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return in_child


def wait_redis_ready(process: subprocess.Popen[bytes], bind: str, port: int) -> bool:
    """Poll PING until the server answers (True) or exits (False: its port was taken); a server that neither
    answers nor exits within the start timeout is a `RedisUnavailable`."""
    import redis

    client = redis.Redis(host=bind, port=port, socket_connect_timeout=1.0)
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    pause_s = POLL_S_MIN
    try:
        while process.poll() is None:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return True
            if time.monotonic() > deadline:
                raise RedisUnavailable(f"redis-server on {bind}:{port} did not answer in {REDIS_START_TIMEOUT_S} s")
            time.sleep(pause_s)  # polling a server that is starting; no ordering depends on it
            pause_s = min(pause_s * 2, POLL_S_MAX)
        return False
    finally:
        client.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it is still there after the stop timeout; reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- commands ----------------------------------------------------------------------------------------------


def chosen_targets(args: argparse.Namespace) -> tuple[DeploymentSpec, ...]:
    """The deployment the options name (`DeploymentSpec.for_faults`, as `ckpt-model check` picks), else every
    fault-free deployment."""
    from ckpt_model.deployments.catalogue import UnknownFaults, faults_named

    try:
        faults = faults_named(args.faults)
    except UnknownFaults as error:
        raise UsageError(str(error)) from None
    if not faults and args.topology is None:
        return FAULT_FREE
    try:
        return (DeploymentSpec.for_faults(faults, topology=args.topology, verify_mode=args.verify_mode),)
    except SpecError as error:
        raise UsageError(str(error)) from None


def searching_settings(profile: str, environ: Mapping[str, str]) -> settings:
    """The profile the workers load; HypoFuzz fuzzes only random runs that keep a database."""
    chosen = profiles.profile_for(profile, profiles.in_ci(environ), environ)
    if chosen.derandomize or chosen.database is None:
        raise UsageError(
            f"profile {profile!r} is derandomized with no example database here (CI is set): "
            f"pick a random profile with a database, such as --profile {DEFAULT_PROFILE}"
        )
    return chosen


def worker_environment(args: argparse.Namespace, targets: Sequence[DeploymentSpec], tmp: str) -> dict[str, str]:
    environ = dict(os.environ)
    environ.update({TARGETS_ENV: " ".join(target.words for target in targets), profiles.PROFILE_ENV: args.profile})
    environ["TMPDIR"] = tmp  # every directory a harness makes, removed with it even after a SIGKILL
    if args.redis:
        environ[profiles.REDIS_ENV] = args.redis
    return environ


def run_worker(args: argparse.Namespace, prog: str) -> int:
    """HypoFuzz over the chosen deployments in its own process group, until it ends or we are interrupted."""
    if args.processes is not None and args.processes < 1:
        raise UsageError(f"-n must be at least 1 (got {args.processes})")
    targets = chosen_targets(args)
    # Kept short: HypoFuzz's multiprocessing manager listens on a socket file in here (108 bytes at most).
    with tempfile.TemporaryDirectory(prefix="ckpt-fuzz-") as tmp:
        environ = worker_environment(args, targets, tmp)
        chosen = searching_settings(args.profile, environ)
        argv = [sys.executable, "-c", HYPOFUZZ, "fuzz"]
        argv += ["-n", str(args.processes)] if args.processes else []  # HypoFuzz's default: one per physical core
        argv += ["--dashboard"] if args.dashboard else ["--no-dashboard"]
        # Only this module's targets: no conftest, no cache, none of the addopts of the directory it runs in.
        argv += ["--", str(Path(__file__).resolve()), "-p", "no:cacheprovider", "--noconftest", "-o", "addopts=", "-q"]
        print(
            f"{prog} worker: {args.processes or 'one per core:'} HypoFuzz process(es) over "
            f"{', '.join(target.words for target in targets)}; profile {args.profile} "
            f"({chosen.stateful_step_count} steps per example), {profiles.database_label(chosen.database)}",
            flush=True,
        )
        bounded = TimeBound(chosen.database, targets) if args.max_time is not None else None
        fuzzer = subprocess.Popen(argv, env=environ, start_new_session=True, preexec_fn=default_sigint)
        try:
            if bounded is None:
                return fuzzer.wait()
            try:
                return fuzzer.wait(args.max_time)
            except subprocess.TimeoutExpired:
                print(
                    f"{prog} worker: time limit reached (--max-time {args.max_time:g} s): stopping the workers as "
                    "Ctrl-C does (HypoFuzz prints the interrupt's traceback as they stop)",
                    flush=True,
                )
                stop_group(fuzzer)  # HypoFuzz's workers tear their harnesses down
                return bounded.report(args, prog)
        finally:
            stop_group(fuzzer)


# --- a worker bounded by time ------------------------------------------------------------------------------------


@attrs.frozen
class Covered:
    """What HypoFuzz's workers reported for one target since a moment: examples run (`valid` of them valid, the
    rest Hypothesis discarded or cut short), the behaviours and fingerprints HypoFuzz's coverage counts saw, and
    the workers that reported."""

    examples: int = 0
    valid: int = 0
    behaviors: int = 0
    fingerprints: int = 0
    workers: int = 0

    def words(self) -> str:
        if not self.workers:
            return "no report from a worker yet (HypoFuzz reports on starting a phase, and then now and then)"
        return (
            f"{self.examples} examples ({self.valid} valid), {self.behaviors} behaviours, "
            f"{self.fingerprints} fingerprints, from {self.workers} worker(s)"
        )


def covered_since(reports: Iterable[bytes], since: float) -> Covered:
    """What the HypoFuzz reports (`<key>.hypofuzz.reports`, JSON) saved at or after `since` (a Unix time) say: a
    worker's report counts its own examples since it started, so each worker's latest counts, summed over workers;
    behaviours and fingerprints are the most any worker saw. A report that does not parse is skipped."""
    latest: dict[str, dict[str, Any]] = {}
    for raw in reports:
        try:
            report = json.loads(raw)
            timestamp, worker = float(report["timestamp"]), str(report["worker_uuid"])
        except (ValueError, KeyError, TypeError):
            continue
        if timestamp >= since and (worker not in latest or timestamp > float(latest[worker]["timestamp"])):
            latest[worker] = report
    counts = [{str(key): int(n) for key, n in report.get("status_counts", {}).items()} for report in latest.values()]
    return Covered(
        examples=sum(sum(count.values()) for count in counts),
        valid=sum(count.get(VALID_STATUS, 0) + count.get(INTERESTING_STATUS, 0) for count in counts),
        behaviors=max((int(report.get("behaviors", 0)) for report in latest.values()), default=0),
        fingerprints=max((int(report.get("fingerprints", 0)) for report in latest.values()), default=0),
        workers=len(latest),
    )


def database_key(target: DeploymentSpec) -> bytes:
    """The key HypoFuzz and plain Hypothesis both keep `target`'s examples under (`lazy_machine`)."""
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    def no_harness() -> Harness:
        raise AssertionError("only the key is wanted")

    test = get_state_machine_test(lazy_machine(target, no_harness))
    return function_digest(test.hypothesis.inner_test)  # type: ignore[attr-defined]


def saved_failures(database: ExampleDatabase, key: bytes) -> set[bytes]:
    """The failing examples saved under `key`: shrunk (the key itself) and unshrunk (`.secondary`)."""
    return set(database.fetch(key)) | set(database.fetch(key + b".secondary"))


class TimeBound:
    """A worker run bounded by `--max-time`: what the database held before it started, so that what it found and
    covered can be told at its end (`report`)."""

    def __init__(self, database: ExampleDatabase | None, targets: Sequence[DeploymentSpec]) -> None:
        self.database, self.targets = database, tuple(targets)
        self.keys = {target: database_key(target) for target in self.targets}
        self.before = {target: self._failures(target) for target in self.targets}
        self.started, self.started_s = time.time(), time.monotonic()

    def _failures(self, target: DeploymentSpec) -> set[bytes]:
        return saved_failures(self.database, self.keys[target]) if self.database is not None else set()

    def report(self, args: argparse.Namespace, prog: str) -> int:
        """Say what each target covered and found since the start; exit 1 if a new failing example was saved (the
        report is `replay`'s), else 0, as a pass."""
        from ckpt_model.results.verdicts import Exit

        elapsed_s = time.monotonic() - self.started_s
        print(f"{prog} worker: stopped at its time limit (--max-time {args.max_time:g} s) after {elapsed_s:.0f} s")
        found = []
        for target in self.targets:
            new = len(self._failures(target) - self.before[target])
            reports = self.database.fetch(self.keys[target] + REPORTS_SUFFIX) if self.database is not None else ()
            covered = covered_since(reports, self.started)
            print(f"  {target.words}: {covered.words()}; {new} new failing example(s) saved", flush=True)
            if new:
                found.append(target)
        if not found:
            print("PASSED: no failing example found within the time limit", flush=True)
            return int(Exit.PASSED)
        names = ", ".join(target.words for target in found)
        print(f"FAILED: a failing example saved for {names}: {replay_command(args, prog)} reports it", flush=True)
        return int(Exit.VIOLATION)


def replay_command(args: argparse.Namespace, prog: str) -> str:
    """The `replay` command for what the worker saved: the same database, profile and deployments."""
    words = [prog, "replay", *(["--redis", args.redis] if args.redis else []), "--profile", args.profile]
    words += ["--topology", args.topology] if args.topology else []
    words += ["--verify-mode", args.verify_mode] if args.verify_mode else []
    words += ["--faults", args.faults] if args.faults else []
    return " ".join(words)


def default_sigint() -> None:
    """In the child before exec: Ctrl-C's default meaning back (a shell's background job starts with SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler), so `stop_group` can interrupt it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(process: subprocess.Popen[Any]) -> None:
    """Ctrl-C to the whole group (HypoFuzz's workers tear their harnesses down), SIGKILL after the stop timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):  # whatever of the group is left, gone or not
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_replay(args: argparse.Namespace) -> int:
    """Every example the database holds for the deployment, and nothing generated: the verdict `check` gives."""
    from hypothesis import Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from ckpt_model.results.verdicts import Exit, report_failure
    from ckpt_model.trainer.machine import machine_for

    environ = dict(os.environ)
    if args.redis:
        environ[profiles.REDIS_ENV] = args.redis
    chosen = settings(searching_settings(args.profile, environ), phases=(Phase.explicit, Phase.reuse))
    verdicts = []
    for target in chosen_targets(args):
        print(f"ckpt-model fuzz replay: {target.words}, {profiles.database_label(chosen.database)}", flush=True)
        try:
            harness = start(target)
            try:
                run_state_machine_as_test(machine_for(harness), settings=chosen)
            finally:
                harness.close()
        except Exception as error:
            verdicts.append(report_failure(error))
        else:
            print("PASSED: no example in the database breaks a property", flush=True)
            verdicts.append(Exit.PASSED)
    return max(verdicts)


def run_redis(args: argparse.Namespace) -> int:
    with redis_server(args.port, args.bind) as url:
        print(f"{profiles.REDIS_ENV}={url}", flush=True)
        signal.pause()
    return 0


def build_parser(prog: str = "python -m ckpt_model.search.fuzz") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="HypoFuzz workers over the state machine until Ctrl-C")
    replay = commands.add_parser("replay", help="replay what the database holds for a deployment, generating nothing")
    for command in (worker, replay):
        command.add_argument("--redis", metavar="URL", help=f"the shared example database (sets {profiles.REDIS_ENV})")
        command.add_argument("--topology", choices=list(TOPOLOGIES))
        command.add_argument("--verify-mode", choices=("wait", "replay"))
        command.add_argument("--faults", default="", help="comma-separated planted faults")
        command.add_argument(
            "--profile", choices=sorted(profiles.PROFILES), default=DEFAULT_PROFILE, help=f"default: {DEFAULT_PROFILE}"
        )
    worker.add_argument("-n", "--processes", type=int, help="HypoFuzz processes (default: one per physical core)")
    worker.add_argument("--dashboard", action="store_true", help="serve HypoFuzz's dashboard on localhost:9999")
    worker.add_argument(
        "--max-time",
        type=duration,
        metavar="DURATION",
        help="stop the workers (as Ctrl-C does) after DURATION (90, 90s, 2m, 1h), say what each deployment covered "
        "and found; exit 0 if no new failing example was saved, else 1",
    )
    redis = commands.add_parser("redis", help="a throwaway Redis server here, until Ctrl-C; prints its URL")
    redis.add_argument("--port", type=int, help="default: a free port")
    redis.add_argument("--bind", default="127.0.0.1", help="default: 127.0.0.1")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m ckpt_model.search.fuzz") -> int:
    """The commands above; `ckpt-model fuzz ...` hands its arguments here with its own `prog`."""
    args = build_parser(prog).parse_args(argv)
    try:
        with sigterm_unwinds():
            if args.command == "worker":
                return run_worker(args, prog)
            if args.command == "replay":
                return run_replay(args)
            return run_redis(args)
    except UsageError as error:
        print(f"{prog} {args.command}: error: {error}", file=sys.stderr)
        return 3
    except RedisUnavailable as error:
        print(f"{prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        signum = signal_number(interrupt)
        print(f"\nINTERRUPTED ({signal.Signals(signum).name}): everything started is stopped", flush=True)
        return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())
