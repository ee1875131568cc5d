"""The lease on a participant's active checkpoint (reference section 2.7).

A controller that goes quiet must not hold admission closed forever: every call under the checkpoint pushes the
lease back to its deadline plus a grace, and once the wall clock passes the lease the control plane ends the
checkpoint as a resume would. The lease only keeps the time and the timer; ending the checkpoint is its owner's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class Lease:
    """The expiry of one checkpoint's lease, and the timer that calls `on_lapse(checkpoint_id)` once it passes.

    `spawn` runs the lapse as a task of the owner's (so the owner's shutdown cancels it); `acts=False` is the
    planted fault `lease_never_expires`: the expiry is kept and shown but never acted on.
    """

    def __init__(
        self,
        grace_s: float,
        *,
        on_lapse: Callable[[str], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        acts: bool = True,
        clock: Callable[[], float] = time.time,
    ):
        self.grace_s = grace_s
        self.expires_at: float | None = None
        self._on_lapse = on_lapse
        self._spawn = spawn
        self._acts = acts
        self._clock = clock
        self._holder: str | None = None
        self._timer: asyncio.TimerHandle | None = None

    def renew(self, checkpoint_id: str | None, deadline_ts: float) -> None:
        """Hold the lease for `checkpoint_id` until `deadline_ts` plus the grace; a lease never shrinks."""
        expires_at = deadline_ts + self.grace_s
        if self.expires_at is not None:
            expires_at = max(expires_at, self.expires_at)
        self.expires_at = expires_at
        self._holder = checkpoint_id
        self._arm()

    def rearm(self) -> None:
        """Arm the timer again from the wall clock as it reads now. The timer runs on the loop's monotonic clock,
        which a skew or a jump of the wall clock alone leaves where it was: without this, a lease the wall clock
        jumped past would lapse only once its old delay ran out in real time (`POST /_ctl/clock` calls it)."""
        if self.expires_at is not None and self._timer is not None:
            self._arm()

    def clear(self) -> None:
        """No lease: the checkpoint ended (or the server shuts down)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._holder = None
        self.expires_at = None

    def _arm(self) -> None:
        if not self._acts:
            return
        if self._timer is not None:
            self._timer.cancel()
        assert self.expires_at is not None
        delay_s = max(0.0, self.expires_at - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._fire, self._holder)

    def _fire(self, checkpoint_id: str | None) -> None:
        self._timer = None
        self._spawn(self._lapse(checkpoint_id))

    async def _lapse(self, checkpoint_id: str | None) -> None:
        """Checked in the task, not the timer: a renewal or a resume that lands first still wins."""
        if checkpoint_id is None or checkpoint_id != self._holder or self.expires_at is None:
            return
        if self.expires_at > self._clock():
            # The loop's monotonic timer can fire a hair before the wall clock reaches the lease.
            self._arm()
            return
        await self._on_lapse(checkpoint_id)
