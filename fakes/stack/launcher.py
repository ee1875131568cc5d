"""A look-alike Gym deployment under one state directory: the fake backend plus the Gym servers, each in its own
process group.

`Stack` starts, crashes (SIGKILL of every Gym process group) and restarts the Gym servers against a backend that
survives, which is what the checker's deployment harness builds on. `python -m fakes.stack` runs one by hand
(`fakes.stack.cli`).

By default the Gym servers are forked from a warmed fork server (`fakes.processes.zygote`, driven through
`fakes.processes.zygote_client`), so a restart costs milliseconds; `fork_server=False` cold-starts `python -m
fakes.gym.serve` per server instead (the fallback, and the baseline of `benchmarks/restart.py`). Either way a
crashed server's port refuses connections until the next start binds it again, as after a real crash. Servers
start, answer and die through `fakes.processes.server_processes`; their ports come from `fakes.processes.ports`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from fakes import clock
from fakes.faults import validate as validate_faults
from fakes.gym.config import (
    CONFIG_ENV,
    DEFAULT_LEASE_GRACE_S,
    PARTICIPANT_WORKER_ROLES,
    ServerConfig,
    check_capture,
    lease_grace,
)
from fakes.gym.faults.power_cuts import lose_unsynced
from fakes.gym.workers.runtime import remove_runtime_dir
from fakes.processes.ports import free_port
from fakes.processes.process_groups import all_stopped, kill, members, none_stopped, poll_until
from fakes.processes.server_processes import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerProcess,
    StackStartError,
    health_client,
    kill_groups,
    log_start,
    log_tail,
    spawn,
    wait_healthy,
)
from fakes.processes.zygote_client import ForkServer, ForkServerError, SpawnRequest
from fakes.stack.topologies import KIND_OF_ROLE, RESOURCES_SERVER_OF, TOPOLOGIES, peer_names, resources_mode

log = logging.getLogger(__name__)

VERIFY_MODES = ("wait", "replay")
# A SIGSTOP or SIGCONT lands on a group's processes within milliseconds; this bounds the wait on a loaded machine.
SIGNAL_LANDS_TIMEOUT_S = 10.0


def kill_gym(servers: Sequence[ServerProcess]) -> None:
    """`kill_groups`, then remove what a SIGKILLed coordinator of several workers could not: its runtime directory."""
    kill_groups(servers)
    for server in servers:
        remove_runtime_dir(server.pid)


def workers_count(value: object, what: str = "policy_workers") -> int:
    """A worker count: an integer >= 1, or a ValueError that names `what` and says so."""
    count = 0
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, str) and value.strip().isdigit():
        count = int(value)  # from the command line
    if count < 1:
        raise ValueError(f"'{what}' must be an integer >= 1 (got {value!r})")
    return count


def policy_workers_count(value: object) -> int:
    """A policy model worker count (`workers_count`)."""
    return workers_count(value, "policy_workers")


def server_workers_count(value: object) -> int:
    """The worker count of the environment, agent and resources servers (`workers_count`)."""
    return workers_count(value, "server_workers")


class Stack:
    """A deployment of the look-alike stack under one state directory."""

    def __init__(
        self,
        topology: str,
        state_dir: Path,
        *,
        backend_url: str | None = None,
        backend_model: str = "",
        faults: tuple[str, ...] = (),
        token: str | None = None,
        fork_server: bool = True,
        verify_mode: str = "wait",
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        token_capture: bool = False,
        generation_cuts: bool = False,
        policy_workers: int = 1,
        server_workers: int = 1,
        time_jumps: bool = False,
        telemetry: bool = True,
    ) -> None:
        self.topology = ""
        self.verify_mode = ""
        self.token_capture = False
        self.generation_cuts = False
        # uvicorn workers of the policy model server (`fakes.gym.workers.coordinator_process`); the other servers run
        # one each.
        self.policy_workers = 1
        # uvicorn workers of each environment, agent and resources server (`fakes.gym.servers.participant_workers`).
        self.server_workers = 1
        self.redeploy(
            topology,
            verify_mode=verify_mode,
            token_capture=token_capture,
            generation_cuts=generation_cuts,
            policy_workers=policy_workers,
            server_workers=server_workers,
        )
        # Every server's monotonic clock follows its libfaketime offset too, so time can pass (`fakes.clock`).
        self.time_jumps = bool(time_jumps)
        # Every start (first, restart, a fork server standby) builds its configs from this, so it survives restarts.
        self.lease_grace_s = lease_grace(lease_grace_s)
        self.state_dir = Path(state_dir).resolve()
        self.faults = tuple(faults)
        self.token = token or "ckpt-" + secrets.token_hex(8)
        # The ledger control routes' own bearer (Gym's NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN), never the control token.
        self.capture_token = "capture-" + secrets.token_hex(8)
        self.backend_url = backend_url
        # The model the policy model names in every forwarded call ("": the agent's), for a real backend_url.
        self.backend_model = backend_model
        self.use_fork_server = fork_server
        self.backend: ServerProcess | None = None
        self.gym: dict[str, ServerProcess] = {}
        self.fork_server: ForkServer | None = None
        self.capture_dir = self.state_dir / "capture"
        self.checkpoint_root = self.state_dir / "checkpoints"
        # Every fsync of the store, so a power cut can be applied to the checkpoints (`lose_unsynced`).
        self.durability_journal = self.state_dir / "durability.jsonl"
        # Each Gym server process's spans and metrics (`fakes.gym.control.telemetry`); None records none.
        self.telemetry_dir: Path | None = self.state_dir / "telemetry" if telemetry else None
        self._ports: dict[str, int] = {}
        self._http: httpx.Client | None = None

    # -- processes -------------------------------------------------------------------------------------------

    def start_backend(self) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "fakes.backend", "--port", str(port), "--exit-with-stdin"]
        self._stop_at_exit()
        if self.use_fork_server and self.fork_server is None:
            # Its seconds of warm-up overlap the backend's start.
            self.fork_server = ForkServer.launch(self.log_path("forkserver"), self._server_env())
        self.backend = spawn("backend", argv, dict(os.environ), self.log_path("backend"), url, None, stdin_pipe=True)
        try:
            wait_healthy([self.backend], "/v1/models", http=self.http)
        except BaseException:
            self._stop_backend()
            raise
        self.backend_url = url
        return url

    def _server_env(self) -> dict[str, str]:
        """The environment every Gym server (and the fork server they come from) starts with."""
        return clock.preloaded_env(os.environ, monotonic=self.time_jumps)

    def configs(self) -> dict[str, ServerConfig]:
        """Each Gym server's configuration; ports are chosen once and kept across restarts."""
        roles = TOPOLOGIES[self.topology]
        for name in roles:
            if name not in self._ports:  # not setdefault: its argument, a fresh port, would be handed out every time
                self._ports[name] = free_port()
        urls = {name: f"http://127.0.0.1:{port}" for name, port in self._ports.items()}
        capture = {
            "token_capture": self.token_capture,
            "generation_cuts": self.generation_cuts,
            "capture_token": self.capture_token if self.token_capture else "",
        }
        return {
            name: ServerConfig(
                name=name,
                role=role,  # type: ignore[arg-type]
                port=self._ports[name],
                token=self.token,
                backend_url=self.backend_url or "",
                peers={peer: urls[peer] for peer in peer_names(roles, name)},
                capture_dir=str(self.capture_dir),
                faults=self.faults,
                verify_mode=self.verify_mode,
                lease_grace_s=self.lease_grace_s,
                verify_judge=self.topology == "slow" and role == "resources",
                resources_mode=resources_mode(self.topology, name),
                resources_server=RESOURCES_SERVER_OF.get(name, "resources"),
                durability_journal=str(self.durability_journal),
                telemetry_dir=str(self.telemetry_dir or ""),
                **(capture if role == "policy_model" else {}),
                backend_model=self.backend_model if role == "policy_model" else "",
                workers=self.workers_of(role),
            )
            for name, role in roles.items()
        }

    def start_gym(self) -> None:
        """Start every Gym server in parallel and wait until all are healthy; on any failure none is left."""
        if self.backend_url is None:
            raise RuntimeError("start the backend (or pass backend_url) before the Gym servers")
        if self.gym:
            raise RuntimeError(f"the Gym servers {sorted(self.gym)} are running: call crash_gym() first")
        self.capture_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        self._stop_at_exit()
        configs = self.configs()
        try:
            serving = self._fork_gym(configs) if self.use_fork_server else self._spawn_gym(configs)
            unheard = [server for name, server in self.gym.items() if name not in serving]
            wait_healthy(unheard, "/health", http=self.http)
        except BaseException:
            with contextlib.suppress(Exception):
                self.crash_gym()
            raise
        if self.use_fork_server:
            self._prebuild(configs)

    def start_afresh(self, faults: Sequence[str] = ()) -> None:
        """Start the Gym servers as a new stack of this deployment would, with `faults` planted, on the running
        backend and fork server: every Gym server killed, the backend reset (no calls, no hold or gate, the default
        script), the checkpoint root, capture directory and durability journal emptied. What one stack serves many
        tests with: a start skips the seconds of a backend and a fork server warming up."""
        if self.backend is None or self.backend_url is None:
            raise RuntimeError("start the backend before starting afresh")
        self.plant_faults(faults)  # first: an unknown fault leaves the running servers alone
        self.crash_gym()
        response = self.http.post(f"{self.backend_url}/_ctl/reset")
        response.raise_for_status()
        self.clear_capture()
        shutil.rmtree(self.checkpoint_root, ignore_errors=True)
        self.durability_journal.unlink(missing_ok=True)
        self.clear_telemetry()
        self.start_gym()

    def redeploy(
        self,
        topology: str,
        *,
        verify_mode: str = "wait",
        token_capture: bool = False,
        generation_cuts: bool = False,
        policy_workers: int = 1,
        server_workers: int = 1,
    ) -> None:
        """The Gym servers started next make up this deployment (the running ones, if any, keep theirs): what lets
        one backend and fork server serve deployment after deployment (`start_afresh` then starts them). Every
        value is checked first, so a bad one is a ValueError that changes nothing."""
        if topology not in TOPOLOGIES:
            raise ValueError(f"'topology' must be one of {sorted(TOPOLOGIES)} (got {topology!r})")
        if verify_mode not in VERIFY_MODES:
            raise ValueError(f"'verify_mode' must be one of {list(VERIFY_MODES)} (got {verify_mode!r})")
        check_capture(token_capture, generation_cuts)
        workers = policy_workers_count(policy_workers)
        participant_workers = server_workers_count(server_workers)
        self.topology = topology
        self.verify_mode = verify_mode
        self.token_capture = token_capture
        self.generation_cuts = generation_cuts
        self.policy_workers = workers
        self.server_workers = participant_workers

    def workers_of_server(self, name: str) -> int:
        """How many workers Gym server `name` of this topology runs."""
        return self.workers_of(TOPOLOGIES[self.topology][name])

    def workers_of(self, role: str) -> int:
        """How many workers a server of `role` runs."""
        if role == "policy_model":
            return self.policy_workers
        return self.server_workers if role in PARTICIPANT_WORKER_ROLES else 1

    def plant_faults(self, faults: Sequence[str]) -> None:
        """The Gym servers started next run with `faults` planted (the running ones keep theirs); an unknown fault
        is a ValueError that lists the known ones, and changes nothing."""
        self.faults = validate_faults(faults)

    def _prebuild(self, configs: Mapping[str, ServerConfig]) -> None:
        """Have the fork server fork the next restart's standby servers now, while these servers do their work."""
        assert self.fork_server is not None
        requests = [SpawnRequest(name, config.to_json(), self.log_path(name)) for name, config in configs.items()]
        try:
            self.fork_server.prebuild(requests)
        except ForkServerError as error:
            # Only a speed-up: the next start notices a dead fork server and reports it with its log.
            log.warning("the fork server did not take the prebuild request: %s", error)

    def _spawn_gym(self, configs: Mapping[str, ServerConfig]) -> frozenset[str]:
        """Cold-start each server; none serves yet (the caller health-checks them all)."""
        for name, config in configs.items():
            env = {**self._server_env(), CONFIG_ENV: config.to_json()}
            argv = [sys.executable, "-m", "fakes.gym.serve"]
            kind = KIND_OF_ROLE.get(config.role)
            self.gym[name] = spawn(name, argv, env, self.log_path(name), config.url, kind)
        return frozenset()

    def _fork_gym(self, configs: Mapping[str, ServerConfig]) -> frozenset[str]:
        """Start each server from the fork server; returns the names already serving (promoted standbys said so,
        so they need no health check)."""
        fork_server = self._running_fork_server()
        requests = []
        for name, config in configs.items():
            log_start(self.log_path(name), name)
            requests.append(SpawnRequest(name, config.to_json(), self.log_path(name)))
        try:
            started = fork_server.start(requests)
        except ForkServerError as error:
            raise StackStartError(f"{error}; log {fork_server.log_path}:\n{log_tail(fork_server.log_path)}") from error
        for name, config in configs.items():
            self.gym[name] = ServerProcess(
                name=name,
                url=config.url,
                kind=KIND_OF_ROLE.get(config.role),
                pid=started.pids[name],
                log_path=self.log_path(name),
                exit_status_of=fork_server.exit_status,
            )
        return started.serving

    def _running_fork_server(self) -> ForkServer:
        """The warmed-up fork server, started on first use and again if it died."""
        if self.fork_server is not None and not self.fork_server.alive():
            log.warning("the fork server (pid %d) died; starting a new one", self.fork_server.pid)
            self._stop_fork_server()
        if self.fork_server is None:
            self.fork_server = ForkServer.launch(self.log_path("forkserver"), self._server_env())
        try:
            self.fork_server.wait_ready(START_TIMEOUT_S)
        except ForkServerError as error:
            log_path = self.fork_server.log_path
            self.fork_server = None  # wait_ready stopped it
            raise StackStartError(f"{error}; log {log_path}:\n{log_tail(log_path)}") from error
        return self.fork_server

    def restart_server(self, name: str) -> None:
        """SIGKILL one Gym server's process group and start it again alone, on the same port; the others run on."""
        if name not in self.gym:
            raise RuntimeError(f"no running Gym server {name!r}; running: {sorted(self.gym)}")
        kill_gym([self.gym.pop(name)])
        configs = {name: self.configs()[name]}
        try:
            serving = self._fork_gym(configs) if self.use_fork_server else self._spawn_gym(configs)
            if name not in serving:
                wait_healthy([self.gym[name]], "/health", http=self.http)
        except BaseException:
            with contextlib.suppress(Exception):
                self.crash_gym()
            raise
        if self.use_fork_server:
            self._prebuild(self.configs())

    def pause_server(self, name: str) -> None:
        """SIGSTOP one Gym server's process group (a GC pause, a frozen VM) and wait until every process of it is
        stopped; it keeps its sockets, so connections queue in the kernel until `continue_server`."""
        self._signal_group(name, signal.SIGSTOP, all_stopped, "stopped")

    def continue_server(self, name: str) -> None:
        """SIGCONT a paused server's process group and wait until none of its processes is stopped."""
        self._signal_group(name, signal.SIGCONT, none_stopped, "running again")

    def _signal_group(self, name: str, sig: int, landed: Any, what: str) -> None:
        if name not in self.gym:
            raise RuntimeError(f"no running Gym server {name!r}; running: {sorted(self.gym)}")
        pgid = self.gym[name].pgid
        kill(pgid, sig)
        if not poll_until(lambda: landed(pgid), SIGNAL_LANDS_TIMEOUT_S):
            raise RuntimeError(f"{name}'s processes are not {what} after {sig!r}: {members(pgid)}")

    def crash_gym(self) -> None:
        """SIGKILL every Gym process group and wait until each is gone; the backend, fork server and dirs survive."""
        servers = list(self.gym.values())
        self.gym = {}
        kill_gym(servers)

    def clear_capture(self) -> None:
        """Empty the capture directory between test examples; only while no Gym server runs (none writes to it)."""
        if self.gym:
            raise RuntimeError(f"the Gym servers {sorted(self.gym)} are running: call crash_gym() first")
        shutil.rmtree(self.capture_dir, ignore_errors=True)
        self.capture_dir.mkdir(parents=True)

    def clear_telemetry(self) -> None:
        """Remove every telemetry file (a new example, or a new stack's start); only while no Gym server runs, since
        a running one keeps appending to the file it opened."""
        if self.gym:
            raise RuntimeError(f"the Gym servers {sorted(self.gym)} are running: call crash_gym() first")
        if self.telemetry_dir is not None:
            shutil.rmtree(self.telemetry_dir, ignore_errors=True)

    def lose_unsynced(self) -> list[str]:
        """A power cut after `crash_gym`: the checkpoints keep only what the store made durable; returns what
        changed."""
        if self.gym:
            raise RuntimeError(f"the Gym servers {sorted(self.gym)} are running: call crash_gym() first")
        return lose_unsynced(self.durability_journal)

    def stop(self) -> None:
        """Stop everything this stack started (idempotent); every step runs, then the first error is raised."""
        errors: list[Exception] = []
        for step in (self.crash_gym, self._stop_fork_server, self._stop_backend, self._close_http):
            try:
                step()
            except Exception as error:
                log.warning("stopping the stack in %s: %s", self.state_dir, error)
                errors.append(error)
        atexit.unregister(self.stop)
        if errors:
            raise errors[0]

    def reap_exited(self) -> None:
        """Collect every exited child of this process (cold-started servers, the backend, the fork server)."""
        children = [self.backend, *self.gym.values()]
        for server in children:
            if server is not None and server.process is not None:
                server.process.poll()
        if self.fork_server is not None:
            self.fork_server.alive()

    def _stop_fork_server(self) -> None:
        fork_server, self.fork_server = self.fork_server, None
        if fork_server is not None:
            fork_server.stop(STOP_TIMEOUT_S)

    def _stop_backend(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            kill_groups([backend], signal.SIGTERM)
            if backend.process is not None and backend.process.stdin is not None:
                backend.process.stdin.close()

    def _close_http(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            http.close()

    def _stop_at_exit(self) -> None:
        # Registered again on every start: stop() unregisters it (registering twice would stop twice).
        atexit.unregister(self.stop)
        atexit.register(self.stop)

    # -- views --------------------------------------------------------------------------------------------------

    @property
    def http(self) -> httpx.Client:
        """The stack's health-check client, built once."""
        if self._http is None:
            self._http = health_client()
        return self._http

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def describe(self) -> dict[str, Any]:
        backend = None
        if self.backend_url is not None:
            backend = {"url": self.backend_url, "pgid": self.backend.pgid if self.backend else None}
        return {
            "topology": self.topology,
            "token": self.token,
            "backend": backend,
            "backend_model": self.backend_model,
            "servers": {name: server.describe() for name, server in self.gym.items()},
            "capture_dir": str(self.capture_dir),
            "checkpoint_root": str(self.checkpoint_root),
            "faults": list(self.faults),
            "verify_mode": self.verify_mode,
            "lease_grace_s": self.lease_grace_s,
            "token_capture": self.token_capture,
            "generation_cuts": self.generation_cuts,
            "capture_token": self.capture_token,
            "policy_workers": self.policy_workers,
            "server_workers": self.server_workers,
            "time_jumps": self.time_jumps,
        }

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        try:
            self.stop()
        except Exception:
            if exc is None:
                raise
            # Never let a teardown error hide the exception that ended the block.
            log.exception("stopping the stack after %r", exc)
