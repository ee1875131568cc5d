"""`ckpt-model check --controller collection` as a user runs it: the collection machine against the embedded stack's
collection program, on the same search runner and with the same outputs as the trainer's check (the coverage table,
`--json`, `--junit`, `--keep-artifacts`, regression files that `replay` and `minimise` take), passing on the
fault-free collector, failing with the property a planted collector fault breaks, and refusing what only the
trainer's machine takes before anything starts."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from ckpt_model.deployments.catalogue import collection_fault_catalogue
from ckpt_model.results import regression
from tests.cli.test_cli import ckpt_model, left_behind

pytestmark = pytest.mark.processes

FAULT = "manifest_names_next_attempt"  # P24 at the first checkpoint published with rows in flight
STEM = f"P24-native-collection-{FAULT}"  # and a digest of the steps that failed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--faults", "no_such_fault"], "unknown collector fault(s) 'no_such_fault'; the collector's: "),
        (["--faults", "resume_deletes_records"], "unknown collector fault(s) 'resume_deletes_records'"),
        (["--weights", "calls=2"], "--controller collection does not take --weights"),
        (["--token-capture"], "--controller collection does not take --token-capture"),
    ],
    ids=["unknown-fault", "trainer-fault", "draw-options", "deployment-option"],
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


def test_a_collection_search_bounded_by_time_stops_between_examples_and_says_its_progress(tmp_path: Path) -> None:
    """`--max-time` ends the collection machine's search between examples by the limit, as the
    trainer's; piped, a plain progress line comes at each `--progress-every`."""
    result = ckpt_model(
        tmp_path,
        "check",
        "--controller",
        "collection",
        "--seed",
        "5",
        "--steps",
        "3",
        "--max-time",
        "1s",
        "--progress-every",
        "0.2s",
        "--json",
        "result.json",
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "examples:    until the time limit, each of up to 3 steps drawn; no example begins" in result.stdout
    assert "round 2" not in result.stdout  # one round: the collection machine is not aimed
    progress = [line for line in result.stdout.splitlines() if line.startswith("progress: ")]
    assert progress, result.stdout
    assert all(" (until the time limit) · " in line and " goals " in line for line in progress)
    assert "\r" not in result.stdout
    (statistics,) = [line for line in result.stdout.splitlines() if line.startswith("statistics: ")]
    assert statistics.endswith("; stopped at its time limit (--max-time)")
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["statistics"]["stopped_by_time"] is True
    assert {row["name"] for row in written["coverage"]["rules"]} >= {"start_run"}
    assert left_behind(tmp_path) == []


def test_the_fault_free_collector_passes_with_the_coverage_table_and_every_output(tmp_path: Path) -> None:
    outputs = ["--json", "result.json", "--junit", "result.xml", "--keep-artifacts", "kept"]
    result = ckpt_model(
        tmp_path, "check", "--controller", "collection", "--examples", "2", "--steps", "6", "--seed", "5", *outputs
    )

    assert result.returncode == 0, result.stdout + result.stderr
    banner, table = result.stdout.split("coverage over ")
    for line in [
        "system:      embedded look-alike stack: its rollout collection program and servers",
        "topology:    native",
        "faults:      none",
        "seed:        5 (from --seed",
        "draw:        a rule among those enabled, uniformly (Hypothesis's draw)",
        f"artifacts:   kept in {tmp_path / 'kept'} (--keep-artifacts)",
    ]:
        assert line in banner
    assert "time:" not in banner  # no rule of the collection machine waits for a deadline or a lease
    # The coverage table of the collection machine: its families, its goals and its rules.
    assert re.match(r"\d+ examples \(native\):", table)
    assert table.splitlines()[1].split() == ["family", "steps", "share", "ms/step"]
    assert "a rerun that continues LATEST" in table
    assert re.search(r"\n  start_run +\d+ +\d+ +\d+", table)
    assert "  P5 token lineage: the collection runs do not turn on token capture" in table
    scope = "checked: P1-P4, P9-P10, P13, P15, P22-P26; not checked: P5-P8, P11-P12, P14, P16-P21 (listed above)"
    assert f"no property violated; {scope}\nwrote result.json\nwrote result.xml" in result.stdout
    written = json.loads((tmp_path / "result.json").read_text())
    assert (written["verdict"], written["controller"], written["seed"]) == ("passed", "collection", 5)
    assert written["statistics"]["rules_drawn"]["start_run"] >= 2
    assert written["properties_skipped"]["P5"] == "the collection runs do not turn on token capture"
    cases = {
        case.get("name", "").split()[0]: case for case in ElementTree.parse(tmp_path / "result.xml").iter("testcase")
    }
    assert {"P22", "P23", "P24", "P25"} <= set(cases)
    assert cases["P5"].find("skipped") is not None
    assert cases["P24"].find("skipped") is None
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == ["logs"]
    assert left_behind(tmp_path) == []


def noisy_file(workdir: Path) -> Path:
    """A collection regression file by hand: the planted collector fault, and a step around the one that shows it."""
    path = workdir / "noisy.json"
    steps = [["start_run", {}], ["release", {"pick": 1}], ["request_checkpoint", {}]]
    document = {
        "format": 1,
        "failure": {"type": "P24Violation", "property": "P24"},
        "controller": "collection",
        "controller_faults": [FAULT],
        "topology": "native",
        "steps": steps,
    }
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("controller", "teleporter", "'controller' must be one of trainer, collection (got 'teleporter')"),
        ("controller_faults", ["resume_deletes_records"], "'controller_faults' must be faults of the collection"),
        ("steps", [["start_run", {}], ["dispatch", {}]], "step 2 names 'dispatch', which is no rule of the machine"),
    ],
    ids=["unknown-controller", "server-fault-as-collector-fault", "trainer-rule"],
)
def test_a_collection_file_that_cannot_be_replayed_is_a_usage_error(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    path = noisy_file(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))

    result = ckpt_model(tmp_path, "replay", str(path))

    assert result.returncode == 3, result.stdout + result.stderr
    assert message in result.stderr
    assert not (tmp_path / "tmp").exists() or left_behind(tmp_path) == []  # found before any server started


