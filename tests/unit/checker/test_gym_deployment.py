"""The real-Gym adapter without a Gym: its pre-flight against tiny HTTP servers started here (and ports nothing
listens on), its settings, and the no-harm rule: a process group the checker did not start is never signalled,
also when its own start failed."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest

from ckpt_model.deployments import preflight
from ckpt_model.deployments.gym import GymCommandError, GymDeployment, system_label
from ckpt_model.deployments.preflight import PreflightError
from ckpt_model.deployments.process_groups import ProcessInfo, descends_from, own_groups, process_table
from ckpt_model.protocol.http import new_http_client
from fakes.processes.ports import free_port

TOKEN = "preflight-token"
STATUS = preflight.STATUS_ROUTE


@attrs.define
class Fake:
    """What one tiny server answers: a participant of `kind` (None: no checkpoint routes), a head server listing
    `config`, or a backend (`backend`)."""

    kind: str | None = None
    token: str = TOKEN
    phase: str = "idle"
    counts: dict[str, int] = attrs.field(factory=dict)
    fenced: bool = False  # it resumed c1 already
    config: dict[str, Any] | None = None
    backend: bool = False
    url: str = ""

    def answer(self, method: str, path: str, headers: Any) -> tuple[int, Any]:
        if self.config is not None and path == preflight.HEAD_ROUTE:
            return 200, json.dumps(self.config)
        if self.backend and path == preflight.BACKEND_ROUTE:
            return 200, []
        if self.kind is None or not path.startswith(preflight.STATUS_ROUTE.rsplit("/", 1)[0]):
            return 404, {"detail": "Not Found"}
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"error": {"code": "unauthorized", "detail": "bad bearer"}}
        if method == "GET" and path == STATUS:
            report = {"ready": True, "blockers": [], "blocker_count": 0, "counts": self.counts, "restarts": []}
            return 200, {"kind": self.kind, "instance": self.kind, "phase": self.phase, "checkpoint_id": None,
                         "lease_expires_at": None, "retired_rollouts": 0, "report": report}  # fmt: skip
        code = "stale_checkpoint" if self.fenced else "deadline_exceeded"
        return 409, {"error": {"code": code, "detail": "refused"}}


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start a tiny server for a `Fake`, on a free loopback port; all stop at the end of the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(fake: Fake) -> Fake:
        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, body = fake.answer(method, self.path, self.headers)
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def log_message(self, *_args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        fake.url = f"http://127.0.0.1:{server.server_address[1]}"
        return fake

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (below the ephemeral range, so no outgoing connection takes it)."""
    return free_port()


@pytest.fixture
def http() -> Iterator[Any]:
    client = new_http_client(5.0)
    yield client
    client.close()


def native(serve: Any, **overrides: Any) -> dict[str, Fake]:
    kinds = {"environment": "environment", "agent": "agent", "resources": "resources", "policy_model": "model"}
    return {name: serve(Fake(kind=kind, **overrides.get(name, {}))) for name, kind in kinds.items()}


def head_for(serve: Any, fakes: dict[str, Fake]) -> Fake:
    kinds = {"environment": "environment_servers", "agent": "responses_api_agents", "model": "responses_api_models"}
    config = {}
    for name, fake in fakes.items():
        port = int(fake.url.rsplit(":", 1)[1])
        server_type = kinds.get(fake.kind or "", "resources_servers")
        config[name] = {server_type: {"impl": {"host": "127.0.0.1", "port": port}}}
    return serve(Fake(config=config))


# --- the pre-flight ----------------------------------------------------------------------------------------


def test_a_whole_deployment_passes_through_its_head_server(serve: Any, http: Any) -> None:
    fakes = native(serve)
    head = head_for(serve, fakes)
    backend = serve(Fake(backend=True))

    found = preflight.check(http, token=TOKEN, topology="native", head_url=head.url, backend_url=backend.url)

    assert found.kinds == {"agent": "agent", "environment": "environment", "policy_model": "model",
                           "resources": "resources"}  # fmt: skip
    assert found.urls["environment"] == fakes["environment"].url


