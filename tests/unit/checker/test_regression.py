"""Regression files are data: a malformed one is refused with a message that says what is wrong."""

from __future__ import annotations

import json
import re
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


SPEC = DeploymentSpec("native", faults=("agent_retire_keeps_sessions",))


def violation(property_id: str) -> AssertionError:
    error = AssertionError(property_id)
    error.property_id = property_id  # type: ignore[attr-defined]  # as a PropertyViolation carries it
    return error


def test_a_file_is_named_by_its_property_deployment_and_the_steps_that_showed_it() -> None:
    stem = regression.stem(SPEC, violation("P7"))
    one = regression.file_name(stem, [("dispatch", {}), ("retire", {"pick": 0, "again": False})])
    other = regression.file_name(stem, [("dispatch", {}), ("retire", {"pick": 1, "again": False})])

    assert stem == "P7-native-agent_retire_keeps_sessions"
    assert re.fullmatch(r"P7-native-agent_retire_keeps_sessions-[0-9a-f]{8}\.json", one)
    assert one != other  # distinct failures never share a name
    # The same steps, however their arguments were ordered, are the same failure.
    assert one == regression.file_name(stem, [("dispatch", {}), ("retire", {"again": False, "pick": 0})])
    assert regression.stem(SPEC, ValueError("no property")) == "ValueError-native-agent_retire_keeps_sessions"


def test_write_records_how_the_steps_were_minimised_and_rewrite_keeps_the_rest(tmp_path: Path) -> None:
    longer = [("dispatch", {}), ("release", {"pick": 0}), ("retire", {"pick": 1, "again": False})]
    path = tmp_path / "P7.json"
    assert regression.write_unless_better(path, regression.document(SPEC, longer, violation("P7")))
    assert "minimised" not in regression.load(path)

    minimal = [("dispatch", {}), ("retire", {"pick": 0, "again": False})]
    how = {"steps_before": 3, "candidates_replayed": 4, "steps_found": [[n, a] for n, a in longer]}
    regression.rewrite(path, regression.load(path), minimal, how)

    document = regression.load(path)
    assert document["steps"] == [["dispatch", {}], ["retire", {"pick": 0, "again": False}]]
    assert document["minimised"] == how
    assert (document["topology"], document["faults"]) == ("native", ["agent_retire_keeps_sessions"])
    assert document["failure"] == {"type": "AssertionError", "property": "P7"}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written beside, renamed over: nothing left over

    # Minimised again, the file keeps the steps first found, not the minimal steps it was given.
    regression.rewrite(path, document, minimal[1:], {"steps_before": 2, "steps_found": [["retire", {}]]})
    assert regression.load(path)["minimised"]["steps_found"] == [[n, a] for n, a in longer]


def test_a_rewrite_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "P9.json"
    path.write_text(json.dumps({"format": 1, "steps": [["dispatch", {}]]}))
    before = path.read_bytes()

    with pytest.raises(TypeError):  # a value JSON cannot hold fails the write before anything is renamed
        regression.rewrite(path, regression.load(path), [("dispatch", {"pick": object()})], {})

    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["P9.json"]


def test_a_file_records_how_often_its_steps_failed_and_a_rewrite_updates_it(tmp_path: Path) -> None:
    found = {"label": "P5", "failing": 3, "replays": 10, "text": "P5 in 3 of 10 replays"}
    path = tmp_path / "P5.json"
    regression.write_unless_better(
        path, regression.document(SPEC, [("dispatch", {})], violation("P5"), reproduction=found)
    )
    assert regression.load(path)["reproduction"] == found

    minimal = {**found, "failing": 4, "text": "P5 in 4 of 10 replays"}
    regression.rewrite(path, regression.load(path), [("dispatch", {})], {"steps_before": 1}, minimal)
    assert regression.load(path)["reproduction"] == minimal


FOUND = {"steps": [["dispatch", {}], ["release", {"pick": 0}], ["retire", {}]]}
MINIMAL = {"steps": [["dispatch", {}], ["retire", {}]], "minimised": {"steps_before": 3}}


@pytest.mark.parametrize(
    ("existing", "new", "replaced"),
    [
        (None, FOUND, True),  # nothing there
        (FOUND, {**FOUND, "reproduction": {"failing": 10}}, True),  # the steps found, now with their rate
        (FOUND, MINIMAL, True),  # minimised
        (MINIMAL, FOUND, False),  # never the steps found over minimised ones
        (MINIMAL, {**FOUND, "reproduction": {"failing": 10}}, False),
        (MINIMAL, {**MINIMAL, "steps": MINIMAL["steps"][:1]}, True),  # a shorter minimal sequence
        (MINIMAL, {**MINIMAL, "reproduction": {"failing": 10}}, True),  # as short: the latest measure
        (MINIMAL, {**FOUND, "minimised": {"steps_before": 5}}, False),  # never a longer one
    ],
    ids=["new", "rate", "minimised", "found-over-minimal", "rate-over-minimal", "shorter", "as-short", "longer"],
)
def test_a_minimised_file_is_replaced_only_by_a_minimal_sequence_as_short(
    existing: dict | None, new: dict, replaced: bool
) -> None:
    assert regression.replaces(existing, new) is replaced


def test_write_unless_better_leaves_a_minimised_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "P7.json"
    minimal = regression.document(SPEC, [("retire", {})], violation("P7"), minimised={"steps_before": 3})
    assert regression.write_unless_better(path, minimal)
    before = path.read_bytes()

    found = regression.document(SPEC, [("dispatch", {}), ("release", {}), ("retire", {})], violation("P7"))
    assert not regression.write_unless_better(path, found)

    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_file_names_the_controller_whose_machine_ran_and_one_that_names_none_is_the_trainer_s(tmp_path: Path) -> None:
    error = violation("P24")
    collection = regression.Origin("collection", ("manifest_names_next_attempt",))

    stem = regression.stem(SPEC, error, collection)
    document = regression.document(SPEC, [("start_run", {})], error, origin=collection)

    assert stem == "P24-native-agent_retire_keeps_sessions-collection-manifest_names_next_attempt"
    assert (document["controller"], document["controller_faults"]) == ("collection", ["manifest_names_next_attempt"])
    assert regression.Origin.from_document(document) == collection
    assert regression.describe(document).startswith(
        "native with agent_retire_keeps_sessions, the collection controller with manifest_names_next_attempt: "
    )
    trainer = regression.document(SPEC, [("dispatch", {})], error)
    assert regression.stem(SPEC, error) == "P24-native-agent_retire_keeps_sessions"  # the trainer's: no controller
    assert trainer["controller"] == "trainer"
    assert regression.Origin.from_document({"format": 1, "steps": []}) == regression.DEFAULT_ORIGIN


def test_a_file_written_before_names_held_a_digest_still_reads_as_replayable(tmp_path: Path) -> None:
    from ckpt_model.commands.replay import load_regression

    path = tmp_path / "P9-native-resume_deletes_records.json"  # as every version before named it
    old = {"format": 1, "failure": {"type": "P9Violation", "property": "P9"}, "topology": "native"}
    path.write_text(json.dumps({**old, "faults": ["resume_deletes_records"], "steps": [["dispatch", {}]]}))

    document, spec, _ = load_regression(path)

    assert (document["steps"], spec.faults) == ([["dispatch", {}]], ("resume_deletes_records",))


def test_a_file_whose_controller_is_not_a_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": 1, "steps": [], "controller": ["collection"]}))
    with pytest.raises(ValueError, match="'controller' must be a name"):
        regression.load(path)
