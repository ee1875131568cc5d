"""A real Gym deployment behind the seam: found from its head server, started and crashed by what the user gives.

The checker needs four things of a deployment it did not build (`ckpt_model.deployment.Deployment`):

- how to start Gym: `start_command`, a program that starts every Gym server and keeps running (as `ng_run`
  does); the checker runs it in its own process group, then reads the head server's global config and waits
  until every participant answers its status route;
- how to crash Gym: SIGKILL of the process groups listed in `description_file` (a JSON file with
  `servers.<name>.pgid`, rewritten on every start, as our launcher writes it), and/or `crash_command`; then the
  start command is stopped (SIGTERM, then SIGKILL of its group);
- where `/run` goes: the environment server's `/run` (`run_server`), or a legacy relay; for topology `mixed`,
  restarts go to `restart_run_server` (Gym's e2e: `restart_environment`, bound to a `restart_only` resources server);
- optionally the gated backend (`backend_url`, Gym's e2e fake backend or ours): without it no model call can be
  held, so the machine runs only the rules that need none (see `docs/real-gym.md`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import httpx

from ckpt_model.coordination import ControlClient, new_http_client
from ckpt_model.errors import CoordinationError

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.05


@attrs.define
class GymDeployment:
    """A deployment of Gym that the user starts and crashes, discovered through its head server."""

    head_url: str
    token: str
    start_command: Sequence[str]
    logs_dir: Path
    topology: str = "native"
    verify_mode: str = "wait"
    backend_url: str | None = None
    description_file: Path | None = None
    crash_command: Sequence[str] | None = None
    run_server: str = "environment"
    restart_run_server: str = "restart_environment"
    lease_grace_s: float = 600.0
    faults: tuple[str, ...] = ()
    start_timeout_s: float = START_TIMEOUT_S
    _process: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)
    _servers: dict[str, str] = attrs.field(factory=dict, init=False)
    _http: httpx.Client = attrs.field(factory=lambda: new_http_client(10.0), init=False)

    @classmethod
    def from_file(cls, path: Path) -> GymDeployment:
        """A deployment from its description (JSON): `head_url`, `token`, `start_command` (a list), and optionally
        `backend_url`, `description_file`, `crash_command`, `topology`, `verify_mode`, `run_server`,
        `restart_run_server`, `lease_grace_s`, `logs_dir` (default: beside the file). Unknown keys are an error
        that names them."""
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a readable deployment description ({error})") from None
        if not isinstance(document, dict):
            raise ValueError(f"{path}: must be a JSON object")
        allowed = {field.name.lstrip("_") for field in attrs.fields(cls) if field.init}
        unknown = sorted(set(document) - allowed)
        missing = sorted({"head_url", "token", "start_command"} - set(document))
        if unknown or missing:
            raise ValueError(
                f"{path}: "
                + "; ".join(
                    ([f"unknown keys {unknown} (allowed: {sorted(allowed)})"] if unknown else [])
                    + ([f"missing keys {missing}"] if missing else [])
                )
            )
        document.setdefault("logs_dir", str(Path(path).parent / "gym-logs"))
        for key in ("logs_dir", "description_file"):
            if document.get(key) is not None:
                document[key] = Path(document[key])
        return cls(**document)

    def start_backend(self) -> str | None:
        """The gated backend is the user's (it must outlive every crash); None when there is none."""
        return self.backend_url

    def start_gym(self) -> dict[str, str]:
        """Run the start command and wait until every participant the head server names answers its status."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with (self.logs_dir / "gym-start.log").open("ab") as log:
            self._process = subprocess.Popen(
                list(self.start_command), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.start_timeout_s
        last_error: Exception | None = None
        with ControlClient(self.token, http=self._http, timeout_s=2.0) as client:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise RuntimeError(
                        f"the start command exited with status {self._process.returncode}; "
                        f"see {self.logs_dir / 'gym-start.log'}"
                    )
                try:
                    participants = client.discover_from_head(self.head_url)
                except (CoordinationError, httpx.HTTPError, ValueError) as error:
                    last_error = error
                    time.sleep(POLL_S)
                    continue
                self._servers = {member.name: member.url for member in participants}
                return self._servers_with_relay()
        raise RuntimeError(f"Gym did not come up within {self.start_timeout_s:g} s: {last_error}")

    def crash_gym(self) -> None:
        """SIGKILL every Gym process group (and/or run the crash command), then stop the start command."""
        for pgid in self._pgids():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        if self.crash_command:
            subprocess.run(list(self.crash_command), check=True, timeout=STOP_TIMEOUT_S)
        self._stop_start_command()
        self._servers = {}

    def run_url(self) -> str:
        return self._servers_with_relay()[self.run_server] + "/run"

    def restart_run_url(self) -> str:
        """Where restarts go (topology `mixed`)."""
        servers = self._servers_with_relay()
        if self.restart_run_server not in servers:
            raise ValueError(
                f"'restart_run_server' {self.restart_run_server!r} is not a server of this Gym (servers: "
                f"{sorted(servers)}); topology mixed needs the environment bound to a restart_only resources server"
            )
        return servers[self.restart_run_server] + "/run"

    def log_tails(self, lines: int = 15) -> str:
        path = self.logs_dir / "gym-start.log"
        try:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = []
        return f"--- start command ({path})\n" + ("\n".join(tail) or "(empty)")

    def close(self) -> None:
        self.crash_gym()
        self._http.close()

    def _servers_with_relay(self) -> dict[str, str]:
        """Participants plus the `/run` server (a legacy relay is not a participant, so discovery skips it)."""
        servers = dict(self._servers)
        if self.run_server not in servers and self.description_file is not None:
            described = json.loads(Path(self.description_file).read_text())["servers"]
            servers[self.run_server] = described[self.run_server]["url"]
        return servers

    def _pgids(self) -> list[int]:
        if self.description_file is None:
            return []
        try:
            described = json.loads(Path(self.description_file).read_text())
        except (OSError, ValueError):
            return []
        return [int(server["pgid"]) for server in described.get("servers", {}).values() if "pgid" in server]

    def _stop_start_command(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
                break
            except subprocess.TimeoutExpired:
                continue
