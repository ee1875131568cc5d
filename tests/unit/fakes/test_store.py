"""The checkpoint store: digest-named records, a manifest that is never replaced, and strict reading."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from fakes.gym.control.store import (
    MANIFEST_NAME,
    StopFlag,
    WriterFaults,
    WriteStoppedError,
    encode_record,
    participant_dir,
    read_participant_state,
    record_line,
    write_participant_state,
)
from fakes.gym.protocol.errors import CheckpointStateError

KIND = "environment"
INSTANCE = "env-1"


def _records(count: int = 3) -> list[dict[str, Any]]:
    return [{"episode_id": {"rollout_id": f"r{i}", "attempt": 0}, "boundary": {"step": i}} for i in range(count)]


def _write(checkpoint_dir: Path, records: list[Any] | None = None, checkpoint_id: str = "c1") -> dict[str, Any]:
    return write_participant_state(
        checkpoint_dir, KIND, INSTANCE, checkpoint_id, _records() if records is None else records
    )


def _directory(checkpoint_dir: Path) -> Path:
    return participant_dir(checkpoint_dir, KIND, INSTANCE)


def _rewrite_manifest(checkpoint_dir: Path, **changes: Any) -> None:
    path = _directory(checkpoint_dir) / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def _records_path(checkpoint_dir: Path) -> Path:
    manifest = json.loads((_directory(checkpoint_dir) / MANIFEST_NAME).read_text())
    return _directory(checkpoint_dir) / manifest["records_file"]


def test_round_trip_returns_manifest_and_records_in_order(tmp_path: Path) -> None:
    manifest = _write(tmp_path)

    read_manifest, records = read_participant_state(tmp_path, KIND, INSTANCE)

    assert read_manifest == manifest
    assert records == _records()
    assert manifest["records_file"] == f"records-{manifest['records_sha256']}.jsonl"
    assert manifest["record_count"] == 3
    assert {key: manifest[key] for key in ("schema_version", "kind", "instance", "checkpoint_id")} == {
        "schema_version": 1,
        "kind": KIND,
        "instance": INSTANCE,
        "checkpoint_id": "c1",
    }


def test_layout_is_records_file_plus_manifest_with_sorted_keys(tmp_path: Path) -> None:
    manifest = _write(tmp_path)

    names = sorted(path.name for path in _directory(tmp_path).iterdir())

    assert names == [MANIFEST_NAME, manifest["records_file"]]
    text = (_directory(tmp_path) / MANIFEST_NAME).read_text()
    assert text == json.dumps(manifest, sort_keys=True, indent=1) + "\n"


def test_empty_export_still_writes_an_empty_records_file(tmp_path: Path) -> None:
    manifest = _write(tmp_path, records=[])

    assert read_participant_state(tmp_path, KIND, INSTANCE) == (manifest, [])
    assert manifest["record_count"] == 0


def test_identical_rewrite_is_idempotent(tmp_path: Path) -> None:
    first = _write(tmp_path)
    before = (_directory(tmp_path) / MANIFEST_NAME).stat().st_ino

    second = _write(tmp_path)

    assert second == first
    assert (_directory(tmp_path) / MANIFEST_NAME).stat().st_ino == before


def test_different_commit_is_refused_and_leaves_the_first_intact(tmp_path: Path) -> None:
    first = _write(tmp_path)

    with pytest.raises(CheckpointStateError, match="already holds a different commit"):
        _write(tmp_path, records=_records(2))

    assert read_participant_state(tmp_path, KIND, INSTANCE) == (first, _records())
    assert sorted(path.name for path in _directory(tmp_path).iterdir()) == [MANIFEST_NAME, first["records_file"]]


def test_other_checkpoint_id_into_the_same_directory_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)

    with pytest.raises(CheckpointStateError, match="already holds a different commit"):
        _write(tmp_path, checkpoint_id="c2")


def test_tampered_record_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    path = _records_path(tmp_path)
    path.write_text(path.read_text().replace('"step": 1', '"step": 7'))

    with pytest.raises(CheckpointStateError, match="SHA-256"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_truncated_records_are_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    path = _records_path(tmp_path)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))

    with pytest.raises(CheckpointStateError, match="SHA-256"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_wrong_record_count_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    _rewrite_manifest(tmp_path, record_count=4)

    with pytest.raises(CheckpointStateError, match="holds 3 records, but the manifest says 4"):
        read_participant_state(tmp_path, KIND, INSTANCE)


@pytest.mark.parametrize(
    ("kind", "instance"),
    [("agent", INSTANCE), (KIND, "other-env")],
    ids=["foreign-kind", "foreign-instance"],
)
def test_manifest_of_another_participant_is_refused(tmp_path: Path, kind: str, instance: str) -> None:
    write_participant_state(tmp_path, kind, instance, "c1", _records())
    source = participant_dir(tmp_path, kind, instance)
    target = _directory(tmp_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)

    with pytest.raises(CheckpointStateError, match="belongs to another server"):
        read_participant_state(tmp_path, KIND, INSTANCE)


@pytest.mark.parametrize(
    "changes",
    [
        {"schema_version": 2},
        {"schema_version": True},
        {"checkpoint_id": 7},
        {"record_count": "3"},
        {"records_sha256": None},
    ],
    ids=["schema-2", "schema-bool", "id-not-string", "count-not-int", "digest-missing"],
)
def test_malformed_manifest_fields_are_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    _write(tmp_path)
    _rewrite_manifest(tmp_path, **changes)

    with pytest.raises(CheckpointStateError, match=next(iter(changes))):
        read_participant_state(tmp_path, KIND, INSTANCE)


@pytest.mark.parametrize(
    "records_file",
    ["../../../../etc/passwd", "../manifest.json", "records-abc.jsonl", "records.jsonl\n", "/tmp/records.jsonl"],
    ids=["traversal", "parent", "short-digest", "trailing-newline", "absolute"],
)
def test_bad_records_file_name_is_refused(tmp_path: Path, records_file: str) -> None:
    _write(tmp_path)
    _rewrite_manifest(tmp_path, records_file=records_file)

    with pytest.raises(CheckpointStateError, match="'records_file' must match"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_records_file_named_after_another_digest_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    _rewrite_manifest(tmp_path, records_file=f"records-{'0' * 64}.jsonl")

    with pytest.raises(CheckpointStateError, match="named after 'records_sha256'"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_non_json_line_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    path = _records_path(tmp_path)
    path.write_text(path.read_text() + "{not json\n")

    with pytest.raises(CheckpointStateError, match=r"line 4 of .* is not JSON"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_manifest_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    (_directory(tmp_path) / MANIFEST_NAME).write_text("[1, 2]")

    with pytest.raises(CheckpointStateError, match="JSON object"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointStateError, match="does not exist"):
        read_participant_state(tmp_path, KIND, INSTANCE)


def test_missing_records_file_is_refused(tmp_path: Path) -> None:
    _write(tmp_path)
    _records_path(tmp_path).unlink()

    with pytest.raises(CheckpointStateError, match="cannot read"):
        read_participant_state(tmp_path, KIND, INSTANCE)


@pytest.mark.parametrize("name", ["..", "a/b", "", ".hidden", "env\n"], ids=repr)
def test_names_that_could_leave_the_directory_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointStateError, match="must match"):
        write_participant_state(tmp_path, KIND, name, "c1", [])
    with pytest.raises(CheckpointStateError, match="must match"):
        read_participant_state(tmp_path, name, INSTANCE)


def test_record_that_is_not_json_is_refused_before_anything_is_published(tmp_path: Path) -> None:
    with pytest.raises(CheckpointStateError, match="record 1 is not JSON"):
        _write(tmp_path, records=[{"ok": 1}, {"bad": float("nan")}])

    assert list(_directory(tmp_path).iterdir()) == []


def test_a_record_with_a_cycle_is_refused_as_not_json(tmp_path: Path) -> None:
    cyclic: dict[str, Any] = {"episode_id": {"rollout_id": "r0"}}
    cyclic["self"] = cyclic
    with pytest.raises(CheckpointStateError, match="record 0 is not JSON"):
        _write(tmp_path, records=[cyclic])


def test_a_records_line_is_its_json_as_json_dumps_writes_it() -> None:
    record = {"episode_id": {"rollout_id": "r0", "attempt": 1}, "text": 'é\n"', "n": [1, 2.5, None, True]}
    assert record_line(record, 0) == (json.dumps(record, allow_nan=False) + "\n").encode()
    assert record_line(encode_record(record, 0), 1) == record_line(record, 0)


def test_unwritable_directory_is_a_checkpoint_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "gym"
    blocker.write_text("a file where the gym directory should be")

    with pytest.raises(CheckpointStateError, match="cannot write"):
        _write(tmp_path)


def test_select_keeps_only_chosen_records_while_digest_covers_all(tmp_path: Path) -> None:
    _write(tmp_path)

    def keep_r1(record: dict[str, Any]) -> Any:
        return record["boundary"] if record["episode_id"]["rollout_id"] == "r1" else None

    manifest, kept = read_participant_state(tmp_path, KIND, INSTANCE, select=keep_r1)

    assert kept == [{"step": 1}]
    assert manifest["record_count"] == 3
    path = _records_path(tmp_path)
    path.write_text(path.read_text().replace('"step": 2', '"step": 9'))  # a record select drops
    with pytest.raises(CheckpointStateError, match="SHA-256"):
        read_participant_state(tmp_path, KIND, INSTANCE, select=keep_r1)


def test_corruption_is_reported_before_an_error_raised_by_select(tmp_path: Path) -> None:
    _write(tmp_path)
    _rewrite_manifest(tmp_path, record_count=5)

    def refuse(record: Any) -> Any:
        raise CheckpointStateError("record refused by select")

    with pytest.raises(CheckpointStateError, match="manifest says 5"):
        read_participant_state(tmp_path, KIND, INSTANCE, select=refuse)


def test_stopped_write_publishes_nothing(tmp_path: Path) -> None:
    flag = StopFlag()
    flag.stop()

    with pytest.raises(WriteStoppedError):
        write_participant_state(tmp_path, KIND, INSTANCE, "c1", _records(), stop=flag)

    assert list(_directory(tmp_path).iterdir()) == []


def test_stop_during_the_records_leaves_no_manifest(tmp_path: Path) -> None:
    flag = StopFlag()

    def records() -> Any:
        yield {"episode_id": {"rollout_id": "r0", "attempt": 0}}
        flag.stop()  # a resume arriving while the records are being written
        yield {"episode_id": {"rollout_id": "r1", "attempt": 0}}

    with pytest.raises(WriteStoppedError, match="stopped by a resume"):
        write_participant_state(tmp_path, KIND, INSTANCE, "c1", records(), stop=flag)

    assert list(_directory(tmp_path).iterdir()) == []


def test_stop_waits_for_a_publication_under_way(tmp_path: Path) -> None:
    flag = StopFlag()
    stopped = threading.Event()
    with flag.publishing("c1"):
        stopper = threading.Thread(target=lambda: (flag.stop(), stopped.set()))
        stopper.start()
        assert not stopped.wait(timeout=0.05)  # a bounded check that stop() is still blocked, not a sync sleep
    stopper.join(timeout=5)

    assert stopped.is_set()
    assert flag.stopped


@pytest.mark.parametrize(
    ("manifest_first", "in_place", "published"),
    [(False, False, ["records"]), (True, False, ["manifest"]), (False, True, ["records"])],
)
def test_between_files_runs_after_the_first_publication_and_before_the_second(
    tmp_path: Path, manifest_first: bool, in_place: bool, published: list[str]
) -> None:
    """Also where the planted `store_failed_write_leaves_manifest` writes the manifest in place: a crash inside a
    commit waits at this failpoint, and without it waited out the settle timeout on that deployment."""
    seen: list[list[str]] = []

    def between_files() -> None:
        names = [path.name for path in _directory(tmp_path).iterdir() if not path.name.startswith(".")]
        seen.append(sorted("manifest" if name == MANIFEST_NAME else "records" for name in names))

    write_participant_state(
        tmp_path,
        KIND,
        INSTANCE,
        "c1",
        _records(),
        between_files=between_files,
        manifest_first=manifest_first,
        faults=WriterFaults(manifest_in_place=in_place),
    )

    assert seen == [published]
    assert read_participant_state(tmp_path, KIND, INSTANCE)[1] == _records()
