"""Damaged copies of a committed checkpoint, which the `failed_restore` rule restores (P8).

The committed directory itself is never touched (P9 keeps re-reading it): the damage goes into a copy beside it,
to one participant's directory, in one of two ways, each of which that participant must refuse with
`invalid_checkpoint_state` (reference sections 6.3 and 6.4):

- `digest`: a line is added to the records file, so its SHA-256 and count no longer match the manifest;
- `record`: the first record the restore's scope names is cut down to its `episode_id` and the file is sealed
  again (named after its new digest, the manifest's digest and name rewritten to match), so the directory reads as
  sound and only the participant's own validation of the record can refuse it (a restore validates only the
  records in its scope).

Written against the layout the checker's own reader (`ckpt_model.protocol.storage`) checks, not the system's writer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal

from ckpt_model.model.contract import capture_key
from ckpt_model.protocol.client import Participant
from ckpt_model.protocol.storage import MANIFEST_NAME, CheckpointUnreadable, participant_dir, read_records

Damage = Literal["digest", "record"]


def holds_records(checkpoint_dir: Path, kind: str, instance: str, scope: Collection[str]) -> bool:
    """Whether the participant's directory in a committed checkpoint holds a record of an attempt in `scope`."""
    try:
        records = read_records(participant_dir(checkpoint_dir, kind, instance), kind, instance)
    except CheckpointUnreadable:
        return False
    return any(_key(record) in scope for record in records)


def _key(record: Any) -> str | None:
    episode_id = record.get("episode_id") if isinstance(record, dict) else None
    if not isinstance(episode_id, dict):
        return None
    return capture_key(str(episode_id.get("rollout_id")), int(episode_id.get("attempt", 0)))


def choose(
    source: Path, members: Sequence[Participant], scope: Collection[str], rejected_record: bool, victim: int
) -> tuple[Participant, Damage]:
    """Which participant's share to damage, and how: with `rejected_record`, among the participants that hold a
    record the restore continues, its first such record (`record`); otherwise anyone's digest (`digest`)."""
    holding = [m for m in members if holds_records(source, m.kind, m.name, scope)]
    how: Damage = "record" if rejected_record and holding else "digest"
    candidates = holding if how == "record" else list(members)
    return candidates[victim % len(candidates)], how


def damaged_copy(
    source: Path, destination: Path, kind: str, instance: str, damage: Damage, scope: Collection[str] = ()
) -> Path:
    """Copy the checkpoint directory `source` to `destination` and damage one participant's share of the copy
    (`record`: its first record of an attempt in `scope`)."""
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
    index = next((i for i, line in enumerate(lines) if line and _key(json.loads(line)) in scope), None)
    if index is None:
        raise ValueError(f"{directory} holds no record of {sorted(scope)} to damage")
    lines[index] = json.dumps({"episode_id": json.loads(lines[index])["episode_id"]}).encode()
    data = b"\n".join(lines)
    digest = hashlib.sha256(data).hexdigest()
    records_path.unlink()
    manifest.update(records_file=f"records-{digest}.jsonl", records_sha256=digest)
    (directory / manifest["records_file"]).write_bytes(data)
    manifest_path.write_text(json.dumps(manifest) + "\n")
    return destination
