"""Rollout collection's properties (P22-P25) and the checker's reader of a collection directory, on hand-built
directories and values (no processes). Each check is made to fail here at least once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.deployments.collection_run import CollectionAudit
from ckpt_model.errors import PropertyViolation
from ckpt_model.properties import collection as props
from ckpt_model.properties.collection import (
    P22Violation,
    P23Violation,
    P24Violation,
    P25Violation,
    p22_latest_complete,
    p22_latest_forward,
    p23_earlier_intact,
    p23_kept,
    p23_stop_published,
    p24_continued_exported,
    p25_rows,
)
from ckpt_model.protocol import collection_files as files
from ckpt_model.protocol.collection_files import CollectionCheckpoint, CollectionUnreadable, OutputRow
from ckpt_model.protocol.wire import EpisodeId
from tests.unit.checker.participant_dirs import write_participant

IDS = [f"ckpt-20261204T1200{second:02d}-0000000{second}" for second in range(5)]
KINDS = ("environment", "agent")


def participant(checkpoint_dir: Path, kind: str, checkpoint_id: str, keys: list[str]) -> None:
    """One participant directory as Gym's writer leaves it (reference 6.2), records keyed by capture key."""
    records = [{"episode_id": EpisodeId.from_capture_key(key).model_dump()} for key in keys]
    data = b"".join(json.dumps(record).encode() + b"\n" for record in records)
    directory = checkpoint_dir / "gym" / kind / kind
    directory.mkdir(parents=True)
    write_participant(directory, data, kind=kind, instance=kind, checkpoint_id=checkpoint_id)


def checkpoint(
    root: Path, checkpoint_id: str, created: float, keys: list[str], *, latest: bool = True, **changes: Any
) -> None:
    """A published checkpoint: every kind's directory holding `keys`, its collection.json, and LATEST."""
    for kind in KINDS:
        participant(root / checkpoint_id, kind, checkpoint_id, keys)
    document = {
        "checkpoint_id": checkpoint_id,
        "run_id": "run-1",
        "created_at": created,
        "continued": [EpisodeId.from_capture_key(key).model_dump() for key in keys],
        "restarted": [],
        **changes,
    }
    (root / checkpoint_id / "collection.json").write_text(json.dumps(document))
    if latest:
        (root / "LATEST").write_text(checkpoint_id + "\n")


def read(root: Path, checkpoint_id: str) -> CollectionCheckpoint:
    return files.read_checkpoint(root, checkpoint_id)


# --- P22 ---------------------------------------------------------------------------------------------------


def test_p22_passes_without_latest_and_for_a_complete_checkpoint(tmp_path: Path) -> None:
    assert p22_latest_complete(tmp_path, KINDS) is None
    checkpoint(tmp_path, IDS[0], 1.0, ["long-1"])

    found = p22_latest_complete(tmp_path, KINDS)

    assert found is not None
    assert found.continued == (EpisodeId(rollout_id="long-1", attempt=0),)


@pytest.mark.parametrize(
    ("damage", "observed"),
    [
        (lambda root: (root / "LATEST").write_text("ckpt-x\n"), "not one checkpoint ID"),
        (lambda root: (root / IDS[0] / "collection.json").unlink(), "No such file"),
        (lambda root: (root / IDS[0] / "gym/agent/agent/manifest.json").unlink(), "manifest"),
        (lambda root: (root / "LATEST").write_text(IDS[0]), "not one checkpoint ID and a newline"),
    ],
    ids=["latest-junk", "manifest-missing", "participant-unpublished", "latest-torn"],
)
def test_p22_fails_when_latest_names_what_is_not_complete(tmp_path: Path, damage: Any, observed: str) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, ["long-1"])
    damage(tmp_path)

    with pytest.raises(P22Violation, match=observed):
        p22_latest_complete(tmp_path, KINDS)


def test_p22_fails_when_a_participant_kind_wrote_nothing(tmp_path: Path) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, ["long-1"])

    with pytest.raises(P22Violation, match=r"none of kind \['resources'\]"):
        p22_latest_complete(tmp_path, (*KINDS, "resources"))


def test_p22_latest_only_moves_forward(tmp_path: Path) -> None:
    checkpoint(tmp_path, IDS[0], 5.0, [], latest=False)
    checkpoint(tmp_path, IDS[1], 7.0, [], latest=False)
    older, newer = read(tmp_path, IDS[0]), read(tmp_path, IDS[1])

    p22_latest_forward(None, older)
    p22_latest_forward(older, newer)
    p22_latest_forward(newer, newer)
    with pytest.raises(P22Violation, match="moves forward"):
        p22_latest_forward(newer, older)
    with pytest.raises(P22Violation, match="no LATEST"):
        p22_latest_forward(older, None)


