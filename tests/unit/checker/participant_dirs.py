"""Committed participant directories written by hand, for the tests of the checker's readers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_participant(
    directory: Path,
    records: bytes,
    *,
    kind: str,
    instance: str,
    checkpoint_id: str,
    manifest_changes: Mapping[str, Any] | None = None,
) -> Path:
    """A committed participant directory as Gym's writer lays it out (reference 6.1-6.2): the records file named
    after its digest, then the manifest (sorted keys, indent 1); `manifest_changes` override or add manifest
    fields. Returns the records file."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(records).hexdigest()
    records_path = directory / f"records-{digest}.jsonl"
    records_path.write_bytes(records)
    manifest = {
        "schema_version": 1,
        "kind": kind,
        "instance": instance,
        "checkpoint_id": checkpoint_id,
        "records_file": records_path.name,
        "records_sha256": digest,
        "record_count": records.count(b"\n"),
        **(manifest_changes or {}),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=1))
    return records_path