def test_a_head_server_nothing_listens_on_fails_at_once_naming_its_url(
    http: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request and no retry (counted, not timed: at load 9-15 a wall-clock bound is a lottery)."""
    asked: list[str] = []
    get = http.get

    def counted_get(url: str, **kwargs: Any) -> Any:
        asked.append(url)
        return get(url, **kwargs)

    monkeypatch.setattr(http, "get", counted_get)
    url = f"http://127.0.0.1:{closed_port()}"

    with pytest.raises(PreflightError) as raised:
        preflight.check(http, token=TOKEN, topology="native", head_url=url)

    assert asked == [f"{url}{preflight.HEAD_ROUTE}"]
    message = str(raised.value)
    assert f"{url}{preflight.HEAD_ROUTE}: the head server: connection refused" in message
    assert "\n" not in message  # one paragraph
    assert raised.value.problems[0].transient


def test_every_participant_that_fails_is_named_at_once(serve: Any, http: Any) -> None:
    fakes = native(serve)
    dead = f"http://127.0.0.1:{closed_port()}"
    servers = {name: fake.url for name, fake in fakes.items()} | {"resources": dead}
    fakes["agent"].token = "another"

    with pytest.raises(PreflightError) as raised:
        preflight.check(http, token=TOKEN, topology="native", servers=servers)

    message = str(raised.value)
    assert f"{dead}{STATUS}: connection refused" in message
    assert f"{fakes['agent'].url}{STATUS}: the token is refused (HTTP 401)" in message
    assert not all(problem.transient for problem in raised.value.problems)  # a refused token never mends


def test_a_server_that_never_answers_is_a_timeout(http: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request carries the timeout asked for (read off the call, not timed: at load 9-15 a wall-clock bound
    is a lottery)."""
    timeouts: list[float] = []
    get = http.get

    def timed_get(url: str, **kwargs: Any) -> Any:
        timeouts.append(kwargs["timeout"])
        return get(url, **kwargs)

    monkeypatch.setattr(http, "get", timed_get)
    with socket.socket() as silent:  # listening, never accepting: the connection opens and nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        with pytest.raises(PreflightError) as raised:
            preflight.check(http, token=TOKEN, topology="native", servers={"environment": url}, timeout_s=0.5)

    assert timeouts == [0.5]
    assert f"{url}{STATUS}: no answer within 0.5 s (timeout)" in str(raised.value)


def test_participants_of_kinds_the_topology_lacks_are_refused(serve: Any, http: Any) -> None:
    fakes = native(serve)
    servers = {name: fake.url for name, fake in fakes.items()}

    with pytest.raises(PreflightError) as raised:
        preflight.check(http, token=TOKEN, topology="legacy", servers=servers)

    assert "topology legacy needs 1 model, 1 agent, 1 resources participant(s), and this Gym has 1 environment" in str(
        raised.value
    )


def test_a_server_answering_404_is_named_with_its_url_and_status(serve: Any, http: Any) -> None:
    fakes = native(serve)
    fakes["agent"] = serve(Fake())  # answers 404 to every route: not a Gym server (a wrong port, say)
    servers = {name: fake.url for name, fake in fakes.items()}

    with pytest.raises(PreflightError) as raised:
        preflight.check(http, token=TOKEN, topology="native", servers=servers)

    said = str(raised.value)
    assert "this Gym has 0 agent" in said
    assert f"answered HTTP 404 Not Found, so no checkpoint routes: agent ({fakes['agent'].url}{STATUS})" in said


def test_a_backend_without_the_control_routes_is_named(serve: Any, http: Any) -> None:
    fakes = native(serve)
    not_a_backend = serve(Fake())

    with pytest.raises(PreflightError) as raised:
        preflight.check(
            http,
            token=TOKEN,
            topology="native",
            servers={name: fake.url for name, fake in fakes.items()},
            backend_url=not_a_backend.url,
        )

    assert f"{not_a_backend.url}/_ctl/calls: not a gated backend: its call list answered HTTP 404" in str(raised.value)


def test_the_expected_kinds_follow_the_topologys_traits() -> None:
    assert preflight.expected_kinds("native") == {"environment": 1, "model": 1, "agent": 1, "resources": 1}
    assert preflight.expected_kinds("counter") == {"model": 1, "agent": 1, "resources": 1}
    assert preflight.expected_kinds("mixed") == {"environment": 2, "model": 1, "agent": 1, "resources": 2}


def test_a_gym_at_rest_passes_and_one_that_ran_an_example_does_not(serve: Any, http: Any) -> None:
    fakes = native(serve)
    servers = {name: fake.url for name, fake in fakes.items()}
    found = preflight.participants(http, token=TOKEN, servers=servers)
    preflight.check_at_rest(http, found, TOKEN)

    fakes["agent"].fenced = True
    fakes["environment"].phase = "prepared"
    fakes["resources"].counts = {"sessions": 1, "workers": 2}
    found = preflight.participants(http, token=TOKEN, servers=servers)
    with pytest.raises(PreflightError) as raised:
        preflight.check_at_rest(http, found, TOKEN)

    message = str(raised.value)
    assert "environment is not at rest ({'phase': 'prepared'})" in message
    assert "resources is not at rest ({'counts': {'sessions': 1}})" in message
    assert f"{fakes['agent'].url}{preflight.PREPARE_ROUTE}: it already resumed checkpoint 'c1'" in message
    assert "give 'crash_command' and 'restart_command'" in message


# --- the settings ------------------------------------------------------------------------------------------


def settings(tmp_path: Path, **fields: Any) -> GymDeployment:
    return GymDeployment(token=TOKEN, logs_dir=tmp_path / "logs", **fields)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"head_url": "http://h"}, "needs 'crash_command' and 'restart_command'"),
        ({"head_url": "http://h", "crash_command": ["true"]}, "needs 'crash_command' and 'restart_command'"),
        (
            {"head_url": "http://h", "crashes": False, "crash_command": ["true"]},
            'leave them out with "crashes": false',
        ),
        (
            {"head_url": "http://h", "start_command": ["gym"], "restart_command": ["gym"]},
            "'restart_command' is for attaching to a running Gym",
        ),
        ({"head_url": "http://h", "start_command": ["gym"], "crashes": False}, "'crashes' is for attaching"),
        ({"start_command": ["gym"]}, "'head_url' (the head server) or 'servers'"),
        ({"head_url": "http://h", "start_command": "gym --all"}, "'start_command' must be a non-empty list"),
        ({"head_url": "http://h", "start_command": ["gym"], "topology": "weather"}, "'topology' must be one of"),
    ],
)
def test_settings_that_cannot_work_are_refused_with_what_to_do(
    tmp_path: Path, fields: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        settings(tmp_path, **fields)


def test_a_file_names_its_problems(tmp_path: Path) -> None:
    path = tmp_path / "gym.json"
    path.write_text(json.dumps({"head_url": "http://h", "token": TOKEN, "crashes": False, "speed": 3}))
    with pytest.raises(ValueError, match=r"unknown keys \['speed'\]"):
        GymDeployment.from_file(path)
    path.write_text(json.dumps({"head_url": "http://h", "token": TOKEN}))
    with pytest.raises(ValueError, match="needs 'crash_command' and 'restart_command'"):
        GymDeployment.from_file(path)


def test_the_label_says_where_gym_is_and_how_it_is_driven(tmp_path: Path) -> None:
    attached = settings(tmp_path, head_url="http://head:11000", crashes=False)
    by_command = settings(
        tmp_path, head_url="http://head:11000", crash_command=["c"], restart_command=["r"], backend_url="http://b:1"
    )
    started = settings(tmp_path, servers={"environment": "http://e:1"}, start_command=["gym"])

    assert system_label(None) == "embedded look-alike stack"
    assert system_label(attached) == (
        "real Gym at http://head:11000 (attached; no crashes: one example, on the Gym as it is; no gated backend: "
        "no rollouts run)"
    )
    assert "(attached; crashed by crash_command, brought back by restart_command; gated backend http://b:1)" in (
        system_label(by_command)
    )
    assert system_label(started).startswith("real Gym at environment http://e:1 (started by the checker's")
    assert (attached.examples_max, by_command.examples_max, started.examples_max) == (1, None, None)
    assert (attached.crashes, by_command.crashes, started.crashes) == (False, True, True)


# --- the no-harm rule --------------------------------------------------------------------------------------


def test_only_groups_whose_every_process_descends_from_the_start_command_are_its_own() -> None:
    table = {
        100: ProcessInfo(ppid=1, pgid=100, start_ticks=50),  # the checker's start command
        101: ProcessInfo(ppid=100, pgid=101, start_ticks=60),  # its fork server
        102: ProcessInfo(ppid=101, pgid=102, start_ticks=70),  # a server it forked, in a group of its own
        103: ProcessInfo(ppid=102, pgid=102, start_ticks=71),  # ... and that server's worker
        200: ProcessInfo(ppid=1, pgid=200, start_ticks=10),  # somebody else's server
        300: ProcessInfo(ppid=1, pgid=102, start_ticks=80),  # a stranger that joined group 102? then not ours
        400: ProcessInfo(ppid=100, pgid=400, start_ticks=40),  # started before the start command: a reused pid
    }

    assert descends_from(103, 100, table)
    assert not descends_from(200, 100, table)
    assert own_groups([101, 102, 200, 400, 999, 100], 100, 50, table) == [101]
    del table[300]
    assert own_groups([101, 102, 200, 400, 999, 100], 100, 50, table) == [101, 102]
    assert own_groups([101, 102], 100, None, table) == []  # no /proc: none but the start command's own group


def test_the_process_table_reads_this_process_and_its_parent() -> None:
    table = process_table()
    me = table[os.getpid()]
    assert me.ppid == os.getppid()
    assert me.pgid == os.getpgid(0)
    assert descends_from(os.getpid(), os.getppid(), table)


@pytest.fixture
def somebody_elses() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own that the checker did not start (a server a user started by hand)."""
    process = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield process
    with_cleanup_kill(process)


def with_cleanup_kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


SPAWNS = """
import json, subprocess, sys, time
child = subprocess.Popen(["sleep", "120"], start_new_session=True)
servers = {"ours": {"pgid": child.pid}, "theirs": {"pgid": int(sys.argv[2])}}
open(sys.argv[1], "w").write(json.dumps({"servers": servers}))
if sys.argv[3] == "exit":
    sys.exit(3)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["never_comes_up", "exits"])
