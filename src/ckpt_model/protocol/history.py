"""What was observed, as an append-only history shaped like Jepsen's.

Every control call and every `/run` is an `invoke` followed by its completion (`ok`, `fail`, or `info` when the
outcome is unknown, such as a reply lost in a crash); backend calls are recorded when first seen. Properties that
depend on time (P2: no reply while prepared) read only this history, never live state, so a reply that arrives
late is still attributed to the interval it arrived in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs

EventType = Literal["invoke", "ok", "fail", "info"]


@attrs.frozen
class Event:
    """One history entry; `invoke_index` pairs a completion with its invocation."""

    index: int
    time_s: float
    process: str
    f: str
    type: EventType
    value: Any = None
    invoke_index: int | None = None

    def describe(self) -> str:
        value = "" if self.value is None else f" {self.value}"
        return f"#{self.index:<4} {self.time_s:9.3f}s {self.process:<12} {self.type:<6} {self.f}{value}"


class History:
    """Thread-safe: `/run` completions arrive from worker threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start_s = clock()
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def _append(self, process: str, f: str, type_: EventType, value: Any, invoke_index: int | None) -> Event:
        with self._lock:
            event = Event(
                index=len(self._events),
                time_s=self._clock() - self._start_s,
                process=process,
                f=f,
                type=type_,
                value=value,
                invoke_index=invoke_index,
            )
            self._events.append(event)
            return event

    def invoke(self, process: str, f: str, value: Any = None) -> Event:
        return self._append(process, f, "invoke", value, None)

    def complete(self, invocation: Event, type_: EventType, value: Any = None) -> Event:
        return self._append(invocation.process, invocation.f, type_, value, invocation.index)

    def note(self, process: str, f: str, value: Any = None) -> Event:
        """A point event (a backend call first seen, a phase change) recorded as `ok`."""
        return self._append(process, f, "ok", value, None)

    @property
    def events(self) -> tuple[Event, ...]:
        with self._lock:
            return tuple(self._events)

    def intervals(self, opened: str, closed: Iterable[str]) -> list[tuple[float, float]]:
        """Controller intervals from each `opened` note to the next `closed` one (open-ended: now)."""
        closing = set(closed)
        spans: list[tuple[float, float]] = []
        start: float | None = None
        for event in self.events:
            if event.process != "controller":
                continue
            if event.f == opened and event.type == "ok" and start is None:
                start = event.time_s
            elif event.f in closing and event.type == "invoke" and start is not None:
                spans.append((start, event.time_s))
                start = None
        if start is not None:
            spans.append((start, float("inf")))
        return spans

    def format(self, events: Iterable[Event] | None = None, last: int = 40) -> str:
        shown = list(self.events if events is None else events)[-last:]
        return "\n".join(event.describe() for event in shown)
