"""`ckpt-model check --deployment FILE` against deployments that cannot be checked: it says so in seconds, naming
the URL and what it did, exits 2 (could not judge) without a traceback, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.processes

RUN_TIMEOUT_S = 60.0
FAILS_WITHIN_S = 30.0


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check(workdir: Path, deployment: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], float]:
    path = workdir / "gym.json"
    path.write_text(json.dumps(deployment))
    env = {key: value for key, value in os.environ.items() if not key.startswith("HYPOTHESIS")}
    env["TMPDIR"] = str(workdir / "tmp")
    env["CKPT_MODEL_REGRESSIONS"] = str(workdir / "regressions")
    (workdir / "tmp").mkdir(exist_ok=True)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "ckpt_model", "check", "--deployment", str(path), "--examples", "3", "--seed", "1"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return result, time.monotonic() - started


def left_behind(workdir: Path) -> list[str]:
    """Processes that still carry the run's `TMPDIR`, and its temporary directories."""
    marker = f"TMPDIR={workdir / 'tmp'}".encode()
    processes = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                processes.append(f"pid {entry.name}: {(entry / 'cmdline').read_bytes()!r}")
        except OSError:
            continue
    return [str(path) for path in (workdir / "tmp").iterdir()] + processes


def assert_could_not_judge(result: subprocess.CompletedProcess[str], elapsed_s: float, url: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert elapsed_s < FAILS_WITHIN_S, output
    assert url in output
    assert "Traceback" not in output
    assert "bug in the checker" not in output
    assert "COULD NOT JUDGE: harness" in output
    return output


def test_an_attached_gym_whose_urls_point_at_nothing_fails_in_seconds_naming_the_url(tmp_path: Path) -> None:
    head_url = f"http://127.0.0.1:{closed_port()}"

    result, elapsed_s = check(tmp_path, {"head_url": head_url, "token": "t", "crashes": False})

    output = assert_could_not_judge(result, elapsed_s, head_url)
    assert f"pre-flight: {head_url}/global_config_dict_yaml: the head server: connection refused" in output
    assert "system:      real Gym at " + head_url + " (attached; no crashes: one example" in output
    assert "examples:    1, each of" in output  # a Gym nothing restarts serves one example
    assert left_behind(tmp_path) == []


def test_a_start_command_whose_servers_never_answer_ends_naming_the_url(tmp_path: Path) -> None:
    """The wait is the start timeout's (2 s here); then the URL that refused, and the start command is stopped."""
    servers = {"environment": f"http://127.0.0.1:{closed_port()}", "policy_model": f"http://127.0.0.1:{closed_port()}"}

    result, elapsed_s = check(
        tmp_path,
        {"servers": servers, "token": "t", "start_command": ["sleep", "300"], "start_timeout_s": 2},
    )

    output = assert_could_not_judge(result, elapsed_s, servers["environment"])
    assert f"{servers['policy_model']}/ng-control/v1/checkpoint/status: connection refused" in output
    assert "Gym did not come up within 2 s after the start command" in output
    assert left_behind(tmp_path) == []


def test_an_attached_gym_with_no_way_to_crash_it_and_crashes_on_is_a_usage_error(tmp_path: Path) -> None:
    result, _ = check(tmp_path, {"head_url": "http://127.0.0.1:1", "token": "t"})

    assert result.returncode == 3, result.stdout + result.stderr
    assert "needs 'crash_command' and 'restart_command'" in result.stderr
    assert '"crashes": false' in result.stderr