def test_a_failed_start_signals_nothing_the_checker_did_not_start(
    tmp_path: Path, somebody_elses: subprocess.Popen[bytes], how: str
) -> None:
    """The description file lists somebody else's process group beside one the start command made; the start
    fails (Gym never answers, or the start command exits), and the deployment closes: somebody else's process
    lives on. The start command's own child goes while the start command still runs (it descends from it); once the
    start command exited its child is an orphan nothing ties to the checker, and it is left alone too."""
    description = tmp_path / "deployment.json"
    url = f"http://127.0.0.1:{closed_port()}"
    gym = settings(
        tmp_path,
        head_url=url,
        start_command=[
            sys.executable,
            "-c",
            SPAWNS,
            str(description),
            str(somebody_elses.pid),
            "exit" if how == "exits" else "run",
        ],
        description_file=description,
        start_timeout_s=3.0,
    )
    started = time.monotonic()
    try:
        with pytest.raises((PreflightError, GymCommandError)) as raised:
            gym.start_backend()
        elapsed_s = time.monotonic() - started
        ours = json.loads(description.read_text())["servers"]["ours"]["pgid"]
        gym.close()

        assert alive(somebody_elses.pid)
        if how == "exits":
            assert isinstance(raised.value, GymCommandError)
            assert "exited with status 3 before Gym came up" in str(raised.value)
            assert alive(ours)  # an orphan: not verifiably the checker's
        else:
            assert isinstance(raised.value, PreflightError)
            assert f"{url}{preflight.HEAD_ROUTE}: the head server: connection refused" in str(raised.value)
            assert "Gym did not come up within 3 s after the start command" in str(raised.value)
            assert elapsed_s >= 3  # it waited the start timeout (no upper bound: slowness is never a verdict)
            deadline = time.monotonic() + 5
            while alive(ours) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not alive(ours)  # the start command's own: signalled
    finally:
        for pgid in [json.loads(description.read_text())["servers"]["ours"]["pgid"]] if description.exists() else []:
            if alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
    assert alive(somebody_elses.pid)