# --- P23 ---------------------------------------------------------------------------------------------------


def test_p23_exit_75_needs_a_checkpoint_published_for_the_stop() -> None:
    p23_stop_published(75, None, IDS[0])
    p23_stop_published(75, IDS[0], IDS[1])
    p23_stop_published(1, IDS[0], IDS[0])
    with pytest.raises(P23Violation, match="exit 75 with LATEST absent"):
        p23_stop_published(75, None, None)
    with pytest.raises(P23Violation, match=f"exit 75 with LATEST {IDS[0]}"):
        p23_stop_published(75, IDS[0], IDS[0])


def test_p23_a_failed_save_leaves_earlier_checkpoints_as_they_were(tmp_path: Path) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, ["a"])
    before = {IDS[0]: files.participant_fingerprints(tmp_path, IDS[0])}
    p23_earlier_intact(before, tmp_path, published_since=[])

    records = next((tmp_path / IDS[0] / "gym/agent/agent").glob("records-*.jsonl"))
    records.write_bytes(records.read_bytes().replace(b'"a"', b'"b"'))
    with pytest.raises(P23Violation, match=f"{IDS[0]} unchanged"):
        p23_earlier_intact(before, tmp_path, published_since=[])


def test_p23_an_earlier_checkpoint_may_go_only_once_two_newer_are_published(tmp_path: Path) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, ["a"])
    before = {IDS[0]: files.participant_fingerprints(tmp_path, IDS[0])}
    for path in sorted((tmp_path / IDS[0]).rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (tmp_path / IDS[0]).rmdir()

    p23_earlier_intact(before, tmp_path, published_since=[IDS[1], IDS[2]])
    with pytest.raises(P23Violation, match="only 1 published since"):
        p23_earlier_intact(before, tmp_path, published_since=[IDS[1]])


def test_p23_a_checkpoint_out_of_the_two_newest_may_be_half_deleted(tmp_path: Path) -> None:
    """A prune may be removing it while the audit reads: once two newer ones are published, no state of it fails."""
    checkpoint(tmp_path, IDS[0], 1.0, ["a"])
    before = {IDS[0]: files.participant_fingerprints(tmp_path, IDS[0])}
    next((tmp_path / IDS[0] / "gym/agent/agent").glob("records-*.jsonl")).unlink()

    p23_earlier_intact(before, tmp_path, published_since=[IDS[1], IDS[2]])
    with pytest.raises(P23Violation, match=f"{IDS[0]} unchanged"):
        p23_earlier_intact(before, tmp_path, published_since=[IDS[2]])


def test_the_audit_keeps_every_checkpoint_latest_named_until_two_newer_exist(tmp_path: Path) -> None:
    audit = CollectionAudit(tmp_path, KINDS, "environment")
    checkpoint(tmp_path, IDS[0], 1.0, ["a"])
    audit.published()
    checkpoint(tmp_path, IDS[1], 2.0, ["a"])
    audit.published()
    shutil.rmtree(tmp_path / IDS[0])
    with pytest.raises(P23Violation, match=f"{IDS[0]} kept"):
        audit.intact()

    checkpoint(tmp_path, IDS[2], 3.0, ["a"], latest=False)  # published, not yet seen as LATEST: it counts too
    audit.intact()
    shutil.rmtree(tmp_path / IDS[1])
    with pytest.raises(P23Violation, match=f"{IDS[1]} kept"):
        audit.intact()


def test_p23_at_most_two_published_and_no_partial_one() -> None:
    p23_kept([IDS[1], IDS[2]], [])
    p23_kept([IDS[1]], [IDS[3]], partial_allowed=[IDS[3]])
    with pytest.raises(P23Violation, match="published"):
        p23_kept(IDS[:3], [])
    with pytest.raises(P23Violation, match=rf"partial \['{IDS[3]}'\]"):
        p23_kept([IDS[1]], [IDS[3]])


# --- P24 ---------------------------------------------------------------------------------------------------


def test_p24_continued_is_exactly_what_the_owner_exported(tmp_path: Path) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, ["a", "b-a1"], restarted=[{"rollout_id": "r", "attempt": 0}])
    written = read(tmp_path, IDS[0])

    p24_continued_exported(written, ["b-a1", "a"])
    with pytest.raises(P24Violation, match="continued"):
        p24_continued_exported(written, ["a"])  # names b-a1, which nobody exported
    with pytest.raises(P24Violation, match="continued"):
        p24_continued_exported(written, ["a", "b-a1", "c"])  # leaves out c, which the owner exported
    with pytest.raises(P24Violation, match=r"restarted \['r'\]"):
        p24_continued_exported(written, ["a", "b-a1", "r"])


