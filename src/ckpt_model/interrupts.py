"""SIGTERM unwinds like Ctrl-C, so every context manager, `finally` and fixture stops what it started.

Python's default for SIGTERM ends the process at once: no `finally` runs, and the Gym servers, each the leader of
its own process group, outlive the run together with their directories. A CI job's timeout, `kill`, or a
supervisor all send SIGTERM. With the handler installed, SIGTERM raises `Interrupted` (a `KeyboardInterrupt`) in
the main thread, and the run unwinds exactly as on Ctrl-C.

Used by `ckpt-model` and `ckpt-model fuzz`, the benchmarks, and, as a pytest plugin, the project's own test suite
(`-p ckpt_model.interrupts` in pyproject.toml's pytest `addopts`; any suite can add the same option).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or another signal turned into one) arrived; unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


def signal_number(interrupt: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: SIGINT for a plain Ctrl-C."""
    return interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises `Interrupted`; the previous handler is back afterwards."""
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def pytest_configure() -> None:
    """As a pytest plugin: for the whole session (pytest-xdist workers load it too, each in its own main thread)."""
    signal.signal(signal.SIGTERM, raise_interrupted)


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
        for signum, unwinds in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, raise_interrupted))
        if signal.getsignal(signum) is unwinds
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held and unwinding() is None:
            raise interrupt_for(held[0])


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """What a signal raises once it unwinds: a plain `KeyboardInterrupt` for Ctrl-C, as Python's own handler."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)
