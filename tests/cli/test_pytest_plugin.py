"""The pytest plugin: inert unless used; its options choose the deployment behind the `ckpt_harness` fixture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

USES_THE_FIXTURE = """
def test_deployment(ckpt_harness):
    assert (ckpt_harness.topology, ckpt_harness.verify_mode, ckpt_harness.faults) == {expected!r}
"""

DEFAULTS = """
from ckpt_model.pytest_plugin import chosen
from ckpt_model.spec import DeploymentSpec

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
        timeout=120,
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
