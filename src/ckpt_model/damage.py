"""Damaged copies of a committed checkpoint, which the `failed_restore` rule restores (P8).

The committed directory itself is never touched (P9 keeps re-reading it): the damage goes into a copy beside it,
to one participant's directory, in one of two ways, each of which that participant must refuse with
`invalid_checkpoint_state` (reference sections 6.3 and 6.4):

- `digest`: a line is added to the records file, so its SHA-256 and count no longer match the manifest;
- `record`: the first record is cut down to its `episode_id` and the file is sealed again (named after its new
  digest, the manifest's digest and name rewritten to match), so the directory reads as sound and only the
  participant's own validation of the record can refuse it.

Written against the layout the checker's own reader (`ckpt_model.storage`) checks, not the system's writer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Literal

from ckpt_model.storage import MANIFEST_NAME, CheckpointUnreadable, participant_dir, read_records

Damage = Literal["digest", "record"]


def holds_records(checkpoint_dir: Path, kind: str, instance: str) -> bool:
    """Whether the participant's directory in a committed checkpoint holds at least one record."""
    try:
        return bool(read_records(participant_dir(checkpoint_dir, kind, instance), kind, instance))
    except CheckpointUnreadable:
        return False


def damaged_copy(source: Path, destination: Path, kind: str, instance: str, damage: Damage) -> Path:
    """Copy the checkpoint directory `source` to `destination` and damage one participant's share of the copy."""
    shutil.copytree(source, destination)
    directory = participant_dir(destination, kind, instance)
    manifest_path = directory / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    records_path = directory / manifest["records_file"]
    if damage == "digest":
        with records_path.open("ab") as records:
            records.write(b'{"damaged": true}\n')
        return destination
    lines = records_path.read_bytes().split(b"\n")
    if not lines or not lines[0]:
        raise ValueError(f"{directory} holds no record to damage")
    lines[0] = json.dumps({"episode_id": json.loads(lines[0])["episode_id"]}).encode()
    data = b"\n".join(lines)
    digest = hashlib.sha256(data).hexdigest()
    records_path.unlink()
    manifest.update(records_file=f"records-{digest}.jsonl", records_sha256=digest)
    (directory / manifest["records_file"]).write_bytes(data)
    manifest_path.write_text(json.dumps(manifest) + "\n")
    return destination
