"""The deployment harness: the look-alike stack as scoped resources the state machine drives.

The backend (inference worker and token store) starts once per harness and is reset between examples; the Gym
servers start fresh for every example and on every crash. Every process lives in its own process group and is
killed on close, at interpreter exit, and when a start fails, so no process, port or directory outlives a run.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from ckpt_model.coordination import ControlClient
from ckpt_model.errors import ServerStartError
from ckpt_model.tasks import WEATHER_SCRIPT
from fakes.stack import Stack, StackStartError

log = logging.getLogger(__name__)

# The participants' lease grace: short, so the machine can let a lease lapse in well under a second (its rule
# `quiet_controller`); every other control call sets a deadline far enough ahead that no lease lapses by itself.
LEASE_GRACE_S = 0.25


class BackendControl:
    """The fake backend's control routes: gate, release chosen calls, read the call list, reset."""

    def __init__(self, url: str, http: httpx.Client) -> None:
        self.url = url
        self._http = http

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._http.post(self.url + path, json=body or {})
        response.raise_for_status()
        return response.json()

    def calls(self) -> list[dict[str, Any]]:
        response = self._http.get(self.url + "/_ctl/calls")
        response.raise_for_status()
        return response.json()

    def gate(self) -> None:
        self._post("/_ctl/gate")

    def reset(self) -> None:
        self._post("/_ctl/reset")

    def release(self, indices: list[int]) -> Any:
        return self._post("/_ctl/step", {"indices": indices})

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any:
        """Pin the policy's tool calls, so the checker knows what an uninterrupted episode earns (P3)."""
        return self._post("/_ctl/script", {"tool_calls": [dict(call) for call in tool_calls]})


class Harness:
    """One topology of the look-alike stack, reused across the examples of a test session."""

    def __init__(
        self,
        topology: str,
        *,
        faults: tuple[str, ...] = (),
        verify_mode: str = "wait",
        root: Path | None = None,
        lease_grace_s: float = LEASE_GRACE_S,
    ) -> None:
        self.topology = topology
        self.verify_mode = verify_mode
        self.faults = tuple(faults)
        self.lease_grace_s = lease_grace_s
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix=f"ckpt-model-{topology}-")) if root is None else Path(root)
        self.stack = Stack(
            topology, self.root / "stack", faults=self.faults, verify_mode=verify_mode, lease_grace_s=lease_grace_s
        )
        self.http = httpx.Client(timeout=httpx.Timeout(30.0, read=None), trust_env=False)
        # Where a failing run writes its regression file (None: `ckpt_model.regression.directory()`).
        self.regressions_dir: Path | None = None
        self.control: ControlClient | None = None
        self.backend: BackendControl | None = None
        self.example = 0
        self.checkpoint_dir = self.root / "example-0" / "checkpoints"
        atexit.register(self.close)
        try:
            self.backend = BackendControl(self._start(self.stack.start_backend), self.http)
        except BaseException:
            self.close()
            raise

    # -- lifecycle --------------------------------------------------------------------------------------------

    def begin_example(self) -> None:
        """Fresh Gym processes, a reset and gated backend, and an empty checkpoint directory."""
        assert self.backend is not None
        self.stack.crash_gym()
        self.backend.reset()
        self.backend.script(WEATHER_SCRIPT)
        self.backend.gate()
        self.example += 1
        shutil.rmtree(self.checkpoint_dir.parent, ignore_errors=True)
        self.checkpoint_dir = self.root / f"example-{self.example}" / "checkpoints"
        self.checkpoint_dir.mkdir(parents=True)
        self.start_gym()

    def start_gym(self) -> None:
        self._start(self.stack.start_gym)
        servers = {name: server.url for name, server in self.stack.gym.items()}
        if self.control is None:
            self.control = ControlClient(self.stack.token, http=self.http)
        self.control.discover_from_servers(servers)

    def crash(self) -> None:
        """SIGKILL every Gym process group, then start fresh processes on the same ports."""
        self.stack.crash_gym()
        self.start_gym()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.stop()
        with contextlib.suppress(Exception):
            self.http.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- views --------------------------------------------------------------------------------------------------

    @property
    def run_url(self) -> str:
        return self.stack.gym["environment"].url + "/run"

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for server in self.stack.gym.values():
            parts.append(f"--- {server.name} ({server.log_path})\n{server.log_tail(lines) or '(empty)'}")
        return "\n".join(parts)

    def _start(self, start: Any) -> Any:
        try:
            return start()
        except StackStartError as error:
            raise ServerStartError(
                name=self.topology, exit_status=None, log_tail=str(error), log_path=str(self.root / "stack" / "logs")
            ) from error
