"""The deployment seam (Jepsen's db and nemesis split) and the harness the state machine drives through it.

Two small protocols say what the checker needs of a system under test:

- `Deployment`: start the backend once (None: there is no gated backend), start fresh Gym servers, crash every
  Gym process group, say where `/run` goes, show log tails, close. Failures to start are `OSError` or
  `RuntimeError` naming the server. Optionally `restart_server(name)`: crash one server alone and start it again
  (returns every server's URL, like `start_gym`); without it the machine never crashes one participant alone.
- `Gate`: the backend's control routes (Gym's fake backend, reference section 11): the call list, release chosen
  calls, reset, gate every call, pin the policy's script. `BackendGate` speaks them over HTTP.

`src/` imports nothing from `fakes/`. The look-alike stack is found through the entry point group
`ckpt_model.systems` (name `embedded`), which hands over a deployment factory and its planted-fault catalogue;
`ckpt_model.gym_deployment` is a second implementation that drives a real Gym from its head server.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import httpx

from ckpt_model.coordination import ControlClient, new_http_client
from ckpt_model.errors import ServerStartError
from ckpt_model.tasks import WEATHER_SCRIPT

log = logging.getLogger(__name__)

# The participants' lease grace: short, so the machine can let a lease lapse in well under a second (its rule
# `quiet_controller`); every other control call sets a deadline far enough ahead that no lease lapses by itself.
LEASE_GRACE_S = 0.25
SYSTEMS_GROUP = "ckpt_model.systems"
EMBEDDED = "embedded"


class Deployment(Protocol):
    """A deployment of Gym participants the checker can start, crash and read."""

    topology: str
    verify_mode: str
    faults: tuple[str, ...]
    lease_grace_s: float

    @property
    def token(self) -> str: ...

    @property
    def logs_dir(self) -> Path: ...

    def start_backend(self) -> str | None: ...

    def start_gym(self) -> dict[str, str]: ...

    def crash_gym(self) -> None: ...

    def run_url(self) -> str: ...

    def log_tails(self, lines: int = 15) -> str: ...

    def close(self) -> None: ...


class Gate(Protocol):
    """The gated backend: nothing a model call does happens until the checker releases it."""

    def calls(self) -> list[dict[str, Any]]: ...

    def release(self, indices: list[int]) -> Any: ...

    def reset(self) -> None: ...

    def gate(self) -> None: ...

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any: ...


class PlantedFault(Protocol):
    """A catalogued fault of a system under test, as the checker reads it."""

    name: str
    server: str
    caught_by: str
    description: str
    topology: str
    verify_mode: str

    @property
    def shows_as(self) -> tuple[str, ...]: ...


class BackendGate:
    """Gym's fake backend's control routes over HTTP: gate, release chosen calls, call list, reset, script."""

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


def system(name: str = EMBEDDED) -> Any:
    """The system under test registered under `name` in the entry point group `ckpt_model.systems`."""
    found = entry_points(group=SYSTEMS_GROUP, name=name)
    if not found:
        raise LookupError(
            f"no system under test named {name!r} in entry point group {SYSTEMS_GROUP!r}; "
            "install the project (pip install -e .) so that its look-alike stack registers itself"
        )
    return next(iter(found)).load()


def fault_catalogue() -> tuple[PlantedFault, ...]:
    """The embedded stack's planted faults."""
    return tuple(system().catalogue)


def planted(name: str) -> PlantedFault:
    for fault in fault_catalogue():
        if fault.name == name:
            return fault
    raise LookupError(f"unknown fault {name!r}; known faults: {', '.join(f.name for f in fault_catalogue())}")


