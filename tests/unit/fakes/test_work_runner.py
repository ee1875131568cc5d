"""The work runner on its own: hand-built work whose steps wait on events the test sets, and a hand-set clock."""

from __future__ import annotations

import asyncio

import pytest

from fakes.gym.control.work_runner import Reply, Result, Work, WorkRunner
from fakes.gym.protocol.errors import (
    CheckpointConflictError,
    DeadlineExceededError,
    InternalControlError,
    InvalidPhaseError,
    StaleCheckpointError,
)
from fakes.gym.protocol.wire import CommitRequest

pytestmark = pytest.mark.anyio

WAIT_TIMEOUT_S = 5.0
NAME = "environment/env-1"
ARGS = ("/ckpt", ("r0-a0",))
OTHER_ARGS = ("/elsewhere", ("r0-a0",))
REPLY: Reply = {"phase": "committed", "episode_ids": ["r0-a0"]}
FAR_DEADLINE_TS = 60.0  # by the hand-set clock, which starts at 0.0: never reached within a test
SHORT_DEADLINE_TS = 0.01  # 10 ms of real time for the wait bounded by it


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """A wall clock that reads what the test set."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class HeldSteps:
    """Steps that enter `stage`, then wait until the test releases them; completed ones record their reply."""

    def __init__(self, runner: WorkRunner, stage: str = "write", *, completes: bool = True) -> None:
        self.runner = runner
        self.stage = stage
        self.completes = completes
        self.entered = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, work: Work) -> Reply:
        work.stage = self.stage
        self.entered.set()
        await self.released.wait()
        if self.completes:
            self.runner.complete(work, REPLY)
        return REPLY

    async def wait_entered(self) -> None:
        await asyncio.wait_for(self.entered.wait(), WAIT_TIMEOUT_S)


def commit_work() -> Work:
    return Work("c1", "commit", ARGS)


# -- recorded replies ------------------------------------------------------------------------------------------


def test_a_completed_reply_replays_only_to_a_retry_with_the_same_arguments() -> None:
    runner = WorkRunner(NAME)
    runner.record("c1", "commit", Result(ARGS, REPLY))
    same = runner.replay("c1", "commit", ARGS)
    never_completed = runner.replay("c1", "restore", ARGS)
    with pytest.raises(CheckpointConflictError, match=r"already completed on environment/env-1 .* repeat them"):
        runner.replay("c1", "commit", OTHER_ARGS)

    assert same == REPLY
    assert never_completed is None


def test_forgetting_a_checkpoint_drops_its_replies_and_keeps_the_others() -> None:
    runner = WorkRunner(NAME)
    runner.record("c1", "prepare", Result((), {"phase": "prepared"}))
    runner.record("c1", "commit", Result(ARGS, REPLY))
    runner.record("c2", "prepare", Result((), {"phase": "prepared"}))
    runner.forget("c1")

    assert runner.replay("c1", "prepare", ()) is None
    assert runner.replay("c1", "commit", ARGS) is None
    assert runner.replay("c2", "prepare", ()) == {"phase": "prepared"}


def test_under_the_retried_commit_conflicts_fault_a_replay_also_compares_the_whole_request() -> None:
    first = CommitRequest(checkpoint_id="c1", deadline_ts=10.0, checkpoint_dir="/ckpt")
    later_deadline = first.model_copy(update={"deadline_ts": 20.0})
    faulty, fault_free = WorkRunner(NAME, compares_requests=True), WorkRunner(NAME)
    for runner in (faulty, fault_free):
        runner.record("c1", "commit", Result(ARGS, REPLY, runner.keep(first)))
    identical = faulty.replay("c1", "commit", ARGS, request=faulty.keep(first))
    with pytest.raises(CheckpointConflictError, match="a retry must repeat it exactly"):
        faulty.replay("c1", "commit", ARGS, request=faulty.keep(later_deadline))

    assert identical == REPLY
    assert fault_free.keep(first) is None
    assert fault_free.replay("c1", "commit", ARGS, request=fault_free.keep(later_deadline)) == REPLY


# -- deadlines and the lock ------------------------------------------------------------------------------------


def test_a_deadline_that_already_passed_is_refused_with_how_long_ago() -> None:
    runner = WorkRunner(NAME, clock=Clock(100.0))
    left_s = runner.remaining_s(100.5, "commit of 'c1'")
    with pytest.raises(DeadlineExceededError, match=r"on environment/env-1: deadline_ts 99\.000 passed 1\.000 s ago"):
        runner.remaining_s(99.0, "commit of 'c1'")

    assert left_s == 0.5


async def test_a_caller_waits_for_the_lock_no_longer_than_its_deadline() -> None:
    runner = WorkRunner(NAME, clock=Clock())
    entered: list[str] = []

    async def retire(deadline_ts: float) -> None:
        async with runner.locked_by(deadline_ts, "retire under 'c1'"):
            entered.append("retire")
            assert runner.lock.locked()

    async with runner.lock:
        with pytest.raises(DeadlineExceededError, match=r"retire under 'c1' \(waiting for the control lock\)"):
            await retire(SHORT_DEADLINE_TS)
    await retire(FAR_DEADLINE_TS)

    assert entered == ["retire"]
    assert not runner.lock.locked()


async def test_a_timeout_of_the_body_itself_is_not_taken_for_the_deadline() -> None:
    runner = WorkRunner(NAME)

    async def body_times_out() -> None:
        async with runner.bounded(WAIT_TIMEOUT_S, "forget under 'c1'"):
            raise TimeoutError("the participant's own timeout")

    with pytest.raises(TimeoutError, match="the participant's own timeout"):
        await body_times_out()


async def test_an_unexpected_exception_becomes_an_internal_error_and_a_refusal_passes_unchanged() -> None:
    runner = WorkRunner(NAME)

    async def broken() -> Reply:
        raise KeyError("episodes")

    async def refused() -> Reply:
        raise InvalidPhaseError("commit of 'c1' is not allowed in phase 'idle'")

    with pytest.raises(InternalControlError, match=r"commit failed unexpectedly on environment/env-1: KeyError"):
        await runner.run("commit", broken)
    with pytest.raises(InvalidPhaseError, match="not allowed in phase 'idle'"):
        await runner.run("commit", refused)


# -- background work -------------------------------------------------------------------------------------------


async def test_a_retry_while_the_work_runs_awaits_the_same_work_and_other_arguments_conflict() -> None:
    runner = WorkRunner(NAME, clock=Clock())
    steps = HeldSteps(runner)
    work = runner.start(commit_work(), steps)
    retry = runner.running("c1", "commit", ARGS)
    another_op = runner.running("c1", "restore", ARGS)
    with pytest.raises(CheckpointConflictError, match="is still running on environment/env-1"):
        runner.running("c1", "commit", OTHER_ARGS)
    first, retried = (asyncio.ensure_future(runner.wait(work, FAR_DEADLINE_TS)) for _ in range(2))
    steps.released.set()
    replies = await asyncio.wait_for(asyncio.gather(first, retried), WAIT_TIMEOUT_S)

    assert retry is work
    assert another_op is None
    assert list(replies) == [REPLY, REPLY]
    assert runner.current is None
    assert runner.running("c1", "commit", ARGS) is None
    assert runner.replay("c1", "commit", ARGS) == REPLY


async def test_a_wait_past_its_deadline_gives_up_while_the_work_runs_on() -> None:
    runner = WorkRunner(NAME, clock=Clock())
    steps = HeldSteps(runner)
    work = runner.start(commit_work(), steps)
    with pytest.raises(DeadlineExceededError, match=r"commit of 'c1' \(still running; a retry awaits it\)"):
        await runner.wait(work, SHORT_DEADLINE_TS)
    running_after_the_deadline = work.running
    steps.released.set()
    reply = await asyncio.wait_for(runner.wait(work, FAR_DEADLINE_TS), WAIT_TIMEOUT_S)

    assert running_after_the_deadline
    assert reply == REPLY


async def test_a_wait_whose_deadline_the_wall_clock_jumped_past_gives_up_at_once() -> None:
    """The deadline's timer runs on the monotonic clock, which a jump of the wall clock alone leaves behind: timed
    again from the wall clock (`POST /_ctl/clock`), it falls due now, not once its old delay ran out."""
    clock = Clock()
    runner = WorkRunner(NAME, clock=clock)
    steps = HeldSteps(runner)
    work = runner.start(commit_work(), steps)
    waiting = asyncio.ensure_future(runner.wait(work, FAR_DEADLINE_TS))
    await steps.wait_entered()
    runner.clock_moved()  # the clock has not moved yet: the wait goes on
    await asyncio.sleep(0)
    still_waiting = not waiting.done()
    clock.now = FAR_DEADLINE_TS + 1.0
    runner.clock_moved()
    with pytest.raises(DeadlineExceededError, match=r"commit of 'c1' \(still running; a retry awaits it\)"):
        await asyncio.wait_for(waiting, WAIT_TIMEOUT_S)
    steps.released.set()

    assert still_waiting
    assert work.running


@pytest.mark.parametrize(
    ("stage", "cancelled", "stopped"),
    [
        ("start", True, False),
        ("export", True, False),
        ("read", True, False),
        ("write", False, True),
        ("install", False, False),
        ("cleanup", False, False),
    ],
)
async def test_an_interrupt_cancels_an_export_or_a_read_stops_a_write_and_lets_the_rest_finish(
    stage: str, cancelled: bool, stopped: bool
) -> None:
    runner = WorkRunner(NAME, clock=Clock())
    steps = HeldSteps(runner, stage, completes=False)
    work = runner.start(commit_work(), steps)
    await steps.wait_entered()
    await work.interrupt()
    steps.released.set()
    await asyncio.wait_for(work.ended(), WAIT_TIMEOUT_S)

    assert work.task is not None
    assert (work.task.cancelled(), work.stop.stopped) == (cancelled, stopped)


async def test_a_wait_on_cancelled_work_says_its_checkpoint_was_resumed() -> None:
    runner = WorkRunner(NAME, clock=Clock())
    steps = HeldSteps(runner, "export")
    work = runner.start(commit_work(), steps)
    await steps.wait_entered()
    await work.interrupt()

    with pytest.raises(StaleCheckpointError, match="resumed on environment/env-1 while its commit ran"):
        await asyncio.wait_for(runner.wait(work, FAR_DEADLINE_TS), WAIT_TIMEOUT_S)


async def test_abandoned_work_never_completes_nor_records_its_reply() -> None:
    runner = WorkRunner(NAME, clock=Clock())
    steps = HeldSteps(runner)
    work = runner.start(commit_work(), steps)
    runner.abandon()
    steps.released.set()

    with pytest.raises(StaleCheckpointError, match="the commit did not complete; use a new checkpoint ID"):
        await asyncio.wait_for(runner.wait(work, FAR_DEADLINE_TS), WAIT_TIMEOUT_S)
    assert runner.replay("c1", "commit", ARGS) is None


async def test_close_cancels_every_background_task() -> None:
    runner = WorkRunner(NAME)
    steps = HeldSteps(runner)
    work = runner.start(commit_work(), steps)
    never_set = asyncio.Event()
    other = runner.spawn(never_set.wait())
    await steps.wait_entered()
    await runner.close()

    assert work.task is not None
    assert (work.task.cancelled(), other.cancelled()) == (True, True)
