"""The checker's own checkpoint reader refuses every directory Gym's reader would (reference 6.1-6.3), and more.

Directories are built by hand from the reference, never with the look-alike stack's writer: the checker and the
system under test share no code, so a misreading of the layout cannot hide on both sides at once.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.protocol.storage import (
    CheckpointUnreadable,
    fingerprint,
    participant_dir,
    read_records,
)
from tests.unit.checker.participant_dirs import write_participant

KIND = "environment"
INSTANCE = "env-1"
CHECKPOINT_ID = "c1"
RECORDS = [
    {"episode_id": {"rollout_id": "r1", "attempt": 2}, "task_digest": "t1", "boundary": {"step": 1}},
    {"episode_id": {"rollout_id": "r0", "attempt": 0}, "task_digest": "t0", "boundary": None},
]


def _jsonl(records: list[Any]) -> bytes:
    """Records as Gym's writer lays them out (6.2): one `json.dumps` line each, key order kept."""
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_path(directory: Path) -> Path:
    return directory / "manifest.json"


def _write_manifest(directory: Path, manifest: Any) -> None:
    """As Gym's writer serialises it (6.2): sorted keys, indent 1."""
    _manifest_path(directory).write_text(json.dumps(manifest, sort_keys=True, indent=1))


def _participant(tmp_path: Path, data: bytes | None = None, **changes: Any) -> Path:
    """A committed participant directory written by hand; `changes` override (or add) manifest fields."""
    directory = tmp_path / "gym" / KIND / INSTANCE
    directory.mkdir(parents=True)
    records_bytes = _jsonl(RECORDS) if data is None else data
    write_participant(
        directory, records_bytes, kind=KIND, instance=INSTANCE, checkpoint_id=CHECKPOINT_ID, manifest_changes=changes
    )
    return directory


def _manifest(directory: Path) -> dict[str, Any]:
    return json.loads(_manifest_path(directory).read_text())


def _records_path(directory: Path) -> Path:
    return directory / _manifest(directory)["records_file"]


def _unreadable(directory: Path, message: str, **expected: Any) -> None:
    """Both entry points refuse the directory, naming the failed check."""
    with pytest.raises(CheckpointUnreadable, match=message):
        fingerprint(directory, KIND, INSTANCE, **expected)
    with pytest.raises(CheckpointUnreadable, match=message):
        read_records(directory, KIND, INSTANCE, **expected)


# -- valid directories -------------------------------------------------------------------------------------------


def test_fingerprint_describes_a_valid_directory(tmp_path: Path) -> None:
    directory = _participant(tmp_path)
    manifest = _manifest(directory)

    found = fingerprint(directory, KIND, INSTANCE, checkpoint_id=CHECKPOINT_ID)

    digest = _sha256(_jsonl(RECORDS))
    assert found.records_file == f"records-{digest}.jsonl"
    assert found.records_sha256 == digest == manifest["records_sha256"]
    assert found.record_count == 2
    assert found.manifest_sha256 == _sha256(_manifest_path(directory).read_bytes())
    assert found.episode_ids == ("r0", "r1-a2")
    assert found.episodes == (("r0", 0), ("r1", 2))


def test_the_pairs_records_name_are_read_as_written(tmp_path: Path) -> None:
    """`x-a1` at attempt 0 and `x` at attempt 1 have one capture key, and stay two pairs (P15 tells them apart)."""
    records = [{"episode_id": {"rollout_id": "x-a1", "attempt": 0}}, {"episode_id": {"rollout_id": "x", "attempt": 1}}]
    found = fingerprint(_participant(tmp_path, _jsonl(records)), KIND, INSTANCE, checkpoint_id=CHECKPOINT_ID)
    assert found.episode_ids == ("x-a1", "x-a1")
    assert found.episodes == (("x", 1), ("x-a1", 0))


def test_read_records_returns_the_records_in_file_order(tmp_path: Path) -> None:
    directory = _participant(tmp_path)

    assert read_records(directory, KIND, INSTANCE, checkpoint_id=CHECKPOINT_ID) == RECORDS
    assert read_records(directory, KIND, INSTANCE) == RECORDS


def test_participant_dir_is_gym_kind_instance(tmp_path: Path) -> None:
    assert participant_dir(tmp_path, KIND, INSTANCE) == tmp_path / "gym" / KIND / INSTANCE


def test_an_empty_export_is_an_empty_records_file(tmp_path: Path) -> None:
    directory = _participant(tmp_path, data=b"")

    found = fingerprint(directory, KIND, INSTANCE)

    assert (found.record_count, found.episode_ids) == (0, ())


def test_the_fixed_records_name_of_older_checkpoints_is_accepted(tmp_path: Path) -> None:
    directory = _participant(tmp_path, records_file="records.jsonl")
    _records_path(directory).write_bytes(_jsonl(RECORDS))

    assert read_records(directory, KIND, INSTANCE) == RECORDS


