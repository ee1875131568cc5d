"""The coordinator process of a multi-worker server (`serve_with_workers`): it forks the workers, hands them the
listening socket, reaps them, and runs the loop that serves their channels.

Reference 1.4 and Appendix B. The parts, by the process they run in:

    the coordinator   coordinator_process (this), coordinator (`WorkerPool`, its view of the workers)
    each worker       worker_process (its life), link (its end of the channel), routes (its routes)
    both              channel (frames, messages, the channel)

What is here is generic (any participant kind); `fakes.gym.policy.model_workers` builds the policy model server on it,
`fakes.gym.servers.participant_workers` the environment, agent and resources servers (`fakes.gym.serve.serve_workers`
starts either).

Process model. The server process, however it was started (`python -m fakes.gym.serve`, or forked by the fork
server with its listening socket bound, or a promoted standby that received it), becomes the coordinator: it binds
a Unix socket in a private runtime directory (`fakes.gym.workers.runtime`) and forks its workers, each of which
starts its event loop and lifespan and waits; then it hands every worker the listening socket (SCM_RIGHTS over a socket
pair, as the fork server hands one to a standby), closes its own copy and serves no HTTP. A standby of the fork server
does all of this but the hand-off before it is promoted, so a restart waits for no fork and no lifespan. The
workers all accept on the one listening socket, as uvicorn's own `--workers` does. One shared socket rather than
SO_REUSEPORT, because: the fork server hands a server exactly one pre-bound socket, so sharing it needs nothing new
from the fork server; a crash closes that one socket with the group, so a crashed server refuses connections as a
single process does; and no other process of the user can join the port, as any could with SO_REUSEPORT. The kernel
spreads connections over the workers waiting in accept (measured here: 16 concurrent connections split 9-13 to
3-7 between two workers).

Workers stay in the coordinator's process group, so a crash (SIGKILL of the group) takes them all. A worker asks to
be killed with its coordinator (PR_SET_PDEATHSIG) and stops when its channel closes; the coordinator exits when no
worker is left. A SIGKILLed coordinator cannot reap its workers: they are re-parented to the nearest child subreaper,
which the fork server is (`fakes.processes.zygote`), or else to init, which on these machines reaps orphans only every
1-1.5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import uvicorn

from fakes.gym.config import ServerConfig
from fakes.gym.workers.coordinator import WorkerPool
from fakes.gym.workers.runtime import make_runtime_dir, remove_runtime_dir
from fakes.gym.workers.worker_process import HANDOFF_GO, HANDOFF_READY, STARTUP_FAILURE_EXIT, run_worker

log = logging.getLogger(__name__)

UNIX_BACKLOG = 64


@attrs.frozen
class Forked:
    """A worker forked by this coordinator, and the coordinator's end of its hand-off channel."""

    pid: int
    handoff: socket.socket


def fork_worker(index: int, name: str, app_config: uvicorn.Config, inherited: Sequence[socket.socket]) -> Forked:
    """Fork worker `index`: it builds its server from `app_config` (whose app's `state.worker_link` it registers)
    and waits for the listening socket on its hand-off channel. The child closes `inherited`."""
    coordinator_pid = os.getpid()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        ours.close()
        for sock in inherited:
            sock.close()
        run_worker(index, name, app_config, theirs, coordinator_pid)
    theirs.close()
    return Forked(pid, ours)


def _wait_built(workers: Sequence[Forked]) -> bool:
    """Wait until every worker has its loop and lifespan up (it says READY); False if one died first."""
    built = True
    for worker in workers:
        try:
            built = worker.handoff.recv(len(HANDOFF_READY)) == HANDOFF_READY and built
        except OSError:
            built = False
    return built


def serve_with_workers(
    config: ServerConfig,
    *,
    assemble: Callable[[ServerConfig, WorkerPool], Any],
    socket_env: str,
    listening: socket.socket | Callable[[], socket.socket | None],
    app_config: uvicorn.Config,
    on_serving: Callable[[], None] | None = None,
) -> int:
    """Run a multi-worker server in this process until every worker is gone or SIGTERM/SIGINT; the exit code.

    The workers are forked and built first, then handed the listening socket: `listening` itself, or what
    `listening()` returns (a standby's blocks until the fork server promotes it, and returns None if it stands
    down instead). `app_config` is uvicorn's config with the worker app;
    `assemble(config, pool)` builds the coordinator's control plane on the pool; `on_serving` runs once every
    worker has registered (a promoted standby says SERVING then)."""
    directory = make_runtime_dir(os.getpid())
    path = directory / f"{config.name}-{secrets.token_hex(4)}.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    workers: list[Forked] = []
    try:
        unix.bind(str(path))
        path.chmod(0o600)
        unix.listen(UNIX_BACKLOG)
        os.environ[socket_env] = str(path)
        held = [unix, *([listening] if isinstance(listening, socket.socket) else [])]
        workers = [fork_worker(index, config.name, app_config, held) for index in range(config.workers)]
        if not _wait_built(workers):
            print(f"a worker of {config.name} died while it started; see above", file=sys.stderr, flush=True)
            return STARTUP_FAILURE_EXIT
        if isinstance(listening, socket.socket):
            sock: socket.socket | None = listening
        else:
            sock = listening()
        if sock is None:
            return 0  # a standby that stood down
        with sock:  # the workers get it; a coordinator serves no HTTP
            for worker in workers:
                with contextlib.suppress(OSError):  # one that died is noticed by the coordinator's reaping
                    socket.send_fds(worker.handoff, [HANDOFF_GO], [sock.fileno()])
        for worker in workers:
            worker.handoff.close()
        return asyncio.run(_coordinate(config, unix, [worker.pid for worker in workers], assemble, on_serving))
    finally:
        unix.close()
        for worker in workers:
            worker.handoff.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)
        remove_runtime_dir(os.getpid())


async def _coordinate(
    config: ServerConfig,
    unix: socket.socket,
    pids: list[int],
    assemble: Callable[[ServerConfig, WorkerPool], Any],
    on_serving: Callable[[], None] | None,
) -> int:
    """The coordinator's loop: accept workers, serve their requests, exit when all are gone or on a stop signal."""
    loop = asyncio.get_running_loop()
    pool = WorkerPool(config.workers)
    control_plane = assemble(config, pool)
    stop = asyncio.Event()
    forked = set(pids)

    def reap() -> None:
        for pid in list(forked):
            with contextlib.suppress(ChildProcessError):
                reaped, status = os.waitpid(pid, os.WNOHANG)
                if reaped == 0:
                    continue
                log.warning("worker %d exited with %d", pid, os.waitstatus_to_exitcode(status))
            forked.discard(pid)
            pool.left = True
        if not forked:
            pool.empty.set()

    loop.add_signal_handler(signal.SIGCHLD, reap)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reap()  # a worker that died before the handler was installed
    server = await asyncio.start_unix_server(pool.accept, sock=unix)
    joined = asyncio.ensure_future(pool.all_joined.wait())
    ended = [asyncio.ensure_future(pool.empty.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait({joined, *ended}, return_when=asyncio.FIRST_COMPLETED)
        if joined.done() and on_serving is not None:
            on_serving()
        await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (joined, *ended):
            task.cancel()
        server.close()
        await control_plane.close()
    if stop.is_set():
        return 0
    print(f"every worker of {config.name} exited; the server stops", file=sys.stderr, flush=True)
    return 1
