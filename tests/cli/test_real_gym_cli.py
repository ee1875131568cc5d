"""`ckpt-model check --deployment FILE` against deployments that cannot be checked: it says so in seconds, naming
the URL and what it did, exits 2 (could not judge) without a traceback, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.processes.ports import free_port
from tests.stack.conftest import wait_until

pytestmark = pytest.mark.processes

RUN_TIMEOUT_S = 120.0
TOKEN = "by-hand-token"


def closed_port() -> int:
    """A loopback port nothing listens on (below the ephemeral range, so no outgoing connection takes it)."""
    return free_port()


def check(workdir: Path, deployment: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = workdir / "gym.json"
    path.write_text(json.dumps(deployment))
    env = {key: value for key, value in os.environ.items() if not key.startswith("HYPOTHESIS")}
    env["TMPDIR"] = str(workdir / "tmp")
    env["CKPT_MODEL_REGRESSIONS"] = str(workdir / "regressions")
    (workdir / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_model", "check", "--deployment", str(path), "--examples", "3", "--seed", "1"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


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


def assert_could_not_judge(result: subprocess.CompletedProcess[str], url: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert url in output
    assert "Traceback" not in output
    assert "bug in the checker" not in output
    assert "COULD NOT JUDGE: harness" in output
    return output


def test_an_attached_gym_whose_urls_point_at_nothing_fails_in_seconds_naming_the_url(tmp_path: Path) -> None:
    head_url = f"http://127.0.0.1:{closed_port()}"

    result = check(tmp_path, {"head_url": head_url, "token": "t", "crashes": False})

    output = assert_could_not_judge(result, head_url)
    assert f"pre-flight: {head_url}/global_config_dict_yaml: the head server: connection refused" in output
    assert "system:      real Gym at " + head_url + " (attached; no crashes: one example" in output
    assert "examples:    1 valid, each of" in output  # a Gym nothing restarts serves one example
    assert left_behind(tmp_path) == []


def test_a_start_command_whose_servers_never_answer_ends_naming_the_url(tmp_path: Path) -> None:
    """The wait is the start timeout's (2 s here); then the URL that refused, and the start command is stopped."""
    servers = {"environment": f"http://127.0.0.1:{closed_port()}", "policy_model": f"http://127.0.0.1:{closed_port()}"}

    result = check(
        tmp_path,
        {"servers": servers, "token": "t", "start_command": ["sleep", "300"], "start_timeout_s": 2},
    )

    output = assert_could_not_judge(result, servers["environment"])
    assert f"{servers['policy_model']}/ng-control/v1/checkpoint/status: connection refused" in output
    assert "Gym did not come up within 2 s after the start command" in output
    assert left_behind(tmp_path) == []


def test_an_attached_gym_with_no_way_to_crash_it_and_crashes_on_is_a_usage_error(tmp_path: Path) -> None:
    result = check(tmp_path, {"head_url": "http://127.0.0.1:1", "token": "t"})

    assert result.returncode == 3, result.stdout + result.stderr
    assert "needs 'crash_command' and 'restart_command'" in result.stderr
    assert '"crashes": false' in result.stderr


@pytest.fixture
def stack_by_hand(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The look-alike stack started as a user starts it by hand (`python -m fakes.stack`, a session of its own):
    its deployment file once every server answers; stopped by SIGTERM, as Ctrl-C would, at the end."""
    state_dir = tmp_path / "by-hand"
    command = [sys.executable, "-m", "fakes.stack", "--topology", "native", "--state-dir", str(state_dir)]
    launcher = subprocess.Popen(
        [*command, "--token", TOKEN, "--lease-grace-s", "0.25"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        described = state_dir / "deployment.json"
        wait_until(described.exists, "the stack started by hand to write its deployment file", 120)
        yield json.loads(described.read_text())
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)


def test_a_gym_started_by_hand_survives_a_check_that_names_what_it_could_not_check(
    tmp_path: Path, stack_by_hand: dict[str, Any]
) -> None:
    """Attached with `"crashes": false` and no gated backend: one example of the control plane, every server
    untouched, and a verdict that says which properties it could not judge and which rules it could not draw."""
    servers = {name: server["url"] for name, server in stack_by_hand["servers"].items()}
    pgids = [server["pgid"] for server in stack_by_hand["servers"].values()]

    result = check(tmp_path, {"servers": servers, "token": TOKEN, "crashes": False, "lease_grace_s": 0.25})

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "PASSED: 1 examples" in output
    assert "not checked on this deployment:" in output
    for unjudged in ("P2", "P3", "P4", "P6", "P14"):  # judged on rollouts, which need a gated backend
        assert f"\n  {unjudged} " in output, unjudged
    assert "rules never drawn on this deployment:" in output
    (crash_row,) = [line for line in output.splitlines() if line.split()[:1] == ["crash"]]
    assert "n/a (not drawable here" in crash_row  # the coverage table does not call it NEVER
    # Every server the user started is still there and still answers.
    for pgid in pgids:
        os.killpg(pgid, 0)  # raises ProcessLookupError if the group is gone
    for url in servers.values():
        assert (
            httpx.get(
                f"{url}/ng-control/v1/checkpoint/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
            ).status_code
            == 200
        )
    assert left_behind(tmp_path) == []
