"""The fake backend as a real model server would run: a process of its own that the real-model tests start."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from fakes.processes.ports import free_port
from fakes.processes.server_processes import kill_groups, spawn, wait_healthy

# Long enough that the second wave is still generating when prepare comes; short enough for a run of seconds.
LATENCY_MS = 150
SERVED_MODEL = "ckpt-model/ungated-fake"


@contextlib.contextmanager
def ungated_backend(log_path: Path, latency_ms: int = LATENCY_MS) -> Iterator[str]:
    """Its base URL while it runs: its own process group, no `/_ctl` routes, a latency per call, one served model.
    Stopped (its group gone) however the block ends, an interrupt included; with `--exit-with-stdin` it also
    stops if this process dies."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "fakes.backend", "--port", str(port), "--exit-with-stdin", "--ungated"]
    argv += ["--latency-ms", str(latency_ms), "--served-model-name", SERVED_MODEL]
    backend = spawn("ungated-backend", argv, dict(os.environ), log_path, url, None, stdin_pipe=True)
    try:
        wait_healthy([backend], "/v1/models")
        yield url
    finally:
        kill_groups([backend], signal.SIGTERM)
        if backend.process is not None and backend.process.stdin is not None:
            backend.process.stdin.close()
