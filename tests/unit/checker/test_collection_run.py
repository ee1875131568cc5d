"""`CollectionRun` and `CollectionAudit` with a stand-in program and hand-built directories: the config handed over,
signals to the run alone, a run that never exits killed and reported as a harness error, and LATEST remembered
across runs."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from ckpt_model.deployments.collection_run import CollectionAudit, CollectionRun, CollectionRunError
from ckpt_model.properties.collection import P22Violation, P23Violation
from tests.unit.checker.test_collection_properties import IDS, KINDS, checkpoint

# Echoes its config's `say` on SIGUSR1 and exits 75 on SIGTERM, or waits for ever.
STAND_IN = """
import json, signal, sys, time
config = json.load(open(sys.argv[1]))
signal.signal(signal.SIGUSR1, lambda *_: print(config["say"], flush=True))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def start(tmp_path: Path, number: int = 0) -> CollectionRun:
    config = {"checkpoint_dir": str(tmp_path / "ckpt"), "say": "checkpoint asked"}
    return CollectionRun([sys.executable, "-c", STAND_IN], config, tmp_path, number)


def logged(run: CollectionRun, line: str, timeout_s: float = 30.0) -> bool:
    """Poll the run's log until it holds `line`; whether it did within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while line not in run.log().splitlines():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_run_reads_its_config_and_takes_its_signals(tmp_path: Path) -> None:
    run = start(tmp_path)
    try:
        assert json.loads(run.config_path.read_text())["say"] == "checkpoint asked"
        assert logged(run, "ready")
        run.signal(signal.SIGUSR1)
        assert logged(run, "checkpoint asked")
        run.signal(signal.SIGTERM)
        assert run.wait() == 75
        run.signal(signal.SIGTERM)  # once it exited, nothing is signalled
    finally:
        run.kill()


def test_a_run_that_does_not_exit_in_time_is_killed_and_is_a_harness_error(tmp_path: Path) -> None:
    run = start(tmp_path)

    with pytest.raises(CollectionRunError, match=r"did not exit within 0\.2 s"):
        run.wait(timeout_s=0.2)
    assert run.process.returncode == -signal.SIGKILL


def test_the_audit_remembers_latest_across_runs(tmp_path: Path) -> None:
    audit = CollectionAudit(tmp_path, KINDS, "environment")
    checkpoint(tmp_path, IDS[1], 5.0, ["a"])
    audit.exited(75, latest_at_start=None)
    checkpoint(tmp_path, IDS[0], 1.0, ["a"])  # a later run points LATEST at an older checkpoint

    with pytest.raises(P22Violation, match="moves forward"):
        audit.exited(0, latest_at_start=IDS[1])


def test_the_audit_refuses_exit_75_without_a_new_checkpoint(tmp_path: Path) -> None:
    audit = CollectionAudit(tmp_path, KINDS, "environment")
    checkpoint(tmp_path, IDS[1], 5.0, ["a"])

    with pytest.raises(P23Violation, match="exit 75"):
        audit.exited(75, latest_at_start=IDS[1])
