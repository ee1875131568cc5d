"""`pytest -n auto` starts one worker more than pytest-xdist's count (tests/conftest.py), unless its own setting
chose the count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from tests.conftest import AUTO_NUM_WORKERS_ENV, auto_num_workers

ROOT = Path(__file__).resolve().parents[3]


def test_one_worker_more_than_one_per_core() -> None:
    assert auto_num_workers(2, {}) == 3
    assert auto_num_workers(2, {AUTO_NUM_WORKERS_ENV: " "}) == 3


def test_pytest_xdist_s_own_setting_is_taken_as_it_is() -> None:
    assert auto_num_workers(5, {AUTO_NUM_WORKERS_ENV: "5"}) == 5


def test_a_run_with_n_auto_starts_that_many_workers() -> None:
    environ = {key: value for key, value in os.environ.items() if key != AUTO_NUM_WORKERS_ENV}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "auto", "-p", "no:cacheprovider", __file__, "-k", "core"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    expected = (psutil.cpu_count(logical=False) or psutil.cpu_count()) + 1
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert f"created: {expected}/{expected} workers" in completed.stdout, completed.stdout