# --- P25 ---------------------------------------------------------------------------------------------------


def test_p25_every_row_once_with_its_reward_and_predicted_attempt() -> None:
    rows = [OutputRow("a", 1, 1.0), OutputRow("b", 0, 1.0)]
    p25_rows(["a", "b"], rows, 1.0, {"a": 1})

    with pytest.raises(P25Violation, match="0 rows"):
        p25_rows(["a", "b", "c"], rows, 1.0, {"a": 1})
    with pytest.raises(P25Violation, match=r"2 rows \(duplicated\)"):
        p25_rows(["a", "b"], [*rows, OutputRow("b", 1, 1.0)], 1.0, {"a": 1})
    with pytest.raises(P25Violation, match=r"rows of \['z'\]"):
        p25_rows(["a", "b"], [*rows, OutputRow("z", 0, 1.0)], 1.0, {"a": 1})
    with pytest.raises(P25Violation, match=r"at attempt 1\n  observed: reward 1.0 at attempt 0"):
        p25_rows(["a", "b"], [OutputRow("a", 0, 1.0), OutputRow("b", 0, 1.0)], 1.0, {"a": 1})  # redone from scratch
    with pytest.raises(P25Violation, match=r"reward 0\.0"):
        p25_rows(["a", "b"], [OutputRow("a", 1, 0.0), OutputRow("b", 0, 1.0)], 1.0, {"a": 1})


# --- the reader --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"extra": 1}, "fields"),
        ({"checkpoint_id": IDS[1]}, "names checkpoint"),
        ({"created_at": True}, "created_at a number"),
        ({"continued": [{"rollout_id": "a"}]}, "not {rollout_id, attempt}"),
        ({"continued": [{"rollout_id": "a-a1", "attempt": 0}]}, "holds"),
    ],
    ids=["extra-field", "other-id", "bool-time", "no-attempt", "reserved-suffix"],
)
def test_a_collection_json_that_is_not_exactly_its_fields_is_unreadable(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, [])
    path = tmp_path / IDS[0] / "collection.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    with pytest.raises(CollectionUnreadable, match=message):
        read(tmp_path, IDS[0])


def test_output_rows_and_the_dispatch_log_read_in_order_and_a_torn_last_line_is_no_row(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text('{"_ng_rollout_id": "a", "_ng_attempt_index": 1, "reward": 1}\n{"_ng_rollout_id": "b", "_ng')
    (tmp_path / "dispatched.jsonl").write_text('{"run_id": "x"}\n{"a": 0}\n{"run_id": "y"}\n{"a": 1}\n')

    assert files.output_rows(output) == [OutputRow("a", 1, 1.0)]
    assert files.dispatched(tmp_path) == [("a", 0), ("a", 1)]
    output.write_text('{"_ng_rollout_id": "a", "_ng_attempt_index": true, "reward": 1}\n')
    with pytest.raises(CollectionUnreadable, match="not an output row"):
        files.output_rows(output)
    (tmp_path / "dispatched.jsonl").write_text('{"a": 0, "b": 0}\n')
    with pytest.raises(CollectionUnreadable, match="not a dispatch entry"):
        files.dispatched(tmp_path)


def test_published_and_partial_checkpoints_are_told_apart(tmp_path: Path) -> None:
    checkpoint(tmp_path, IDS[0], 1.0, [])
    (tmp_path / IDS[1]).mkdir()
    (tmp_path / "elsewhere").mkdir()

    assert files.checkpoint_dirs(tmp_path) == ([IDS[0]], [IDS[1]])
    assert files.checkpoint_dirs(tmp_path / "absent") == ([], [])


def test_the_docs_collection_table_names_every_collection_property() -> None:
    """docs/how-it-works.md's table of the collection machine's properties has a row for exactly the violation
    classes `ckpt_model.properties.collection` defines, titled by their names."""
    docs = (Path(__file__).parents[3] / "docs" / "how-it-works.md").read_text()
    table = docs[docs.index("| id | checked by |") :].split("\n\n")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    classes = [
        value for value in vars(props).values() if isinstance(value, type) and issubclass(value, PropertyViolation)
    ]
    defined = {cls.property_id for cls in classes if cls is not PropertyViolation}
    assert {row.split()[0] for row in rows} == defined == {"P22", "P23", "P24", "P25"}
