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


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ctrl-C ignored while a teardown runs: a second one must not cut it short."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
