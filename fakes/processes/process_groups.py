"""Process groups: signal one, wait (bounded) until it is gone, say who is left in one that will not go.

Every server runs as the leader of its own process group, so a crash is `kill(pgid)`. Its parent must reap the
leader before the group is gone: `killpg(pgid, 0)` still succeeds while only zombies remain (SPEC section 11), so
`wait_gone` calls the caller's `reap` on every poll.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

# A SIGKILLed server is usually gone within a few milliseconds: polling starts this fine and backs off to the
# interval. A poll costs microseconds (a signal 0 and a read of /proc), and every millisecond waited past the
# group's end is a millisecond added to every restart.
GONE_POLL_FIRST_S = 0.0002
GONE_POLL_INTERVAL_S = 0.001


def kill(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to every process in group `pgid`; a group that is gone already is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def gone(pgid: int) -> bool:
    """No process is left in the group (zombies count as present until their parent reaps them)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pgid: int, reap: Callable[[], object], timeout_s: float) -> bool:
    """Poll until group `pgid` is gone, calling `reap` first each time (it collects the leader if it is a zombie);
    False if the group is still there after `timeout_s`."""

    def reaped_and_gone() -> bool:
        reap()
        return gone(pgid)

    return poll_until(reaped_and_gone, timeout_s)


def poll_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` (backing off as `wait_gone` does) until it holds; False if it still fails after
    `timeout_s`."""
    deadline_s = time.monotonic() + timeout_s
    interval_s = GONE_POLL_FIRST_S
    while not condition():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(interval_s)
        interval_s = min(interval_s * 2, GONE_POLL_INTERVAL_S)
    return True


def process_state(pid: int) -> str | None:
    """The one-letter state `/proc` shows for `pid` (R, S, D, Z, ...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _member_stats(pgid: int) -> list[tuple[str, str, str]]:
    """`(pid, state, ppid)` of every process in group `pgid`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                found.append((entry.name, fields[0], fields[1]))
    return found


def members(pgid: int) -> str:
    """`pid state ppid` of every process left in a group, for an error message a person can act on."""
    found = [f"pid {pid} state {state} parent {parent}" for pid, state, parent in _member_stats(pgid)]
    return "; ".join(found) or "no members visible"


def all_stopped(pgid: int) -> bool:
    """Every process of group `pgid` is stopped by a signal (state T), so a SIGSTOP has landed on each."""
    stats = _member_stats(pgid)
    return bool(stats) and all(state == "T" for _, state, _ in stats)


def none_stopped(pgid: int) -> bool:
    """No process of group `pgid` is stopped any more, so a SIGCONT has landed on each."""
    return all(state != "T" for _, state, _ in _member_stats(pgid))
