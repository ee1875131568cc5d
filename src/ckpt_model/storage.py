"""The checker's own reader of Gym's checkpoint directory layout (reference section 6).

Written independently of any participant's code: P9 must not trust the system's reader to judge the system's
writes. `fingerprint` validates a participant directory exactly as Gym's reader does (schema version, kind,
instance, records-file name, per-line JSON, whole-file SHA-256 and record count) and returns what a later check
compares byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from ckpt_model.wire import MANIFEST_SCHEMA_VERSION, RECORDS_FILE_RE


class CheckpointUnreadable(Exception):
    """A participant directory that does not verify; the message says which check failed."""


@attrs.frozen
class Fingerprint:
    """What a committed participant directory held: its manifest and the digest of its records file."""

    manifest_sha256: str
    records_file: str
    records_sha256: str
    record_count: int
    episode_ids: tuple[str, ...]


def participant_dir(checkpoint_dir: Path, kind: str, instance: str) -> Path:
    return Path(checkpoint_dir) / "gym" / kind / instance


def fingerprint(directory: Path, kind: str, instance: str) -> Fingerprint:
    """Verify one participant's directory and describe it; raise `CheckpointUnreadable` on any defect."""
    checked = _read_verified(directory, kind, instance)
    return Fingerprint(
        manifest_sha256=hashlib.sha256(checked.manifest_bytes).hexdigest(),
        records_file=checked.manifest["records_file"],
        records_sha256=checked.manifest["records_sha256"],
        record_count=checked.manifest["record_count"],
        episode_ids=tuple(sorted(_capture_key(record) for record in checked.records)),
    )


def read_records(directory: Path, kind: str, instance: str) -> list[Any]:
    """The records of one participant's directory, after every check `fingerprint` makes."""
    return _read_verified(directory, kind, instance).records


@attrs.frozen
class _Verified:
    manifest_bytes: bytes
    manifest: dict[str, Any]
    records: list[Any]


def _read_verified(directory: Path, kind: str, instance: str) -> _Verified:
    manifest_path = directory / "manifest.json"
    try:
        manifest_bytes = manifest_path.read_bytes()
    except OSError as error:
        raise CheckpointUnreadable(f"{manifest_path}: cannot read the manifest ({error})") from None
    manifest = _manifest(manifest_path, manifest_bytes, kind, instance)
    records_path = directory / manifest["records_file"]
    try:
        records_bytes = records_path.read_bytes()
    except OSError as error:
        raise CheckpointUnreadable(f"{records_path}: cannot read the records ({error})") from None
    digest = hashlib.sha256(records_bytes).hexdigest()
    if digest != manifest["records_sha256"]:
        raise CheckpointUnreadable(
            f"{records_path}: SHA-256 {digest} is not the manifest's {manifest['records_sha256']}"
        )
    lines = records_bytes.splitlines()
    if len(lines) != manifest["record_count"]:
        raise CheckpointUnreadable(
            f"{records_path}: {len(lines)} records, the manifest says {manifest['record_count']}"
        )
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise CheckpointUnreadable(f"{records_path}:{number}: not JSON") from None
    return _Verified(manifest_bytes=manifest_bytes, manifest=manifest, records=records)


def _manifest(path: Path, data: bytes, kind: str, instance: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except ValueError:
        raise CheckpointUnreadable(f"{path}: not JSON") from None
    if not isinstance(manifest, dict):
        raise CheckpointUnreadable(f"{path}: must be a JSON object")
    problems = []
    if manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        problems.append(f"schema_version must be {MANIFEST_SCHEMA_VERSION} (got {manifest.get('schema_version')!r})")
    if manifest.get("kind") != kind or manifest.get("instance") != instance:
        problems.append(f"belongs to {manifest.get('kind')}/{manifest.get('instance')}, not {kind}/{instance}")
    if not isinstance(manifest.get("checkpoint_id"), str):
        problems.append("checkpoint_id must be a string")
    if not isinstance(manifest.get("records_file"), str) or not RECORDS_FILE_RE.match(manifest["records_file"]):
        problems.append(f"records_file must match {RECORDS_FILE_RE.pattern} (got {manifest.get('records_file')!r})")
    if not isinstance(manifest.get("records_sha256"), str) or not isinstance(manifest.get("record_count"), int):
        problems.append("records_sha256 must be a string and record_count an integer")
    if problems:
        raise CheckpointUnreadable(f"{path}: " + "; ".join(problems))
    return manifest


def _capture_key(record: Any) -> str:
    episode = record.get("episode_id") if isinstance(record, dict) else None
    if not isinstance(episode, dict) or not isinstance(episode.get("rollout_id"), str):
        return "?"
    attempt = episode.get("attempt", 0)
    return episode["rollout_id"] if attempt == 0 else f"{episode['rollout_id']}-a{attempt}"
