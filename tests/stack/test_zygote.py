"""The fork server behind `Stack`: fresh processes on the same ports, clean crashes, clean stops, clear failures.

The fork server is `fakes.processes.zygote`; `Stack` drives it through `fakes.processes.zygote_client`.

Most tests share one started native stack (a fork server warms up in seconds) and leave its Gym servers running;
the ones about stopping and about the owner dying start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest

from ckpt_model.protocol.client import ControlClient
from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX
from fakes.gym.config import ServerConfig
from fakes.processes.server_processes import StackStartError
from fakes.processes.zygote import EXIT_STATUSES_KEPT_MAX, PREPARED_CONFIGS_KEPT, PREPARED_CONFIGS_MAX, listening_socket
from fakes.stack.launcher import Stack
from tests.stack.conftest import WAIT_TIMEOUT_S, group_gone, process_gone, wait_until

processes = pytest.mark.processes

DEADLINE_S = 20.0


def children_of(pid: int) -> dict[int, str]:
    """{pid: process name} of the live children of `pid`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                name, _, rest = (entry / "stat").read_text().partition(" (")[2].rpartition(")")
                fields = rest.split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found[int(entry.name)] = name
    return found


def servers_of(pid: int) -> list[int]:
    """The fork server's children that serve, standbys (named `gym-standby-...`) left out."""
    return [child for child, name in children_of(pid).items() if not name.startswith("gym-standby")]


def fd_targets(pid: int) -> set[str]:
    targets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.add(os.readlink(fd))
        except FileNotFoundError:
            continue
    return targets


def listening_inodes() -> dict[int, str]:
    """{port: socket inode} of every listening IPv4 TCP socket."""
    inodes = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # TCP_LISTEN
            inodes[int(fields[1].split(":")[1], 16)] = fields[9]
    return inodes


def bearer(stack: Stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.token}"}


# --- the listening socket (no processes) ---------------------------------------------------------------------------


def test_listening_socket__is_tcp_so_asyncio_sets_nodelay() -> None:
    with listening_socket("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1


def test_listening_socket__connections_accepted_by_asyncio_have_tcp_nodelay() -> None:
    """The trap itself: with protocol 0 asyncio leaves Nagle on, and requests after the first stall ~44 ms."""

    async def accepted_nodelay(sock: socket.socket) -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connection, sock=sock)
        async with server:
            _reader, writer = await asyncio.open_connection(*sock.getsockname())
            nodelay = await seen
            writer.close()
            await writer.wait_closed()
        return nodelay

    assert asyncio.run(accepted_nodelay(listening_socket("127.0.0.1", 0))) == 1


REAPER = """
import json, os
from fakes.processes.zygote import EXIT_STATUSES_KEPT_MAX, Zygote

zygote = Zygote([])
zygote.exit_statuses.update((-index, 0) for index in range(1, EXIT_STATUSES_KEPT_MAX + 1))
pid = os.fork()
if pid == 0:
    os._exit(7)
zygote.children[pid] = "server"
while pid in zygote.children:
    zygote.reap()
statuses = zygote.exit_statuses
print(json.dumps({"status": statuses[pid], "kept": len(statuses), "oldest_dropped": -1 not in statuses}))
"""


def test_reap__records_how_a_child_exited_and_keeps_a_bounded_history() -> None:
    # In a process of its own: it forks, and forking pytest (which may run threads) is not safe.
    reaper = subprocess.run([sys.executable, "-c", REAPER], capture_output=True, text=True, timeout=WAIT_TIMEOUT_S)
    assert reaper.returncode == 0, reaper.stderr
    assert json.loads(reaper.stdout) == {"status": 7, "kept": EXIT_STATUSES_KEPT_MAX, "oldest_dropped": True}