def test_participant_extras_in_the_manifest_are_accepted(tmp_path: Path) -> None:
    directory = _participant(tmp_path, session_owners={"r0": "worker-0"}, placed_sessions=[])

    assert read_records(directory, KIND, INSTANCE) == RECORDS


def test_a_carriage_return_inside_a_line_does_not_split_the_record(tmp_path: Path) -> None:
    # Gym iterates the file in binary, so only b"\n" ends a line; a lone b"\r" is JSON whitespace.
    directory = _participant(tmp_path, data=b'{"episode_id":\r{"rollout_id": "r0"}}\n')

    assert read_records(directory, KIND, INSTANCE) == [{"episode_id": {"rollout_id": "r0"}}]


# -- the records file --------------------------------------------------------------------------------------------


def test_a_tampered_record_byte_is_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path)
    path = _records_path(directory)
    path.write_bytes(path.read_bytes().replace(b'"t0"', b'"t9"'))

    _unreadable(directory, "SHA-256 .* is not the manifest's")


def test_records_without_their_last_line_are_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path)
    _records_path(directory).write_bytes(_jsonl(RECORDS[:1]))

    _unreadable(directory, "SHA-256 .* is not the manifest's")


def test_records_with_a_partial_last_line_are_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path)
    path = _records_path(directory)
    path.write_bytes(path.read_bytes()[:-10])

    _unreadable(directory, "SHA-256 .* is not the manifest's")


def test_a_count_that_is_not_the_number_of_lines_is_unreadable(tmp_path: Path) -> None:
    # Digest and name agree with the file; only the count is off.
    directory = _participant(tmp_path, record_count=3)

    _unreadable(directory, "2 records, the manifest says 3")


def test_a_partial_last_line_that_matches_the_digest_is_still_not_json(tmp_path: Path) -> None:
    directory = _participant(tmp_path, data=_jsonl(RECORDS)[:-10], record_count=2)

    _unreadable(directory, ":2: not JSON")


@pytest.mark.parametrize(
    "data",
    [b'{"episode_id": {"rollout_id": "r0"}}\nnot json\n', b"\n", b'{"episode_id": {"rollout_id": "r0"}'],
    ids=["word", "blank-line", "unclosed-object"],
)
def test_a_line_that_is_not_json_is_unreadable(tmp_path: Path, data: bytes) -> None:
    directory = _participant(tmp_path, data=data, record_count=len(data.rstrip(b"\n").split(b"\n")))

    _unreadable(directory, ": not JSON")


def test_a_records_file_renamed_on_disk_is_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path)
    path = _records_path(directory)
    path.rename(directory / f"records-{'0' * 64}.jsonl")

    _unreadable(directory, "cannot read the records")


def test_a_records_file_not_named_after_its_digest_is_unreadable(tmp_path: Path) -> None:
    # The file exists under the other name and its bytes match the digest: only the name is wrong.
    other = f"records-{'0' * 64}.jsonl"
    directory = _participant(tmp_path, records_file=other)
    (directory / other).write_bytes(_jsonl(RECORDS))

    _unreadable(directory, "'records_file' must be named after 'records_sha256'")


@pytest.mark.parametrize(
    "template",
    ["../{name}", "sub/{name}", "/{root}/{name}", "./{name}", "{name}/.", "..", "."],
    ids=["parent", "subdirectory", "absolute", "dot-slash", "trailing-dot", "dot-dot", "dot"],
)
def test_a_records_file_with_a_path_is_unreadable(tmp_path: Path, template: str) -> None:
    directory = _participant(tmp_path)
    name = _records_path(directory).name
    # A verifying copy where the path points, so only the name check can refuse it.
    for target in (directory.parent, directory / "sub"):
        target.mkdir(exist_ok=True)
        (target / name).write_bytes(_jsonl(RECORDS))
    records_file = template.format(name=name, root=str(directory.parent).strip("/"))
    _write_manifest(directory, {**_manifest(directory), "records_file": records_file})

    _unreadable(directory, re.escape("'records_file' must be a plain file name"))


@pytest.mark.parametrize(
    "suffix",
    [".bak", "x", "\n", "~"],
    ids=["dot-bak", "letter", "newline", "tilde"],
)
def test_a_records_file_that_only_starts_like_the_pattern_is_unreadable(tmp_path: Path, suffix: str) -> None:
    directory = _participant(tmp_path)
    path = _records_path(directory)
    renamed = path.rename(path.with_name(path.name + suffix))
    _write_manifest(directory, {**_manifest(directory), "records_file": renamed.name})

    _unreadable(directory, "'records_file' must be a plain file name matching")


@pytest.mark.parametrize(
    "records_file",
    ["Records.jsonl", "records-.jsonl", f"records-{'A' * 64}.jsonl", f"records-{'0' * 63}.jsonl", 7, None],
    ids=["capital", "empty-digest", "upper-hex", "short-digest", "number", "missing"],
)
def test_a_records_file_name_off_the_pattern_is_unreadable(tmp_path: Path, records_file: Any) -> None:
    directory = _participant(tmp_path, records_file=records_file)

    _unreadable(directory, "'records_file' must be a plain file name matching")


