"""`python -m fakes.stack` as a person uses it: launch, describe, drive with plain HTTP, crash, relaunch, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.stack.conftest import group_gone, wait_until

pytestmark = pytest.mark.processes
STATUS = "/ng-control/v1/checkpoint/status"


def launch(state_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "fakes.stack", "--topology", "native", "--state-dir", str(state_dir), *extra]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def stop(launcher: subprocess.Popen[bytes]) -> None:
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 0, stderr.decode(errors="replace")


def test_the_launcher_serves_a_described_deployment_and_stops_everything(tmp_path: Path) -> None:
    first = launch(tmp_path / "first")
    try:
        description_path = tmp_path / "first" / "deployment.json"
        wait_until(description_path.exists, "deployment.json")
        described = json.loads(description_path.read_text())
        assert sorted(described["servers"]) == ["agent", "environment", "policy_model", "resources"]
        environment = described["servers"]["environment"]["url"]
        with httpx.Client(trust_env=False) as http:
            assert http.get(environment + STATUS).status_code == 401
            bearer = {"Authorization": f"Bearer {described['token']}"}
            assert http.get(environment + STATUS, headers=bearer).json()["phase"] == "idle"

            # A crash kills the Gym process groups; a second launcher brings up fresh Gym against the same backend.
            for server in described["servers"].values():
                os.killpg(server["pgid"], signal.SIGKILL)
            for server in described["servers"].values():
                wait_until(lambda pgid=server["pgid"]: group_gone(pgid), f"process group {server['pgid']} to end")
            second = launch(tmp_path / "second", "--backend-url", described["backend"]["url"], "--token", "t0ken")
            try:
                again_path = tmp_path / "second" / "deployment.json"
                wait_until(again_path.exists, "the relaunched deployment.json")
                again = json.loads(again_path.read_text())
                assert again["backend"]["url"] == described["backend"]["url"]
                assert again["backend"]["pgid"] is None
                status = http.get(again["servers"]["agent"]["url"] + STATUS, headers={"Authorization": "Bearer t0ken"})
                assert status.json()["kind"] == "agent"
            finally:
                stop(second)
            for server in again["servers"].values():
                wait_until(lambda pgid=server["pgid"]: group_gone(pgid), "the relaunched Gym to stop")
    finally:
        stop(first)
    wait_until(lambda: group_gone(described["backend"]["pgid"]), "the backend to stop")


OWNER = """
import sys, threading
from pathlib import Path
from fakes.stack.launcher import Stack
stack = Stack("native", Path(sys.argv[1]))
stack.start_backend()
print(stack.backend.pid, flush=True)
threading.Event().wait()
"""


def test_an_owner_killed_with_sigterm_leaves_no_backend_behind(tmp_path: Path) -> None:
    """SIGTERM skips atexit; the backend still stops, because its stdin pipe from the owner closes."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert owner.stdout is not None
        backend_pid = int(owner.stdout.readline())
        owner.send_signal(signal.SIGTERM)
        owner.wait(timeout=30)
    finally:
        owner.kill()
        owner.wait(timeout=30)
        if owner.stdout is not None:
            owner.stdout.close()
    wait_until(lambda: group_gone(backend_pid), "the orphaned backend to stop")
