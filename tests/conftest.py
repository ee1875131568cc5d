"""For the whole suite: how many workers `pytest -n auto` starts, and bytecode kept for the processes it starts.

The suite mostly waits on real processes (settles polling servers, leases lapsing, held model calls), so one
worker per core leaves the cores part idle: `-n auto` starts one worker more than pytest-xdist would (docs/parallel.md
has the figures). `PYTEST_XDIST_AUTO_NUM_WORKERS`, pytest-xdist's own setting, is taken as it is.
"""

from __future__ import annotations

import compileall
import os
import sys
from collections.abc import Generator, Mapping
from pathlib import Path

import pytest

AUTO_NUM_WORKERS_ENV = "PYTEST_XDIST_AUTO_NUM_WORKERS"
EXTRA_WORKERS = 1
ROOT = Path(__file__).resolve().parent.parent


def auto_num_workers(xdist_count: int, environ: Mapping[str, str] = os.environ) -> int:
    """The workers `-n auto` starts: pytest-xdist's count (one per core), plus one unless its setting chose."""
    if environ.get(AUTO_NUM_WORKERS_ENV, "").strip():
        return xdist_count
    return xdist_count + EXTRA_WORKERS


# Set on some machines (these among them): every Python process the suite starts (the CLI, fork servers, backends,
# collectors, pytest runs, hundreds in all) would compile the project's modules anew and every worker would rewrite
# the test modules' asserts anew. The suite lets Python keep bytecode in `__pycache__` (ignored by git), as it does
# by default, and compiles the project's packages once before any worker starts, so that no two processes starting
# at once compile the same module.
BYTECODE_OFF_ENV = "PYTHONDONTWRITEBYTECODE"
PACKAGES = (ROOT / "src" / "ckpt_model", ROOT / "fakes")
# Every `check` explores the contract model for its transition coverage and keeps what it explored where
# `CKPT_MODEL_EXPLORED` says (`ckpt_model.search.transition_coverage`): one directory for the whole suite, so the CLI
# tests, each in a directory of its own, explore each deployment once between them, not once each.
EXPLORED_ENV = "CKPT_MODEL_EXPLORED"


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode is written from here on, by this process and every process it starts (xdist workers included); the
    controller (not a worker) compiles what has changed since the last run."""
    os.environ.pop(BYTECODE_OFF_ENV, None)
    os.environ.setdefault(EXPLORED_ENV, str(ROOT / ".ckpt-model" / "explored"))
    sys.dont_write_bytecode = False
    if not hasattr(config, "workerinput"):
        for package in PACKAGES:
            compileall.compile_dir(package, quiet=1)


# Optional: a run without pytest-xdist (`-p no:xdist`) does not know the hook.
@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> Generator[None, int, int]:
    return auto_num_workers((yield))