PREPARER = """
import gc, json, weakref
import fakes.processes.zygote
from fakes.processes.zygote import PREPARED_CONFIGS_KEPT, PREPARED_CONFIGS_MAX, Zygote

class App:
    \"\"\"Stands in for a built app: full of reference cycles, as a FastAPI app is.\"\"\"
    def __init__(self, config_json):
        if config_json == "bad":
            raise ValueError("no such role")
        self.config_json, self.me = config_json, self

fakes.processes.zygote.build_config = App
zygote = Zygote([])
first = zygote.prepared_for_spawn("config-0")
again = zygote.prepared_for_spawn("config-0")
same_object = first is again
refs = [weakref.ref(first)]
refs += [weakref.ref(zygote.prepare(f"config-{index}")) for index in range(1, PREPARED_CONFIGS_MAX)]
del first, again
alive_at_max = sum(ref() is not None for ref in refs)
newest = zygote.prepare(f"config-{PREPARED_CONFIGS_MAX}")
newest_kept = range(PREPARED_CONFIGS_MAX - PREPARED_CONFIGS_KEPT + 1, PREPARED_CONFIGS_MAX + 1)
gc.collect()
print(json.dumps({
    "same_object": same_object,
    "bad": zygote.prepared_for_spawn("bad"),
    "alive_at_max": alive_at_max,
    "kept": list(zygote.prepared) == [f"config-{index}" for index in newest_kept],
    "alive_after": sum(ref() is not None for ref in refs) + 1,
    "frozen": gc.get_freeze_count() > 0,
}))
"""


def test_prepare__builds_a_config_once__and_evicts_to_the_kept_freeing_what_it_evicts() -> None:
    # In a process of its own: it freezes the garbage collector's objects.
    preparer = subprocess.run([sys.executable, "-c", PREPARER], capture_output=True, text=True, timeout=WAIT_TIMEOUT_S)
    assert preparer.returncode == 0, preparer.stderr
    # A config that does not build is left to the child, whose log says why; the fork server only prints it.
    assert "ValueError: no such role" in preparer.stderr
    assert json.loads(preparer.stdout) == {
        "same_object": True,
        "bad": None,
        "alive_at_max": PREPARED_CONFIGS_MAX,
        "kept": True,
        # Frozen objects are never collected: the evicted apps are gone only because eviction unfreezes first.
        "alive_after": PREPARED_CONFIGS_KEPT,
        "frozen": True,
    }


SPAWNER = """
import json, os, sys
import fakes.processes.zygote
from fakes.processes.zygote import Zygote

out = sys.argv[1]
built = []
fakes.processes.zygote.build_config = lambda config_json: built.append(os.getpid()) or {"app of": config_json}

def serve(config_json, sock, prepared):
    with open(os.path.join(out, "child.json"), "w") as child:
        json.dump({"prepared": prepared}, child)
    return 0

fakes.processes.zygote.serve_config = serve
zygote = Zygote([])
config = json.dumps({"name": "environment", "host": "127.0.0.1", "port": 0})
pids = {}
zygote.fork_all([{"name": "environment", "config": config, "log_path": os.path.join(out, "log")}], pids)
while pids["environment"] in zygote.children:
    zygote.reap()
with open(os.path.join(out, "child.json")) as child:
    print(json.dumps({"built_here": built == [os.getpid()], "child": json.load(child), "config": config}))
"""


def test_spawn__builds_a_new_config_here_once_and_hands_it_to_the_child(tmp_path: Path) -> None:
    # The standbys the start asks for next share the same build; the child does not build it again.
    spawner = subprocess.run(
        [sys.executable, "-c", SPAWNER, str(tmp_path)], capture_output=True, text=True, timeout=WAIT_TIMEOUT_S
    )
    assert spawner.returncode == 0, spawner.stderr
    seen = json.loads(spawner.stdout)
    assert seen == {"built_here": True, "child": {"prepared": {"app of": seen["config"]}}, "config": seen["config"]}


# --- one shared stack -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack("native", tmp_path_factory.mktemp("forkserver") / "stack") as started:
        started.start_backend()
        started.start_gym()
        yield started


@pytest.fixture
def running(stack: Stack) -> Stack:
    """The shared stack with its Gym servers up (a failed test may have left them down)."""
    if not stack.gym:
        stack.start_gym()
    return stack


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        yield client


