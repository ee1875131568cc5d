"""The nightly's JUnit reports: under this project's pytest configuration (warnings are errors), a test that
records a property, as each contract run records its coverage table, passes and the report carries it."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RECORDS_A_PROPERTY = """
def test_records(record_property):
    record_property("coverage", "the coverage table")
"""


def test_a_recorded_property_reaches_the_junit_report(tmp_path: Path) -> None:
    (tmp_path / "test_records.py").write_text(RECORDS_A_PROPERTY)
    report = tmp_path / "junit.xml"

    configured = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *configured, f"--junitxml={report}", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert ran.returncode == 0, ran.stdout + ran.stderr
    recorded = {p.get("name"): p.get("value") for p in ElementTree.parse(report).iter("property")}
    assert recorded == {"coverage": "the coverage table"}
