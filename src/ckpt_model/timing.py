"""Where an example's time goes: named spans and counts, recorded only while a `Timings` collects them.

The checker marks its costly parts (`with timing.span("settle"): ...`, `timing.count("settle.polls")`). With no
collector active, `span` hands back one shared no-op context manager and `count` returns at once, so the marks
cost a function call each and change nothing. `benchmarks/example_profile.py` activates a collector around a
run (`with timing.collecting(timings): ...`) and prints the breakdown.

Spans nest: a span opened inside another is recorded under the outer one's path ("crash/restart.start"), so the
top level adds up to the time the marked parts took, and each level says what its parent was made of. Spans in
other threads (the `/run` pool) go under `background`: they overlap the main thread's, and are reported apart.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

PATH_SEPARATOR = "/"
BACKGROUND = "background"
_NO_OP = contextlib.nullcontext()


class Timings:
    """Total seconds and count per span path, and plain counts; thread-safe (the `/run` pool records too)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.spans: defaultdict[str, int] = defaultdict(int)
        self.counts: defaultdict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._local = threading.local()
        # Spans of any other thread are recorded under BACKGROUND: they overlap this thread's.
        self._owner = threading.get_ident()

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        stack: list[str] = self._stack()
        path = f"{stack[-1]}{PATH_SEPARATOR}{name}" if stack else name
        stack.append(path)
        started_s = time.perf_counter()
        try:
            yield
        finally:
            elapsed_s = time.perf_counter() - started_s
            stack.pop()
            with self._lock:
                self.seconds[path] += elapsed_s
                self.spans[path] += 1

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def snapshot(self) -> dict[str, Any]:
        """A copy of everything recorded so far (to subtract one snapshot from a later one)."""
        with self._lock:
            return {"seconds": dict(self.seconds), "spans": dict(self.spans), "counts": dict(self.counts)}

    def _stack(self) -> list[str]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = [] if threading.get_ident() == self._owner else [BACKGROUND]
        return stack


_active: Timings | None = None


def span(name: str) -> AbstractContextManager[None]:
    """Time the block as `name` when a collector is active; otherwise a shared no-op."""
    active = _active
    return _NO_OP if active is None else active.span(name)


def count(name: str, n: int = 1) -> None:
    """Add `n` to the count `name` when a collector is active."""
    active = _active
    if active is not None:
        active.count(name, n)


@contextlib.contextmanager
def collecting(timings: Timings) -> Iterator[Timings]:
    """Record every span and count into `timings` while the block runs (one collector at a time)."""
    global _active
    previous, _active = _active, timings
    try:
        yield timings
    finally:
        _active = previous
