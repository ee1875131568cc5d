"""The real-Gym adapter drives our stack through the seam, as a user pointing it at a real Gym would.

The stack runs as an outside deployment: a backend the checker does not own, and a launcher started by a command
that also serves a look-alike of Gym's head server. The adapter finds the servers from the head server, crashes
them by the process groups the launcher describes, and starts them again with the same command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from ckpt_model.deployments.gym import GymDeployment
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.process_groups import described_pgids
from ckpt_model.search.deployment_scenarios import named
from ckpt_model.search.profiles import BASE
from ckpt_model.search.scenarios import run
from ckpt_model.trainer.machine import machine_for
from fakes.processes.ports import free_port
from tests.stack.conftest import process_gone, wait_until

pytestmark = pytest.mark.processes
TOKEN = "real-gym-token"


@pytest.fixture
def outside_backend(tmp_path: Path) -> Iterator[str]:
    """A backend started by someone else, outliving every crash of Gym."""
    port = free_port()
    with (tmp_path / "backend.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "fakes.backend", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url + "/v1/models"), "the backend to answer", 30)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def deployment(tmp_path: Path, backend_url: str, *, gated: bool) -> GymDeployment:
    head_port = free_port()
    state_dir = tmp_path / "gym"
    start = [
        sys.executable,
        "-m",
        "fakes.stack",
        "--topology",
        "native",
        "--state-dir",
        str(state_dir),
        "--backend-url",
        backend_url,
        "--token",
        TOKEN,
        "--head-port",
        str(head_port),
        "--lease-grace-s",
        "0.25",
    ]
    return GymDeployment(
        head_url=f"http://127.0.0.1:{head_port}",
        token=TOKEN,
        start_command=start,
        logs_dir=tmp_path / "logs",
        backend_url=backend_url if gated else None,
        description_file=state_dir / "deployment.json",
        lease_grace_s=0.25,
    )


def test_the_adapter_runs_fixed_scenarios_against_a_gym_it_did_not_start(tmp_path: Path, outside_backend: str) -> None:
    gym = deployment(tmp_path, outside_backend, gated=True)
    with Harness(gym) as harness:
        run(harness, named("crash_after_prepare__continues_from_boundary"))
        pgids = described_pgids(gym.description_file)
        run(harness, named("quiet_controller__lease_lapses_and_admission_reopens"))
    assert pgids
    wait_until(lambda: all(process_gone(pgid) for pgid in pgids), "every Gym process of the last start to be gone", 10)


def test_without_a_gated_backend_the_machine_checks_the_control_plane_only(
    tmp_path: Path, outside_backend: str
) -> None:
    """No model call can be held, so no rollout is dispatched: fencing, replay, the lease, empty checkpoints,
    crashes and restores are still checked (P1, P9, P10, P13)."""
    gym = deployment(tmp_path, outside_backend, gated=False)
    with Harness(gym) as harness:
        assert harness.backend is None
        run_state_machine_as_test(
            machine_for(harness),
            settings=settings(BASE, max_examples=2, stateful_step_count=6, derandomize=True, database=None),
        )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code < 500
    except httpx.HTTPError:
        return False
