"""Launch a look-alike Gym deployment: the fake backend plus the four Gym servers, each in its own process group.

As a program: `python -m fakes.stack --topology native --state-dir DIR [--backend-url URL] [--faults a,b]`
starts everything, writes `DIR/deployment.json` and stays in the foreground until SIGTERM or SIGINT. As a library:
`Stack` starts, crashes (SIGKILL of every Gym process group) and restarts the Gym servers against a backend that
survives, which is what the checker's deployment harness builds on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx

from fakes.gym.config import CONFIG_ENV, ServerConfig

PORT_RANGE = (20000, 32767)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.005
LOG_TAIL_LINES = 30

# Server instance names as in Gym's suite, with the role each plays per topology.
TOPOLOGIES: dict[str, dict[str, str]] = {
    "native": {
        "environment": "environment",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
    },
    "legacy": {
        "environment": "legacy_relay",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
    },
}
KIND_OF_ROLE = {
    "environment": "environment",
    "legacy_relay": None,
    "agent": "agent",
    "resources": "resources",
    "policy_model": "model",
}
PEERS = {
    "environment": ("agent", "resources"),
    "legacy_relay": ("agent",),
    "agent": ("policy_model", "resources"),
    "resources": (),
    "policy_model": (),
}

_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port in 20000-32767 that binds now and was not handed out before by this process."""
    for _ in range(1000):
        port = secrets.choice(range(*PORT_RANGE))
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free loopback port in 20000-32767 after 1000 tries")


class StackStartError(RuntimeError):
    """A server exited or never became healthy; the message carries its log tail."""


@attrs.define(eq=False)
class ServerProcess:
    """One server process in its own process group, with its log file."""

    name: str
    url: str
    kind: str | None
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "kind": self.kind, "pgid": self.pgid}


def spawn(name: str, argv: list[str], env: dict[str, str], log_path: Path, url: str, kind: str | None) -> ServerProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"--- start {name} at {time.time():.3f}\n".encode())
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return ServerProcess(name=name, url=url, kind=kind, process=process, log_path=log_path)


def wait_healthy(servers: list[ServerProcess], path: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll each server's health route until it answers < 500; a server that exits fails the start."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    with httpx.Client(timeout=2.0) as client:
        while pending:
            server = pending[0]
            if server.process.poll() is not None:
                raise StackStartError(
                    f"{server.name} exited with status {server.process.returncode} before it was healthy; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            try:
                if client.get(server.url + path).status_code < 500:
                    pending.pop(0)
                    continue
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise StackStartError(
                    f"{server.name} was not healthy at {server.url}{path} within {timeout_s:.0f} s; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            time.sleep(POLL_INTERVAL_S)


def kill_group(server: ServerProcess, sig: int = signal.SIGKILL, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Signal the whole process group, reap the leader, and wait (bounded) until the group is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pgid, sig)
    try:
        server.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(server.pgid, signal.SIGKILL)
        server.process.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(server.pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_INTERVAL_S)


class Stack:
    """A deployment of the look-alike stack under one state directory."""

    def __init__(
        self,
        topology: str,
        state_dir: Path,
        *,
        backend_url: str | None = None,
        faults: tuple[str, ...] = (),
        token: str | None = None,
    ) -> None:
        if topology not in TOPOLOGIES:
            raise ValueError(f"'topology' must be one of {sorted(TOPOLOGIES)} (got {topology!r})")
        self.topology = topology
        self.state_dir = Path(state_dir).resolve()
        self.faults = tuple(faults)
        self.token = token or "ckpt-" + secrets.token_hex(8)
        self.backend_url = backend_url
        self.backend: ServerProcess | None = None
        self.gym: dict[str, ServerProcess] = {}
        self.capture_dir = self.state_dir / "capture"
        self.checkpoint_root = self.state_dir / "checkpoints"
        self._ports: dict[str, int] = {}

    # -- processes -------------------------------------------------------------------------------------------

    def start_backend(self) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "fakes.backend", "--port", str(port)]
        self.backend = spawn("backend", argv, dict(os.environ), self.state_dir / "logs" / "backend.log", url, None)
        wait_healthy([self.backend], "/v1/models")
        self.backend_url = url
        return url

    def configs(self) -> dict[str, ServerConfig]:
        """Each Gym server's configuration; ports are chosen once and kept across restarts."""
        roles = TOPOLOGIES[self.topology]
        for name in roles:
            self._ports.setdefault(name, free_port())
        urls = {name: f"http://127.0.0.1:{port}" for name, port in self._ports.items()}
        return {
            name: ServerConfig(
                name=name,
                role=role,  # type: ignore[arg-type]
                port=self._ports[name],
                token=self.token,
                backend_url=self.backend_url or "",
                peers={peer: urls[peer] for peer in PEERS[role]},
                capture_dir=str(self.capture_dir),
                faults=self.faults,
            )
            for name, role in roles.items()
        }

    def start_gym(self) -> None:
        """Start every Gym server in parallel and wait until all are healthy."""
        if self.backend_url is None:
            raise RuntimeError("start the backend (or pass backend_url) before the Gym servers")
        self.capture_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        for name, config in self.configs().items():
            env = {**os.environ, CONFIG_ENV: config.to_json()}
            argv = [sys.executable, "-m", "fakes.gym.serve"]
            log_path = self.state_dir / "logs" / f"{name}.log"
            self.gym[name] = spawn(name, argv, env, log_path, config.url, KIND_OF_ROLE[config.role])
        try:
            wait_healthy(list(self.gym.values()), "/health")
        except StackStartError:
            self.crash_gym()
            raise

    def crash_gym(self) -> None:
        """SIGKILL every Gym process group; the backend and the directories survive."""
        for server in self.gym.values():
            kill_group(server)
        self.gym = {}

    def stop(self) -> None:
        """Stop everything this stack started (idempotent)."""
        self.crash_gym()
        if self.backend is not None:
            kill_group(self.backend, signal.SIGTERM)
            self.backend = None

    def describe(self) -> dict[str, Any]:
        backend = None
        if self.backend_url is not None:
            backend = {"url": self.backend_url, "pgid": self.backend.pgid if self.backend else None}
        return {
            "topology": self.topology,
            "token": self.token,
            "backend": backend,
            "servers": {name: server.describe() for name, server in self.gym.items()},
            "capture_dir": str(self.capture_dir),
            "checkpoint_root": str(self.checkpoint_root),
            "faults": list(self.faults),
        }

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.stack", description=__doc__.splitlines()[0])
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="native")
    parser.add_argument("--state-dir", type=Path, required=True, help="logs, checkpoints, deployment.json")
    parser.add_argument("--backend-url", help="use a running backend (one that survived a crash) instead")
    parser.add_argument("--faults", default="", help="comma-separated fault names (see fakes.faults)")
    parser.add_argument("--token", help="control bearer token (default: a fresh random one)")
    args = parser.parse_args(argv)
    faults = tuple(name for name in args.faults.split(",") if name)
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    stack = Stack(args.topology, args.state_dir, backend_url=args.backend_url, faults=faults, token=args.token)
    try:
        if args.backend_url is None:
            stack.start_backend()
        stack.start_gym()
        description_path = stack.state_dir / "deployment.json"
        description_path.write_text(json.dumps(stack.describe(), indent=2) + "\n")
        print(f"deployment ready: {description_path}", flush=True)
        # Block the stop signals only now: children inherit the mask, and they must stay killable.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        if not stop_requested:
            signal.sigwait({signal.SIGTERM, signal.SIGINT})
    except StackStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
