"""`ckpt-model check --controller collection` as a user runs it: the collection machine against the embedded stack's
collection program, passing on the fault-free collector, failing with the property a planted collector fault
breaks and the command that replays it, and refusing what only the trainer's check takes before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckpt_model.deployments.catalogue import collection_fault_catalogue
from tests.cli.test_cli import ckpt_model, left_behind

pytestmark = pytest.mark.processes


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--faults", "no_such_fault"], "unknown collector fault(s) 'no_such_fault'; the collector's: "),
        (["--faults", "resume_deletes_records"], "unknown collector fault(s) 'resume_deletes_records'"),
        (["--swarm", "--json", "out.json"], "--controller collection does not take --swarm, --json"),
        (["--token-capture"], "--controller collection does not take --token-capture"),
        (["--no-minimise"], "does not take --no-minimise"),
    ],
    ids=["unknown-fault", "trainer-fault", "trainer-options", "deployment-option", "no-minimise"],
)
def test_what_the_collection_machine_cannot_take_is_a_usage_error(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    result = ckpt_model(tmp_path, "check", "--controller", "collection", *arguments)

    assert result.returncode == 3, result.stdout + result.stderr
    assert message in result.stderr
    assert result.stdout == ""  # said before the banner: nothing started
    if "no_such_fault" in arguments:
        assert all(fault.name in result.stderr for fault in collection_fault_catalogue())


def test_the_fault_free_collector_passes(tmp_path: Path) -> None:
    arguments = ["--examples", "2", "--steps", "6", "--seed", "5"]
    result = ckpt_model(tmp_path, "check", "--controller", "collection", *arguments)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "the collection controller on the embedded stack's native topology" in result.stdout
    assert "collector faults: none" in result.stdout
    assert "seed 5" in result.stdout
    assert "PASSED: " in result.stdout
    assert "no collection property violated (P22 LATEST, P23 stops and saves, P24 continued, P25" in result.stdout
    assert "no server property (P1, P2, P3, P4, P9, P10, P13 and P15 on the runs' own calls)" in result.stdout
    assert left_behind(tmp_path) == []


# A search through the command (25 s on a loaded run): the nightly's `pytest -m search`. The default run checks the
# same fault's steps (tests/stateful/test_collection_faults.py) and the report's printing on hand-built findings
# (tests/unit/checker/test_collection_check.py).
@pytest.mark.search
def test_a_collector_fault_fails_with_its_property_minimal_steps_and_replay(tmp_path: Path) -> None:
    arguments = ["check", "--controller", "collection", "--faults", "manifest_names_next_attempt"]
    result = ckpt_model(tmp_path, *arguments, "--examples", "5", "--steps", "4", "--seed", "3")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "P24 collection.json continues exactly the rollouts the episode owner exported" in result.stdout
    assert "observed: continued ['row-0-a1', 'row-1-a1', 'row-2-a1']" in result.stdout
    assert re.search(r"minimised to 2 in [\d.]+ s \(\d+ candidates replayed\):", result.stdout), result.stdout
    # P24 shows at the first checkpoint published with rows in flight, whichever rule asked for it
    steps = r"  state\.start_run\(\)\n  state\.\w+\([^)]*\)\nFAILED: property violation \(P24\)\n"
    assert re.search(steps, result.stdout), result.stdout
    replay = (
        "replay: ckpt-model check --controller collection --topology native --examples 5 --steps 4 "
        "--faults manifest_names_next_attempt --seed 3"
    )
    assert replay in result.stdout
    assert left_behind(tmp_path) == []
