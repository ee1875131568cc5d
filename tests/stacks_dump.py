"""On a hang, say where the hung process is: its threads' stacks (py-spy, when installed) for the failure."""

from __future__ import annotations

import shutil
import subprocess

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
