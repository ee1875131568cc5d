"""libfaketime as the look-alike's servers preload it: which settings they get, and that timed waits keep their real
length at any skew with the library's monotonic fix off (it doubled the servers' CPU; `fakes.clock`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakes import clock

SKEWS_S = (600.0, -600.0)
# Each wait in the child lasts this long; a wait that returned early or waited out the skew shows beside it.
WAIT_S = 0.1
# The child's own bound on the whole run, far below the skew: a wait that waited the skew out fails it.
CHILD_TIMEOUT_S = 120.0

CHILD = """
import asyncio, json, os, sys, threading, time
os.environ["FAKETIME"] = sys.argv[1]  # as POST /_ctl/clock sets it, from inside the process
wait_s = float(sys.argv[2])

def timed(wait):
    started = time.perf_counter()
    wait()
    return time.perf_counter() - started

def condition_wait():
    condition = threading.Condition()
    with condition:
        condition.wait(wait_s)

def locked_acquire():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire(timeout=wait_s)

print(json.dumps({
    "wall_ahead_s": time.time() - float(sys.argv[3]),
    "event": timed(lambda: threading.Event().wait(wait_s)),
    "condition": timed(condition_wait),
    "lock": timed(locked_acquire),
    "asyncio_sleep": timed(lambda: asyncio.run(asyncio.sleep(wait_s))),
}))
"""


def fake_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "libfaketimeMT.so.1"
    path.write_bytes(b"")
    monkeypatch.setenv(clock.LIBRARY_ENV, str(path))
    return str(path)


def test_a_true_monotonic_clock_turns_the_monotonic_fix_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library = fake_library(tmp_path, monkeypatch)
    env = clock.preloaded_env({"LD_PRELOAD": "other.so"})
    assert env["LD_PRELOAD"] == f"{library} other.so"
    assert (env["FAKETIME"], env["FAKETIME_NO_CACHE"], env["FAKETIME_DONT_FAKE_MONOTONIC"]) == ("+0", "1", "1")
    assert env[clock.MONOTONIC_FIX_ENV] == "0"


def test_a_clock_whose_time_passes_keeps_the_monotonic_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """There the monotonic clock is faked too, so its deadlines need the library's conversion."""
    fake_library(tmp_path, monkeypatch)
    env = clock.preloaded_env({}, monotonic=True)
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == "0"
    assert clock.MONOTONIC_FIX_ENV not in env


def test_without_the_library_nothing_is_preloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.LIBRARY_ENV, str(tmp_path / "absent.so"))
    assert clock.preloaded_env({"A": "1"}) == {"A": "1"}


@pytest.mark.skipif(clock.library() is None, reason="needs Debian's faketime (libfaketime), as .ci/run installs")
@pytest.mark.parametrize("skew_s", SKEWS_S, ids=lambda skew: f"{skew:+g}s")
def test_timed_waits_keep_their_length_at_any_skew(skew_s: float) -> None:
    env = clock.preloaded_env({key: value for key, value in os.environ.items() if key != "LD_PRELOAD"})
    done = subprocess.run(
        [sys.executable, "-c", CHILD, f"{skew_s:+.3f}", str(WAIT_S), str(time.time())],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen.pop("wall_ahead_s") == pytest.approx(skew_s, abs=30.0), "the wall clock follows the skew"
    for wait, took_s in seen.items():
        assert WAIT_S * 0.9 <= took_s < abs(skew_s), f"{wait} took {took_s:.3f} s for a {WAIT_S} s wait"
