"""Timeouts that fall at a wall time, so that a move of the server's clock moves them too.

asyncio times its timeouts on the loop's monotonic clock. A server's deadlines are wall times (`deadline_ts`, a
lease, half the prepare time left for a generation cut), and the checker moves a server's wall clock
(`POST /_ctl/clock`: a skew, or time passing where the checker owns time): a timeout the wall clock jumped past
must fall due at once, as after that much real time, not when its old delay runs out. Each timeout taken here
remembers the wall time it falls at, and `clock_moved` times every live one again from the clock as it reads now.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable


class WallTimeouts:
    """The live timeouts of one server process (or one part of it), each with the wall time it falls at."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._falls_at: dict[asyncio.Timeout, float] = {}

    @contextlib.asynccontextmanager
    async def within(self, remaining_s: float | None) -> AsyncIterator[asyncio.Timeout]:
        """Run the body for at most `remaining_s` seconds of this clock (None: no limit); TimeoutError after."""
        timeout = asyncio.timeout(remaining_s)
        async with timeout:
            if remaining_s is not None:
                self._falls_at[timeout] = self._clock() + remaining_s
            try:
                yield timeout
            finally:
                self._falls_at.pop(timeout, None)

    def clock_moved(self) -> None:
        """The wall clock moved: every live timeout falls at its wall time as the clock now reads it."""
        now, loop_now = self._clock(), asyncio.get_running_loop().time()
        for timeout, falls_at in self._falls_at.items():
            if not timeout.expired():
                timeout.reschedule(loop_now + max(falls_at - now, 0.0))

    def __len__(self) -> int:
        return len(self._falls_at)
