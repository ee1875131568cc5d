"""Ctrl-C and SIGTERM at a random moment in each phase of `ckpt-model` runs: honoured within 2 s, nothing left.

    python benchmarks/interrupt_soak.py [--runs 20] [--phases search,measuring,minimising,report]
        [--signals INT,TERM] [--fault resume_deletes_records] [--limit-s 2] [--keep DIR]

Every run is started as a terminal starts a foreground job (its own process group, Ctrl-C's default meaning) in one
project directory, which a first, uninterrupted `check --faults FAULT` seeds with a kept failure (its regression file
and timeline under `.ckpt-model/`); that run also measures how long each phase lasts. Then, for each phase asked,
`--runs` runs each get the signal (alternating between those of `--signals`) at a moment drawn uniformly within the
phase's measured length, counted from the moment the run is seen entering it:

- `search`, `measuring`, `minimising`, `report`: `check --faults FAULT --seed S` (a fresh seed per run), entered at
  the banner, at "measuring and minimising ...", when a file under `.ckpt-model/` is rewritten with the failure's
  rate (the measurement's end), and at "  found: ...";
- `passing`: a passing `check --examples 6 --seed S`, from its banner;
- `replay`: `replay` of the kept regression file; `scale`: `scale --rollouts 200`; `collection`:
  `check --controller collection --examples 3 --seed S`; each from its first line of output.

A run whose phase ended before its moment came is not counted and is run again (the "missed" column). Each counted
run is judged on: the time from the signal to the process's exit (`--limit-s`); its exit code, 130 for SIGINT and
143 for SIGTERM, or death by the signal itself (the "by signal" column: one that arrives while the interpreter
finishes a run that already gave its verdict; a shell reports it as 130 and 143 too); every process it started
gone (found by a marker in their environment) and its own temporary directory (`TMPDIR`) empty
`LEFTOVER_GRACE_S` after it exited; and every file kept under `.ckpt-model/` before it still there and no smaller
(the "kept lost" column). A file rewritten is counted apart (the kept failure's contents changed). Whatever a run
leaves is removed after it is counted, and everything the soak started is stopped and removed when it ends or is
itself interrupted. The table shows, per phase: runs, honoured within the limit, the wrong exit codes, the median
and the most time to exit, what was left, and the load average seen when the signals were sent.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import attrs

from ckpt_model.interrupts import sigterm_unwinds

MARKER_ENV = "CKPT_MODEL_INTERRUPT_SOAK_RUN"
LEFTOVER_GRACE_S = 5.0
HUNG_S = 60.0  # a run this long past its signal is stopped with SIGKILL and counted as not honoured
POLL_S = 0.02
KEPT = ".ckpt-model"
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}


@attrs.frozen
class Phase:
    """A phase: the command it is part of, and how a run is seen entering and leaving it."""

    name: str
    command: Callable[[argparse.Namespace, int], list[str]]
    enters: Callable[[Run], float | None]  # when the run entered the phase (monotonic), or None yet
    leaves: Callable[[Run], float | None]  # when it left it, or None yet


@attrs.define
class Run:
    """One `ckpt-model` process, its output lines with the moment each was read, and its marker."""

    process: subprocess.Popen[bytes]
    project: Path
    marker: str
    started_s: float
    started_ns: int
    lines: list[tuple[float, str]] = attrs.field(factory=list)
    rate_written_s: float | None = None

    def line_at(self, prefix: str) -> float | None:
        return next((at for at, line in list(self.lines) if line.startswith(prefix)), None)

    def exited_at(self) -> float | None:
        return time.monotonic() if self.process.poll() is not None else None

    def rate_written(self) -> float | None:
        """When a file under `.ckpt-model/` was first seen rewritten with a failure's rate by this run."""
        if self.rate_written_s is None and self.line_at("measuring") is not None:
            for path in (self.project / KEPT).rglob("*.json"):
                try:
                    if path.stat().st_mtime_ns >= self.started_ns and '"reproduction"' in path.read_text():
                        self.rate_written_s = time.monotonic()
                        break
                except OSError:
                    continue
        return self.rate_written_s


def check_faults(args: argparse.Namespace, seed: int) -> list[str]:
    return ["check", "--faults", args.fault, "--seed", str(seed)]


def first_line(run: Run) -> float | None:
    return run.lines[0][0] if run.lines else None


def ended(run: Run) -> float | None:
    return run.exited_at()


def banner(run: Run) -> float | None:
    return run.line_at("ckpt-model check")


