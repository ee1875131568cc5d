"""A one-line progress display for a long run on a terminal: examples, steps, failures so far, examples per
second, and what the run is doing now (searching, measuring, minimising).

A search starts real processes for every example, so a run takes minutes; without a word for that long a user
cannot tell a slow run from a hung one. The line is redrawn in place (a carriage return) about once a second by a
daemon thread that only reads the counters `SearchStats` keeps, and it is drawn only on a terminal: output piped
to a file or a CI log gets none of it, so logs stay as they were.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from ckpt_model.results.stats import SearchStats

REDRAW_S = 1.0
# ANSI: erase the whole line, so a shorter line leaves nothing of a longer one behind.
ERASE_LINE = "\r\x1b[2K"


def progress_text(stats: SearchStats, examples_asked: int, doing: str, now_s: float) -> str:
    """The line itself: pure, so a test builds it from hand-made counters."""
    elapsed_s = max(now_s - stats.started_s, 0.0)
    finished = len(stats.finished)
    steps = sum(example.steps for example in stats.finished)
    rate = finished / elapsed_s if elapsed_s > 0 else 0.0
    failures = len(stats.seen)
    parts = [
        f"{doing}",
        _example_count(stats.examples, examples_asked),
        f"{steps} steps",
        f"{failures} failure{'' if failures == 1 else 's'}",
        f"{rate:.2f} examples/s",
        f"{elapsed_s:.0f} s",
    ]
    return "  " + " · ".join(parts)


def _example_count(started: int, asked: int) -> str:
    """`example 4 of 8`; past the count asked (Hypothesis also runs examples it discards as incomplete, and the
    PASSED line says so) the count goes on rather than standing still at `8 of 8` while examples still run."""
    if started <= asked:
        return f"example {started} of {asked}"
    return f"example {started} ({asked} asked)"


class Progress:
    """Draws `progress_text` on `stream` while the `with` block runs, if `stream` is a terminal (or `enabled`
    says so); `doing` can be changed as the run moves from the search to measuring and minimising."""

    def __init__(
        self,
        stats: SearchStats,
        examples_asked: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats, self.examples_asked, self.clock = stats, examples_asked, clock
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.doing = "searching"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._redraw, name="ckpt-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def now_doing(self, doing: str) -> None:
        self.doing = doing
        self.draw()

    def draw(self) -> None:
        if not self.enabled or self._stop.is_set():
            return
        with self._lock:
            line = progress_text(self.stats, self.examples_asked, self.doing, self.clock())
            self.stream.write(ERASE_LINE + line)
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
            print(line, flush=True)
        self.draw()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.clear()

    def _redraw(self) -> None:
        while not self._stop.is_set():
            self.draw()
            self._stop.wait(REDRAW_S)