@processes
def test_restart__fresh_processes_on_the_same_ports_without_the_old_state(running: Stack, http: httpx.Client) -> None:
    stack = running
    assert stack.fork_server is not None
    before = {name: (server.pid, server.url) for name, server in stack.gym.items()}
    urls = {name: url for name, (_, url) in before.items()}
    with ControlClient.from_servers(urls, stack.token, http=http) as control:
        assert control.prepare("c-old", time.time() + DEADLINE_S).prepared
        assert {reply["phase"] for reply in control.status_all().values()} == {"prepared"}

        stack.crash_gym()
        stack.start_gym()

        after = {name: (server.pid, server.url) for name, server in stack.gym.items()}
        assert {name: url for name, (_, url) in after.items()} == urls
        assert not {pid for pid, _ in after.values()} & {pid for pid, _ in before.values()}
        for pid, _ in after.values():
            assert os.getpgid(pid) == pid
            assert os.getsid(pid) == pid
            assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(stack.fork_server.pid)
        statuses = control.status_all()
    assert {(reply["phase"], reply["checkpoint_id"]) for reply in statuses.values()} == {("idle", None)}


@processes
def test_restart_of_one_server__only_it_is_fresh_the_others_keep_their_state(
    running: Stack, http: httpx.Client
) -> None:
    stack = running
    before = {name: (server.pid, server.url) for name, server in stack.gym.items()}
    urls = {name: url for name, (_, url) in before.items()}
    with ControlClient.from_servers(urls, stack.token, http=http) as control:
        assert control.prepare("c-open", time.time() + DEADLINE_S).prepared

        stack.restart_server("agent")

        after = {name: (server.pid, server.url) for name, server in stack.gym.items()}
        assert {name: url for name, (_, url) in after.items()} == urls
        assert after["agent"][0] != before["agent"][0]
        assert process_gone(before["agent"][0])
        assert {name: pid for name, (pid, _) in after.items() if name != "agent"} == {
            name: pid for name, (pid, _) in before.items() if name != "agent"
        }
        phases = {name: reply["phase"] for name, reply in control.status_all().items()}
        prepared = dict.fromkeys(("environment", "policy_model", "resources"), "prepared")
        assert phases == {"agent": "idle", **prepared}
        control.resume("c-open", time.time() + DEADLINE_S)
    with pytest.raises(RuntimeError, match="no running Gym server 'nobody'"):
        stack.restart_server("nobody")


@processes
def test_restart__promotes_the_standbys_forked_after_the_last_start(running: Stack) -> None:
    """Each start leaves one standby per server (built while the servers work); the next start serves with them."""
    stack = running
    assert stack.fork_server is not None
    stack.fork_server.wait_idle()
    standbys = {pid: name for pid, name in children_of(stack.fork_server.pid).items() if name.startswith("gym-standby")}
    assert len(standbys) == 4, children_of(stack.fork_server.pid)

    stack.crash_gym()
    stack.start_gym()

    assert {server.pid for server in stack.gym.values()} == set(standbys)
    names = children_of(stack.fork_server.pid)
    for name, server in stack.gym.items():
        assert names[server.pid] == f"gym-{name}"[:15], "a promoted standby is named after its server"
        assert os.getpgid(server.pid) == server.pid


@processes
def test_a_server_log__holds_the_requests_served_after_its_start(running: Stack, http: httpx.Client) -> None:
    # A restarted server (a promoted standby), a refused /run, a call without the token: both are logged with their
    # status; the backend, started cold, logs the request the start's health check sent it.
    running.crash_gym()
    running.start_gym()
    environment = running.gym["environment"]
    assert http.post(environment.url + "/run", json={"not": "a run"}).status_code == 422
    assert http.get(environment.url + CHECKPOINT_ROUTE_PREFIX + "/status").status_code == 401

    def logged() -> str | None:
        text = environment.log_path.read_text()
        last_start = text.rsplit("--- start environment", 1)[1]
        wanted = ['"POST /run HTTP/1.1" 422', f'"GET {CHECKPOINT_ROUTE_PREFIX}/status HTTP/1.1" 401']
        return last_start if all(line in last_start for line in wanted) else None

    wait_until(logged, "the environment's log to hold both requests")
    backend_log = running.log_path("backend").read_text()
    assert '"GET /v1/models HTTP/1.1" 200' in backend_log


