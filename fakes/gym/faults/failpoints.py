"""Failpoints: named places inside a server's work where a checker can stop it, to crash it exactly there.

The checker arms a point (`POST /_ctl/failpoints/{point}`, with the control bearer); the next time the server's work
reaches it, the worker marks it reached and stays there (the checker then SIGKILLs the process, which is the point);
`GET /_ctl/failpoints` says what is armed and what was reached, so the checker waits for the moment by polling,
never by sleeping. Only the look-alike stack has them: a real Gym has no such routes, and the checker never draws
the steps that need them there.
"""

from __future__ import annotations

import threading
from typing import Literal, get_args

# Inside a commit, between the participant's two file publications (records renamed to their digest name, then
# the manifest linked; the other way round under the fault `store_publishes_manifest_first`).
BETWEEN_FILES = "commit.between_files"
# Inside a restore: admission closed, the records read and validated, nothing installed yet.
BEFORE_INSTALL = "restore.before_install"
Failpoint = Literal["commit.between_files", "restore.before_install"]
POINTS: tuple[str, ...] = get_args(Failpoint)
# A point reached is held this long at most, so a server nobody crashes still ends (its worker thread then fails).
HOLD_S = 300.0


class UnknownFailpoint(ValueError):
    pass


class Failpoints:
    """The points armed in one server and those its work reached; `hit` is called from worker threads."""

    def __init__(self) -> None:
        self._armed: set[str] = set()
        self._reached: set[str] = set()
        self._lock = threading.Lock()
        self._never = threading.Event()

    def arm(self, point: str) -> None:
        if point not in POINTS:
            raise UnknownFailpoint(f"no failpoint {point!r}; known: {list(POINTS)}")
        with self._lock:
            self._armed.add(point)

    def armed(self, point: str) -> bool:
        with self._lock:
            return point in self._armed

    def hit(self, point: str) -> None:
        """Return at once unless `point` is armed; else mark it reached and hold the calling thread."""
        with self._lock:
            if point not in self._armed:
                return
            self._reached.add(point)
        self._never.wait(HOLD_S)
        raise RuntimeError(f"failpoint {point!r} held {HOLD_S:g} s and nobody crashed the server")

    def state(self) -> dict[str, list[str]]:
        with self._lock:
            return {"armed": sorted(self._armed), "reached": sorted(self._reached)}
