"""Helpers for tests that interrupt a process: give it Ctrl-C's default meaning, and on a hang, show its stacks."""

from __future__ import annotations

import shutil
import signal
import subprocess


def default_sigint() -> None:
    """`preexec_fn` for a child that must stop on SIGINT: a shell that starts a job in the background (`cmd &`,
    no job control) leaves SIGINT ignored, the child inherits that, and Python then installs no Ctrl-C handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


DUMP_TIMEOUT_S = 20.0


def stacks_of(pid: int) -> str:
    """Every thread's Python stack of process `pid`, or why it cannot be shown."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "(install py-spy to see the hung process's stacks here)"
    try:
        dumped = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return "(py-spy dump timed out)"
    return dumped.stdout + dumped.stderr
