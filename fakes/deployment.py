"""The look-alike stack behind the checker's deployment seam (`ckpt_model.deployments.seam.Deployment`).

The checker never imports `fakes`: it finds this module through the entry point `ckpt_model.systems` named
`embedded` (declared in pyproject.toml), so a misreading of the protocol cannot hide on both sides at once and
the same checker drives a real Gym through another implementation of the seam. Failures to start are raised as
`RuntimeError` with the server's name and log, as the seam asks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from fakes import clock
from fakes.collection.config import COLLECTION_FAULTS, CollectionFault
from fakes.faults import CATALOGUE, Fault
from fakes.gym.config import DEFAULT_LEASE_GRACE_S
from fakes.gym.protocol.wire import PLACEMENT_ROUTE, WORKERS_ROUTE, bearer
from fakes.processes.process_groups import poll_until
from fakes.processes.server_processes import StackStartError, health_client
from fakes.stack.cli import main as launch
from fakes.stack.launcher import Stack
from fakes.stack.topologies import TOPOLOGIES

FAILPOINT_TIMEOUT_S = 10.0
POLICY_MODEL = "policy_model"


class EmbeddedDeployment:
    """One topology of the look-alike stack: the backend once, the Gym servers fresh on every start."""

    def __init__(
        self,
        topology: str,
        *,
        faults: tuple[str, ...] = (),
        verify_mode: str = "wait",
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        root: Path | None = None,
        token_capture: bool = False,
        generation_cuts: bool = False,
        policy_workers: int = 1,
        server_workers: int = 1,
        time_jumps: bool = False,
        model_url: str | None = None,
        model_name: str = "",
    ) -> None:
        """`model_url`: an OpenAI-compatible server (a real model) the policy model forwards to, serving
        `model_name`, in place of the fake backend; then no backend starts and nothing is gated."""
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix=f"ckpt-model-{topology}-")) if root is None else Path(root)
        try:
            self.stack = Stack(
                topology,
                self.root / "stack",
                faults=faults,
                verify_mode=verify_mode,
                lease_grace_s=lease_grace_s,
                token_capture=token_capture,
                generation_cuts=generation_cuts,
                policy_workers=policy_workers,
                server_workers=server_workers,
                time_jumps=time_jumps,
                backend_url=model_url,
                backend_model=model_name,
            )
        except BaseException:
            self._remove_root()
            raise
        self.model_url = model_url
        self.topology = topology
        self.verify_mode = verify_mode
        self.lease_grace_s = self.stack.lease_grace_s
        self.token_capture = token_capture
        self.generation_cuts = generation_cuts
        # uvicorn workers of the policy model server behind its one port (`fakes.gym.workers.coordinator_process`).
        self.policy_workers = self.stack.policy_workers
        # ... and of each environment, agent and resources server (`fakes.gym.servers.participant_workers`).
        self.server_workers = self.stack.server_workers
        # The placement of episodes on those workers (`place_calls`), set again on every fresh server.
        self._placement: dict[str, int] = {}
        # One client for the look-alike's own `/_ctl` routes, polled while a crash point is awaited: a client per
        # call built a TLS context each time (a tenth of the checker's CPU). Built on first use (most deployments
        # never call them). One call at a time: httpcore's pool can hand a connection it is closing to another
        # thread (encode/httpcore#1110).
        self._routes: httpx.Client | None = None
        self._routes_lock = threading.Lock()

    def plant_faults(self, faults: Sequence[str]) -> None:
        """The Gym servers started next run with `faults` planted (`ckpt_model.deployments.lifecycle.PlantsFaults`)."""
        self.stack.plant_faults(faults)

    @property
    def faults(self) -> tuple[str, ...]:
        """The faults the next Gym servers start with: the stack's, which every start reads."""
        return self.stack.faults

    @property
    def token(self) -> str:
        return self.stack.token

    @property
    def capture_token(self) -> str:
        """The bearer of the policy model's ledger control routes (token capture only)."""
        return self.stack.capture_token

    @property
    def logs_dir(self) -> Path:
        return self.root / "stack" / "logs"

    def start_backend(self) -> str | None:
        """Start the inference backend and token store (once); returns its base URL. With a real model
        (`model_url`) there is none to start and no gate: None."""
        if self.model_url is not None:
            return None
        try:
            return self.stack.start_backend()
        except StackStartError as error:
            raise RuntimeError(f"the backend did not start: {error}") from error

    def start_gym(self) -> dict[str, str]:
        """Start fresh Gym servers; returns every server's base URL by name."""
        try:
            self.stack.start_gym()
        except StackStartError as error:
            raise RuntimeError(str(error)) from error
        self._send_placement()
        return {name: server.url for name, server in self.stack.gym.items()}

    def crash_gym(self) -> None:
        """SIGKILL every Gym process group; the backend and the directories survive."""
        self.stack.crash_gym()

    def clear_capture(self) -> None:
        """Empty the capture directory (its ledgers) between examples, while no Gym server runs."""
        self.stack.clear_capture()

    @property
    def telemetry_dir(self) -> Path | None:
        """Where every Gym server process writes its spans and metrics (docs/protocol.md), or None."""
        return self.stack.telemetry_dir

    def clear_telemetry(self) -> None:
        """Remove the telemetry files of the Gym servers that ran, between examples, while none runs."""
        self.stack.clear_telemetry()

    def lose_unsynced(self) -> None:
        """After `crash_gym`, a power cut: the checkpoints keep only what was fsynced
        (`fakes.gym.faults.power_cuts`)."""
        self.stack.lose_unsynced()

    def restart_server(self, name: str) -> dict[str, str]:
        """SIGKILL one Gym server's process group and start it again alone; returns every server's base URL."""
        try:
            self.stack.restart_server(name)
        except StackStartError as error:
            raise RuntimeError(str(error)) from error
        if name == POLICY_MODEL:
            self._send_placement()
        return {server_name: server.url for server_name, server in self.stack.gym.items()}

    def pause_server(self, name: str) -> None:
        """SIGSTOP one Gym server's process group; it answers nothing until `continue_server`."""
        self.stack.pause_server(name)

    def continue_server(self, name: str) -> None:
        """SIGCONT a paused server's process group."""
        self.stack.continue_server(name)

    def lose_reply(self, name: str, operation: str) -> None:
        """Cut off the reply to one server's next call of `operation` after it ran (`fakes.gym.faults.lost_replies`)."""
        self._look_alike_route(name, "/_ctl/lost-replies", post=True, body={"operation": operation})

    def lost_replies(self, name: str) -> int:
        """How many replies the server has cut off."""
        return int(self._look_alike_route(name, "/_ctl/lost-replies")["lost"])

    def fail_hook(self, name: str, hook: str) -> None:
        """Make one server's next call of its `hook` (close, export, install) fail (`fakes.gym.faults.hooks`)."""
        self._look_alike_route(name, "/_ctl/hooks", post=True, body={"hook": hook})

    def failed_hooks(self, name: str) -> int:
        """How many hooks of the server have failed."""
        return int(self._look_alike_route(name, "/_ctl/hooks")["failed"])

    @property
    def skews_clocks(self) -> bool:
        """Whether one server's wall clock can be moved alone (`fakes.clock`): Debian's `faketime` is installed, and
        the monotonic clocks do not follow the offsets (no `time_jumps`). The checker then also owns the time of
        every server: it moves their wall clocks together where it would wait for a deadline or a lease (each offset
        the time passed plus the server's skew, `ckpt_model.deployments.clocks.Clocks.jump_to`)."""
        return clock.library() is not None and not self.stack.time_jumps

    @property
    def jumps_clocks(self) -> bool:
        """Whether time can pass for a server, its wall and monotonic clocks at once (`time_jumps`, with
        libfaketime)."""
        return clock.library() is not None and self.stack.time_jumps

    def jump_clock(self, name: str, offset_s: float) -> float:
        """Move both clocks of one server to `offset_s` seconds ahead of the true time (never back: time has
        passed); returns the wall time the server's clock reads right after."""
        return self._set_clock(name, offset_s)

    def _set_clock(self, name: str, offset_s: float) -> float:
        """Set one server's libfaketime offset (`POST /_ctl/clock`): what it moves, the wall clock alone or the
        monotonic clock too, the stack decided at start (`time_jumps`). The time the server's clock reads after."""
        return float(self._look_alike_route(name, "/_ctl/clock", post=True, body={"offset_s": offset_s})["time"])

    def skew_clock(self, name: str, offset_s: float) -> float:
        """Move one server's wall clock `offset_s` seconds from the true time (0 puts it back); returns the time
        the server's clock reads right after."""
        return self._set_clock(name, offset_s)

    def place_calls(self, placement: Mapping[str, int]) -> None:
        """From now on every request of capture key K is served by worker `placement[K]` (an index, modulo the
        server's workers) of every multi-worker server, whichever worker accepts its connection: the policy
        model's generation calls (`fakes.gym.workers.placement`), the other servers' episode and session requests
        (`fakes.gym.workers.session_routing`); kept, and set again on a fresh server."""
        self._placement = dict(placement)
        self._send_placement()

    def _send_placement(self) -> None:
        if not self._placement:
            return
        for name, server in self.stack.gym.items():
            workers = self.stack.workers_of_server(name)
            if workers == 1:
                continue
            placement = {key: index % workers for key, index in self._placement.items()}
            response = self.stack.http.post(
                server.url + PLACEMENT_ROUTE,
                json={"placement": placement},
                headers={"Authorization": bearer(self.stack.token)},
            )
            if response.is_error:
                raise RuntimeError(f"{name} refused the placement {placement}: {response.text}")

    def kill_worker(self, name: str, index: int) -> int:
        """SIGKILL worker `index` of server `name` (several workers) alone; its pid. The server goes on with the
        others; what that worker held dies with it (`fakes.gym.workers.session_routing` answers its episodes 410).
        Returns once the server's coordinator no longer counts it."""
        pid = self._live_workers(name).get(index)
        if pid is None:
            raise RuntimeError(f"{name} has no live worker {index} (live: {sorted(self._live_workers(name))})")
        os.kill(pid, signal.SIGKILL)
        if not poll_until(lambda: index not in self._live_workers(name), FAILPOINT_TIMEOUT_S):
            raise RuntimeError(f"{name}'s coordinator still counts worker {index} (pid {pid}) after its SIGKILL")
        return pid

    def _live_workers(self, name: str) -> dict[int, int]:
        """Worker index -> pid of server `name`'s live workers. Each ask on a connection of its own: a kept one may
        be the killed worker's, and reset under the next request."""
        with httpx.Client(trust_env=False, timeout=FAILPOINT_TIMEOUT_S) as client:
            reply = client.get(
                self.stack.gym[name].url + WORKERS_ROUTE, headers={"Authorization": bearer(self.stack.token)}
            )
        reply.raise_for_status()
        return {int(worker["index"]): int(worker["pid"]) for worker in reply.json()["workers"]}

    def arm_failpoint(self, name: str, point: str) -> None:
        """Arm a failpoint in one Gym server (`fakes.gym.faults.failpoints`): its work stops there once it gets
        there."""
        self._look_alike_route(name, f"/_ctl/failpoints/{point}", post=True)

    def failpoint_reached(self, name: str, point: str) -> bool:
        """Whether the server's work has reached the armed failpoint (and stays there until it is killed)."""
        return point in self._look_alike_route(name, "/_ctl/failpoints")["reached"]

    def break_storage(self, name: str, point: str, how: str) -> None:
        """Fail or stall one server's next checkpoint write at `point` (`fakes.gym.faults.storage`)."""
        self._look_alike_route(name, "/_ctl/storage", post=True, body={"point": point, "how": how})

    def storage_state(self, name: str) -> dict[str, Any]:
        """What is armed in one server, where a write stalled, and how many writes run."""
        return self._look_alike_route(name, "/_ctl/storage")

    def release_storage(self, name: str) -> None:
        """Let the server's stalled write go on."""
        self._look_alike_route(name, "/_ctl/storage/release", post=True)

    def _look_alike_route(
        self, name: str, path: str, *, post: bool = False, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """GET (or POST `body` to) one of the look-alike's own `/_ctl` routes of a server, with the control bearer;
        its JSON reply, or the HTTP error raised."""
        url = f"{self.stack.gym[name].url}{path}"
        headers = {"Authorization": bearer(self.stack.token)}
        with self._routes_lock:
            if self._routes is None:
                self._routes = health_client()
            if post:
                response = self._routes.post(url, headers=headers, json=body, timeout=FAILPOINT_TIMEOUT_S)
            else:
                response = self._routes.get(url, headers=headers, timeout=FAILPOINT_TIMEOUT_S)
        response.raise_for_status()
        return dict(response.json())

    def run_url(self) -> str:
        return self.stack.gym["environment"].url + "/run"

    def restart_run_url(self) -> str:
        """`/run` of `restart_environment` (topology `mixed`), whose episodes the restart-only resources server
        makes restarts: a checkpoint never continues them, a crash starts them over."""
        if "restart_environment" not in TOPOLOGIES[self.topology]:
            with_one = sorted(name for name, roles in TOPOLOGIES.items() if "restart_environment" in roles)
            raise ValueError(
                f"topology {self.topology!r} has no restart_environment, so no restart /run; use one of {with_one}"
            )
        return self.stack.gym["restart_environment"].url + "/run"

    def collection_command(self) -> list[str]:
        """The look-alike's rollout collection (`fakes.collection`), run by this interpreter, its spans written
        beside the servers'."""
        telemetry = self.telemetry_dir
        return [sys.executable, "-m", "fakes.collection", *(["--telemetry-dir", str(telemetry)] if telemetry else [])]

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for server in self.stack.gym.values():
            parts.append(f"--- {server.name} ({server.log_path})\n{server.log_tail(lines) or '(empty)'}")
        return "\n".join(parts)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.stop()
        with self._routes_lock:
            routes, self._routes = self._routes, None
        if routes is not None:
            routes.close()
        self._remove_root()

    def _remove_root(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


class EmbeddedSystem:
    """What the entry point hands the checker: the deployment factory and the planted-fault catalogue."""

    name = "embedded"
    catalogue: tuple[Fault, ...] = CATALOGUE
    # The look-alike collector's planted faults (`check --controller collection --faults ...`).
    collection_catalogue: tuple[CollectionFault, ...] = tuple(COLLECTION_FAULTS.values())
    deployment = EmbeddedDeployment
    # `python -m fakes.stack`'s entry: runs a deployment by hand until SIGTERM or Ctrl-C (`ckpt-model stack`).
    launch = staticmethod(launch)


SYSTEM = EmbeddedSystem()
