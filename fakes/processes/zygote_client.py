"""The owner's handle on a fork server (`fakes.processes.zygote`): launch it, ask it for servers and standbys, stop it.

`fakes.stack.launcher.Stack` holds one `ForkServer` at a time (a new one if the last died). Each request is one JSON
line to the fork server's stdin and one reply line from its stdout (`fakes.processes.zygote_protocol`), every reply
bounded by a timeout: a hung fork server fails a start with its log, never hangs the checker.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from fakes.processes import process_groups
from fakes.processes.zygote_protocol import write_message

READY_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class ForkServerError(RuntimeError):
    """The fork server did not start, refused a request, or stopped answering."""


@attrs.frozen
class SpawnRequest:
    """One server to fork: its name, its JSON config (whose host and port it listens on), its log file."""

    name: str
    config_json: str
    log_path: Path

    def to_wire(self) -> dict[str, str]:
        return {"name": self.name, "config": self.config_json, "log_path": str(self.log_path)}


@attrs.frozen
class Started:
    """What a spawn started: each server's pid, and which of them already serve (their standbys said so)."""

    pids: dict[str, int]
    serving: frozenset[str]


class ForkServer:
    """The owner's end of a running fork server: start it, ask it for children and exit statuses, stop it."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self._buffer = b""
        # Set when a reply did not come in time: a late one would be taken for the next request's.
        self._out_of_step = False
        self._ready = False

    @classmethod
    def launch(cls, log_path: Path, env: Mapping[str, str] | None = None) -> ForkServer:
        """Start a fork server in its own session (with `env`, by default this process's); it warms up in the
        background (see `wait_ready`)."""
        argv = [sys.executable, "-m", "fakes.processes.zygote"]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"--- start fork server at {time.time():.3f}\n".encode())
            log.flush()
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env=None if env is None else dict(env),
            )
        return cls(process, log_path)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until the fork server has warmed up (seconds, once); stop it if it cannot."""
        if self._ready:
            return
        try:
            reply = self._read_message(timeout_s)
            if not reply.get("ready"):
                raise ForkServerError(f"the fork server could not start: {reply.get('error')}")
        except BaseException:
            self.stop()
            raise
        self._ready = True

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        """Running and answering in step; the owner replaces a fork server that is not."""
        return self.process.poll() is None and not self._out_of_step

    def spawn(self, requests: Sequence[SpawnRequest], timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, int]:
        """Fork every requested server; returns {name: pid}, each pid leading its own process group."""
        return self.start(requests, timeout_s).pids

    def start(self, requests: Sequence[SpawnRequest], timeout_s: float = REPLY_TIMEOUT_S) -> Started:
        """Start every requested server (a standby if one is built, else a fork): each pid leads its own process
        group, and the servers named in `serving` already accept on their sockets (no health check needed)."""
        reply = self._request({"op": "spawn", "servers": [request.to_wire() for request in requests]}, timeout_s)
        pids = {name: int(pid) for name, pid in reply["pids"].items()}
        return Started(pids=pids, serving=frozenset(reply.get("serving", ())))

    def prebuild(self, requests: Sequence[SpawnRequest], timeout_s: float = REPLY_TIMEOUT_S) -> None:
        """Fork a standby child per server (from this config) that the next start of that server hands its socket."""
        self._request({"op": "prebuild", "servers": [request.to_wire() for request in requests]}, timeout_s)

    def wait_idle(self, timeout_s: float = REPLY_TIMEOUT_S) -> None:
        """Return once the fork server has done all earlier work (requests are served in order) and every standby
        child is built and waiting for its socket."""
        self._request({"op": "ping"}, timeout_s)

    def exit_status(self, pid: int, timeout_s: float = REPLY_TIMEOUT_S) -> int | None:
        """How a reaped child exited (negative: killed by that signal); None while it runs or if unknown."""
        status = self._request({"op": "exit_status", "pid": pid}, timeout_s)["exit_status"]
        return None if status is None else int(status)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Close its stdin (it kills and reaps its children, then exits); SIGKILL its group if it does not."""
        if not self._ready:
            # Still warming up, so no child yet, and closing stdin would be noticed only after the warm-up. SIGTERM
            # first: it exits through its handlers and removes its warm-up directory; SIGKILL below if it does not.
            process_groups.kill(self.process.pid, signal.SIGTERM)
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process_groups.kill(self.process.pid)
            self.process.wait(timeout=timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()

    # -- the channel ----------------------------------------------------------------------------------------

    def _request(self, message: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.wait_ready()
        if self._out_of_step:
            raise ForkServerError(f"the fork server (pid {self.pid}) missed a reply before; stop it and start another")
        try:
            write_message(self.process.stdin, message)
        except (BrokenPipeError, ValueError) as error:
            raise ForkServerError(f"the fork server (pid {self.pid}) is gone: {error}") from error
        reply = self._read_message(timeout_s)
        if not reply.get("ok"):
            raise ForkServerError(f"the fork server refused {message.get('op')!r}: {reply.get('error')}")
        return reply

    def _read_message(self, timeout_s: float) -> dict[str, Any]:
        """The next reply line, bounded by `timeout_s` (a hung fork server must not hang the checker)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline_s = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0 or not selector.select(remaining_s):
                    self._out_of_step = True
                    raise ForkServerError(f"the fork server (pid {self.pid}) did not answer within {timeout_s:.0f} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    status = self.process.wait(timeout=STOP_TIMEOUT_S)
                    raise ForkServerError(f"the fork server (pid {self.pid}) exited with status {status}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)