@pytest.mark.parametrize(
    "digest",
    [lambda d: d.upper(), lambda d: d[:-1], lambda d: d + "0", lambda d: int(d, 16), lambda d: None],
    ids=["upper", "short", "long", "number", "null"],
)
def test_a_records_sha256_not_64_lowercase_hex_is_unreadable(tmp_path: Path, digest: Any) -> None:
    directory = _participant(tmp_path)
    manifest = _manifest(directory)
    _write_manifest(directory, {**manifest, "records_sha256": digest(manifest["records_sha256"])})

    _unreadable(directory, "'records_sha256' must be 64 lowercase hex digits")


# -- the manifest ------------------------------------------------------------------------------------------------


def test_a_missing_manifest_is_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path)
    _manifest_path(directory).unlink()

    _unreadable(directory, "cannot read the manifest")


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b'{"kind": "environment",}', json.dumps({"kind": KIND}).encode("utf-16")],
    ids=["empty", "unclosed", "trailing-comma", "utf-16"],
)
def test_a_manifest_that_is_not_utf8_json_is_unreadable(tmp_path: Path, data: bytes) -> None:
    directory = _participant(tmp_path)
    _manifest_path(directory).write_bytes(data)

    _unreadable(directory, "not UTF-8 JSON")


@pytest.mark.parametrize("manifest", [[], "manifest", 1, None], ids=["list", "string", "number", "null"])
def test_a_manifest_that_is_not_an_object_is_unreadable(tmp_path: Path, manifest: Any) -> None:
    directory = _participant(tmp_path)
    _write_manifest(directory, manifest)

    _unreadable(directory, "must be a JSON object")


def test_a_manifest_of_another_checkpoint_is_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path)

    _unreadable(directory, "belongs to checkpoint 'c1', not 'c2'", checkpoint_id="c2")


@pytest.mark.parametrize("checkpoint_id", [None, 1, ["c1"]], ids=["null", "number", "list"])
def test_a_checkpoint_id_that_is_not_a_string_is_unreadable(tmp_path: Path, checkpoint_id: Any) -> None:
    directory = _participant(tmp_path, checkpoint_id=checkpoint_id)

    _unreadable(directory, "'checkpoint_id' must be a string")


def test_a_manifest_of_another_kind_is_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path, kind="agent")

    _unreadable(directory, "belongs to 'agent'/'env-1', not 'environment'/'env-1'")


def test_a_manifest_of_another_instance_is_unreadable(tmp_path: Path) -> None:
    directory = _participant(tmp_path, instance="env-2")

    _unreadable(directory, "belongs to 'environment'/'env-2', not 'environment'/'env-1'")


@pytest.mark.parametrize("count", [True, 1.0, "1", None, -1], ids=["bool", "float", "string", "null", "negative"])
def test_a_record_count_that_is_not_a_non_negative_int_is_unreadable(tmp_path: Path, count: Any) -> None:
    # One record, so `True == 1` and `1.0 == 1` would pass a plain comparison with the line count.
    directory = _participant(tmp_path, data=_jsonl(RECORDS[:1]), record_count=count)

    _unreadable(directory, "'record_count' must be a non-negative integer")


@pytest.mark.parametrize("version", [True, 1.0, "1", 2, None], ids=["bool", "float", "string", "two", "missing"])
def test_a_schema_version_that_is_not_the_int_1_is_unreadable(tmp_path: Path, version: Any) -> None:
    directory = _participant(tmp_path, schema_version=version)

    _unreadable(directory, "'schema_version' must be the integer 1")


def test_every_manifest_problem_is_reported_at_once(tmp_path: Path) -> None:
    directory = _participant(
        tmp_path, schema_version=True, kind="agent", checkpoint_id="c9", records_file="x", record_count=False
    )

    with pytest.raises(CheckpointUnreadable) as caught:
        fingerprint(directory, KIND, INSTANCE, checkpoint_id=CHECKPOINT_ID)

    message = str(caught.value)
    for problem in (
        "'schema_version'",
        "belongs to 'agent'",
        "belongs to checkpoint 'c9'",
        "'records_file'",
        "'record_count'",
    ):
        assert problem in message


# -- participant names -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "instance"),
    [("..", INSTANCE), (KIND, "../env-1"), (KIND, "env/1"), ("", INSTANCE), (KIND, "env-1\n"), ("-env", INSTANCE)],
    ids=["dot-dot-kind", "traversing-instance", "slash", "empty", "newline", "leading-dash"],
)
def test_a_participant_name_gym_refuses_is_unreadable(tmp_path: Path, kind: str, instance: str) -> None:
    directory = _participant(tmp_path)

    with pytest.raises(CheckpointUnreadable, match="must match"):
        participant_dir(tmp_path, kind, instance)
    with pytest.raises(CheckpointUnreadable, match="must match"):
        fingerprint(directory, kind, instance)
