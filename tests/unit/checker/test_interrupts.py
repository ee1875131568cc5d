"""Ctrl-C and SIGTERM end the run: a teardown neither drains after one nor hides it, a replay cut short by one is
never counted, and one held during a teardown is raised when the teardown ends (`ckpt_model.interrupts`)."""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

import ckpt_model.search.minimise as mm
from ckpt_model.errors import HarnessError
from ckpt_model.interrupts import (
    Interrupted,
    dropped_there,
    interrupt_behind,
    interrupt_prevails,
    interrupts_held,
    raise_interrupted,
    raise_swallowed_since,
    raised_so_far,
    sigterm_unwinds,
)
from ckpt_model.steps.steplog import StepLog


class Violation(AssertionError):
    property_id = "P9"


def stopping_fails_after(interrupt: KeyboardInterrupt) -> None:
    """What a cleanup in a `finally` does when it fails while `interrupt` unwinds: its error replaces it."""
    try:
        raise interrupt
    finally:
        raise HarnessError("the servers were killed before the settle ended")


def test_an_error_raised_while_an_interrupt_unwinds_hides_it_and_is_found() -> None:
    interrupt = KeyboardInterrupt()
    with pytest.raises(HarnessError) as hiding:
        stopping_fails_after(interrupt)
    assert interrupt_behind(hiding.value) is interrupt
    assert interrupt_behind(HarnessError("no interrupt behind this one")) is None
    group = BaseExceptionGroup("two failures", [Violation("seen"), Interrupted(signal.SIGTERM)])
    assert isinstance(interrupt_behind(group), Interrupted)


