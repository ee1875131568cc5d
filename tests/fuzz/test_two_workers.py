"""Many machines, one example database: a HypoFuzz worker finds a planted fault and saves it to a shared Redis
database; another process, generating nothing, replays it from there and fails by the same property.

Worker A is `python -m ckpt_model.search.fuzz worker`: HypoFuzz over the state machine against a stack with
`agent_retire_keeps_sessions` planted (P7; found in seconds). As soon as the failure is in Redis under the key plain
Hypothesis uses for `machine_for(harness)` (HypoFuzz saves it there unshrunk at once, shrunk later), A is stopped
with SIGTERM and leaves no process and no directory behind. Worker B is `python -m ckpt_model.search.fuzz replay`:
`run_state_machine_as_test(machine_for(harness))` with only the reuse phase, on a fresh deployment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import psutil
import pytest
import redis
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import get_state_machine_test

from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.trainer.machine import machine_for
from fakes.faults import BY_NAME

# End to end, what the default run checks in parts (the database key against a real harness in test_targets.py,
# examples saved by one process and read by another through Redis in test_shared_database.py): a minute of two
# loaded cores, so the nightly's deep step runs it (`pytest -m deep`), which installs redis-server as CI does.
pytestmark = [pytest.mark.processes, pytest.mark.deep]

FAULT = "agent_retire_keeps_sessions"
PREFIX = b"hypothesis-example:"
# Guards against a hang, not a speed requirement: A finds this fault in well under a minute on 2 busy cores.
FOUND_GUARD_S = 600.0
GONE_GUARD_S = 60.0
WORKER = [sys.executable, "-m", "ckpt_model.search.fuzz"]


def plain_hypothesis_key(target: DeploymentSpec) -> bytes:
    """The database key of `run_state_machine_as_test(machine_for(harness))` for a harness of `target`."""
    test = get_state_machine_test(machine_for(cast("Harness", SimpleNamespace(spec=target))))
    return function_digest(test.hypothesis.inner_test)  # type: ignore[attr-defined]


def saved_failures(client: redis.Redis, key: bytes) -> int:
    """Failing examples saved under `key`: shrunk (the key itself) and unshrunk (`.secondary`)."""
    return int(client.scard(PREFIX + key)) + int(client.scard(PREFIX + key + b".secondary"))


def wait_for_failure(worker: subprocess.Popen[str], client: redis.Redis, key: bytes, log_path: Path) -> None:
    """Until a failure is saved under `key`; pausing on the worker's own exit, which would end the wait."""
    waited_s = 0.0
    while not saved_failures(client, key):
        assert waited_s < FOUND_GUARD_S, f"worker A saved no failure in {FOUND_GUARD_S} s"
        try:
            worker.wait(0.2)
        except subprocess.TimeoutExpired:
            waited_s += 0.2
            continue
        raise AssertionError(f"worker A exited ({worker.returncode}) before saving a failure:\n{log_path.read_text()}")


def found_by(client: redis.Redis, key: bytes) -> set[str]:
    """What HypoFuzz recorded as each saved failure's origin ("P7Violation at quiescence.py:227"), the exception
    type only."""
    observations = [full for full in client.scan_iter() if full.startswith(PREFIX + key + b".hypofuzz.failures.")]
    reasons = [json.loads(seen)["status_reason"] for full in observations for seen in client.smembers(full)]
    return {reason.split(" at ")[0] for reason in reasons}


def test_a_failure_one_worker_finds_replays_on_another_from_the_shared_database(redis_url: str, tmp_path: Path) -> None:
    target = DeploymentSpec("native", "wait", (FAULT,))
    key = plain_hypothesis_key(target)
    client = redis.Redis.from_url(redis_url)
    # Short: HypoFuzz's multiprocessing manager listens on a socket file in here (108 bytes at most).
    worker_tmp = Path(tempfile.mkdtemp(prefix="fuzz-a-", dir="/tmp"))
    environ = os.environ | {"TMPDIR": str(worker_tmp)}

    command = [*WORKER, "worker", "--redis", redis_url, "-n", "1", "--faults", FAULT]
    log_path = tmp_path / "worker-a.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(command, env=environ, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_failure(worker, client, key, log_path)
            started = psutil.Process(worker.pid).children(recursive=True)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait()
    output = log_path.read_text()
    assert worker.returncode == 128 + signal.SIGTERM, output
    assert "HypoFuzz" in output
    # Everything A started, its harness too, is gone (the backend and the fork server stop with their parent).
    _, left = psutil.wait_procs(started, timeout=GONE_GUARD_S)
    assert not left, f"left running: {left}"
    assert list(worker_tmp.iterdir()) == []
    worker_tmp.rmdir()

    # A bug with more than one symptom shows the one the search reaches first (`Fault.also_shows_as`).
    hypofuzz_saw = found_by(client, key)
    assert hypofuzz_saw, "the worker saved no failure"
    assert hypofuzz_saw <= {f"{shown}Violation" for shown in BY_NAME[FAULT].shows_as}, hypofuzz_saw

    replay = subprocess.run(
        [*WORKER, "replay", "--redis", redis_url, "--faults", FAULT], capture_output=True, text=True, check=False
    )
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert any(f"FAILED: property violation ({shown})" in replay.stdout for shown in BY_NAME[FAULT].shows_as)
