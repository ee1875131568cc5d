"""Loopback ports for the stack's servers, each reserved for as long as the process that took it lives.

The reservation is a one-byte lock at offset `port` of `PORT_LOCK_PATH` (one file per user): the kernel drops a
process's locks however it ends, SIGKILL included. Ports belong to the machine, so the file does too: not under
$TMPDIR, which differs between processes.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import threading
from pathlib import Path

PORT_RANGE = (20000, 32767)
PORT_LOCK_PATH = Path("/tmp") / f"ckpt-model-ports-{os.getuid()}.lock"
PORT_TRIES_MAX = 1000

_handed_out: set[int] = set()
_port_lock_fd: int | None = None
_port_mutex = threading.Lock()


def free_port() -> int:
    """A loopback port in 20000-32767 that binds now and that no live process of this user has taken.

    Checkers run side by side (pytest-xdist workers, HypoFuzz workers, several `ckpt-model check`), and a port stays
    its server's across restarts, while nothing listens on it: a bind probe alone would hand it to another process
    then. So each port handed out is locked in `PORT_LOCK_PATH` (POSIX byte-range locks, per process; a child does
    not inherit them) and a port another process holds is skipped. The range lies below the kernel's ephemeral
    ports (32768-60999), so no outgoing connection takes one meanwhile."""
    global _port_lock_fd
    with _port_mutex:
        if _port_lock_fd is None:
            _port_lock_fd = os.open(PORT_LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
        for _ in range(PORT_TRIES_MAX):
            port = secrets.choice(range(*PORT_RANGE))
            if port in _handed_out:
                continue
            try:
                fcntl.lockf(_port_lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except OSError:
                continue  # another process holds it
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    fcntl.lockf(_port_lock_fd, fcntl.LOCK_UN, 1, port)
                    continue
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free loopback port in 20000-32767 after {PORT_TRIES_MAX} tries")
