"""SIGTERM unwinds like Ctrl-C, and neither is ever lost, so every context manager, `finally` and fixture stops
what it started, and the run ends.

Python's default for SIGTERM ends the process at once: no `finally` runs, and the Gym servers, each the leader of
its own process group, outlive the run together with their directories. A CI job's timeout, `kill`, or a
supervisor all send SIGTERM. With the handler installed, SIGTERM raises `Interrupted` (a `KeyboardInterrupt`) in
the main thread, and the run unwinds exactly as on Ctrl-C.

Python raises a signal's exception wherever the main thread is, also inside a garbage collector callback (such as
the one Hypothesis installs), a `__del__` or a weakref callback, where it can only print it ("Exception ignored in
...") and drop it: such a Ctrl-C was never honoured, and the run went on to its verdict. So the handler of both
signals (`raise_interrupted`) does not raise there (`dropped_there`) but sends the signal again once the main thread
is outside; and an interrupt dropped all the same reaches Python's hook for what it drops (`redeliver_dropped`),
which sends it again the same way.

Used by `ckpt-model` and `ckpt-model fuzz`, the benchmarks, and, as a pytest plugin, the project's own test suite
(`-p ckpt_model.interrupts` in pyproject.toml's pytest `addopts`; any suite can add the same option).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

UnraisableHook = Callable[[Any], object]
# How often, and at most how long, an interrupt sent again waits for the main thread to leave the code where Python
# would drop it (a garbage collector callback runs for microseconds).
SEND_AGAIN_POLL_S = 0.001
SEND_AGAIN_WAIT_S = 5.0


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or another signal turned into one) arrived; unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Every signal `raise_interrupted` turned into an interrupt in this process, in order (`raise_swallowed_since`).
_raised: list[int] = []


def raise_interrupted(signum: int, frame: FrameType | None) -> None:
    """The handler of SIGTERM and Ctrl-C: raise the interrupt in the main thread, or, where Python would drop it,
    send the signal again for when the main thread is outside (`send_again_outside`)."""
    if frame is not None and dropped_there(frame):
        send_again_outside(signum)
        return
    _raised.append(signum)
    raise interrupt_for(signum)


def raised_so_far() -> int:
    """How many interrupts the handler raised in this process: a search notes it as it begins, to ask
    `raise_swallowed_since` later."""
    return len(_raised)


def raise_swallowed_since(mark: int) -> None:
    """Raise again the first interrupt raised since `raised_so_far()` was `mark`, if the run goes on all the same:
    a library can lose one on the way. Seen: Ctrl-C met Hypothesis's final replay of a failing example, which it
    then reported as `FlakyStrategyDefinition` with no trace of the interrupt, and the run went on to measure,
    minimise and print its verdict. An interrupt ends the run, so any that did not was swallowed."""
    if len(_raised) > mark and unwinding() is None:
        interrupt = interrupt_for(_raised[mark])
        interrupt.add_note("raised again: it was swallowed on its way out (by Hypothesis, say) and the run went on")
        raise interrupt


def send_again_outside(signum: int) -> None:
    """Send `signum` to this process again once the main thread has left the code where Python would drop its
    interrupt: from a thread, since a signal marked from there would be handled at once, inside that code again."""
    threading.Thread(target=_send_when_outside, args=(signum,), name="ckpt-interrupt-again", daemon=True).start()


def _send_when_outside(signum: int) -> None:
    main, polled = threading.main_thread().ident, threading.Event()
    deadline_s = time.monotonic() + SEND_AGAIN_WAIT_S
    while time.monotonic() < deadline_s:
        frame = sys._current_frames().get(main or 0)
        if frame is None or not dropped_there(frame):
            break
        polled.wait(SEND_AGAIN_POLL_S)
    os.kill(os.getpid(), signum)


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """What a signal raises once it unwinds: a plain `KeyboardInterrupt` for Ctrl-C, as Python's own handler."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)


