"""The checker's own reader of a rollout collection's checkpoint directory (reference Appendix C, 6.1): `LATEST`,
each checkpoint's `collection.json` beside its participants' directories, the dispatch log and the output rows.

Written apart from any collector's code, as `ckpt_model.protocol.storage` is apart from any participant's: the
collection properties must not trust the system's reader to judge the system's files. It is strict where a lenient
reader would hide a defect: `collection.json` has exactly its five fields, typed; `LATEST` names a checkpoint ID.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pydantic

from ckpt_model.protocol.storage import Fingerprint, fingerprint
from ckpt_model.protocol.wire import EpisodeId

MANIFEST = "collection.json"
LATEST = "LATEST"
DISPATCH_LOG = "dispatched.jsonl"
CHECKPOINT_ID = re.compile(r"^ckpt-\d{8}T\d{6}-[0-9a-f]{8}$")
MANIFEST_FIELDS = frozenset({"checkpoint_id", "run_id", "created_at", "continued", "restarted"})
ROLLOUT_KEY = "_ng_rollout_id"
ATTEMPT_KEY = "_ng_attempt_index"


class CollectionUnreadable(Exception):
    """A collection file that does not read; the message names the file and what is wrong."""


@attrs.frozen
class CollectionCheckpoint:
    """One published checkpoint's `collection.json`."""

    checkpoint_id: str
    run_id: str
    created_at: float
    continued: tuple[EpisodeId, ...]
    restarted: tuple[EpisodeId, ...]


@attrs.frozen
class OutputRow:
    rollout_id: str
    attempt: int
    reward: float | None


def latest_id(root: Path) -> str | None:
    """The checkpoint `LATEST` names; None when there is no `LATEST`."""
    path = root / LATEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    checkpoint_id = text.strip()
    if text != checkpoint_id + "\n" or not CHECKPOINT_ID.match(checkpoint_id):
        raise CollectionUnreadable(f"{path} holds {text!r}, not one checkpoint ID and a newline")
    return checkpoint_id


def read_checkpoint(root: Path, checkpoint_id: str) -> CollectionCheckpoint:
    path = root / checkpoint_id / MANIFEST
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CollectionUnreadable(f"{path}: {exc}") from None
    if not isinstance(document, dict) or set(document) != MANIFEST_FIELDS:
        fields = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise CollectionUnreadable(f"{path}: fields {fields}, not {sorted(MANIFEST_FIELDS)}")
    if document["checkpoint_id"] != checkpoint_id:
        raise CollectionUnreadable(f"{path} names checkpoint {document['checkpoint_id']!r}")
    if not isinstance(document["run_id"], str) or not _number(document["created_at"]):
        raise CollectionUnreadable(f"{path}: run_id must be a string and created_at a number")
    return CollectionCheckpoint(
        checkpoint_id=checkpoint_id,
        run_id=document["run_id"],
        created_at=float(document["created_at"]),
        continued=_episodes(path, "continued", document["continued"]),
        restarted=_episodes(path, "restarted", document["restarted"]),
    )


def checkpoint_dirs(root: Path) -> tuple[list[str], list[str]]:
    """(published, partial): the checkpoint directories with and without `collection.json`, by name."""
    published: list[str] = []
    partial: list[str] = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if path.is_dir() and CHECKPOINT_ID.match(path.name):
                (published if (path / MANIFEST).exists() else partial).append(path.name)
    return published, partial


def participant_fingerprints(root: Path, checkpoint_id: str) -> dict[str, Fingerprint]:
    """Every participant directory of a checkpoint (`gym/<kind>/<instance>`), verified with the checker's reader
    against that checkpoint's ID, by `kind/instance`; raises `CheckpointUnreadable` at the first defect."""
    gym = root / checkpoint_id / "gym"
    found: dict[str, Fingerprint] = {}
    for kind_dir in sorted(gym.iterdir()) if gym.is_dir() else []:
        for instance_dir in sorted(kind_dir.iterdir()):
            key = f"{kind_dir.name}/{instance_dir.name}"
            found[key] = fingerprint(instance_dir, kind_dir.name, instance_dir.name, checkpoint_id=checkpoint_id)
    return found


def published_shares(root: Path) -> dict[str, set[tuple[str, str]]]:
    """Each published checkpoint's participant directories, `(kind, instance)`, by checkpoint ID."""
    published, _ = checkpoint_dirs(root)
    shares: dict[str, set[tuple[str, str]]] = {}
    for checkpoint_id in published:
        gym = root / checkpoint_id / "gym"
        kinds = sorted(gym.iterdir()) if gym.is_dir() else []
        shares[checkpoint_id] = {(kind.name, each.name) for kind in kinds if kind.is_dir() for each in kind.iterdir()}
    return shares


def output_rows(path: Path) -> list[OutputRow]:
    """The output file's rows in order; a torn last line (a process killed mid-write) is not a row."""
    rows: list[OutputRow] = []
    for number, line in _json_lines(path):
        rollout_id, attempt, reward = line.get(ROLLOUT_KEY), line.get(ATTEMPT_KEY, -1), line.get("reward")
        if not isinstance(rollout_id, str) or not _integer(attempt) or not (reward is None or _number(reward)):
            raise CollectionUnreadable(f"{path}:{number}: not an output row: {line!r}")
        rows.append(OutputRow(rollout_id, attempt, None if reward is None else float(reward)))
    return rows


def dispatched(root: Path) -> list[tuple[str, int]]:
    """Every `(rollout_id, attempt)` the dispatch log names, in order, run-ID lines left out."""
    entries: list[tuple[str, int]] = []
    for number, line in _json_lines(root / DISPATCH_LOG):
        if set(line) == {"run_id"}:
            continue
        if len(line) != 1 or not all(_integer(value) for value in line.values()):
            raise CollectionUnreadable(f"{root / DISPATCH_LOG}:{number}: not a dispatch entry: {line!r}")
        entries.extend(line.items())
    return entries


def _json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    parsed: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, 1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise CollectionUnreadable(f"{path}:{number} is not JSON") from None
        if not isinstance(value, dict):
            raise CollectionUnreadable(f"{path}:{number} is not a JSON object")
        parsed.append((number, value))
    return parsed


def _episodes(path: Path, field: str, value: Any) -> tuple[EpisodeId, ...]:
    if not isinstance(value, list):
        raise CollectionUnreadable(f"{path}: {field} must be a list")
    episodes: list[EpisodeId] = []
    for entry in value:
        if not isinstance(entry, Mapping) or set(entry) != {"rollout_id", "attempt"} or not _integer(entry["attempt"]):
            raise CollectionUnreadable(f"{path}: {field} holds {entry!r}, not {{rollout_id, attempt}}")
        try:
            episodes.append(EpisodeId(rollout_id=entry["rollout_id"], attempt=entry["attempt"]))
        except pydantic.ValidationError as exc:
            raise CollectionUnreadable(f"{path}: {field} holds {entry!r}: {exc.errors()[0]['msg']}") from None
    return tuple(episodes)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