def test_an_attached_gym_is_never_signalled(
    tmp_path: Path, serve: Any, somebody_elses: subprocess.Popen[bytes]
) -> None:
    """Attached without crashes: the pre-flight, an example's start, close: the Gym's processes are untouched (here
    somebody else's process listed in a description file, which attach mode never reads for process groups)."""
    fakes = native(serve)
    description = tmp_path / "deployment.json"
    description.write_text(json.dumps({"servers": {"environment": {"pgid": somebody_elses.pid, "url": "x"}}}))
    gym = settings(
        tmp_path,
        servers={name: fake.url for name, fake in fakes.items()},
        crashes=False,
        description_file=description,
    )

    assert gym.start_backend() is None
    gym.crash_gym()
    assert gym.start_gym()["environment"] == fakes["environment"].url
    gym.close()

    assert alive(somebody_elses.pid)


def test_attached_with_commands_crashes_and_restarts_by_them(tmp_path: Path, serve: Any) -> None:
    fakes = native(serve)
    marks = tmp_path / "marks"
    gym = settings(
        tmp_path,
        servers={name: fake.url for name, fake in fakes.items()},
        crash_command=["sh", "-c", f"echo crash >> {marks}"],
        restart_command=["sh", "-c", f"echo restart >> {marks}"],
    )
    gym.start_backend()
    gym.crash_gym()
    gym.start_gym()
    gym.close()

    assert marks.read_text().split() == ["crash", "restart"]


def test_a_command_that_fails_is_a_harness_error_with_its_log(tmp_path: Path, serve: Any) -> None:
    fakes = native(serve)
    gym = settings(
        tmp_path,
        servers={name: fake.url for name, fake in fakes.items()},
        crash_command=["sh", "-c", "echo no permission to kill; exit 4"],
        restart_command=["true"],
        command_timeout_s=5.0,
    )
    gym.start_backend()
    with pytest.raises(GymCommandError, match=r"exited with status 4; last lines of .*\nno permission to kill"):
        gym.crash_gym()
    gym.close()