class Harness:
    """A deployment as scoped resources for the machine: gate and client built once, Gym fresh per example.

    Every example gets fresh Gym processes, a reset and gated backend, the pinned script and an empty checkpoint
    directory under the harness's own root (the controller's directory, visible to the servers)."""

    def __init__(self, deployment: Deployment, *, root: Path | None = None) -> None:
        self.deployment = deployment
        self._own_root = root is None
        prefix = f"ckpt-model-checkpoints-{deployment.topology}-"
        self.root = Path(tempfile.mkdtemp(prefix=prefix)) if root is None else Path(root)
        self.http = new_http_client(httpx.Timeout(30.0, read=None))
        # Where a failing run writes its regression file (None: `ckpt_model.regression.directory()`).
        self.regressions_dir: Path | None = None
        self.control: ControlClient | None = None
        self.backend: Gate | None = None
        self.example = 0
        self.checkpoint_dir = self.root / "example-0" / "checkpoints"
        atexit.register(self.close)
        try:
            backend_url = self._started(deployment.start_backend)
        except BaseException:
            self.close()
            raise
        # Without a gated backend no model call can be held, so the machine runs only the rules that need none.
        self.backend = None if backend_url is None else BackendGate(backend_url, self.http)

    @classmethod
    def embedded(
        cls,
        topology: str,
        *,
        faults: tuple[str, ...] = (),
        verify_mode: str = "wait",
        lease_grace_s: float = LEASE_GRACE_S,
    ) -> Harness:
        """A harness over the look-alike stack (the `embedded` system)."""
        deployment = system().deployment(
            topology, faults=tuple(faults), verify_mode=verify_mode, lease_grace_s=lease_grace_s
        )
        try:
            return cls(deployment)
        except BaseException:
            deployment.close()
            raise

    # -- what the machine and reports read -------------------------------------------------------------------

    @property
    def topology(self) -> str:
        return self.deployment.topology

    @property
    def verify_mode(self) -> str:
        return self.deployment.verify_mode

    @property
    def faults(self) -> tuple[str, ...]:
        return tuple(self.deployment.faults)

    @property
    def lease_grace_s(self) -> float:
        return self.deployment.lease_grace_s

    @property
    def run_url(self) -> str:
        return self.deployment.run_url()

    def log_tails(self, lines: int = 15) -> str:
        return self.deployment.log_tails(lines)

    # -- lifecycle --------------------------------------------------------------------------------------------

    def begin_example(self) -> None:
        """Fresh Gym processes, a reset and gated backend with the pinned script, an empty checkpoint directory."""
        self.deployment.crash_gym()
        if self.backend is not None:
            self.backend.reset()
            self.backend.script(WEATHER_SCRIPT)
            self.backend.gate()
        self.example += 1
        shutil.rmtree(self.checkpoint_dir.parent, ignore_errors=True)
        self.checkpoint_dir = self.root / f"example-{self.example}" / "checkpoints"
        self.checkpoint_dir.mkdir(parents=True)
        self.start_gym()

    def start_gym(self) -> None:
        servers = self._started(self.deployment.start_gym)
        if self.control is None:
            self.control = ControlClient(self.deployment.token, http=self.http)
        self.control.discover_from_servers(servers)

    def crash(self) -> None:
        """SIGKILL every Gym process group, then start fresh processes."""
        self.deployment.crash_gym()
        self.start_gym()

    @property
    def can_restart_one(self) -> bool:
        return callable(getattr(self.deployment, "restart_server", None))

    def restart_server(self, name: str) -> None:
        """SIGKILL one Gym server alone and start it again; the client learns the servers anew."""
        servers = self._started(lambda: self.deployment.restart_server(name))  # type: ignore[attr-defined]
        assert self.control is not None, "start_gym comes first"
        self.control.discover_from_servers(servers)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.deployment.close()
        with contextlib.suppress(Exception):
            self.http.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _started(self, start: Any) -> Any:
        try:
            return start()
        except (OSError, RuntimeError) as error:
            raise ServerStartError(
                name=self.topology, exit_status=None, log_tail=str(error), log_path=str(self.deployment.logs_dir)
            ) from error