PHASES = {
    phase.name: phase
    for phase in (
        Phase("search", check_faults, banner, lambda run: run.line_at("measuring")),
        Phase("measuring", check_faults, lambda run: run.line_at("measuring"), Run.rate_written),
        Phase("minimising", check_faults, Run.rate_written, lambda run: run.line_at("  found:")),
        Phase("report", check_faults, lambda run: run.line_at("  found:"), ended),
        Phase("passing", lambda args, seed: ["check", "--examples", "6", "--seed", str(seed)], banner, ended),
        Phase("replay", lambda args, seed: ["replay", str(args.kept_file)], first_line, ended),
        Phase("scale", lambda args, seed: ["scale", "--rollouts", "200"], first_line, ended),
        Phase(
            "collection",
            lambda args, seed: ["check", "--controller", "collection", "--examples", "3", "--seed", str(seed)],
            banner,
            ended,
        ),
    )
}


@attrs.frozen
class Outcome:
    phase: str
    signum: int
    latency_s: float
    said_s: float | None  # from the signal to the line INTERRUPTED: the rest of the latency is the exit itself
    exit_code: int | None
    load: float
    processes_left: tuple[str, ...]
    temp_left: tuple[str, ...]
    kept_removed: tuple[str, ...]
    kept_shrunk: tuple[str, ...]
    kept_rewritten: tuple[str, ...]
    output: tuple[str, ...]

    def honoured(self, limit_s: float) -> bool:
        """Ended within the limit with 128 + the signal's number, or by the signal itself (what a shell reports
        the same way): one that arrives while the interpreter finishes a run that already gave its verdict."""
        return self.latency_s <= limit_s and self.exit_code in (128 + self.signum, -self.signum)


# --- processes ------------------------------------------------------------------------------------------------


def default_sigint() -> None:
    """A run's Ctrl-C means what it means at a terminal, even if this script was started with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: argparse.Namespace, phase: Phase, project: Path, temp: Path, seed: int) -> Run:
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER_ENV: marker, "TMPDIR": str(temp)}
    argv = [str(args.ckpt_model), *phase.command(args, seed)]
    started_ns = time.time_ns()
    process = subprocess.Popen(
        argv,
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    run = Run(process, project, marker, time.monotonic(), started_ns)
    threading.Thread(target=read_lines, args=(run,), name="soak-output", daemon=True).start()
    return run


def read_lines(run: Run) -> None:
    assert run.process.stdout is not None
    for raw in run.process.stdout:
        run.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))


def marked(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment carries `marker`: the run's, wherever they were re-parented."""
    found = []
    needle = f"{MARKER_ENV}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    """A process as `ps` shows it: its pid and the start of its command line."""
    try:
        command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return str(pid)
    return f"{pid} {command[:80]}"


def kill_marked(marker: str) -> None:
    """SIGKILL every process of the run's that is left (each was started by the run this soak started)."""
    for pid in marked(marker):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop(run: Run) -> None:
    """Whatever the run left running, stopped: its process group, then every marked process."""
    if run.process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)
        run.process.wait()
    kill_marked(run.marker)
    wait_for(lambda: not marked(run.marker), LEFTOVER_GRACE_S)


# --- the kept failures ----------------------------------------------------------------------------------------


def kept_files(project: Path) -> dict[str, tuple[int, str]]:
    """Every file under `.ckpt-model/`: its size and digest."""
    root = project / KEPT
    files = {}
    for path in sorted(root.rglob("*")) if root.exists() else []:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            files[str(path.relative_to(project))] = (len(data), hashlib.sha256(data).hexdigest())
    return files


# --- one run --------------------------------------------------------------------------------------------------


