"""Skewed clocks and time passing: Debian's libfaketime preloaded into every Gym server, each one's offset set from
inside it.

libfaketime (`LD_PRELOAD`) fakes the wall clock of a process (`clock_gettime(CLOCK_REALTIME)`, so `time.time()`);
with `FAKETIME_NO_CACHE=1` it reads the offset from the process's own `FAKETIME` variable on every call, so a server
can be skewed at any moment by setting that variable in it (`POST /_ctl/clock`), and the servers forked from one
fork server each keep their own. The monotonic clock stays true (`FAKETIME_DONT_FAKE_MONOTONIC=1`): asyncio's
timers measure real durations, and only what is compared with `deadline_ts` and the lease, absolute wall times,
moves. File times are left alone (`NO_FAKE_STAT=1`). Without the library nothing is preloaded and no server can be
skewed (the checker then never draws a skew).

With `monotonic=True` (a deployment whose time can pass, `Stack(time_jumps=True)`) the monotonic clock follows the
offset too: libfaketime then reads it on the wall clock's scale (about 1.8e9 s, from the process's start, so
nothing jumps), and an offset moves both clocks at once, as if that much time had passed: asyncio's timers due by
then fire at the loop's next turn, and an episode's budget sees the time. An offset that only skews the wall clock
is then impossible, so such a deployment never skews one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# Where Debian's libfaketime puts its thread-safe variant (package `libfaketime`, pulled in by `faketime`); the
# environment variable names another file.
LIBRARY_ENV = "CKPT_MODEL_LIBFAKETIME"
LIBRARY_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)
OFFSET_ENV = "FAKETIME"
MONOTONIC_FIX_ENV = "FAKETIME_FORCE_MONOTONIC_FIX"


def library() -> str | None:
    """The libfaketime to preload, or None when this machine has none."""
    named = os.environ.get(LIBRARY_ENV)
    candidates = (named,) if named else LIBRARY_PATHS
    return next((path for path in candidates if path and Path(path).is_file()), None)


def preloaded_env(base: Mapping[str, str], *, monotonic: bool = False) -> dict[str, str]:
    """`base` with libfaketime preloaded at offset zero, when the machine has it; else `base` unchanged.
    `monotonic`: the offset moves the monotonic clock too (time passes; see the module)."""
    env = dict(base)
    path = library()
    if path is None:
        return env
    env["LD_PRELOAD"] = " ".join(part for part in (path, env.get("LD_PRELOAD", "")) if part)
    env.update({OFFSET_ENV: "+0", "FAKETIME_NO_CACHE": "1", "NO_FAKE_STAT": "1"})
    env["FAKETIME_DONT_FAKE_MONOTONIC"] = "0" if monotonic else "1"
    # libfaketime's "monotonic fix" wraps every timed condition-variable wait (CPython's GIL hand-over among them)
    # to convert a faked monotonic deadline, blocking and restoring signals and reading its settings each time. With
    # the monotonic clock true there is nothing to convert, and the fix doubled the servers' CPU in the default
    # suite (a GIL contended by two threads spent as much time in sigprocmask as in Python). Timed waits of every
    # kind take the same time with it off, at any skew (`tests/unit/fakes/test_clock.py`).
    if not monotonic:
        env[MONOTONIC_FIX_ENV] = "0"
    return env


def skewable() -> bool:
    """Whether this process runs with libfaketime preloaded (its clock follows `FAKETIME`)."""
    return "faketime" in os.environ.get("LD_PRELOAD", "")


def set_offset(offset_s: float) -> None:
    """Move this process's wall clock `offset_s` seconds from the true time (0 puts it back)."""
    os.environ[OFFSET_ENV] = f"{offset_s:+.3f}"


def offset() -> float:
    return float(os.environ.get(OFFSET_ENV, "+0"))
