"""A collection's checkpoint directory: one directory per checkpoint (the participants' records beside
`collection.json`), `LATEST` naming the newest published one, and the dispatch log `dispatched.jsonl`.

A checkpoint is published when its `collection.json` exists; `LATEST` moves to it only afterwards, each file
written whole and renamed into place (then the directory fsynced), so a reader finds either the old or the new
one, never a torn one. The two newest published checkpoints are kept; partial ones are deleted after a success.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from fakes.gym.protocol.wire import key_of

MANIFEST = "collection.json"
LATEST = "LATEST"
DISPATCH_LOG = "dispatched.jsonl"
PUBLISHED_KEPT = 2
CHECKPOINT_ID = re.compile(r"^ckpt-\d{8}T\d{6}-[0-9a-f]{8}$")


class LayoutError(ValueError):
    """What the directory holds cannot be read as a collection checkpoint."""


def new_checkpoint_id(now: float | None = None) -> str:
    """`ckpt-<YYYYmmddTHHMMSS>-<8 hex>`, in UTC."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"ckpt-{stamp}-{secrets.token_hex(4)}"


@attrs.frozen
class Episode:
    rollout_id: str
    attempt: int

    @property
    def capture_key(self) -> str:
        """`rollout_id` for attempt 0, else `<rollout_id>-a<attempt>`, as the participants name episodes."""
        return key_of(self.rollout_id, self.attempt)

    def wire(self) -> dict[str, Any]:
        return {"rollout_id": self.rollout_id, "attempt": self.attempt}

    @classmethod
    def from_wire(cls, value: Any) -> Episode:
        if not isinstance(value, dict) or set(value) != {"rollout_id", "attempt"}:
            raise LayoutError(f"an episode is {{rollout_id, attempt}}, not {value!r}")
        return cls(str(value["rollout_id"]), int(value["attempt"]))


@attrs.frozen
class CollectionManifest:
    """`collection.json`: what a checkpoint continues (exported) and what it starts over (restarts)."""

    checkpoint_id: str
    run_id: str
    created_at: float
    continued: tuple[Episode, ...]
    restarted: tuple[Episode, ...]

    def wire(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "run_id": self.run_id,
            "created_at": self.created_at,
            "continued": [episode.wire() for episode in self.continued],
            "restarted": [episode.wire() for episode in self.restarted],
        }

    @classmethod
    def from_wire(cls, value: Any) -> CollectionManifest:
        try:
            return cls(
                checkpoint_id=str(value["checkpoint_id"]),
                run_id=str(value["run_id"]),
                created_at=float(value["created_at"]),
                continued=tuple(Episode.from_wire(each) for each in value["continued"]),
                restarted=tuple(Episode.from_wire(each) for each in value["restarted"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"not a collection manifest: {exc}") from None


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` through a fsynced temporary file renamed into place, then fsync the directory."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish(root: Path, manifest: CollectionManifest) -> None:
    """Publish a checkpoint whose participants' records are written: its `collection.json`, then `LATEST`."""
    write_whole(root / manifest.checkpoint_id / MANIFEST, json.dumps(manifest.wire(), indent=1) + "\n")
    write_whole(root / LATEST, manifest.checkpoint_id + "\n")


def read_manifest(root: Path, checkpoint_id: str) -> CollectionManifest:
    path = root / checkpoint_id / MANIFEST
    try:
        manifest = CollectionManifest.from_wire(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise LayoutError(f"{path}: {exc}") from None
    if manifest.checkpoint_id != checkpoint_id:
        raise LayoutError(f"{path} names checkpoint {manifest.checkpoint_id!r}")
    return manifest


def latest(root: Path) -> CollectionManifest | None:
    """The checkpoint `LATEST` names, read and checked; None when there is no `LATEST`."""
    try:
        checkpoint_id = (root / LATEST).read_text().strip()
    except FileNotFoundError:
        return None
    if not CHECKPOINT_ID.match(checkpoint_id):
        raise LayoutError(f"{root / LATEST} names {checkpoint_id!r}, not a checkpoint ID")
    return read_manifest(root, checkpoint_id)


def checkpoint_dirs(root: Path) -> list[Path]:
    return sorted(path for path in root.iterdir() if path.is_dir() and CHECKPOINT_ID.match(path.name))


def prune(root: Path, keep: int = PUBLISHED_KEPT) -> list[str]:
    """Delete every partial checkpoint and all but the `keep` newest published ones (never the one `LATEST`
    names); the names deleted."""
    newest = latest(root)
    published: list[tuple[float, str]] = []
    doomed: list[str] = []
    for path in checkpoint_dirs(root):
        if not (path / MANIFEST).exists():
            doomed.append(path.name)
            continue
        try:
            published.append((read_manifest(root, path.name).created_at, path.name))
        except LayoutError:
            doomed.append(path.name)
    published.sort()
    kept = {name for _, name in published[-keep:]} | ({newest.checkpoint_id} if newest else set())
    doomed += [name for _, name in published if name not in kept]
    for name in sorted(doomed):
        shutil.rmtree(root / name, ignore_errors=True)
    return sorted(doomed)


class DispatchLog:
    """`dispatched.jsonl`: a run's ID, then `{rollout_id: attempt}` for every `/run` before it is sent."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.path = root / DISPATCH_LOG
        # Open for the run's whole life; every line is written through before its `/run` is sent.
        self._handle = open(self.path, "a", buffering=1)  # noqa: SIM115
        self._write({"run_id": run_id})

    def record(self, rollout_id: str, attempt: int) -> None:
        self._write({rollout_id: attempt})

    def _write(self, line: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._handle.close()


def dispatched_attempts(root: Path) -> dict[str, int]:
    """The highest attempt the dispatch log names for each rollout, over every run it holds."""
    attempts: dict[str, int] = {}
    for line in json_lines(root / DISPATCH_LOG):
        for key, value in line.items():
            if key != "run_id":
                attempts[key] = max(attempts.get(key, -1), int(value))
    return attempts


def json_lines(path: Path) -> Iterable[dict[str, Any]]:
    """Every JSON object line of `path` (none if it does not exist); a torn last line, as a kill mid-write leaves,
    is skipped, a torn line anywhere else is an error."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    objects = []
    for number, line in enumerate(lines, 1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise LayoutError(f"{path}:{number} is not JSON") from None
        if not isinstance(value, dict):
            raise LayoutError(f"{path}:{number} is not a JSON object")
        objects.append(value)
    return objects
