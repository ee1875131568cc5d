"""A wall clock a test moves, and the loop turns that let what fell due run: wall-clock timeouts without real time."""

from __future__ import annotations

import asyncio


class MovableClock:
    """A wall clock that reads what the test set."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def loop_turns(count: int = 20) -> None:
    """Let the loop run what is due now (a timer due at once, the cancellation it starts)."""
    for _ in range(count):
        await asyncio.sleep(0)
