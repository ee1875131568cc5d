"""Progress of a long run: examples, rules drawn, failures, coverage goals reached, examples per second, and what the
run is doing now (starting the deployment, searching, measuring, minimising). While a failure is measured and
minimised the line says how far that got instead (`FailureWork`: replay 4 of 10; candidates replayed and the
sequence's length), from the counters the minimiser keeps as it goes.

A search starts real processes for every example, so a run takes minutes; without a word for that long a user
cannot tell a slow run from a hung one, and a CI job cannot tell either. On a terminal the line is redrawn in place
(a carriage return) about once a second. Without one (output piped to a file or a CI log) it is printed as a plain
line on standard output every `EVERY_S` seconds (`check --progress-every`), with no carriage return, so a log reads
top-down. Both are drawn by a daemon thread that only reads the counters `SearchStats` keeps; `Heartbeat` is the
plain line alone, for runs that are not searches (`ckpt-model scale`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

import attrs

from ckpt_model.results.stats import SearchStats

REDRAW_S = 1.0
# Without a terminal, a plain progress line this often (seconds).
EVERY_S = 10.0
# ANSI: erase the whole line, so a shorter line leaves nothing of a longer one behind.
ERASE_LINE = "\r\x1b[2K"
# What starts each plain line, so a log can be searched for them.
PLAIN_PREFIX = "progress: "


def progress_text(
    stats: SearchStats, examples_asked: int | None, doing: str, now_s: float, goals_total: int | None = None
) -> str:
    """The line itself: pure, so a test builds it from hand-made counters. `examples_asked` None: a search bounded
    by time alone. Steps are the rules Hypothesis drew, the count `--steps` bounds (`SearchStats.drawn_steps`)."""
    elapsed_s = max(now_s - stats.started_s, 0.0)
    finished = len(stats.finished)
    rate = finished / elapsed_s if elapsed_s > 0 else 0.0
    failures = len(stats.seen)
    parts = [
        f"{doing}",
        _example_count(stats.examples, examples_asked),
        f"{stats.drawn_steps} steps",
        f"{failures} failure{'' if failures == 1 else 's'}",
    ]
    if goals_total is not None:
        parts.append(f"goals {stats.goals_reached()} of {goals_total}")
    parts += [f"{rate:.2f} examples/s", f"{elapsed_s:.0f} s"]
    return "  " + " · ".join(parts)


def _example_count(started: int, asked: int | None) -> str:
    """`example 4 of 8`; past the count asked (Hypothesis also runs examples it discards as invalid, and the
    PASSED line says so) the count goes on rather than standing still at `8 of 8` while examples still run."""
    if asked is None:
        return f"example {started} (until the time limit)"
    if started <= asked:
        return f"example {started} of {asked}"
    return f"example {started} ({asked} asked)"


# The stages of measuring and minimising one failure (`FailureWork.stage`), as the progress line names them.
MEASURING = "measuring"
MINIMISING = "minimising"
MINIMISING_AGAIN = "minimising again, each candidate with the full settle"
MEASURING_MINIMAL = "measuring the minimal sequence of"


@attrs.define
class FailureWork:
    """How far measuring and minimising one failure (`failure`: "P9") got, since `started_s`: the stage under way,
    its replays (of `replays_asked`, when it measures a rate) and how many failed the expected way, and the steps of
    the sequence found and of the shortest that still fails. The minimiser tells it (`begin`, `replayed`,
    `shortened`) and the progress line reads it (`text`), from another thread: it only counts."""

    failure: str
    started_s: float
    stage: str = MEASURING
    replays_asked: int | None = None
    replays: int = 0
    failing: int = 0
    steps_found: int | None = None
    steps_now: int | None = None

    def begin(self, stage: str, replays_asked: int | None = None, steps_found: int | None = None) -> None:
        """A stage begins: its replays are counted from none (a new minimisation from the sequence found)."""
        self.stage, self.replays_asked, self.replays, self.failing = stage, replays_asked, 0, 0
        if steps_found is not None:
            self.steps_found = self.steps_now = steps_found

    def replayed(self, failed: bool) -> None:
        self.replays += 1
        self.failing += failed

    def shortened(self, steps: int) -> None:
        """A candidate of `steps` steps failed the expected way: the minimiser goes on from it."""
        self.steps_now = steps

    def text(self, now_s: float) -> str:
        """`minimising P9: 14 candidates replayed (9 failing), 12 -> 5 steps, 31 s`; `measuring P9: replay 4 of 10
        (3 failing), 12 s` (the replay under way, or the last one once all are done)."""
        elapsed = f"{max(now_s - self.started_s, 0.0):.0f} s"
        steps = None if self.steps_found is None else f"{self.steps_found} steps"
        if steps is not None and self.steps_now != self.steps_found:
            steps = f"{self.steps_found} -> {self.steps_now} steps"
        if self.replays_asked is None:
            counts = f"{self.replays} candidate{'' if self.replays == 1 else 's'} replayed ({self.failing} failing)"
        else:
            under_way = min(self.replays + 1, self.replays_asked)
            counts = f"replay {under_way} of {self.replays_asked} ({self.failing} failing)"
        parts = (f"{self.stage} {self.failure}: {counts}", steps, elapsed)
        return ", ".join(part for part in parts if part)


def plain_line(text: str) -> str:
    """A progress line as a log shows it: prefixed, without the terminal line's indent."""
    return PLAIN_PREFIX + text.strip()