def interrupted_run(
    args: argparse.Namespace, phase: Phase, span_s: float, signum: int, project: Path, temp: Path
) -> Outcome | None:
    """One run signalled at a random moment within the phase; None if the phase ended before that moment."""
    temp.mkdir()
    before = kept_files(project)
    run = start(args, phase, project, temp, random.randrange(2**32))
    try:
        if not wait_for(lambda: phase.enters(run) is not None or run.process.poll() is not None, HUNG_S * 5):
            raise SystemExit(f"{phase.name}: the run never entered the phase\n" + tail(run))
        entered = phase.enters(run)
        if entered is None:
            return None
        moment = entered + random.uniform(0.0, span_s)
        while time.monotonic() < moment:
            if phase.leaves(run) is not None or run.process.poll() is not None:
                return None
            time.sleep(POLL_S)
        if phase.leaves(run) is not None or run.process.poll() is not None:
            return None
        load = os.getloadavg()[0]
        os.killpg(run.process.pid, signum)
        sent_s = time.monotonic()
        try:
            run.process.wait(timeout=HUNG_S)
            latency_s = time.monotonic() - sent_s
        except subprocess.TimeoutExpired:
            latency_s = float("inf")
        exit_code = run.process.poll()
        wait_for(lambda: run.line_at("INTERRUPTED") is not None, 1.0)  # read by the output's thread
        said = run.line_at("INTERRUPTED")
        wait_for(lambda: not marked(run.marker) and not any(temp.iterdir()), LEFTOVER_GRACE_S)
        processes_left = tuple(describe(pid) for pid in marked(run.marker))
        temp_left = tuple(sorted(entry.name for entry in temp.iterdir()))
    finally:
        stop(run)
        shutil.rmtree(temp, ignore_errors=True)
    after = kept_files(project)
    return Outcome(
        phase=phase.name,
        signum=signum,
        latency_s=latency_s,
        said_s=None if said is None else said - sent_s,
        exit_code=exit_code,
        load=load,
        processes_left=processes_left,
        temp_left=temp_left,
        kept_removed=tuple(path for path in before if path not in after),
        kept_shrunk=tuple(path for path in before if path in after and after[path][0] < before[path][0]),
        kept_rewritten=tuple(path for path in before if path in after and after[path][1] != before[path][1]),
        output=tuple(f"{at - sent_s:+8.3f} {line}" for at, line in run.lines),
    )


def tail(run: Run, lines: int = 15) -> str:
    return "\n".join(f"    | {line}" for _, line in run.lines[-lines:])


# --- calibration: one uninterrupted run per command ------------------------------------------------------------


def spans(args: argparse.Namespace, phases: Sequence[Phase], project: Path, temp_root: Path) -> dict[str, float]:
    """Each phase's length in one uninterrupted run of its command (the first seeds the kept failure)."""
    measured: dict[str, float] = {}
    runs: dict[object, Run] = {}
    for index, phase in enumerate(phases):
        run = runs.get(phase.command)
        if run is None:
            temp = temp_root / f"calibration-{index}"
            temp.mkdir()
            run = runs[phase.command] = start(args, phase, project, temp, random.randrange(2**32))
            try:
                watched = [p for p in phases if p.command is phase.command]
                marks: dict[str, list[float | None]] = {p.name: [None, None] for p in watched}
                while run.process.poll() is None:  # the phases' ends are polled as they pass (the rate file's)
                    for p in watched:
                        marks[p.name] = [marks[p.name][0] or p.enters(run), marks[p.name][1] or p.leaves(run)]
                    time.sleep(POLL_S)
                exited_s = time.monotonic()
                for p in watched:
                    entered, left = marks[p.name]
                    entered = entered or p.enters(run)
                    measured[p.name] = ((left or exited_s) - entered) if entered is not None else 0.0
                print(f"calibration: {' '.join(phase.command(args, 0))}: exit {run.process.returncode}", flush=True)
            finally:
                stop(run)
                shutil.rmtree(temp, ignore_errors=True)
    return measured


# --- the table ------------------------------------------------------------------------------------------------


