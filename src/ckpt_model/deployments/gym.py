"""A real Gym deployment behind the seam: one the checker starts, or one already running that it attaches to.

Where Gym is: `head_url`, the head server (the checker reads its global config and probes every server's status
route, as Gym's own `coordination.discover` does), or `servers`, each server's URL by name. Then one of two modes:

- Own start (`start_command`): a program that starts every Gym server and keeps running, as `ng_run` does. The
  checker runs it in a session of its own, waits until every participant answers (`start_timeout_s`), and crashes
  Gym by SIGKILL of the process groups it started (below), then stops the start command (SIGTERM, then SIGKILL of
  its group); `crash_command`, if given, runs after the SIGKILLs.
- Attach (no `start_command`): Gym is already running and stays the user's. Either `crash_command` and
  `restart_command` crash it and bring it back (the checker runs them and waits for each to exit; then it waits
  until every participant answers), or `crashes: false`: the checker never crashes Gym, so no rule that crashes is
  drawn, and since nothing can start Gym afresh the run is one example, on a Gym that must be at rest and must never
  have run an example (`preflight.check_at_rest`). The checker signals nothing of an attached Gym.

The no-harm rule: **the checker never signals a process it did not start.** It signals only process groups it
created itself (each command it runs gets a session, and so a process group, of its own) and, in own-start mode, the
groups a description file lists (`description_file`: `servers.<name>.pgid`, as our launcher writes it) whose every
process, read from `/proc` before any signal is sent, descends from the checker's own start command and started
after it (`ckpt_model.deployments.process_groups`). A group of someone else's (a stack started by hand that wrote
the same file, a pgid whose number came round again) fails that test and is left alone; so is everything after a
start that failed (the start command's children are orphans then, and nothing descends from it). A process the
checker started is never reaped before its group has been signalled for the last time, so its pid, and with it the
group's ID, cannot pass to anyone else's process meanwhile. Where there is no `/proc`, only the checker's own groups
are signalled.

Before any example runs, the pre-flight (`ckpt_model.deployments.preflight`) asks every URL in seconds: a URL that does
not answer, a token refused or participants of the wrong kinds end the run with one paragraph naming the URL
(`PreflightError`, a harness error: exit 2). In own-start mode it runs once the start command brought Gym up.

Optionally the gated backend (`backend_url`, Gym's e2e fake backend or ours): without it no model call can be held,
so the machine runs only the rules that need none (`ckpt_model.steps.checkable` says which properties that leaves).
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

from ckpt_model.deployments import preflight
from ckpt_model.deployments.preflight import PREFLIGHT_TIMEOUT_S, PreflightError
from ckpt_model.deployments.process_groups import described_pgids, own_groups, process_table, start_ticks
from ckpt_model.deployments.seam import spec_of
from ckpt_model.errors import HarnessError
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.protocol.http import new_http_client

REAL_GYM_DOC = "docs/real-gym.md"
START_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1
LOG_TAIL_LINES = 15
EMBEDDED_LABEL = "embedded look-alike stack"


class GymCommandError(HarnessError):
    """A command of the deployment's (start, crash, restart) failed: it could not run, exited with an error, or did
    not finish in time. The message names the command, what happened and the tail of its log."""


@attrs.define(kw_only=True)
class GymDeployment:
    """A Gym deployment the checker starts (`start_command`) or attaches to, found through its head server."""

    token: str
    logs_dir: Path
    head_url: str | None = None
    servers: dict[str, str] | None = None
    start_command: Sequence[str] | None = None
    crash_command: Sequence[str] | None = None
    restart_command: Sequence[str] | None = None
    crashes: bool = True
    topology: str = "native"
    verify_mode: str = "wait"
    backend_url: str | None = None
    description_file: Path | None = None
    run_server: str = "environment"
    restart_run_server: str = "restart_environment"
    lease_grace_s: float = 600.0
    faults: tuple[str, ...] = ()
    start_timeout_s: float = START_TIMEOUT_S
    command_timeout_s: float = COMMAND_TIMEOUT_S
    preflight_timeout_s: float = PREFLIGHT_TIMEOUT_S
    _process: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)
    _process_ticks: int | None = attrs.field(default=None, init=False)
    # Own start: Gym was started before the first example (for the pre-flight) and nothing has used it since.
    _fresh: bool = attrs.field(default=False, init=False)
    _servers: dict[str, str] = attrs.field(factory=dict, init=False)
    _http: httpx.Client = attrs.field(factory=lambda: new_http_client(10.0), init=False)

    def __attrs_post_init__(self) -> None:
        problems = self.problems()
        if problems:
            self._http.close()
            raise ValueError("; ".join(problems))

    @classmethod
    def from_file(cls, path: Path) -> GymDeployment:
        """A deployment from its description (JSON): `token`, `head_url` or `servers`, and `start_command` (own
        start), or `crash_command` and `restart_command`, or `"crashes": false` (attach); optionally `backend_url`,
        `description_file`, `topology`, `verify_mode`, `run_server`, `restart_run_server`, `lease_grace_s`,
        `start_timeout_s`, `command_timeout_s`, `logs_dir` (default: beside the file). Every problem is said at
        once (unknown keys named)."""
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a readable deployment description ({error})") from None
        if not isinstance(document, dict):
            raise ValueError(f"{path}: must be a JSON object")
        allowed = {field.name.lstrip("_") for field in attrs.fields(cls) if field.init}
        unknown = sorted(set(document) - allowed)
        missing = sorted({"token"} - set(document))
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
        try:
            return cls(**document)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}: {error}") from None

    # -- what it is -----------------------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        """Gym runs already and stays the user's (no start command)."""
        return self.start_command is None

    @property
    def examples_max(self) -> int | None:
        """At most one example when Gym cannot be started afresh between examples (attached, crashes off)."""
        return 1 if not self.crashes else None

    @property
    def label(self) -> str:
        """What the run checks, for the banner's `system:` line."""
        where = self.head_url or ", ".join(f"{name} {url}" for name, url in sorted((self.servers or {}).items()))
        if not self.attached:
            how = "started by the checker's start command; crashed by SIGKILL of the process groups it started"
        elif self.crashes:
            how = "attached; crashed by crash_command, brought back by restart_command"
        else:
            how = "attached; no crashes: one example, on the Gym as it is"
        gate = f"gated backend {self.backend_url}" if self.backend_url else "no gated backend: no rollouts run"
        return f"real Gym at {where} ({how}; {gate})"

    def problems(self) -> list[str]:
        """What is wrong with these settings, each said once with what to do."""
        found: list[str] = []
        if not self.head_url and not self.servers:
            found.append("'head_url' (the head server) or 'servers' ({name: URL}) must say where Gym is")
        try:  # the spec checks a topology and its verify mode against the topology table
            DeploymentSpec(self.topology, self.verify_mode)
        except ValueError as error:
            found.append(str(error))
        for key in ("start_command", "crash_command", "restart_command"):
            command = getattr(self, key)
            if command is not None and (
                isinstance(command, str) or not command or not all(isinstance(part, str) for part in command)
            ):
                found.append(f"'{key}' must be a non-empty list of strings (program and arguments; got {command!r})")
        if not isinstance(self.crashes, bool):
            found.append(f"'crashes' must be true or false (got {self.crashes!r})")
        found += self._mode_problems()
        return found

    def _mode_problems(self) -> list[str]:
        if not self.attached:
            return [
                f"'{key}' is for attaching to a running Gym; with 'start_command' the checker starts Gym again itself"
                for key, wrong in (("restart_command", self.restart_command is not None), ("crashes", not self.crashes))
                if wrong
            ]
        commands = (self.crash_command is not None, self.restart_command is not None)
        if self.crashes and commands != (True, True):
            return [
                "a Gym the checker attaches to (no 'start_command') needs 'crash_command' and 'restart_command' to be "
                'crashed and brought back, or "crashes": false to be checked without crashes'
            ]
        if not self.crashes and any(commands):
            return ["'crash_command' and 'restart_command' crash Gym: leave them out with \"crashes\": false"]
        return []

    # -- the seam -----------------------------------------------------------------------------------------------

    def start_backend(self) -> str | None:
        """Before any example: the pre-flight. Own start: start Gym now (the first example keeps it); attached:
        every URL answers, and without crashes Gym is at rest. The gated backend is the user's (None: none)."""
        if self.attached:
            found = self._checked()
            if not self.crashes:
                preflight.check_at_rest(self._http, found, self.token, timeout_s=self.preflight_timeout_s)
            self._servers = found.urls
        else:
            self._servers = self._start()
            self._fresh = True
        return self.backend_url

    def start_gym(self) -> dict[str, str]:
        """Gym running afresh: own start, the start command again (unless the Gym the pre-flight started is still
        unused); attached, the restart command, or, without crashes, the Gym as it is, once it is at rest."""
        if self._fresh:
            self._fresh = False
        elif not self.attached:
            self._servers = self._start()
        elif self.crashes:
            self._run("restart_command", self.restart_command, self.start_timeout_s)
            self._servers = self._wait_until_up(None)
        else:
            found = preflight.participants(
                self._http,
                token=self.token,
                head_url=self.head_url,
                servers=self.servers,
                timeout_s=self.preflight_timeout_s,
            )
            preflight.check_at_rest(self._http, found, self.token, timeout_s=self.preflight_timeout_s)
            self._servers = found.urls
        return self._servers_with_relay()

    def crash_gym(self) -> None:
        """Own start: SIGKILL every process group the checker started (the no-harm rule), the crash command if any,
        then stop the start command. Attached: the crash command, or nothing without crashes (the harness asks as
        each example begins)."""
        if self._fresh:
            return  # the Gym the pre-flight started is the first example's
        if not self.attached:
            self._kill_own()
        elif self.crashes:
            self._run("crash_command", self.crash_command, self.command_timeout_s)
        self._servers = {}

    def run_url(self) -> str:
        return self._server_url(self.run_server, "'run_server'") + "/run"

    def restart_run_url(self) -> str:
        """Where restarts go (topology `mixed`)."""
        return (
            self._server_url(
                self.restart_run_server,
                "'restart_run_server' (topology mixed needs the environment bound to a restart_only resources server)",
            )
            + "/run"
        )

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every command's output (the servers' own logs are Gym's)."""
        paths = [self.logs_dir / f"{name}.log" for name in ("gym-start", "crash_command", "restart_command")]
        tails = [f"--- {path}\n" + (_tail(path, lines) or "(empty)") for path in paths if path.exists()]
        return "\n".join(tails) or f"--- no command of the deployment wrote output (in {self.logs_dir})"

    def close(self) -> None:
        """Own start: crash what the checker started and stop the start command. Attached: Gym stays as it is."""
        try:
            if not self.attached:
                self._fresh = False
                self._kill_own()
        finally:
            self._http.close()

    # -- own start ------------------------------------------------------------------------------------------

    def _start(self) -> dict[str, str]:
        """Run the start command in a session of its own, and wait until every participant answers."""
        assert self.start_command is not None
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with (self.logs_dir / "gym-start.log").open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    list(self.start_command), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as error:
                raise GymCommandError(f"start_command {list(self.start_command)} could not run: {error}") from None
        self._process_ticks = start_ticks(self._process.pid)
        return self._wait_until_up(self._process)

    def _kill_own(self) -> None:
        """SIGKILL the described groups that are the checker's own (verified while the start command still runs,
        before any signal), run the crash command, stop the start command."""
        process = self._process
        if process is None:
            return
        listed = described_pgids(self.description_file)
        mine = own_groups(listed, process.pid, self._process_ticks, process_table())
        for pgid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        try:
            if self.crash_command:
                self._run("crash_command", self.crash_command, self.command_timeout_s)
        finally:
            self._stop_start_command()
            self._servers = {}

    def _stop_start_command(self) -> int | None:
        """SIGTERM the start command's group, wait for its leader, SIGKILL whatever of the group is left, and only
        then reap the leader (until then its pid, the group's ID, stays the checker's); its exit status."""
        process, self._process = self._process, None
        if process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        exited_within(process, STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait()

    # -- waiting, commands, servers -------------------------------------------------------------------------

    def _checked(self) -> preflight.Found:
        return preflight.check(
            self._http,
            token=self.token,
            topology=self.topology,
            head_url=self.head_url,
            servers=self.servers,
            backend_url=self.backend_url,
            timeout_s=self.preflight_timeout_s,
        )

    def _wait_until_up(self, process: subprocess.Popen[bytes] | None) -> dict[str, str]:
        """Until the pre-flight passes (a URL that refuses or times out may still be starting; a refused token or
        wrong kinds never mend, so they end the wait at once), within `start_timeout_s`; a start command that
        exits first ends it too."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if process is not None and exited_within(process, 0.0):
                status = self._stop_start_command()  # what is left of its group goes too
                log = self.logs_dir / "gym-start.log"
                raise GymCommandError(
                    f"start_command {list(self.start_command or ())} exited with status {status} before Gym came up; "
                    f"last lines of {log}:\n{_tail(log, LOG_TAIL_LINES) or '(empty)'}"
                )
            try:
                return self._checked().urls
            except PreflightError as error:
                if not all(problem.transient for problem in error.problems) or time.monotonic() >= deadline:
                    raise self._not_up(error) from None
            time.sleep(POLL_S)

    def _not_up(self, error: PreflightError) -> PreflightError:
        if not all(problem.transient for problem in error.problems):
            return error
        started_by = "the start command" if not self.attached else "restart_command"
        log = self.logs_dir / ("gym-start.log" if not self.attached else "restart_command.log")
        return PreflightError(
            error.problems,
            f"Gym did not come up within {self.start_timeout_s:g} s after {started_by} (its log: {log}). "
            + preflight.WHAT_TO_DO,
        )

    def _run(self, key: str, command: Sequence[str] | None, timeout_s: float) -> None:
        """Run one of the deployment's commands in a session of its own and wait for it to exit 0. One that
        outlives `timeout_s` is stopped (SIGKILL of the group the checker created for it) and reported."""
        assert command is not None
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log = self.logs_dir / f"{key}.log"
        with log.open("ab") as output:
            try:
                process = subprocess.Popen(
                    list(command), stdout=output, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as error:
                raise GymCommandError(f"{key} {list(command)} could not run: {error}") from None
        if not exited_within(process, timeout_s):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # not reaped yet: the group is still the one it created
            process.wait()
            raise GymCommandError(
                f"{key} {list(command)} did not finish within {timeout_s:g} s, so the checker stopped it (SIGKILL of "
                f"the process group it started for it); last lines of {log}:\n{_tail(log, LOG_TAIL_LINES) or '(empty)'}"
            )
        status = process.wait()
        if status != 0:
            raise GymCommandError(
                f"{key} {list(command)} exited with status {status}; last lines of {log}:\n"
                f"{_tail(log, LOG_TAIL_LINES) or '(empty)'}"
            )

    def _server_url(self, name: str, what: str) -> str:
        servers = self._servers_with_relay()
        if name not in servers:
            raise HarnessError(f"{what} {name!r} is not a server of this Gym (servers: {sorted(servers)})")
        return servers[name]

    def _servers_with_relay(self) -> dict[str, str]:
        """Participants plus the servers that take no part (a legacy relay, which discovery skips): from `servers`,
        else from the description file."""
        servers = {**(self.servers or {}), **self._servers}
        if self.run_server not in servers and self.description_file is not None:
            try:
                described = json.loads(Path(self.description_file).read_text())["servers"]
                servers.setdefault(self.run_server, described[self.run_server]["url"])
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise HarnessError(
                    f"'run_server' {self.run_server!r} is no participant, and the description file "
                    f"{self.description_file} does not give its URL ({type(error).__name__}: {error})"
                ) from None
        return {name: url.rstrip("/") for name, url in servers.items()}


def described(path: Path) -> tuple[GymDeployment, DeploymentSpec]:
    """The real Gym a description file names, and its spec: what `ckpt-model check --deployment FILE` and the
    pytest plugin's `--ckpt-deployment FILE` check. A bad file is a ValueError that says what is wrong and where the
    format is documented."""
    try:
        gym = GymDeployment.from_file(path)
        return gym, spec_of(gym)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{error} (see {REAL_GYM_DOC})") from None


def system_label(deployment: GymDeployment | None) -> str:
    """The banner's `system:` line: the real Gym and how the checker drives it, or the embedded stack."""
    return EMBEDDED_LABEL if deployment is None else deployment.label


def exited_within(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether the process has exited, waiting up to `timeout_s`, without reaping it (`WNOWAIT`): until the caller
    reaps it, its pid cannot be given to another process."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already (by `wait`)
            return True
        if found is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
