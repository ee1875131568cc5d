"""Storage faults: a checkpoint write that fails or stalls at a named point, as a full or failing disk makes it.

Gym's own simulations hold writes and fail them ("disk full", reference Appendix D); this is the same on a real
server process. The checker arms one point of one server (`POST /_ctl/storage` with the control bearer and
`{"point", "how"}`); the next write that gets there either raises a real `OSError` (ENOSPC or EIO, once: the disk
is full or failing for that write only, so a retry in the same process can succeed) or stalls until the checker
releases it (`POST /_ctl/storage/release`). `GET /_ctl/storage` says what is armed, which stall was reached and
how many writes are running, so the checker waits for each of those moments by polling, never by sleeping.

The points, in the order a write passes them (reference section 6.2): the records lines written into the
temporary file (`records.write`), its fsync (`records.fsync`), the manifest's temporary file written
(`manifest.write`), and the records renamed to their digest name but the manifest not yet linked
(`manifest.link`, failures only: a stall there would hold the publication lock that a resume waits for).
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Iterator
from typing import Any, Literal, get_args

from fakes.gym.faults import INJECTED_MARK

StoragePoint = Literal["records.write", "records.fsync", "manifest.write", "manifest.link"]
StorageHow = Literal["ENOSPC", "EIO", "stall"]
POINTS: tuple[str, ...] = get_args(StoragePoint)
HOWS: tuple[str, ...] = get_args(StorageHow)
# Where a stall may be armed: before the publication lock (section 6.2 step 3), which a resume waits for.
STALL_POINTS = ("records.write", "records.fsync", "manifest.write")
_ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}
# A stall nobody releases ends after this long, so a server the checker abandoned still finishes its write.
STALL_MAX_S = 300.0


class StorageFaultError(ValueError):
    """An arming the look-alike cannot do (an unknown point or kind, or a stall where a resume would hang)."""


class StorageFaults:
    """The storage fault armed in one server, the stall reached, and the writes running; `hit` runs in the
    writer's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: tuple[str, str] | None = None
        self._reached: str | None = None
        self._release = threading.Event()
        self._writes = 0

    def arm(self, point: str, how: str) -> None:
        if point not in POINTS or how not in HOWS:
            raise StorageFaultError(f"no storage fault {how!r} at {point!r}; points {list(POINTS)}, kinds {list(HOWS)}")
        if how == "stall" and point not in STALL_POINTS:
            raise StorageFaultError(f"a stall at {point!r} would hold the publication lock; stall at {STALL_POINTS}")
        with self._lock:
            self._armed, self._reached = (point, how), None
            self._release = threading.Event()

    def release(self) -> None:
        """Let a stalled write go on, and disarm what no write met yet."""
        with self._lock:
            self._armed = None
            self._release.set()

    def hit(self, point: str) -> None:
        """The write is at `point`: fail it once, stall it, or (unarmed) return at once."""
        with self._lock:
            if self._armed is None or self._armed[0] != point:
                return
            how = self._armed[1]
            self._armed = None
            if how == "stall":
                self._reached = point
                release = self._release
        if how != "stall":
            code = _ERRNOS[how]
            raise OSError(code, f"{errno.errorcode[code]} {INJECTED_MARK} at {point}")
        release.wait(STALL_MAX_S)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Count one checkpoint write while it runs (the checker waits for a stopped write to end)."""
        with self._lock:
            self._writes += 1
        try:
            yield
        finally:
            with self._lock:
                self._writes -= 1

    def state(self) -> dict[str, Any]:
        with self._lock:
            armed = None if self._armed is None else {"point": self._armed[0], "how": self._armed[1]}
            return {"armed": armed, "stalled_at": self._reached, "writes": self._writes}
