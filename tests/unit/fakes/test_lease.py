"""The lease on its own: a hand-set wall clock, and lapses the test runs itself when it chooses."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from fakes.gym.control.lease import Lease

pytestmark = pytest.mark.anyio

WAIT_TIMEOUT_S = 5.0
GRACE_S = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """A wall clock that reads what the test set."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Lapses:
    """What the lease's timer hands over: each lapse is held until the test awaits it, and what it ended."""

    def __init__(self) -> None:
        self.pending: list[Coroutine[Any, Any, None]] = []
        self.ended: list[str] = []
        self._fired = asyncio.Event()

    def spawn(self, lapse: Coroutine[Any, Any, None]) -> None:
        self.pending.append(lapse)
        self._fired.set()

    async def on_lapse(self, checkpoint_id: str) -> None:
        self.ended.append(checkpoint_id)

    async def next_firing(self) -> Coroutine[Any, Any, None]:
        """The next lapse a timer handed over (waiting for the timer to fire, never for a fixed time)."""
        if not self.pending:
            self._fired.clear()
            await asyncio.wait_for(self._fired.wait(), WAIT_TIMEOUT_S)
        return self.pending.pop(0)


def lease_of(lapses: Lapses, clock: Clock, *, acts: bool = True) -> Lease:
    return Lease(GRACE_S, on_lapse=lapses.on_lapse, spawn=lapses.spawn, acts=acts, clock=clock)


async def test_a_renewal_holds_the_lease_to_deadline_plus_grace_and_never_shortens_it() -> None:
    lease = lease_of(Lapses(), Clock(0.0))
    lease.renew("c1", 100.0)
    first = lease.expires_at
    lease.renew("c1", 50.0)
    after_an_earlier_deadline = lease.expires_at
    lease.renew("c1", 200.0)
    after_a_later_deadline = lease.expires_at
    lease.clear()

    assert (first, after_an_earlier_deadline, after_a_later_deadline) == (110.0, 110.0, 210.0)
    assert lease.expires_at is None


async def test_once_the_clock_reaches_the_expiry_the_lapse_ends_the_checkpoint() -> None:
    lapses = Lapses()
    lease = lease_of(lapses, Clock(110.0))
    lease.renew("c1", 100.0)  # expires at 110.0: due at once
    await (await lapses.next_firing())

    assert lapses.ended == ["c1"]
    assert lease.expires_at == 110.0  # ending the checkpoint (and clearing the lease) is the owner's


async def test_a_timer_that_fires_before_the_wall_clock_reaches_the_expiry_waits_again() -> None:
    lapses, clock = Lapses(), Clock(110.0)
    lease = lease_of(lapses, clock)
    lease.renew("c1", 100.0)  # due at once by the clock when armed ...
    clock.now = 109.999  # ... but the wall clock reads a hair earlier when the timer fires
    await (await lapses.next_firing())
    ended_early = list(lapses.ended)
    clock.now = 110.0
    await (await lapses.next_firing())  # the timer armed again, for the millisecond still left

    assert ended_early == []
    assert lapses.ended == ["c1"]


async def test_a_lapse_that_finds_the_lease_cleared_does_nothing() -> None:
    lapses = Lapses()
    lease = lease_of(lapses, Clock(110.0))
    lease.renew("c1", 100.0)
    stale = await lapses.next_firing()
    lease.clear()  # a resume of c1 landed between the timer and its lapse
    await stale

    assert lapses.ended == []


async def test_a_lapse_of_an_earlier_checkpoint_never_ends_the_one_holding_the_lease_now() -> None:
    lapses = Lapses()
    lease = lease_of(lapses, Clock(110.0))
    lease.renew("c1", 100.0)
    stale = await lapses.next_firing()
    lease.clear()  # c1 ended after its timer fired ...
    lease.renew("c2", 100.0)  # ... and c2 holds a lease that is due as well
    await stale
    ended_by_the_stale_lapse = list(lapses.ended)
    await (await lapses.next_firing())

    assert ended_by_the_stale_lapse == []
    assert lapses.ended == ["c2"]


async def test_clearing_the_lease_cancels_its_timer() -> None:
    cleared_lapses, witness_lapses, clock = Lapses(), Lapses(), Clock(110.0)
    cleared, witness = lease_of(cleared_lapses, clock), lease_of(witness_lapses, clock)
    cleared.renew("c1", 100.0)
    cleared.clear()
    witness.renew("c1", 100.0)  # armed after the cleared lease's timer, for the same moment
    await (await witness_lapses.next_firing())

    assert cleared_lapses.pending == []


async def test_a_lease_that_does_not_act_shows_its_expiry_but_never_fires() -> None:
    """The planted fault `lease_never_expires`; a lease armed after it for the same moment is the witness."""
    inert_lapses, witness_lapses, clock = Lapses(), Lapses(), Clock(110.0)
    inert, witness = lease_of(inert_lapses, clock, acts=False), lease_of(witness_lapses, clock)
    inert.renew("c1", 100.0)
    witness.renew("c1", 100.0)
    await (await witness_lapses.next_firing())

    assert inert.expires_at == 110.0
    assert inert_lapses.pending == []


async def test_a_lease_the_wall_clock_jumped_past_lapses_once_armed_again() -> None:
    """The timer runs on the monotonic clock, which a jump of the wall clock alone leaves behind; armed again from
    the wall clock (`POST /_ctl/clock`), it fires at once. A lease with no timer (none held) stays unarmed."""
    lapses, clock = Lapses(), Clock(0.0)
    lease = lease_of(lapses, clock)
    idle = lease_of(Lapses(), clock)
    lease.renew("c1", 100.0)  # expires at 110.0, a long way off in real time
    clock.now = 110.0
    lease.rearm()
    idle.rearm()
    await (await lapses.next_firing())

    assert lapses.ended == ["c1"]
    assert idle.expires_at is None