def dropped_there(frame: FrameType) -> bool:
    """Whether an exception raised in `frame` would be printed and dropped by Python instead of unwinding the run:
    the frame, or one it was called from, is a garbage collector callback, a `__del__`, or `redeliver_dropped`."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    current: FrameType | None = frame
    while current is not None:
        code = current.f_code
        if code is redeliver_dropped.__code__ or code.co_name == "__del__" or code in callbacks:
            return True
        current = current.f_back
    return False


# The hooks `install` replaced, the latest last: what `redeliver_dropped` hands everything but an interrupt to.
_hooks_before: list[UnraisableHook] = []


def redeliver_dropped(unraisable: Any) -> None:
    """`sys.unraisablehook`: an interrupt Python dropped where it could only print it is sent again, for when the
    main thread is outside; anything else goes to the hook that was there before."""
    interrupt = unraisable.exc_value
    if isinstance(interrupt, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        send_again_outside(signal_number(interrupt))
        return
    (_hooks_before[-1] if _hooks_before else sys.__unraisablehook__)(unraisable)


def signal_number(interrupt: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: SIGINT for a plain Ctrl-C."""
    return interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT


def install() -> dict[int, Any]:
    """`raise_interrupted` for SIGTERM, and for Ctrl-C unless it is ignored (a job a shell started in the
    background), and `redeliver_dropped` as Python's hook; returns the handlers replaced."""
    previous: dict[int, Any] = {signal.SIGTERM: signal.signal(signal.SIGTERM, raise_interrupted)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, raise_interrupted)
    _hooks_before.append(sys.unraisablehook)
    sys.unraisablehook = redeliver_dropped
    return previous


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises `Interrupted` and no interrupt is dropped (`install`); the previous
    handlers and hook are back afterwards."""
    previous = install()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = _hooks_before.pop()


def pytest_configure() -> None:
    """As a pytest plugin: for the whole session (pytest-xdist workers load it too, each in its own main thread)."""
    install()


def unwinding() -> KeyboardInterrupt | None:
    """The interrupt this thread is unwinding from, when called from a `finally` (or `except`) it runs: a teardown
    asks, so that it stops what runs and judges nothing (a drain would take seconds and could raise an error of
    its own, which Python would let replace the interrupt)."""
    error = sys.exc_info()[1]
    return error if isinstance(error, KeyboardInterrupt) else None


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The interrupt an error hides: one the error was raised while unwinding from (Python keeps it as the error's
    `__context__`; a cleanup in a `finally` that fails replaces the interrupt so), or one inside an exception
    group (Hypothesis groups what its final replay of several failures raised, an interrupt included)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        if current.__context__ is not None:
            pending.append(current.__context__)
    return None


def reraise_interrupt_behind(error: BaseException) -> None:
    """Raise the interrupt `error` hides, if it hides one: whoever catches `Exception` to count an outcome (a
    replay, an example, a measurement) calls this first, so an interrupted run is never counted as a pass or as a
    failure, and the run ends."""
    interrupt = interrupt_behind(error)
    if interrupt is not None:
        interrupt.add_note(f"while unwinding from it: {type(error).__name__}: {error}")
        raise interrupt from None


@contextlib.contextmanager
def interrupt_prevails() -> Iterator[None]:
    """Around a teardown: an error it raises while an interrupt unwinds (one that came before the teardown or
    during it: the error's `__context__` is then the interrupt) is noted on the interrupt, which goes on. Without
    this, Python lets the `finally`'s error replace the interrupt, and whoever catches `Exception` above (a replay
    counting its outcome, Hypothesis judging an example) takes an interrupted run for a failing or a passing one
    and carries on."""
    try:
        yield
    except Exception as error:
        reraise_interrupt_behind(error)
        raise


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C (and SIGTERM, where it unwinds) held while a teardown runs: neither cuts it short, and the first that
    came is raised once the teardown has finished, so it is honoured, never lost (ignoring it would let a run
    interrupted during a teardown print a verdict and exit 0). An interrupt already unwinding goes on as it is."""
    held: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    previous = {
        signum: signal.signal(signum, hold)
        for signum in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(signum) in (signal.default_int_handler, raise_interrupted)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held and unwinding() is None:
            raise interrupt_for(held[0])


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once an interrupt has unwound: the exit handlers run and the output is flushed,
    but the interpreter is not torn down (freeing every object and module one by one is CPU a loaded machine gives
    out slowly; the kernel frees the memory at once). Only for a process whose every resource is already released."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