def test_a_collection_regression_file_written_by_a_failing_run_replays_and_minimises(tmp_path: Path) -> None:
    # The failing run: a replay of the steps by hand, which writes its own regression file with what it kept.
    replayed = ckpt_model(tmp_path, "replay", str(noisy_file(tmp_path)), "--keep-artifacts", "kept")
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    (written,) = (tmp_path / "kept").glob(f"{STEM}-*.json")
    assert f"Replay it again: ckpt-model replay {tmp_path / 'noisy.json'}" in replayed.stdout
    assert f"(open in a browser): {written.with_suffix('.html')}" in replayed.stdout  # its timeline, kept beside it
    document = regression.load(written)
    assert (document["controller"], document["controller_faults"]) == ("collection", [FAULT])
    assert [name for name, _ in document["steps"]] == ["start_run", "release", "request_checkpoint"]

    minimised = ckpt_model(tmp_path, "minimise", str(written))

    assert minimised.returncode == 0, minimised.stdout + minimised.stderr
    assert "native, the collection controller with manifest_names_next_attempt: start_run(); " in minimised.stdout
    assert "state = CollectionMachine()\nstate.start_run()\nstate.request_checkpoint()\nstate.teardown()" in (
        minimised.stdout
    )
    assert regression.load(written)["steps"] == [["start_run", {}], ["request_checkpoint", {}]]
    again = ckpt_model(tmp_path, "replay", str(written))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "FAILED as recorded: P24" in again.stdout
    assert left_behind(tmp_path) == []


# A search through the command (minutes on a loaded run): the nightly's `pytest -m search`. The default run checks the
# same fault's steps (tests/stateful/test_collection_faults.py) and its regression file's replay and minimising
# (above).
@pytest.mark.search
def test_a_collector_fault_fails_with_its_property_minimal_steps_and_its_regression_file(tmp_path: Path) -> None:
    arguments = ["check", "--controller", "collection", "--faults", FAULT, "--examples", "5", "--steps", "4"]
    outputs = ["--json", "result.json", "--junit", "result.xml"]
    result = ckpt_model(tmp_path, *arguments, "--seed", "3", *outputs)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "P24 collection.json continues exactly the rollouts the episode owner exported" in result.stdout
    assert "found: P24 in 10 of 10 replays" in result.stdout
    # P24 shows at the first checkpoint published with rows in flight, whichever rule asked for it
    assert re.search(
        r"Minimal failing sequence .*\nstate = CollectionMachine\(\)\nstate\.start_run\(\)\nstate\.\w+", result.stdout
    )
    assert "FAILED: property violation (P24 in 10 of 10 replays)\nwrote result.json\nwrote result.xml" in result.stdout
    (path,) = (tmp_path / "regressions").glob(f"{STEM}-*.json")
    assert f"ckpt-model replay {path}" in result.stdout
    assert len(regression.load(path)["steps"]) == 2
    written = json.loads((tmp_path / "result.json").read_text())
    assert (written["controller"], written["properties_violated"]) == ("collection", ["P24"])
    assert written["failures"][0]["regression_file"] == str(path)
    suite = ElementTree.parse(tmp_path / "result.xml").getroot()
    failing = [case.get("name", "") for case in suite.iter("testcase") if case.find("failure") is not None]
    assert [name.split()[0] for name in failing] == ["P24"]
    assert left_behind(tmp_path) == []
