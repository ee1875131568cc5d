"""How a control plane runs its operations (reference sections 2.6 and 3).

Short state transitions run one at a time under one asyncio lock, each bounded by its request's deadline. Long
work (a commit or a restore) runs as a background `Work` task that the request awaits under its deadline: the
work keeps running past the deadline, so a retry with the same arguments awaits the same task, and a retry with
other arguments conflicts. A completed operation's reply is kept per (checkpoint ID, operation) and replayed to
a retry with the same arguments without running anything again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
from pydantic import BaseModel

from fakes.gym.control.store import StopFlag, WriteStoppedError
from fakes.gym.faults import blame
from fakes.gym.faults.wall_timeouts import WallTimeouts
from fakes.gym.protocol.errors import (
    CheckpointConflictError,
    ControlError,
    DeadlineExceededError,
    InternalControlError,
    StaleCheckpointError,
)

log = logging.getLogger(__name__)

Reply = dict[str, Any]


@attrs.frozen
class Result:
    """A completed operation's reply, replayed to a retry with the same arguments.

    `request` is the whole first request (deadline included), kept only for the `retried_commit_conflicts` fault.
    """

    args: tuple[Any, ...]
    reply: Reply
    request: Reply | None = None


@attrs.define(eq=False)
class Work:
    """A commit or restore running for the active checkpoint; `stage` says how a resume may interrupt it."""

    checkpoint_id: str
    op: str
    args: tuple[Any, ...]
    request: Reply | None = None
    stop: StopFlag = attrs.Factory(StopFlag)
    stage: str = "start"
    task: asyncio.Task[Reply] | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def ended(self) -> None:
        """Until the task ends, however it ends (the request awaiting it reports how)."""
        assert self.task is not None
        await asyncio.wait({self.task})

    async def interrupt(self) -> None:
        """Cancel what may be cancelled; stop a write; let an install or a cleanup finish."""
        assert self.task is not None
        if self.stage in ("start", "export", "read"):
            self.task.cancel()
        elif self.stage == "write":
            # Blocks only while a publication is already under the store's lock.
            await asyncio.to_thread(self.stop.stop)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class WorkRunner:
    """One participant server's lock, deadlines, background work and recorded replies.

    `name` ("kind/instance") goes into every refusal; `compares_requests` is the planted fault
    `retried_commit_conflicts`: a replay also compares the whole kept request, deadline included.
    """

    def __init__(self, name: str, *, compares_requests: bool = False, clock: Callable[[], float] = time.time):
        self.name = name
        self.lock = asyncio.Lock()
        self.current: Work | None = None
        self._compares_requests = compares_requests
        self._clock = clock
        self._results: dict[tuple[str, str], Result] = {}
        self._background: set[asyncio.Task[Any]] = set()
        # Every deadline a request waits under now (`bounded`), each falling at its wall time.
        self.timeouts = WallTimeouts(clock)

    async def run(self, op: str, operation: Callable[[], Awaitable[Reply]]) -> Reply:
        """Run the operation; an unexpected exception becomes 500 checkpoint_error."""
        try:
            return await operation()
        except ControlError:
            raise
        except Exception as exc:
            log.exception("checkpoint %s failed on %s", op, self.name)
            raise InternalControlError(f"{op} failed unexpectedly on {self.name}: {exc!r}; {blame(exc)}") from exc

    async def close(self) -> None:
        """Cancel the background work (server shutdown; tests)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- deadlines ------------------------------------------------------------------------------------------

    def remaining_s(self, deadline_ts: float, what: str) -> float:
        """The seconds left before `deadline_ts`; 409 deadline_exceeded once it has passed."""
        remaining_s = deadline_ts - self._clock()
        if remaining_s <= 0:
            raise DeadlineExceededError(
                f"{what} on {self.name}: deadline_ts {deadline_ts:.3f} passed {-remaining_s:.3f} s ago; "
                "retry with a deadline in the future"
            )
        return remaining_s

    @contextlib.asynccontextmanager
    async def locked_by(self, deadline_ts: float, what: str) -> AsyncIterator[None]:
        """Hold the lock, waiting for it no longer than the request's deadline: a resume that waits under the lock
        for a commit's write to stop must not leave a retire hanging past its caller's timeout."""
        async with self.bounded(self.remaining_s(deadline_ts, what), f"{what} (waiting for the control lock)"):
            await self.lock.acquire()
        try:
            yield
        finally:
            self.lock.release()

    @contextlib.asynccontextmanager
    async def bounded(self, remaining_s: float, what: str) -> AsyncIterator[None]:
        """Run the body under the request's deadline; its expiry becomes 409 deadline_exceeded."""
        timeout: asyncio.Timeout | None = None
        try:
            async with self.timeouts.within(remaining_s) as timeout:
                yield
        except TimeoutError as exc:
            if timeout is None or not timeout.expired():
                raise
            raise DeadlineExceededError(
                f"{what} did not finish by its deadline on {self.name}; retry with a later deadline"
            ) from exc

    def clock_moved(self) -> None:
        """The wall clock moved (a skew, or time passing, `POST /_ctl/clock`): each deadline waited under is timed
        again from it (`WallTimeouts`)."""
        self.timeouts.clock_moved()

    # -- recorded replies -----------------------------------------------------------------------------------

    def keep(self, request: BaseModel) -> Reply | None:
        """The whole request, kept only under the `retried_commit_conflicts` fault (which compares it)."""
        return request.model_dump() if self._compares_requests else None

    def record(self, checkpoint_id: str, op: str, result: Result) -> None:
        self._results[(checkpoint_id, op)] = result

    def drop_result(self, checkpoint_id: str, op: str) -> None:
        """Forget one recorded reply (only the planted fault `replay_recorded_once_delivered` does)."""
        self._results.pop((checkpoint_id, op), None)

    def result(self, checkpoint_id: str, op: str) -> Result | None:
        return self._results.get((checkpoint_id, op))

    def replay(
        self, checkpoint_id: str, op: str, args: tuple[Any, ...], *, request: Reply | None = None
    ) -> Reply | None:
        """The recorded reply of a completed op when its arguments match; a retry's deadline never matters."""
        result = self._results.get((checkpoint_id, op))
        if result is None:
            return None
        if self._compares_requests and result.request != request:
            raise CheckpointConflictError(
                f"{op} of {checkpoint_id!r} already completed on {self.name} with the request {result.request}; "
                f"a retry must repeat it exactly (got {request})"
            )
        if result.args != args:
            raise CheckpointConflictError(
                f"{op} of {checkpoint_id!r} already completed on {self.name} with (checkpoint_dir, scope) = "
                f"{result.args}; a retry must repeat them (got {args})"
            )
        return result.reply

    def forget(self, checkpoint_id: str) -> None:
        """Drop the recorded replies of a checkpoint that ended."""
        self._results = {key: result for key, result in self._results.items() if key[0] != checkpoint_id}

    # -- background work ------------------------------------------------------------------------------------

    def start(self, work: Work, steps: Callable[[Work], Awaitable[Reply]]) -> Work:
        """Run `steps(work)` in the background as the current work."""
        work.task = self.spawn(steps(work))
        self.current = work
        return work

    def running(self, checkpoint_id: str, op: str, args: tuple[Any, ...]) -> Work | None:
        """A retry with the same arguments awaits the running work; other arguments conflict."""
        work = self.current
        if work is None or work.op != op or not work.running:
            return None
        if work.args != args:
            raise CheckpointConflictError(
                f"a {op} of {checkpoint_id!r} with (checkpoint_dir, scope) = {work.args} is still running on "
                f"{self.name}; retry with the same arguments (got {args}), or resume"
            )
        return work

    async def wait(self, work: Work, deadline_ts: float) -> Reply:
        """The work's reply, awaited no longer than the deadline; the work itself runs on past it."""
        what = f"{work.op} of {work.checkpoint_id!r}"
        remaining_s = self.remaining_s(deadline_ts, what)
        assert work.task is not None  # set by start
        try:
            async with self.bounded(remaining_s, f"{what} (still running; a retry awaits it)"):
                return await asyncio.shield(work.task)
        except WriteStoppedError as exc:
            raise self.ended_during(work) from exc
        except asyncio.CancelledError:
            if work.task.cancelled() and not _being_cancelled():
                raise self.ended_during(work) from None
            raise

    def complete(self, work: Work, reply: Reply) -> None:
        """Record the current work's reply; work that is no longer current was ended by a resume meanwhile."""
        if self.current is not work:
            raise self.ended_during(work)
        self.record(work.checkpoint_id, work.op, Result(work.args, reply, work.request))
        self.current = None

    def abandon(self) -> None:
        """The checkpoint ended: the current work, if still running, can no longer complete."""
        self.current = None

    def ended_during(self, work: Work) -> StaleCheckpointError:
        return StaleCheckpointError(
            f"checkpoint {work.checkpoint_id!r} was resumed on {self.name} while its {work.op} ran; "
            f"the {work.op} did not complete; use a new checkpoint ID"
        )

    def spawn(self, coroutine: Awaitable[Any]) -> asyncio.Task[Any]:
        """A background task that `close` cancels."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so a failure nobody awaited (its request gave up) is logged, not lost.
            log.info("background checkpoint work on %s ended with %r", self.name, task.exception())
