"""Private runtime directories of multi-worker servers: where a coordinator's Unix socket lives.

Each coordinator gets `/tmp/ckpt-workers-<uid>/<coordinator pid>/` (mode 0700; the socket in it is 0600). The path
is short on purpose: a Unix socket path has at most 107 bytes, and a state directory under pytest's `tmp_path` can
be longer than that by itself. It is `/tmp`, not `$TMPDIR`, for the same reason as the port locks in
`fakes.processes.ports`: the owner and its servers must agree on it whatever their environments say.

A coordinator removes its directory when it exits; one SIGKILLed cannot, so the owner that killed it removes it by
pid (`remove_runtime_dir`, called by `fakes.stack` after every kill), and every coordinator sweeps the directories
of dead pids when it starts. Only the standard library is imported here, so the owner pays nothing for it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

RUNTIME_ROOT = Path("/tmp") / f"ckpt-workers-{os.getuid()}"


def runtime_dir(pid: int) -> Path:
    """The runtime directory of the coordinator with process ID `pid`."""
    return RUNTIME_ROOT / str(pid)


def make_runtime_dir(pid: int) -> Path:
    """A fresh, private runtime directory for coordinator `pid` (one a dead process with the same pid left behind
    is replaced)."""
    _private_root()
    sweep_dead()
    directory = runtime_dir(pid)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700)
    return directory


def remove_runtime_dir(pid: int) -> None:
    """Remove coordinator `pid`'s runtime directory if it is there (its process is gone)."""
    shutil.rmtree(runtime_dir(pid), ignore_errors=True)


def sweep_dead() -> None:
    """Remove the runtime directories of coordinators that are no longer running."""
    with contextlib.suppress(FileNotFoundError):
        for entry in RUNTIME_ROOT.iterdir():
            if entry.name.isdigit() and not _alive(int(entry.name)):
                shutil.rmtree(entry, ignore_errors=True)


def _private_root() -> None:
    """Create the root, refusing one that is not a directory of ours (someone else's, or a symlink)."""
    with contextlib.suppress(FileExistsError):
        RUNTIME_ROOT.mkdir(mode=0o700)
    info = RUNTIME_ROOT.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeError(
            f"{RUNTIME_ROOT} must be a directory owned by uid {os.getuid()} (it is not); remove it and start again"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        RUNTIME_ROOT.chmod(0o700)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
