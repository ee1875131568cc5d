"""Regression files are data: a malformed one is refused with a message that says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results import regression


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable regression file"):
        regression.load(path)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"format": 99, "steps": []}, "'format' must be 1"),
        ({"format": 1, "steps": [["dispatch"]]}, "'steps' must be a list"),
        ({"format": 1, "steps": [[1, {}]]}, "'steps' must be a list"),
    ],
)
def test_a_malformed_document_is_refused(tmp_path: Path, document: dict, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=problem):
        regression.load(path)


def test_describe_prints_the_steps_as_calls() -> None:
    steps = [["dispatch", {}], ["release", {"pick": 0}]]
    document = {"topology": "native", "faults": ["model_delivers_held"], "steps": steps}
    assert regression.describe(document) == "native with model_delivers_held: dispatch(); release(pick=0)"


class FakeHarness:
    spec = DeploymentSpec("native", faults=("agent_retire_keeps_sessions",))

    def __init__(self, directory: Path) -> None:
        self.regressions_dir = directory


def test_write_records_how_the_steps_were_minimised_and_rewrite_keeps_the_rest(tmp_path: Path) -> None:
    error = AssertionError("P7")
    error.property_id = "P7"  # type: ignore[attr-defined]  # as a PropertyViolation carries it
    longer = [("dispatch", {}), ("release", {"pick": 0}), ("retire", {"pick": 1, "again": False})]
    path = regression.write(FakeHarness(tmp_path), longer, error)
    assert path.name == "P7-native-agent_retire_keeps_sessions.json"
    assert "minimised" not in regression.load(path)

    minimal = [("dispatch", {}), ("retire", {"pick": 0, "again": False})]
    how = {"steps_before": 3, "candidates_replayed": 4}
    regression.rewrite(path, regression.load(path), minimal, how)

    document = regression.load(path)
    assert document["steps"] == [["dispatch", {}], ["retire", {"pick": 0, "again": False}]]
    assert document["minimised"] == how
    assert (document["topology"], document["faults"]) == ("native", ["agent_retire_keeps_sessions"])
    assert document["failure"] == {"type": "AssertionError", "property": "P7"}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written beside, renamed over: nothing left over


def test_a_rewrite_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "P9.json"
    path.write_text(json.dumps({"format": 1, "steps": [["dispatch", {}]]}))
    before = path.read_bytes()

    with pytest.raises(TypeError):  # a value JSON cannot hold fails the write before anything is renamed
        regression.rewrite(path, regression.load(path), [("dispatch", {"pick": object()})], {})

    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["P9.json"]


def test_a_file_records_how_often_its_steps_failed_and_a_rewrite_updates_it(tmp_path: Path) -> None:
    error = AssertionError("P5")
    error.property_id = "P5"  # type: ignore[attr-defined]  # as a PropertyViolation carries it
    found = {"label": "P5", "failing": 3, "replays": 10, "text": "P5 in 3 of 10 replays"}
    path = regression.write(FakeHarness(tmp_path), [("dispatch", {})], error, reproduction=found)
    assert regression.load(path)["reproduction"] == found

    minimal = {**found, "failing": 4, "text": "P5 in 4 of 10 replays"}
    regression.rewrite(path, regression.load(path), [("dispatch", {})], {"steps_before": 1}, minimal)
    assert regression.load(path)["reproduction"] == minimal


def test_a_file_names_the_controller_whose_machine_ran_and_one_that_names_none_is_the_trainer_s(tmp_path: Path) -> None:
    error = AssertionError("P24")
    error.property_id = "P24"  # type: ignore[attr-defined]  # as a PropertyViolation carries it
    collection = regression.Origin("collection", ("manifest_names_next_attempt",))

    path = regression.write(FakeHarness(tmp_path), [("start_run", {})], error, origin=collection)

    assert path.name == "P24-native-agent_retire_keeps_sessions-collection-manifest_names_next_attempt.json"
    document = regression.load(path)
    assert (document["controller"], document["controller_faults"]) == ("collection", ["manifest_names_next_attempt"])
    assert regression.Origin.from_document(document) == collection
    assert regression.describe(document).startswith(
        "native with agent_retire_keeps_sessions, the collection controller with manifest_names_next_attempt: "
    )
    trainer = regression.write(FakeHarness(tmp_path), [("dispatch", {})], error)
    assert trainer.name == "P24-native-agent_retire_keeps_sessions.json"  # the trainer's files keep their names
    assert regression.load(trainer)["controller"] == "trainer"
    assert regression.Origin.from_document({"format": 1, "steps": []}) == regression.DEFAULT_ORIGIN


def test_a_file_whose_controller_is_not_a_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": 1, "steps": [], "controller": ["collection"]}))
    with pytest.raises(ValueError, match="'controller' must be a name"):
        regression.load(path)
