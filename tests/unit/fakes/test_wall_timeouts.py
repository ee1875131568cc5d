"""`WallTimeouts`: a timeout falls at a wall time, and a move of the clock moves it (the loop's timer does not)."""

from __future__ import annotations

import asyncio

import pytest

from fakes.gym.faults.wall_timeouts import WallTimeouts
from tests.unit.fakes.movable_clock import MovableClock, loop_turns


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _waits_within(timeouts: WallTimeouts, remaining_s: float | None) -> str:
    try:
        async with timeouts.within(remaining_s):
            await asyncio.Event().wait()
    except TimeoutError:
        return "timed out"
    return "ended"


@pytest.mark.anyio
@pytest.mark.parametrize(("moved_s", "falls_due"), [(30.0, True), (10.0, True), (9.0, False), (0.0, False)])
async def test_a_timeout_falls_due_once_the_clock_moved_past_its_wall_time(moved_s: float, falls_due: bool) -> None:
    clock = MovableClock()
    timeouts = WallTimeouts(clock)
    waiter = asyncio.ensure_future(_waits_within(timeouts, 10.0))
    await loop_turns()
    assert len(timeouts) == 1

    clock.now += moved_s
    timeouts.clock_moved()
    await loop_turns()

    assert waiter.done() == falls_due
    if falls_due:
        assert waiter.result() == "timed out"
        assert len(timeouts) == 0
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


@pytest.mark.anyio
async def test_without_a_clock_move_the_loops_timer_keeps_its_old_delay() -> None:
    clock = MovableClock()
    timeouts = WallTimeouts(clock)
    waiter = asyncio.ensure_future(_waits_within(timeouts, 10.0))
    await loop_turns()

    clock.now += 30.0  # nobody says the clock moved
    await loop_turns()

    assert not waiter.done()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


@pytest.mark.anyio
async def test_no_limit_is_never_timed_and_the_body_ends_as_it_likes() -> None:
    timeouts = WallTimeouts(MovableClock())
    async with timeouts.within(None):
        assert len(timeouts) == 0
    async with timeouts.within(5.0):
        assert len(timeouts) == 1
    assert len(timeouts) == 0
