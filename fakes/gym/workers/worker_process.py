"""A worker process's life: forked by its coordinator (`fakes.gym.workers.coordinator_process`), it builds its uvicorn
server, waits for the listening socket, serves it, and stops with its coordinator.

A worker stays in the coordinator's process group, so a crash (SIGKILL of the group) takes it too. It asks to be
killed with its coordinator (PR_SET_PDEATHSIG) and stops when its channel closes.

Besides the shared listening socket, each worker serves a private Unix socket beside its coordinator's
(`fakes.gym.workers.placement.private_socket_path`): its siblings forward there the calls placed on it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import traceback
from typing import NoReturn

import uvicorn

from fakes.gym.workers.fd_passing import receive_fds
from fakes.gym.workers.link import WorkerLink
from fakes.gym.workers.placement import private_socket_path

# A worker whose coordinator is gone exits with this (EX_SOFTWARE); one that could not register, with 3 (uvicorn's
# STARTUP_FAILURE).
COORDINATOR_LOST_EXIT = 70
STARTUP_FAILURE_EXIT = 3
# Coordinator <-> worker hand-off of the listening socket, as between the fork server and a standby.
HANDOFF_READY = b"r"  # worker -> coordinator: loop and lifespan up, waiting for the socket
HANDOFF_GO = b"g"  # coordinator -> worker, with the listening socket's descriptor
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15
PROCESS_NAME_BYTES_MAX = 15
PRIVATE_BACKLOG = 64


class WorkerServer(uvicorn.Server):
    """A worker's uvicorn server. It starts its loop and lifespan, says READY on `handoff` and waits there for the
    listening socket its coordinator hands every worker (SCM_RIGHTS), so a promoted standby's workers are built
    before the restart that needs them; then it serves the socket, registers with its coordinator, and stops when
    the coordinator is gone. It also serves `private`, the socket its siblings forward placed calls to."""

    stood_down = False

    def __init__(
        self, config: uvicorn.Config, link: WorkerLink, handoff: socket.socket, private: socket.socket
    ) -> None:
        super().__init__(config)
        self.link = link
        self.handoff = handoff
        self.private = private

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            _flush_and_exit(STARTUP_FAILURE_EXIT)
        with contextlib.suppress(OSError):
            self.handoff.sendall(HANDOFF_READY)
        fds = await receive_fds(self.handoff, len(HANDOFF_GO))
        sock = socket.socket(fileno=fds[0]) if fds else None
        self.handoff.close()
        if sock is None:  # stood down: the coordinator is gone, or stands down itself
            self.stood_down = True
            self.should_exit = True
            return
        self.lifespan.startup = _started  # type: ignore[method-assign]  # it ran above; the base startup calls it
        await super().startup(sockets=[sock, self.private])
        if not self.started:
            return
        try:
            await self.link.start(on_lost=_coordinator_lost)
        except Exception:
            traceback.print_exc()
            print(f"worker {os.getpid()} could not register with its coordinator", file=sys.stderr, flush=True)
            _flush_and_exit(STARTUP_FAILURE_EXIT)


async def _started() -> None:
    return None


def _coordinator_lost() -> None:
    """Reference 13.1 item 29: a worker that lost its coordinator stops (at once: held replies never finish)."""
    print(f"worker {os.getpid()} lost its coordinator; stopping", file=sys.stderr)
    _flush_and_exit(COORDINATOR_LOST_EXIT)


def _flush_and_exit(code: int) -> NoReturn:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _private_socket(link: WorkerLink, index: int) -> socket.socket:
    """Worker `index`'s private Unix socket, bound and listening (mode 0600, in the coordinator's private directory)."""
    path = private_socket_path(os.environ[link.socket_env], index)
    private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    private.bind(path)
    os.chmod(path, 0o600)
    private.listen(PRIVATE_BACKLOG)
    return private


def _prctl(option: int, value: int | bytes) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value)


def run_worker(
    index: int, name: str, app_config: uvicorn.Config, handoff: socket.socket, coordinator_pid: int
) -> NoReturn:
    """In a forked worker: serve until killed or until the coordinator is gone; never returns."""
    exit_code = 1
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != coordinator_pid:
            _flush_and_exit(COORDINATOR_LOST_EXIT)  # the coordinator died before the request took effect
        _prctl(PR_SET_NAME, f"gym-w{index}-{name}".encode()[:PROCESS_NAME_BYTES_MAX])
        link: WorkerLink = app_config.app.state.worker_link
        link.index = index
        server = WorkerServer(app_config, link, handoff, _private_socket(link, index))
        server.run()
        exit_code = 0 if server.started or server.stood_down else STARTUP_FAILURE_EXIT
    except SystemExit as exit_:
        exit_code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_and_exit(exit_code)
