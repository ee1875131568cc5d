"""`fuzz worker --max-time`: the workers stopped as Ctrl-C stops them, what each deployment covered and found said
from what HypoFuzz saved in the database, and the exit code of a pass when nothing new failed."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from hypothesis.database import InMemoryExampleDatabase

from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.search import fuzz

NATIVE = DeploymentSpec("native", "wait")
# Guard against a hang, not speed requirements: a worker that never stops, processes that never go.
STOPPED_GUARD_S = 600.0
GONE_GUARD_S = 60.0


def report(worker: str, timestamp: float, counts: dict[str, int], behaviors: int = 0) -> bytes:
    """A HypoFuzz report as its database holds it (the fields `covered_since` reads)."""
    fields = {"worker_uuid": worker, "timestamp": timestamp, "status_counts": counts, "behaviors": behaviors}
    return json.dumps({**fields, "fingerprints": behaviors // 2, "elapsed_time": 1.0}).encode()


def test_each_workers_latest_report_since_the_start_counts_once() -> None:
    reports = [
        report("a", 90.0, {"2": 50}, behaviors=40),  # before the run: another run's
        report("a", 101.0, {"0": 1, "1": 2, "2": 3}, behaviors=10),
        report("a", 105.0, {"0": 1, "1": 2, "2": 7, "3": 1}, behaviors=12),  # a's latest: counts since it started
        report("b", 104.0, {"2": 4}, behaviors=20),
        b"not json",
        json.dumps({"timestamp": 103.0}).encode(),  # no worker: skipped
    ]

    covered = fuzz.covered_since(reports, since=100.0)

    assert covered == fuzz.Covered(examples=15, valid=12, behaviors=20, fingerprints=10, workers=2)
    assert covered.words() == "15 examples (12 valid), 20 behaviours, 10 fingerprints, from 2 worker(s)"


def test_no_report_since_the_start_is_said_as_such() -> None:
    covered = fuzz.covered_since([report("a", 90.0, {"2": 50})], since=100.0)
    assert covered == fuzz.Covered()
    assert covered.words().startswith("no report from a worker yet")


def worker_args(**values: object) -> argparse.Namespace:
    defaults = {"redis": None, "profile": "ci", "topology": "native", "verify_mode": None, "faults": "", "max_time": 60}
    return argparse.Namespace(**(defaults | values))


def test_only_failing_examples_saved_after_the_start_fail_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    database = InMemoryExampleDatabase()
    key = fuzz.database_key(NATIVE)
    database.save(key, b"an earlier run's failure")
    bound = fuzz.TimeBound(database, [NATIVE])

    assert bound.report(worker_args(), "ckpt-model fuzz") == 0
    out = capsys.readouterr().out
    assert "stopped at its time limit (--max-time 60 s)" in out
    assert "native:wait:: no report from a worker yet" in out
    assert "0 new failing example(s) saved" in out
    assert "PASSED: no failing example found within the time limit" in out

    database.save(key + b".secondary", b"found in this run, unshrunk")
    assert bound.report(worker_args(redis="redis://h:1/0"), "ckpt-model fuzz") == 1
    out = capsys.readouterr().out
    assert "1 new failing example(s) saved" in out
    assert "ckpt-model fuzz replay --redis redis://h:1/0 --profile ci --topology native reports it" in out


def test_the_key_is_the_one_hypofuzz_and_hypothesis_share() -> None:
    from tests.fuzz.test_targets import database_key, no_harness

    assert fuzz.database_key(NATIVE) == database_key(fuzz.lazy_machine(NATIVE, no_harness))


@pytest.mark.processes
def test_a_worker_bounded_by_time_stops_cleanly_and_passes(redis_url: str, tmp_path: Path) -> None:
    """The limit is short: whether HypoFuzz got to run examples in it or not, the run ends as a pass, with nothing
    left running and no directory left behind."""
    worker_tmp = Path(tempfile.mkdtemp(prefix="fuzz-t-", dir="/tmp"))
    environ = os.environ | {"TMPDIR": str(worker_tmp)}
    command = [sys.executable, "-m", "ckpt_model.search.fuzz", "worker", "--redis", redis_url, "-n", "1"]
    command += ["--topology", "native", "--max-time", "5s"]
    worker = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started: list[psutil.Process] = []
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(0.5)  # running: HypoFuzz's group started, and runs until the limit
        started = psutil.Process(worker.pid).children(recursive=True)
        output, _ = worker.communicate(timeout=STOPPED_GUARD_S)
        left_in_tmp = list(worker_tmp.iterdir())
    finally:
        if worker.poll() is None:  # the test was interrupted: SIGTERM stops the worker's group as Ctrl-C does
            worker.terminate()
            worker.communicate()
        shutil.rmtree(worker_tmp, ignore_errors=True)
    assert worker.returncode == 0, output
    assert "time limit reached (--max-time 5 s): stopping the workers" in output
    assert "stopped at its time limit (--max-time 5 s)" in output
    assert "native:wait:: " in output
    assert "PASSED: no failing example found within the time limit" in output
    _, left = psutil.wait_procs(started, timeout=GONE_GUARD_S)
    assert not left, f"left running: {left}"
    assert left_in_tmp == []
