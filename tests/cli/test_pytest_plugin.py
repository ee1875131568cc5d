"""The pytest plugin: inert unless used; its options choose the deployment behind the `ckpt_harness` fixture, and
`ckpt_check` fails a test with the report `ckpt-model check` prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

USES_THE_FIXTURE = """
def test_deployment(ckpt_harness):
    assert (ckpt_harness.spec.topology, ckpt_harness.spec.verify_mode, ckpt_harness.spec.faults) == {expected!r}
"""

DEFAULTS = """
from ckpt_model.pytest_plugin import chosen
from ckpt_model.model.spec import DeploymentSpec

def test_defaults(pytestconfig):
    assert chosen(pytestconfig) == DeploymentSpec("native")
"""


def pytest_in(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    (directory / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: none of this project's options
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *arguments],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_options_build_the_fixture_and_name_it_in_the_header(tmp_path: Path) -> None:
    expected = ("slow", "replay", ("resume_deletes_records",))
    (tmp_path / "test_it.py").write_text(USES_THE_FIXTURE.format(expected=expected))

    result = pytest_in(
        tmp_path, "--ckpt-topology", "slow", "--ckpt-verify-mode", "replay", "--ckpt-faults", "resume_deletes_records"
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "ckpt-model: ckpt_harness topology slow, verify mode replay, faults resume_deletes_records" in result.stdout


def test_without_options_the_deployment_is_native_and_the_header_is_unchanged(tmp_path: Path) -> None:
    # What the fixture would build, read without starting it: without options nothing starts at all.
    (tmp_path / "test_it.py").write_text(DEFAULTS)

    result = pytest_in(tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "ckpt-model:" not in result.stdout  # the plugin line only; "plugins: ckpt-model-0.1.0" stays


def test_an_unknown_fault_is_a_usage_error(tmp_path: Path) -> None:
    result = pytest_in(tmp_path, "--ckpt-faults", "no_such_fault")

    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "--ckpt-faults: unknown fault(s) 'no_such_fault'; known faults:" in result.stderr


CHECKS = """
def test_the_contract(ckpt_check):
    ckpt_check(examples=30, steps=4, seed=2, replays=1)
"""


def test_ckpt_check_fails_the_test_with_the_check_s_report_and_keeps_its_artifacts(tmp_path: Path) -> None:
    # The fault `ckpt-model check` finds in tests/cli/test_cli.py, found here the same way: no Hypothesis shrink,
    # one replay for the rate, the checker's minimiser.
    (tmp_path / "test_it.py").write_text(CHECKS)
    kept = tmp_path / "kept"

    result = pytest_in(tmp_path, "--ckpt-faults", "resume_deletes_records", "--ckpt-keep-artifacts", "kept")

    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    report = result.stdout
    header = "ckpt-model: ckpt_harness topology native, verify mode wait, faults resume_deletes_records"
    assert f"{header}; artifacts kept in {kept}" in report
    for line in [
        "=== property violation 1 of 1: P9 in 1 of 1 replays ===",
        "P9Violation: P9 checkpoints are durable and immutable",
        "  expected: ",
        f"  observed: {kept / 'checkpoints'}",
        "Minimal failing sequence (ckpt_model.search.minimise:",
        f"ckpt-model replay {kept / 'P9-native-resume_deletes_records-'}",
        "FAILED: property violation (P9 in 1 of 1 replays)",
    ]:
        assert line in report
    # The check's run is kept in the run store too, with the report it failed the test with.
    (run_dir,) = [path for path in (tmp_path / ".ckpt-model" / "runs").iterdir() if path.name != "latest"]
    assert "FAILED: property violation (P9 in 1 of 1 replays)" in (run_dir / "report.txt").read_text()
    assert "Traceback" not in report  # the report alone, as the command prints it
    assert json.loads((kept / "history.jsonl").read_text().splitlines()[0])["index"] == 0
    assert (kept / "logs" / "environment.log").exists()


BOUNDED = """
def test_the_contract_for_a_while(ckpt_check):
    stats = ckpt_check(steps=3, seed=2)
    assert stats.stopped_by_time
    assert stats.finished
"""


def test_ckpt_max_time_bounds_ckpt_check_by_time(tmp_path: Path) -> None:
    """`--ckpt-max-time`: without `examples`, ckpt_check runs examples until the limit, as `check --max-time`."""
    (tmp_path / "test_it.py").write_text(BOUNDED)

    result = pytest_in(tmp_path, "--ckpt-max-time", "1s", "--ckpt-topology", "native")

    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr


def test_keep_artifacts_in_a_directory_that_is_not_empty_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("the user's")

    result = pytest_in(tmp_path, "--ckpt-keep-artifacts", "kept")

    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "--ckpt-keep-artifacts: " in result.stderr
    assert "is not empty" in result.stderr
    assert [path.name for path in (tmp_path / "kept").iterdir()] == ["mine.txt"]


REAL_GYM = """
from ckpt_model.pytest_plugin import chosen

def test_real_gym(pytestconfig):
    assert (chosen(pytestconfig).topology, chosen(pytestconfig).lease_grace_s) == ("legacy", 600.0)
"""


def test_a_real_gym_s_description_names_the_deployment_in_the_header(tmp_path: Path) -> None:
    description = {"head_url": "http://127.0.0.1:1", "token": "t", "crashes": False, "topology": "legacy"}
    (tmp_path / "gym.json").write_text(json.dumps(description))
    (tmp_path / "test_it.py").write_text(REAL_GYM)

    result = pytest_in(tmp_path, "--ckpt-deployment", "gym.json")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "ckpt-model: ckpt_harness real Gym gym.json, topology legacy" in result.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--ckpt-deployment", "missing.json"], "--ckpt-deployment: missing.json: not a readable deployment"),
        (
            ["--ckpt-deployment", "gym.json", "--ckpt-faults", "resume_deletes_records"],
            "--ckpt-faults plants faults in the embedded stack",
        ),
    ],
    ids=["unreadable", "with-faults"],
)
def test_a_bad_real_gym_deployment_is_a_usage_error(tmp_path: Path, arguments: list[str], message: str) -> None:
    (tmp_path / "gym.json").write_text(json.dumps({"head_url": "http://127.0.0.1:1", "token": "t", "crashes": False}))

    result = pytest_in(tmp_path, *arguments)

    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert message in result.stderr