def table(outcomes: Sequence[Outcome], misses: dict[str, int], limit_s: float) -> str:
    header = (
        "phase", "runs", f"<= {limit_s:g} s", "wrong exit", "by signal", "median s", "max s", "procs left", "tmp left",
        "kept lost", "rewritten", "missed", "load",
    )  # fmt: skip
    rows = [header]
    for name in dict.fromkeys(outcome.phase for outcome in outcomes):
        mine = [outcome for outcome in outcomes if outcome.phase == name]
        latencies = [outcome.latency_s for outcome in mine]
        loads = [outcome.load for outcome in mine]
        rows.append(
            (
                name,
                str(len(mine)),
                str(sum(outcome.honoured(limit_s) for outcome in mine)),
                str(sum(outcome.exit_code not in (128 + outcome.signum, -outcome.signum) for outcome in mine)),
                str(sum(outcome.exit_code == -outcome.signum for outcome in mine)),
                f"{statistics.median(latencies):.2f}",
                f"{max(latencies):.2f}",
                str(sum(bool(outcome.processes_left) for outcome in mine)),
                str(sum(bool(outcome.temp_left) for outcome in mine)),
                str(sum(bool(outcome.kept_removed or outcome.kept_shrunk) for outcome in mine)),
                str(sum(bool(outcome.kept_rewritten) for outcome in mine)),
                str(misses.get(name, 0)),
                f"{min(loads):.1f}-{max(loads):.1f}",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)


def problems(outcome: Outcome, limit_s: float) -> list[str]:
    found = []
    if not outcome.honoured(limit_s):
        found.append(f"exit {outcome.exit_code} after {outcome.latency_s:.2f} s")
    found += [f"process left: {left}" for left in outcome.processes_left]
    found += [f"temporary entry left: {left}" for left in outcome.temp_left]
    found += [f"kept file removed: {path}" for path in outcome.kept_removed]
    found += [f"kept file shrunk: {path}" for path in outcome.kept_shrunk]
    return found


@contextmanager
def soak_root(keep: Path | None) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ckpt-soak-")) if keep is None else keep
    root.mkdir(parents=True, exist_ok=True)
    try:
        yield root
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="counted runs per phase (default 20)")
    parser.add_argument("--phases", default="search,measuring,minimising,report", help=f"of {', '.join(PHASES)}")
    parser.add_argument("--signals", default="INT,TERM", help="sent in turn: INT, TERM or both (default)")
    parser.add_argument("--fault", default="resume_deletes_records", help="the planted fault of `check --faults`")
    parser.add_argument("--limit-s", type=float, default=2.0, help="the most time from the signal to the exit")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temporary one)")
    parser.add_argument("--verbose", action="store_true", help="a line per run")
    parser.add_argument("--logs", type=Path, help="write here the whole output of each run that left a problem")
    args = parser.parse_args(argv)
    args.ckpt_model = Path(sys.executable).with_name("ckpt-model")
    phases = [PHASES[name] for name in args.phases.split(",")]
    signums = [SIGNALS[name] for name in args.signals.split(",")]
    outcomes: list[Outcome] = []
    misses: dict[str, int] = {}
    with sigterm_unwinds(), soak_root(args.keep) as root:
        project = root / "project"
        project.mkdir(exist_ok=True)
        measured = spans(args, [PHASES["search"]], project, root)  # the run that keeps a failure
        args.kept_file = next((project / KEPT).rglob("*.json"), None)
        if args.kept_file is None:
            raise SystemExit("the calibration run kept no failure: nothing to check the runs keep")
        measured.update(spans(args, [phase for phase in phases if phase.name not in measured], project, root))
        print(f"phase lengths (s): {', '.join(f'{name} {seconds:.1f}' for name, seconds in measured.items())}")
        print(f"load average at the start: {' '.join(f'{value:.1f}' for value in os.getloadavg())}", flush=True)
        for phase in phases:
            span_s = max(measured[phase.name], 0.2)
            counted = 0
            while counted < args.runs:
                signum = signums[(counted + misses.get(phase.name, 0)) % len(signums)]
                temp = root / f"tmp-{phase.name}-{counted}-{misses.get(phase.name, 0)}"
                outcome = interrupted_run(args, phase, span_s, signum, project, temp)
                if outcome is None:
                    misses[phase.name] = misses.get(phase.name, 0) + 1
                    if misses[phase.name] > 3 * args.runs:
                        raise SystemExit(f"{phase.name}: too many runs ended the phase before their moment")
                    continue
                counted += 1
                outcomes.append(outcome)
                found = problems(outcome, args.limit_s)
                if args.verbose or found:
                    name = signal.Signals(outcome.signum).name
                    print(
                        f"{phase.name} #{counted} {name}: exit {outcome.exit_code} in {outcome.latency_s:.2f} s"
                        f" (INTERRUPTED said after {outcome.said_s or float('nan'):.2f} s; load {outcome.load:.1f})"
                        + "".join(f"\n  {problem}" for problem in found),
                        flush=True,
                    )
                    if found:
                        print("\n".join(f"    | {line}" for line in outcome.output[-15:]), flush=True)
                    if found and args.logs is not None:
                        args.logs.mkdir(parents=True, exist_ok=True)
                        log = args.logs / f"{phase.name}-{counted}-{name}.log"
                        log.write_text("\n".join(outcome.output) + "\n")
                        print(f"  whole output (seconds from the signal): {log}", flush=True)
        print(table(outcomes, misses, args.limit_s))
        print(f"load average at the end: {' '.join(f'{value:.1f}' for value in os.getloadavg())}")
    return 0 if all(not problems(outcome, args.limit_s) for outcome in outcomes) else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt as interrupt:  # everything the soak started is stopped and removed by now
        print(f"\ninterrupted: everything the soak started is stopped and removed ({interrupt!r})", flush=True)
        raise SystemExit(130) from None