def test_a_replay_an_interrupt_cut_short_is_never_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The observed 9 of 10: the fifth replay met Ctrl-C, its teardown failed, and it was counted as not failing."""
    failing: list[BaseException] = [Violation("lost") for _ in range(10)]
    failing[4] = KeyboardInterrupt()
    replays = iter(failing)

    def replay(controller: object, harness: object, steps: object, settle_timeout_s: object) -> None:
        outcome = next(replays)
        if isinstance(outcome, KeyboardInterrupt):
            stopping_fails_after(outcome)
        raise outcome

    monkeypatch.setattr(mm, "replay", replay)
    replayer = mm.Replayer(harness=None, expected=("Violation", "P9"))  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt) as interrupted:
        replayer.rate([("crash", {})], 10)
    assert replayer.replays == 5
    assert any("HarnessError" in note for note in interrupted.value.__notes__)


def after_an_interrupt(teardown: Callable[[], None]) -> None:
    """Run `teardown` as Hypothesis and `playback.play` run it: in the `finally` of a step that met Ctrl-C."""
    try:
        raise KeyboardInterrupt
    finally:
        teardown()


def test_the_drain_is_skipped_while_an_interrupt_unwinds() -> None:
    log = StepLog(None, None, None)  # type: ignore[arg-type]
    drained: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        after_an_interrupt(lambda: log.drain(lambda: drained.append("after the interrupt")))
    assert drained == []
    log.broken = False
    log.drain(lambda: drained.append("at the end of a run"))
    assert drained == ["at the end of a run"]


def stop_failing() -> None:
    with interrupt_prevails():
        raise HarnessError("relay did not close")


def test_an_interrupt_prevails_over_what_stopping_raises() -> None:
    with pytest.raises(KeyboardInterrupt) as interrupted:
        after_an_interrupt(stop_failing)
    assert "HarnessError: relay did not close" in interrupted.value.__notes__[0]
    with pytest.raises(HarnessError):  # without an interrupt, the error is the outcome
        stop_failing()


@pytest.fixture
def unwinding_signals() -> Iterator[None]:
    """SIGINT and SIGTERM as `ckpt-model` handles them (whatever the test runner installed), restored after."""
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with sigterm_unwinds():
            yield
    finally:
        signal.signal(signal.SIGINT, previous_sigint)


# A bound on waiting for the interrupt sent again, far above the milliseconds it takes: the verdict is whether it
# comes, never how fast.
ARRIVES_WITHIN_S = 60.0


def collect_garbage() -> None:
    gc.collect()
    threading.Event().wait(ARRIVES_WITHIN_S)  # the interrupt, sent again from a thread, ends the wait


@pytest.mark.usefixtures("unwinding_signals")
@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Interrupted)])
def test_an_interrupt_that_arrives_in_a_garbage_collector_callback_is_raised_after_it(
    signum: int, raised: type[KeyboardInterrupt]
) -> None:
    """The Ctrl-C that was lost: Hypothesis times the garbage collector with a callback, and a signal that arrived
    while it ran was printed ("Exception ignored in ... gc_callback") and dropped; the run went on to its verdict."""
    arrived: list[str] = []

    def callback(phase: str, _info: dict[str, int]) -> None:
        if phase == "start" and not arrived:
            arrived.append(phase)
            signal.raise_signal(signum)

    gc.callbacks.append(callback)
    try:
        with pytest.raises(raised):
            collect_garbage()
    finally:
        gc.callbacks.remove(callback)
    assert arrived == ["start"]


def test_where_python_would_drop_an_interrupt() -> None:
    seen: list[bool] = []

    def callback(_phase: str, _info: dict[str, int]) -> None:
        seen.append(dropped_there(sys._getframe()))

    class Finalised:
        def __del__(self) -> None:
            seen.append(dropped_there(sys._getframe()))

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    Finalised()
    assert seen == [True, True, True]  # the collection's start and stop, the finaliser
    assert not dropped_there(sys._getframe())


class DropsAnInterrupt:
    def __del__(self) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C arriving during a finaliser does, where Python's handler raises it


def drop_a_finalised_object() -> None:
    DropsAnInterrupt()
    threading.Event().wait(ARRIVES_WITHIN_S)


@pytest.mark.usefixtures("unwinding_signals")
def test_an_interrupt_python_drops_is_raised_again() -> None:
    with pytest.raises(KeyboardInterrupt):
        drop_a_finalised_object()


def teardown_meeting(signum: int, finished: list[str], failure: BaseException | None = None) -> None:
    """A teardown under `interrupts_held` that receives `signum` halfway, with `failure` unwinding (or none)."""
    with interrupts_held():
        signal.raise_signal(signum)
        finished.append("the teardown")
        if failure is not None:
            raise failure


@pytest.mark.usefixtures("unwinding_signals")
@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Interrupted)])
def test_an_interrupt_during_a_teardown_waits_for_it_and_is_then_raised(
    signum: int, raised: type[KeyboardInterrupt]
) -> None:
    finished: list[str] = []
    with pytest.raises(raised) as interrupted:
        teardown_meeting(signum, finished)
    assert finished == ["the teardown"]
    assert getattr(interrupted.value, "signum", signal.SIGINT) == signum
    with interrupts_held():  # no signal, nothing raised
        finished.append("another teardown")


@pytest.mark.usefixtures("unwinding_signals")
def test_an_interrupt_held_during_a_teardown_outranks_the_failure_being_reported() -> None:
    finished: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        teardown_meeting(signal.SIGINT, finished, Violation("found before the Ctrl-C"))
    assert finished == ["the teardown"]


def swallows_what_it_meets() -> Exception:
    """What a library did with an interrupt raised inside it (seen: Hypothesis reporting `FlakyStrategyDefinition` for
    the example Ctrl-C cut short): caught, and replaced by an error that carries no trace of it."""
    with contextlib.suppress(KeyboardInterrupt):
        raise_interrupted(signal.SIGINT, None)
    return RuntimeError("Inconsistent data generation")


def test_an_interrupt_a_library_swallowed_is_raised_again_where_the_run_would_go_on() -> None:
    before = raised_so_far()
    raise_swallowed_since(before)  # none raised yet: the run goes on

    reported = swallows_what_it_meets()

    assert interrupt_behind(reported) is None  # nothing links the error to the interrupt
    with pytest.raises(KeyboardInterrupt) as again:
        raise_swallowed_since(before)
    assert "swallowed" in again.value.__notes__[0]
    raise_swallowed_since(raised_so_far())  # one swallowed before a run began is not that run's


def test_a_search_hypothesis_lost_an_interrupt_in_ends_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`checking.search` asks after Hypothesis returns or raises: the interrupt ends it, nothing is measured."""
    import types

    import hypothesis.stateful

    import ckpt_model.search.checking as checking

    measured: list[object] = []

    def run_state_machine_as_test(factory: object, settings: object) -> None:
        raise swallows_what_it_meets()

    monkeypatch.setattr(hypothesis.stateful, "run_state_machine_as_test", run_state_machine_as_test)
    monkeypatch.setattr(checking, "measure_failures", lambda *args, **kwargs: measured.append(args))
    controller = types.SimpleNamespace(factory=lambda *args, **kwargs: object)
    with pytest.raises(KeyboardInterrupt):
        checking.search(
            None,  # type: ignore[arg-type]
            checking.settings(max_examples=1),
            checking.SearchStats(),
            controller=controller,  # type: ignore[arg-type]
        )
    assert measured == []
