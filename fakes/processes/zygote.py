"""The fork server ("zygote") for the look-alike Gym servers: restarts in milliseconds instead of a cold start.

    python -m fakes.processes.zygote     (started by `fakes.processes.zygote_client.ForkServer.launch`, never by hand)

A cold `python -m fakes.gym.serve` spends ~380 ms importing and warming up before its first reply, and the
checker restarts all four Gym servers for every example and every crash. This process pays that once: it
imports every server module and uvicorn and serves warm-up requests through each role's app on a throwaway event
loop (closed again, so no thread runs when it forks). Children make their own session (so
`os.killpg(pid, SIGKILL)` is a crash of exactly that server) and serve a listening socket the fork server bound
to the server's fixed port at the start (`listening_socket`: IPPROTO_TCP, SO_REUSEADDR).

After a start the owner asks for a `prebuild`: the fork server forks a *standby* child per server, which starts
its event loop and runs its lifespan while the checker runs an example and then waits on a socket pair. The app
and uvicorn's config are built once per server config in the fork server itself (`Zygote.prepare`) and shared by
every standby forked after, so the standbys a restart asks for cost little CPU next to the example. The next
start binds the port and passes the standby the listening socket (SCM_RIGHTS); it serves, and says SERVING on
its socket pair, so the start needs no health check over HTTP. A start without a usable standby builds (prepares) a
new config here first and forks a child that serves it, so the standbys forked after share that one build.

A server with several workers (`ServerConfig.workers`, see `fakes.gym.workers.coordinator_process`) starts the same way:
its child becomes the coordinator, forks its workers (each starts its loop and lifespan and waits) and hands each the
listening socket; its standby forks and builds them before it reports READY, waits for the socket without an event
loop (a process that runs one must not fork), and says SERVING only once every worker has registered.

The fork server closes its copy of that socket right after the fork, so the child holds the only one and a crash
looks like a real one: connections waiting in the backlog are reset and new ones are refused until the next
start, which binds the same port again. (A socket kept by the fork server across children would keep accepting
connections for a dead server and hand them to the next process.) At most one child per server name lives.

The owner (`fakes.stack.launcher.Stack`, through `fakes.processes.zygote_client.ForkServer`) talks to this process over
its stdin and stdout, one JSON line each way (`fakes.processes.zygote_protocol` lists the requests and replies).

Reaping: a SIGCHLD handler reaps children as they die and keeps their exit statuses, so a killed server's process
group disappears at once (`killpg(pgid, 0)` succeeds on zombies) and the owner can still ask how a server exited.
Children also get SIGKILL if the fork server dies (PR_SET_PDEATHSIG), so none is ever orphaned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any, NoReturn

import attrs

from fakes.gym.serve import build_config, listening_socket, touch_stateless_routes
from fakes.gym.server_logs import uvicorn_logging
from fakes.gym.workers.fd_passing import receive_fds
from fakes.gym.workers.runtime import remove_runtime_dir
from fakes.processes import process_groups
from fakes.processes.zygote_protocol import write_message

# How long a ping waits for the standbys to be built; how long stopping waits for the children to be gone.
STANDBYS_READY_TIMEOUT_S = 30.0
CHILDREN_GONE_TIMEOUT_S = 10.0
EXIT_STATUSES_KEPT_MAX = 1024
# Server configs whose app the fork server keeps built for its children (a deployment has four to six): beyond the
# most, the least recently used are evicted down to the kept.
PREPARED_CONFIGS_MAX = 24
PREPARED_CONFIGS_KEPT = 8
WARM_UP_TOKEN = "warm-up"
# Peers no warm-up request reaches: a closed loopback port (the discard service is never listened on here).
WARM_UP_PEER_URL = "http://127.0.0.1:9"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PROCESS_NAME_BYTES_MAX = 15
STANDBY_PREFIX = "standby:"
READY = b"r"  # standby -> fork server: built, waiting for its socket
GO = b"g"  # fork server -> standby, with the listening socket's descriptor
SERVING = b"s"  # standby -> fork server: promoted, its server accepts on the socket
# How long a spawn waits for promoted standbys to report SERVING; one that does not is health-checked by the owner.
SERVING_TIMEOUT_S = 10.0
# Signals whose fork-server handlers a child must not keep.
HANDLED_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


# --- warm-up, once, before any fork ------------------------------------------------------------------------------


def warm_up() -> float:
    """Import and exercise everything a server runs, so a forked child pays none of it; returns the cost in ms."""
    started_s = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="ckpt-forkserver-warm-up-") as capture_dir:
        # asyncio.run closes its loop and joins the default executor's threads before it returns.
        asyncio.run(_warm_up_requests(capture_dir))
    if threading.active_count() != 1:
        raise RuntimeError(f"warm-up left {threading.active_count() - 1} thread(s) running; forking now is unsafe")
    # Keep the warmed objects out of the children's garbage collections: fewer copy-on-write page faults.
    gc.collect()
    gc.freeze()
    return (time.perf_counter() - started_s) * 1000


async def _warm_up_requests(capture_dir: str) -> None:
    """One app per role, with its lifespan, answers in-process requests; one answers through uvicorn over TCP."""
    import httpx
    import uvicorn

    from fakes.gym.config import ROLES, ServerConfig
    from fakes.gym.protocol.wire import CHECKPOINT_ROUTE_PREFIX
    from fakes.gym.serve import build_app

    peers = dict.fromkeys(("environment", "agent", "resources", "policy_model"), WARM_UP_PEER_URL)
    headers = {"Authorization": f"Bearer {WARM_UP_TOKEN}"}
    app = None
    for role in ROLES:
        config = ServerConfig(
            name=f"warm-up-{role}",
            role=role,  # type: ignore[arg-type]
            port=0,
            token=WARM_UP_TOKEN,
            backend_url=WARM_UP_PEER_URL,
            peers=peers,
            capture_dir=capture_dir,
        )
        app = build_app(config)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://warm-up") as client,
        ):
            await client.get("/health")
            await client.get(CHECKPOINT_ROUTE_PREFIX + "/status", headers=headers)
            await client.get(CHECKPOINT_ROUTE_PREFIX + "/status")  # 401: the error handlers
    # The path a child takes: uvicorn serving an inherited socket, answering a real TCP client.
    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", **uvicorn_logging()))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        host, port = sock.getsockname()
        # No readiness wait needed: the socket listens already, so the request waits in its backlog.
        async with httpx.AsyncClient(trust_env=False) as client:
            await client.get(f"http://{host}:{port}/health")
    finally:
        server.should_exit = True
        await serving
        sock.close()


# --- the fork server's state and requests -----------------------------------------------------------------------


class Zygote:
    """The fork server's state: the live children, how the dead exited, and apps built ahead for the next ones."""

    def __init__(self, control_files: Sequence[IO[bytes]]) -> None:
        self.control_files = tuple(control_files)
        # Both are changed by the SIGCHLD handler, which can run between any two bytecodes of other code (and of
        # itself): read them through single calls (`list(...)`, `.get`), never by iterating them in Python.
        self.children: dict[int, str] = {}
        self.exit_statuses: OrderedDict[int, int] = OrderedDict()
        # Per server name: a standby child, forked ahead for the next start of that server with this config.
        self.standbys: dict[str, Standby] = {}
        self.standbys_wanted: list[Mapping[str, str]] = []
        # Channels of standbys promoted by the spawn under way, until they say SERVING: a child forked meanwhile
        # must close its copies too.
        self.promoted_channels: list[socket.socket] = []
        self.pid = os.getpid()
        # Per config: uvicorn's config with the app built, once, here; children forked after share it.
        self.prepared: OrderedDict[str, Any] = OrderedDict()
        # Loaded before any fork, so a child only calls it.
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.forking = False

    # -- requests ---------------------------------------------------------------------------------------------

    def handle(self, line: bytes) -> dict[str, Any]:
        """One request line to one reply; a bad request gets an error reply, never kills the fork server."""
        # Also here, not only in the SIGCHLD handler: should a signal ever go unhandled, no zombie outlives a request.
        self.reap()
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "spawn":
                pids, serving = self.spawn_all(request["servers"])
                return {"ok": True, "pids": pids, "serving": serving}
            if op == "exit_status":
                return {"ok": True, "exit_status": self.exit_statuses.get(int(request["pid"]))}
            if op == "ping":
                self.wait_standbys_ready()
                return {"ok": True}
            if op == "prebuild":
                # Forked after the reply is sent (see `serve`), so the owner does not wait for it.
                self.standbys_wanted = list(request["servers"])
                return {"ok": True}
            return {"ok": False, "error": f"'op' must be 'spawn', 'exit_status', 'prebuild' or 'ping' (got {op!r})"}
        except Exception as error:
            return {"ok": False, "error": f"{type(error).__name__}: {error}"}

    def spawn_all(self, servers: list[dict[str, str]]) -> tuple[dict[str, int], list[str]]:
        """Start one child per server; returns once every child leads its own process group, with the names of
        those already serving (promoted standbys that said so; the owner health-checks the others).

        Standbys are promoted first, so they start serving while the rest fork. All forks go first and the wait
        comes once after them, so no fork waits for an earlier child to be scheduled. If anything fails, the
        children already started for this request die too.
        """
        pids: dict[str, int] = {}
        promoted: dict[str, socket.socket] = {}
        to_fork = []
        for server in servers:
            started = self.promote_standby(server["name"], server["config"])
            if started is None:
                to_fork.append(server)
            else:
                pids[server["name"]], promoted[server["name"]] = started
        self.promoted_channels = list(promoted.values())
        try:
            self.fork_all(to_fork, pids)
            serving = wait_serving(promoted, SERVING_TIMEOUT_S)
        except BaseException:
            for pid in pids.values():
                process_groups.kill(pid)
            raise
        finally:
            self.promoted_channels = []
            for channel in promoted.values():
                channel.close()
        return pids, serving

    def fork_all(self, servers: list[dict[str, str]], pids: dict[str, int]) -> None:
        """Fork a child per server (into `pids`); returns once each leads its own process group."""
        ready_read_fd, ready_write_fd = os.pipe()
        try:
            for server in servers:
                name, log_path = server["name"], Path(server["log_path"])
                pids[name] = self.spawn(name, server["config"], log_path, (ready_read_fd, ready_write_fd))
        finally:
            os.close(ready_write_fd)
            # EOF once every child has closed its copy of the write end, which each does right after setsid()
            # (or by dying). Until then killpg(pid) could miss it: replying earlier would hand out process groups
            # that do not exist yet.
            while os.read(ready_read_fd, 64):
                pass
            os.close(ready_read_fd)

    def spawn(self, name: str, config_json: str, log_path: Path, ready_pipe: tuple[int, int]) -> int:
        """Fork a child serving `name`; the child closes `ready_pipe`'s write end once it leads its own group."""
        running = [pid for pid, child_name in list(self.children.items()) if child_name == name]
        if running:
            raise RuntimeError(f"server {name!r} still runs as pid {running[0]}: kill its process group first")
        address = json.loads(config_json)
        prepared = self.prepared_for_spawn(config_json)
        try:
            sock = listening_socket(address["host"], address["port"])
        except OSError as error:
            raise OSError(f"server {name!r} cannot listen on {address['host']}:{address['port']}: {error}") from None
        with sock:  # our copy closes right after the fork: the child must hold the only one
            pid = self.fork()
            if pid == 0:
                os.close(ready_pipe[0])
                self.die_with_parent()
                self.name_process(name)
                run_child(
                    f"server {name!r}",
                    log_path,
                    self.inherited(),
                    ready_pipe[1],
                    lambda: serve_config(config_json, sock, prepared),
                )
        self.record(pid, name)
        return pid

    def prepared_for_spawn(self, config_json: str) -> Any:
        """The config's app, built here before a start forks its child: the standbys the start asks for next share
        it, so a new config (a first start, new faults) is built once, not by the child and then again here. None
        if it does not build: the child then builds it itself and its log shows why it failed."""
        try:
            return self.prepare(config_json)
        except Exception:
            traceback.print_exc()
            return None

    # -- children -----------------------------------------------------------------------------------------------

    def fork(self) -> int:
        """`os.fork()`, refused while a thread runs (the child would inherit its locks held) and with stdout and
        stderr flushed first (or the child would write our buffered bytes again)."""
        if threading.active_count() != 1:
            raise RuntimeError(f"{threading.active_count() - 1} thread(s) running in the fork server; fork is unsafe")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        # Until `record` names the child, the SIGCHLD handler collects recorded children only (see `reap`).
        self.forking = True
        try:
            return os.fork()
        except BaseException:
            self.forking = False
            raise

    def record(self, pid: int, name: str) -> None:
        """Name a child just forked; one that died already is collected here (the handler reaps only recorded
        children while a fork is unrecorded)."""
        self.children[pid] = name
        self.forking = False
        self.reap()

    def inherited(self) -> tuple[IO[bytes] | socket.socket, ...]:
        """What a child gets from the fork and must close: the control channel, other standbys' socket pairs."""
        standbys = (standby.channel for standby in self.standbys.values())
        return (*self.control_files, *standbys, *self.promoted_channels)

    def die_with_parent(self) -> None:
        """In a child: be SIGKILLed when the fork server dies, even by SIGKILL, so no server is ever orphaned."""
        if self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != self.pid:
            os._exit(1)  # the fork server died before the request took effect

    def name_process(self, name: str) -> None:
        """In a child: `ps`/`pgrep` show `gym-<name>` instead of the fork server's name (argv stays its own)."""
        self.libc.prctl(PR_SET_NAME, f"gym-{name}".encode()[:PROCESS_NAME_BYTES_MAX])

    def reap(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """SIGCHLD handler: collect every recorded child that died, keeping its exit status for the owner.

        While a fork is not yet recorded only recorded children are waited for, so a child is never reaped before
        `record` names it. Otherwise any child is: this process is a child subreaper (see `main`), so the workers
        of a multi-worker server, orphaned when their coordinator dies with them, are re-parented here and must be
        collected as promptly as the servers (init here reaps orphans only every 1-1.5 s, and a process group is
        not gone while a zombie is left in it). The handler may interrupt other code and itself (a second
        SIGCHLD), so each change is one atomic dict call; and it never raises, since an exception would surface in
        whatever code the signal interrupted.
        """
        try:
            for pid in list(self.children):
                try:
                    reaped_pid, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    self.children.pop(pid, None)  # collected by an interrupted call of this same handler
                    continue
                if reaped_pid == 0:
                    continue
                self.collected(pid, status)
            while not self.forking:
                try:
                    reaped_pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if reaped_pid == 0:
                    break
                self.collected(reaped_pid, status)
        except Exception:
            traceback.print_exc()

    def collected(self, pid: int, status: int) -> None:
        """Keep how a reaped process exited (orphans too: harmless, and bounded)."""
        self.exit_statuses[pid] = os.waitstatus_to_exitcode(status)
        self.children.pop(pid, None)
        while len(self.exit_statuses) > EXIT_STATUSES_KEPT_MAX:
            self.exit_statuses.popitem(last=False)

    def kill_children(self, timeout_s: float = CHILDREN_GONE_TIMEOUT_S) -> None:
        """SIGKILL every live child's group and wait (bounded) until each is reaped and gone, so none outlives the
        fork server."""
        pids = list(self.children)
        for pid in pids:
            process_groups.kill(pid)
        deadline_s = time.monotonic() + timeout_s
        for pid in pids:
            process_groups.wait_gone(pid, self.reap, deadline_s - time.monotonic())
            remove_runtime_dir(pid)  # a multi-worker server (or its standby) killed here could not remove its own

    # -- standby children ---------------------------------------------------------------------------------------

    def fork_standbys(self, servers: Sequence[Mapping[str, str]]) -> None:
        """Fork a standby child per server, for its next start (one kept with the same config stays).

        A standby forks now, while the checker runs an example, from the config `prepare` built, starts its loop
        and lifespan and waits; a start only hands it the listening socket (`promote_standby`), so the fork, the
        app build and uvicorn's set-up are all off the path from a crash to serving again.
        """
        for server in servers:
            name, config_json = server["name"], server["config"]
            kept = self.standbys.get(name)
            if kept is not None and kept.config_json == config_json and kept.pid in self.children:
                continue
            self.discard_standby(name)
            self.standbys[name] = self.fork_standby(name, config_json, Path(server["log_path"]))

    def prepare(self, config_json: str) -> Any:
        """uvicorn's loaded config for `config_json`, its app built and warmed here once: every standby forked
        after shares it (copy-on-write) and only starts its loop and lifespan, so a restart's standbys cost a
        fraction of the CPU that building four apps takes, CPU the example running meanwhile would wait for.

        A built app holds no state from a request (only stateless ones warm it) and none from disk, so each child
        starts from the same pristine app, as if it had built it itself."""
        prepared = self.prepared.get(config_json)
        if prepared is not None:
            self.prepared.move_to_end(config_json)
            return prepared
        prepared = build_config(config_json)
        self.prepared[config_json] = prepared
        if len(self.prepared) > PREPARED_CONFIGS_MAX:
            while len(self.prepared) > PREPARED_CONFIGS_KEPT:
                self.prepared.popitem(last=False)
            # An app is full of reference cycles, and frozen objects are never collected: without this, every
            # config evicted would stay in memory, and every later fork would copy its page tables. A collection
            # of everything costs about 0.1 s, so configs are evicted many at a time.
            gc.unfreeze()
        # Keep the built objects out of the children's garbage collections: fewer copy-on-write page faults.
        gc.collect()
        gc.freeze()
        return prepared

    def fork_standby(self, name: str, config_json: str, log_path: Path) -> Standby:
        config = self.prepare(config_json)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ready_read_fd, ready_write_fd = os.pipe()
        try:
            pid = self.fork()
            if pid == 0:
                os.close(ready_read_fd)
                ours.close()
                self.die_with_parent()
                self.name_process(f"standby-{name}")
                run_child(
                    f"standby for server {name!r}",
                    log_path,
                    self.inherited(),
                    ready_write_fd,
                    lambda: run_standby(config_json, config, theirs, lambda: self.name_process(name)),
                )
            self.record(pid, STANDBY_PREFIX + name)
        finally:
            theirs.close()
            os.close(ready_write_fd)
        # As for a started child: returned only once it leads its own process group.
        while os.read(ready_read_fd, 64):
            pass
        os.close(ready_read_fd)
        return Standby(pid=pid, config_json=config_json, channel=ours)

    def promote_standby(self, name: str, config_json: str) -> tuple[int, socket.socket] | None:
        """Hand the standby for `name` its listening socket: it serves from then on. Returns its pid and its
        channel, on which it says SERVING once it accepts (`wait_serving`). None: no usable standby."""
        standby = self.standbys.pop(name, None)
        if standby is None:
            return None
        if standby.config_json != config_json or standby.pid not in self.children:
            self.discard(standby)
            return None
        running = [pid for pid, child_name in list(self.children.items()) if child_name == name]
        if running:
            self.discard(standby)
            raise RuntimeError(f"server {name!r} still runs as pid {running[0]}: kill its process group first")
        address = json.loads(config_json)
        try:
            sock = listening_socket(address["host"], address["port"])
        except OSError as error:
            self.discard(standby)
            raise OSError(f"server {name!r} cannot listen on {address['host']}:{address['port']}: {error}") from None
        with sock:  # our copy closes once sent: the child must hold the only one
            try:
                socket.send_fds(standby.channel, [GO], [sock.fileno()])
            except OSError:
                standby.channel.close()
                process_groups.kill(standby.pid)
                return None
        self.children[standby.pid] = name
        return standby.pid, standby.channel

    def wait_standbys_ready(self, timeout_s: float = STANDBYS_READY_TIMEOUT_S) -> None:
        """Wait until every standby has built its server and waits for its socket (or died trying)."""
        deadline_s = time.monotonic() + timeout_s
        for standby in list(self.standbys.values()):
            if standby.ready:
                continue
            standby.channel.settimeout(max(deadline_s - time.monotonic(), 0.001))
            with contextlib.suppress(OSError):
                standby.ready = standby.channel.recv(len(READY)) == READY
            standby.channel.settimeout(None)

    def discard_standby(self, name: str) -> None:
        standby = self.standbys.pop(name, None)
        if standby is not None:
            self.discard(standby)

    def discard(self, standby: Standby) -> None:
        """Stop a standby that will not be used (its channel closing tells it to exit; SIGKILL makes sure)."""
        standby.channel.close()
        process_groups.kill(standby.pid)
        remove_runtime_dir(standby.pid)  # a multi-worker standby made one before it reported READY

    def serve(self, requests: IO[bytes], replies: IO[bytes]) -> None:
        """Answer request lines until the owner closes our stdin."""
        for line in iter(requests.readline, b""):
            if line.strip():
                write_message(replies, self.handle(line))
                if self.standbys_wanted:
                    wanted, self.standbys_wanted = self.standbys_wanted, []
                    try:
                        self.fork_standbys(wanted)
                    except Exception:
                        # Only a speed-up: the next start forks its servers itself.
                        traceback.print_exc()


def wait_serving(channels: Mapping[str, socket.socket], timeout_s: float) -> list[str]:
    """The names whose promoted standby said SERVING on its channel within `timeout_s` (sorted); a standby that
    died (end of stream) or is slow is left out, for the owner's health check to judge."""
    serving: list[str] = []
    deadline_s = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        for name, channel in channels.items():
            selector.register(channel, selectors.EVENT_READ, name)
        while selector.get_map():
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                break
            for key, _ in selector.select(remaining_s):
                try:
                    data = key.fileobj.recv(64)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                # Bytes before SERVING are the READY nobody read (the standby was promoted before a ping).
                if not data or SERVING in data:
                    selector.unregister(key.fileobj)
                    if data:
                        serving.append(key.data)
    return sorted(serving)


@attrs.define(eq=False)
class Standby:
    """A forked child that will serve `config_json` once it receives its listening socket over `channel`."""

    pid: int
    config_json: str
    channel: socket.socket
    ready: bool = False


# --- in a forked child ------------------------------------------------------------------------------------------


def run_child(
    label: str,
    log_path: Path,
    inherited: Sequence[IO[bytes] | socket.socket],
    ready_fd: int,
    serve: Callable[[], int],
) -> NoReturn:
    """A forked child: own session, default signals, stdio to its log, nothing of the fork server's channels;
    then `serve()` until it returns its exit code. Never returns into the fork server's loop."""
    exit_code = 1
    try:
        os.setsid()
        os.close(ready_fd)  # tells the fork server this child is its own process group now
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for resource in inherited:
            resource.close()
        redirect_stdio(log_path)
        exit_code = serve()
    except SystemExit as exit_:
        exit_code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        print(f"{label} failed to start from the fork server", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # Skip the fork server's atexit handlers and buffers.
        os._exit(exit_code)


def run_standby(config_json: str, config: Any, channel: socket.socket, on_promotion: Callable[[], None]) -> int:
    """A standby's life with uvicorn's `config` (its app built by the fork server): start the loop and the
    lifespan, report READY, wait for the listening socket, serve it. Only the socket is left for a start to
    supply; no request is served before it, so the server starts as clean as a freshly forked one."""
    use_config_env(config_json)
    # The app's request path once more, here: its pages are this process's own before the first real request
    # (copy-on-write would otherwise copy them during it, on the path from a crash to serving again).
    asyncio.run(touch_stateless_routes(config.app))
    if workers_of(config_json) > 1:
        return run_coordinator_standby(config_json, config, channel, on_promotion)
    server = standby_server(config, channel, on_promotion)
    server.run()
    return 0 if server.started or server.stood_down else 3  # uvicorn's STARTUP_FAILURE


def run_coordinator_standby(
    config_json: str, config: Any, channel: socket.socket, on_promotion: Callable[[], None]
) -> int:
    """A standby of a server with several workers (`fakes.gym.workers.coordinator_process`): it forks its workers, which
    start their loops and lifespans and wait for the listening socket, then reports READY and waits, without an
    event loop (a process that runs one must not fork), for the socket; it hands it to every worker, becomes their
    coordinator, and says SERVING once every worker has registered."""
    from fakes.gym.config import ServerConfig
    from fakes.gym.serve import serve_workers

    def listening() -> socket.socket | None:
        with contextlib.suppress(OSError):
            channel.sendall(READY)
        _, fds, _, _ = socket.recv_fds(channel, len(GO), 1)
        if not fds:  # stood down: the fork server discarded this standby, or is gone
            channel.close()
            return None
        on_promotion()
        return socket.socket(fileno=fds[0])

    def serving() -> None:
        with contextlib.suppress(OSError):
            channel.sendall(SERVING)
        channel.close()

    return serve_workers(ServerConfig.from_json(config_json), listening, config, serving)


def standby_server(config: Any, channel: socket.socket, on_promotion: Callable[[], None]) -> Any:
    """A uvicorn server that runs its lifespan, reports READY on `channel`, and only then waits there for the
    listening socket it is to serve; with the event loop and the lifespan already up, serving starts at once."""
    import uvicorn

    class StandbyServer(uvicorn.Server):
        stood_down = False

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await self.lifespan.startup()
            if self.lifespan.should_exit:
                sys.exit(3)  # uvicorn's STARTUP_FAILURE
            with contextlib.suppress(OSError):  # promoted before it was built: its socket already waits for it
                channel.sendall(READY)
            fds = await receive_fds(channel, len(GO))
            if not fds:  # stood down: the fork server discarded this standby, or is gone
                channel.close()
                self.stood_down = True
                self.should_exit = True
                return
            on_promotion()
            sock = socket.socket(fileno=fds[0])  # family, type and protocol (IPPROTO_TCP) come from the descriptor
            self.lifespan.startup = _started  # type: ignore[method-assign] - it ran above; base startup calls it
            await super().startup(sockets=[sock])
            # Accepting now: saying so spares the owner polling the health route over HTTP.
            with contextlib.suppress(OSError):
                if self.started:
                    channel.sendall(SERVING)
            channel.close()

    return StandbyServer(config)


async def _started() -> None:
    return None


def redirect_stdio(log_path: Path) -> None:
    """stdin from /dev/null, stdout and stderr appended to the server's log (this also drops the control pipes)."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in (null_fd, log_fd):
        if fd > 2:
            os.close(fd)


def serve_config(config_json: str, sock: socket.socket, prepared: Any = None) -> int:
    """Serve `sock` with the config's server until killed; the exit code uvicorn's runner gives."""
    import uvicorn

    use_config_env(config_json)
    if workers_of(config_json) > 1:
        from fakes.gym.config import ServerConfig
        from fakes.gym.serve import serve_workers

        return serve_workers(ServerConfig.from_json(config_json), sock, prepared)
    server = uvicorn.Server(prepared if prepared is not None else build_config(config_json))
    server.run(sockets=[sock])
    return 0 if server.started else 3  # uvicorn's STARTUP_FAILURE


def workers_of(config_json: str) -> int:
    """How many worker processes the server serves with; more than one makes it their coordinator."""
    workers = json.loads(config_json).get("workers", 1)
    return workers if isinstance(workers, int) else 1


def use_config_env(config_json: str) -> None:
    """In a child: the config in the environment, as a cold-started server would see it."""
    from fakes.gym.config import CONFIG_ENV

    os.environ[CONFIG_ENV] = config_json


# --- the program ------------------------------------------------------------------------------------------------


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.processes.zygote", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    # The protocol gets a private copy of stdout; fd 1 then points at the log, so nothing printed by an
    # imported module can corrupt the channel.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _raise_exit)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
    try:
        warm_up_ms = warm_up()
    except Exception as error:
        traceback.print_exc()
        write_message(replies, {"ready": False, "error": f"{type(error).__name__}: {error}"})
        return 1
    # stdin needs no closing in a child: redirect_stdio replaces fd 0, which drops the request pipe.
    zygote = Zygote([replies])
    # Orphans of our children come to us, not to init: see `Zygote.reap`.
    zygote.libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGCHLD, zygote.reap)
    try:
        write_message(replies, {"ready": True, "pid": os.getpid(), "warm_up_ms": round(warm_up_ms, 1)})
        zygote.serve(requests, replies)
    except BrokenPipeError:
        pass  # the owner is gone: clean up below
    finally:
        zygote.kill_children()
    return 0


def exit_once_done(code: int) -> NoReturn:
    """End the fork server at once when `main` is done: its children are killed and reaped and its warm-up
    directory removed by then, and tearing down an interpreter that holds every server's warmed app takes seconds
    on a loaded machine, seconds its owner's stop (a run's Ctrl-C) would wait for."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        exit_code = main()
    except SystemExit as stop:  # SIGTERM, SIGHUP or SIGINT, after `main` has killed its children
        exit_code = stop.code if isinstance(stop.code, int) else 1
    exit_once_done(exit_code)