@processes
def test_sigkill_of_a_server_group__leaves_no_process_in_it(running: Stack) -> None:
    stack = running
    assert stack.fork_server is not None
    server = stack.gym["environment"]
    os.killpg(server.pgid, signal.SIGKILL)
    # The fork server reaps it: a zombie leader would keep killpg(pgid, 0) succeeding.
    wait_until(lambda: group_gone(server.pgid), f"process group {server.pgid} to vanish")
    assert server.poll() == -signal.SIGKILL
    assert stack.fork_server.exit_status(server.pid) == -signal.SIGKILL
    stack.crash_gym()
    assert not servers_of(stack.fork_server.pid)


@processes
def test_a_crashed_server__resets_what_waited_for_it_and_refuses_until_restarted(running: Stack) -> None:
    """As a real crash: a request still in the backlog is reset, not served later by the next process."""
    stack = running
    server = stack.gym["agent"]
    address = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    os.killpg(server.pgid, signal.SIGSTOP)  # it accepts nothing more, so the next request waits in the backlog
    with socket.create_connection(address, timeout=WAIT_TIMEOUT_S) as waiting:
        waiting.sendall(b"GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")
        os.killpg(server.pgid, signal.SIGKILL)
        wait_until(lambda: group_gone(server.pgid), f"process group {server.pgid} to vanish")
        with pytest.raises(ConnectionResetError):
            waiting.recv(1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=WAIT_TIMEOUT_S).close()
    stack.crash_gym()
    stack.start_gym()
    with socket.create_connection(address, timeout=WAIT_TIMEOUT_S):
        pass


@processes
def test_a_forked_server__holds_its_own_socket_and_no_other_and_no_control_pipe(running: Stack) -> None:
    stack = running
    assert stack.fork_server is not None
    inodes = listening_inodes()
    ports = {name: int(server.url.rsplit(":", 1)[1]) for name, server in stack.gym.items()}
    fork_server_pipes = {target for target in fd_targets(stack.fork_server.pid) if target.startswith("pipe:")}
    assert fork_server_pipes, "the fork server talks to its owner over pipes"
    for name, server in stack.gym.items():
        held = fd_targets(server.pid)
        assert f"socket:[{inodes[ports[name]]}]" in held
        others = {f"socket:[{inodes[port]}]" for other, port in ports.items() if other != name}
        assert not held & others, f"{name} holds another server's listening socket"
        assert not held & fork_server_pipes, f"{name} holds the fork server's control pipe"
        assert os.readlink(f"/proc/{server.pid}/fd/0") == os.devnull
        assert os.readlink(f"/proc/{server.pid}/fd/1") == str(server.log_path)


