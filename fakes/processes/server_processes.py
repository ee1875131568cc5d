"""The stack's server processes, each the leader of its own process group: start one, wait until servers answer,
show a log's tail, kill groups and wait until they are gone.

`fakes.processes.process_groups` signals and waits on a bare process group; this module knows the server behind one: its
name, URL and log, and who reaps it (this process, or the fork server).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

from fakes.processes import process_groups
from fakes.processes.zygote_client import ForkServerError

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.005
# One health request: a forked server's socket listens before the server runs, so a request waits here while the
# server starts; a server that hangs before accepting is looked at again after this long.
HEALTH_REQUEST_TIMEOUT_S = 1.0
LOG_TAIL_LINES = 30


class StackStartError(RuntimeError):
    """A server exited or never became healthy; the message carries its log tail."""


class StackStopError(RuntimeError):
    """A process group still had processes after SIGKILL and the stop timeout."""


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@attrs.define(eq=False)
class ServerProcess:
    """One server process leading its own process group, with its log file.

    Its parent is either this process (`process` is the Popen, which reaps it) or the fork server (which reaps
    it and is asked, through `exit_status_of`, how it exited).
    """

    name: str
    url: str
    kind: str | None
    pid: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    exit_status_of: Callable[[int], int | None] | None = None

    @property
    def pgid(self) -> int:
        return self.pid

    def poll(self) -> int | None:
        """The exit status once the process is gone (-1 if no one recorded it), None while it runs."""
        if self.process is not None:
            return self.process.poll()
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            # Gone means reaped, and the fork server records the status as it reaps.
            status = self.exit_status_of(self.pid) if self.exit_status_of is not None else None
            return -1 if status is None else status
        return None

    def reap(self) -> None:
        """Have the process collected if it exited: its group cannot disappear while its leader is a zombie.

        Through its Popen on the cold path. The fork server's SIGCHLD handler reaps its children; should a zombie
        wait there anyway, any request makes the fork server reap before it answers.
        """
        if self.process is not None:
            self.process.poll()
        elif self.exit_status_of is not None and process_groups.process_state(self.pid) == "Z":
            with contextlib.suppress(ForkServerError):
                self.exit_status_of(self.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "kind": self.kind, "pgid": self.pgid}


def log_start(log_path: Path, name: str) -> None:
    """Mark a (re)start in the server's log, which every start of that server appends to."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        log_file.write(f"--- start {name} at {time.time():.3f}\n".encode())


def spawn(
    name: str,
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    url: str,
    kind: str | None,
    *,
    stdin_pipe: bool = False,
) -> ServerProcess:
    """Cold-start one server as our child, in a new session (so its own process group).

    With `stdin_pipe` the child's stdin is a pipe from us: a server started with `--exit-with-stdin` stops when
    it closes, which happens however we die (SIGTERM and SIGKILL skip atexit)."""
    log_start(log_path, name)
    stdin = subprocess.PIPE if stdin_pipe else subprocess.DEVNULL
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=stdin, start_new_session=True
        )
    return ServerProcess(name=name, url=url, kind=kind, pid=process.pid, log_path=log_path, process=process)


def health_client() -> httpx.Client:
    """The client health checks reuse: building one costs ~42 ms (its SSL context), so a Stack builds one."""
    return httpx.Client(timeout=HEALTH_REQUEST_TIMEOUT_S, trust_env=False)


def wait_healthy(
    servers: Sequence[ServerProcess],
    path: str,
    timeout_s: float = START_TIMEOUT_S,
    http: httpx.Client | None = None,
) -> None:
    """Poll each server's health route until it answers < 500; a server that exits fails the start.

    A cold server refuses connections until it binds, hence the polling; a forked server's socket listens
    before the server runs, so its first request simply waits in the backlog until the server answers.
    """
    deadline_s = time.monotonic() + timeout_s
    pending = list(servers)
    with contextlib.ExitStack() as resources:
        client = http if http is not None else resources.enter_context(health_client())
        while pending:
            server = pending[0]
            status = server.poll()
            if status is not None:
                raise StackStartError(
                    f"{server.name} exited with status {status} before it was healthy; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            try:
                if client.get(server.url + path).status_code < 500:
                    pending.pop(0)
                    continue
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline_s:
                raise StackStartError(
                    f"{server.name} was not healthy at {server.url}{path} within {timeout_s:.0f} s; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            time.sleep(POLL_INTERVAL_S)


def kill_groups(servers: Sequence[ServerProcess], sig: int = signal.SIGKILL, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Signal every server's process group first (they die in parallel), then wait (bounded) until each group is
    gone; a group still there after `timeout_s` gets SIGKILL and another `timeout_s`, then the stop fails.

    A SIGKILL of several groups is one crash: every group is stopped (SIGSTOP) before any is killed. Killed one
    after another, a server killed first closes its sockets while a later one still runs, and that one answers
    its clients about the death (a `/run` replies "Server disconnected" instead of being cut off): a race
    between the kills that no rule chose."""
    if sig == signal.SIGKILL and len(servers) > 1:
        for server in servers:
            process_groups.kill(server.pgid, signal.SIGSTOP)
    for server in servers:
        process_groups.kill(server.pgid, sig)
    stuck = [server for server in servers if not process_groups.wait_gone(server.pgid, server.reap, timeout_s)]
    for server in stuck:
        process_groups.kill(server.pgid, signal.SIGKILL)
    stuck = [server for server in stuck if not process_groups.wait_gone(server.pgid, server.reap, timeout_s)]
    if stuck:
        names = ", ".join(
            f"{server.name} (pgid {server.pgid}: {process_groups.members(server.pgid)})" for server in stuck
        )
        waited_s = 2 * timeout_s
        raise StackStopError(f"process groups still alive {waited_s:.0f} s after signal {sig}, then SIGKILL: {names}")