def print_line(line: str) -> None:
    """One whole line on standard output, written at once (a line another thread prints never splits it)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Heartbeat:
    """Says `describe()` through `say` every `every_s` seconds while the `with` block runs (the first after
    `every_s`), from a daemon thread; `tick` is what the thread calls, so a test drives it with a fake clock."""

    def __init__(
        self,
        describe: Callable[[], str],
        *,
        every_s: float = EVERY_S,
        say: Callable[[str], None] = print_line,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.describe, self.every_s, self.say, self.clock = describe, every_s, say, clock
        self.next_s = clock() + every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self.next_s = self.clock() + self.every_s
        self._thread = threading.Thread(target=self._beat, name="ckpt-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def tick(self) -> bool:
        """Say the line if it is due; whether it was said. The next is due `every_s` after this one was due, or
        `every_s` from now if the thread woke later than that (one line, not a burst of them)."""
        now = self.clock()
        if now < self.next_s or self._stop.is_set():
            return False
        self.say(self.describe())
        self.next_s += self.every_s
        if self.next_s <= now:
            self.next_s = now + self.every_s
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _beat(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(max(self.next_s - self.clock(), 0.01))


class Progress:
    """Draws `progress_text` on `stream` while the `with` block runs, if `stream` is a terminal (or `enabled`
    says so); otherwise prints it as a plain line every `every_s` seconds (None: never). `doing` can be changed as
    the run moves from starting the deployment to the search, measuring and minimising."""

    def __init__(
        self,
        stats: SearchStats,
        examples_asked: int | None,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        every_s: float | None = EVERY_S,
        goals_total: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats, self.examples_asked, self.goals_total, self.clock = stats, examples_asked, goals_total, clock
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.doing = "searching"
        self.work: FailureWork | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.heartbeat = (
            Heartbeat(self.plain_text, every_s=every_s, say=self._print, clock=clock)
            if every_s is not None and not self.enabled
            else None
        )

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._redraw, name="ckpt-progress", daemon=True)
            self._thread.start()
        elif self.heartbeat is not None:
            self.heartbeat.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def text(self) -> str:
        if self.work is not None:
            return "  " + self.work.text(self.clock())
        return progress_text(self.stats, self.examples_asked, self.doing, self.clock(), self.goals_total)

    def plain_text(self) -> str:
        return plain_line(self.text())

    def now_doing(self, doing: str) -> None:
        self.doing, self.work = doing, None
        self.draw()

    def now_working_on(self, work: FailureWork | None) -> None:
        """Say how far `work` got, measuring and minimising a failure, until the next `now_doing` (or None)."""
        self.work = work
        self.draw()

    def draw(self) -> None:
        if not self.enabled or self._stop.is_set():
            return
        with self._lock:
            self.stream.write(ERASE_LINE + self.text())
            self.stream.flush()

    def clear(self) -> None:
        """Erase the line, so what the run prints next starts on a clean line."""
        if self.enabled:
            with self._lock:
                self.stream.write(ERASE_LINE)
                self.stream.flush()

    def say(self, line: str) -> None:
        """Print `line` on standard output on a line of its own (also when the output is piped); the progress
        line comes back below it."""
        with self._lock:
            if self.enabled:
                self.stream.write(ERASE_LINE)
                self.stream.flush()
            print_line(line)
        self.draw()

    def stop(self) -> None:
        self._stop.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.clear()

    def _print(self, line: str) -> None:
        with self._lock:
            print_line(line)

    def _redraw(self) -> None:
        while not self._stop.is_set():
            self.draw()
            self._stop.wait(REDRAW_S)