@processes
def test_a_server_that_exits_at_start__fails_the_start_naming_it_with_its_log(
    running: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = running
    assert stack.fork_server is not None
    configs = Stack.configs

    def with_a_bad_role(self: Stack) -> dict[str, ServerConfig]:
        chosen = configs(self)
        # As a hand-edited config would: the child validates it and exits.
        object.__setattr__(chosen["resources"], "role", "no_such_role")
        return chosen

    stack.crash_gym()
    monkeypatch.setattr(Stack, "configs", with_a_bad_role)
    with pytest.raises(StackStartError) as failure:
        stack.start_gym()
    message = str(failure.value)
    assert message.startswith("resources exited with status 1 before it was healthy")
    assert str(stack.log_path("resources")) in message
    assert "no_such_role" in message
    assert stack.gym == {}
    assert not servers_of(stack.fork_server.pid)

    monkeypatch.undo()
    stack.start_gym()
    assert sorted(stack.gym) == ["agent", "environment", "policy_model", "resources"]


# --- stacks of their own ------------------------------------------------------------------------------------------


@processes
def test_stop__leaves_no_server_no_fork_server_and_no_backend(tmp_path: Path) -> None:
    stack = Stack("legacy", tmp_path / "stack")
    try:
        stack.start_backend()
        stack.start_gym()
        assert stack.fork_server is not None
        assert stack.backend is not None
        pgids = [server.pgid for server in stack.gym.values()]
        fork_server_pid, backend_pgid = stack.fork_server.pid, stack.backend.pgid
    finally:
        stack.stop()
    assert stack.gym == {}
    assert stack.fork_server is None
    assert stack.backend is None
    for pgid in [*pgids, fork_server_pid, backend_pgid]:
        assert group_gone(pgid), f"process group {pgid} survived stop()"
    stack.stop()  # idempotent


@processes
def test_stop__while_the_fork_server_still_warms_up__leaves_it_dead(tmp_path: Path) -> None:
    stack = Stack("native", tmp_path / "stack")
    try:
        stack.start_backend()  # launches the fork server too, to warm up while the backend starts
        assert stack.fork_server is not None
        fork_server_pid = stack.fork_server.pid
    finally:
        stack.stop()
    assert group_gone(fork_server_pid)


@processes
def test_the_cold_path__still_restarts_on_the_same_ports(stack: Stack, tmp_path: Path, http: httpx.Client) -> None:
    assert stack.backend_url is not None
    with Stack("native", tmp_path / "cold", backend_url=stack.backend_url, fork_server=False) as cold:
        cold.start_gym()
        before = {name: (server.pid, server.url) for name, server in cold.gym.items()}
        cold.crash_gym()
        cold.start_gym()
        assert cold.fork_server is None
        for name, server in cold.gym.items():
            assert server.process is not None
            assert server.url == before[name][1]
            assert server.pid != before[name][0]
            assert http.get(server.url + CHECKPOINT_ROUTE_PREFIX + "/status", headers=bearer(cold)).status_code == 200


OWNER = """
import json, sys
from pathlib import Path
from fakes.stack.launcher import Stack

stack = Stack("native", Path(sys.argv[1]), backend_url=sys.argv[2])
stack.start_gym()
pgids = [server.pgid for server in stack.gym.values()]
print(json.dumps({"pgids": pgids, "fork_server": stack.fork_server.pid}), flush=True)
sys.stdin.readline()
"""


@attrs.frozen
class Owner:
    process: subprocess.Popen[str]
    pgids: list[int]
    fork_server_pid: int


@pytest.fixture
def owner(stack: Stack, tmp_path: Path) -> Iterator[Owner]:
    """A process that starts its own Gym servers (against the shared backend) and waits for a line on stdin."""
    assert stack.backend_url is not None
    argv = [sys.executable, "-c", OWNER, str(tmp_path / "owned"), stack.backend_url]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline() or "{}")
        assert started, f"the owner failed to start (status {process.wait(timeout=WAIT_TIMEOUT_S)})"
        yield Owner(process, started["pgids"], started["fork_server"])
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=WAIT_TIMEOUT_S)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


@processes
def test_an_owner_that_exits_without_stop__stops_everything_at_exit(owner: Owner) -> None:
    assert owner.process.stdin is not None
    owner.process.stdin.write("exit\n")
    owner.process.stdin.flush()
    assert owner.process.wait(timeout=WAIT_TIMEOUT_S) == 0
    for pgid in owner.pgids:
        assert group_gone(pgid), f"process group {pgid} outlived its owner"
    assert process_gone(owner.fork_server_pid)


@processes
def test_an_owner_killed_by_sigkill__its_fork_server_takes_the_servers_down(owner: Owner) -> None:
    owner.process.kill()
    owner.process.wait(timeout=WAIT_TIMEOUT_S)
    # The fork server reads end-of-file on its stdin, kills and reaps its children, and exits.
    for pgid in owner.pgids:
        wait_until(lambda pgid=pgid: group_gone(pgid), f"process group {pgid} to end with its owner")
    wait_until(lambda: process_gone(owner.fork_server_pid), "the fork server to exit")


@processes
def test_the_launcher__forks_its_servers_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    state_dir = tmp_path / "launched"
    argv = [sys.executable, "-m", "fakes.stack", "--topology", "native", "--state-dir", str(state_dir)]
    launcher = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        description_path = state_dir / "deployment.json"
        wait_until(description_path.exists, "deployment.json")
        described = json.loads(description_path.read_text())
        pgids = [server["pgid"] for server in described["servers"].values()]
        parents = {Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()[1] for pgid in pgids}
        assert len(parents) == 1, "the servers have different parents"
        assert parents != {str(launcher.pid)}, "the servers are the launcher's children, not its fork server's"
        fork_server_pid = int(parents.pop())
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=WAIT_TIMEOUT_S) == 0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=WAIT_TIMEOUT_S)
        assert launcher.stderr is not None
        launcher.stderr.close()
    for pgid in [*pgids, described["backend"]["pgid"]]:
        assert group_gone(pgid), f"process group {pgid} survived Ctrl-C"
    assert process_gone(fork_server_pid)
