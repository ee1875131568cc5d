"""The checker's own reader of Gym's checkpoint directory layout (reference section 6).

Written independently of any participant's code, and importing none of the protocol descriptions the look-alike
stack also uses: P9 must not trust the system's reader to judge the system's writes. `fingerprint` validates a
participant directory as Gym's `read_participant_state` does (6.3: safe kind and instance names, a manifest that
is a UTF-8 JSON object, schema version, kind, instance, checkpoint ID, records-file name, per-line JSON,
whole-file SHA-256 and record count) and returns what a later check compares byte for byte.

It is stricter than Gym where Gym's checks only happen to pass on what Gym's writer produces (6.2): integers must
not be bools, the records-file name must match the pattern in full and carry the manifest's digest, the digest
must be 64 lowercase hex digits, and the caller may name the checkpoint the manifest must belong to.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from ckpt_model.protocol.wire import rollout_key

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
# Reference 6.1: named after the digest, or the fixed name that older checkpoints used (Gym reads both).
RECORDS_FILE_PATTERN = r"^records(-[0-9a-f]{64})?\.jsonl$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Always `fullmatch`: with `match`, `$` also accepts a trailing newline. Neither pattern admits a path separator
# or `..`, so a name that matches cannot leave the participant's (or the checkpoint's) directory.
_RECORDS_FILE_RE = re.compile(RECORDS_FILE_PATTERN)
_NAME_RE = re.compile(NAME_PATTERN)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


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
    # The (rollout ID, attempt) pair each record names, sorted: what its capture key is derived from (P15).
    episodes: tuple[tuple[str, int], ...] = ()


def participant_dir(checkpoint_dir: Path, kind: str, instance: str) -> Path:
    """`<dir>/gym/<kind>/<instance>`; a name Gym refuses (it could leave the directory) is unreadable."""
    _check_names(kind, instance)
    return Path(checkpoint_dir) / "gym" / kind / instance


def fingerprint(directory: Path, kind: str, instance: str, *, checkpoint_id: str | None = None) -> Fingerprint:
    """Verify one participant's directory and describe it; raise `CheckpointUnreadable` on any defect.

    `checkpoint_id`, when given, is the checkpoint the caller committed there: a manifest naming another one
    is a commit that landed in the wrong directory.
    """
    return read_share(directory, kind, instance, checkpoint_id=checkpoint_id)[0]


def read_share(
    directory: Path, kind: str, instance: str, *, checkpoint_id: str | None = None
) -> tuple[Fingerprint, list[Any]]:
    """`fingerprint` and `read_records` from one read of the directory, for a caller that needs both."""
    checked = _read_verified(Path(directory), kind, instance, checkpoint_id)
    described = Fingerprint(
        manifest_sha256=hashlib.sha256(checked.manifest_bytes).hexdigest(),
        records_file=checked.manifest["records_file"],
        records_sha256=checked.manifest["records_sha256"],
        record_count=checked.manifest["record_count"],
        episode_ids=tuple(sorted(_capture_key(record) for record in checked.records)),
        episodes=tuple(sorted(pair for pair in map(_episode, checked.records) if pair is not None)),
    )
    return described, checked.records


# The file (device, inode), its size, and its modification and change times: a write, truncation, rename or
# replacement changes at least one of them, provided the file changed after the filesystem's clock last ticked
# past its change time (`FingerprintCache`).
FileKey = tuple[int, int, int, int, int]
CLOCK_PROBE_NAME = ".fingerprint-clock"


class FingerprintCache:
    """`fingerprint` that reads a participant directory again only when one of its two files changed.

    P9 reads every committed directory after every step; reading and hashing them all is O(checkpoints) per step.
    This keeps, per directory, each file's `FileKey` and the fingerprint they gave, and hands the fingerprint back
    while both keys stand. A file changed in the same tick of the filesystem's clock as the keys were taken can
    keep every key (timestamps are coarse, ~4 ms; a same-size rewrite keeps size and inode), so a key counts only
    when the file's change time is older than the clock's reading: `clock_ns()` touches a probe file in
    `clock_dir` and returns its change time, the filesystem's own clock on its own scale. Any change made after
    that reading gets a later change time, which no key holds. Until its file is that old, a directory is read
    in full every time. Unreadable directories are never kept."""

    def __init__(self, clock_dir: Path) -> None:
        self.clock_dir = Path(clock_dir)
        self._kept: dict[tuple[Path, str, str, str | None], tuple[FileKey, FileKey, Fingerprint]] = {}
        self.reads = 0  # directories read in full (tests read it)

    def fingerprint(
        self, directory: Path, kind: str, instance: str, *, checkpoint_id: str | None = None
    ) -> Fingerprint:
        """As `fingerprint(...)`, from the kept result while neither file changed."""
        entry = (Path(directory), kind, instance, checkpoint_id)
        kept = self._kept.get(entry)
        if kept is not None:
            kept_manifest, kept_records, kept_found = kept
            if (
                _file_key(entry[0] / MANIFEST_NAME) == kept_manifest
                and _file_key(entry[0] / kept_found.records_file) == kept_records
            ):
                return kept_found
            del self._kept[entry]
        # Clock first, then every file's key, then the read: a change after the keys were taken makes the next
        # call read again (the kept key is out of date by then); one before them is in what was read.
        clock_ns = self.clock_ns()
        keys = _file_keys(entry[0])
        self.reads += 1
        found = fingerprint(directory, kind, instance, checkpoint_id=checkpoint_id)
        manifest_key, records_key = keys.get(MANIFEST_NAME), keys.get(found.records_file)
        if manifest_key is not None and records_key is not None and max(manifest_key[4], records_key[4]) < clock_ns:
            self._kept[entry] = (manifest_key, records_key, found)
        return found

    def clock_ns(self) -> int:
        """The filesystem's clock now: the change time of a probe file touched just now.

        Touched (`utime`, a change of metadata only), not rewritten: on ext4 a truncating rewrite forces the data
        out on close, which costs milliseconds."""
        probe = self.clock_dir / CLOCK_PROBE_NAME
        try:
            try:
                os.utime(probe)
            except FileNotFoundError:
                probe.touch()
            return probe.stat().st_ctime_ns
        except OSError:
            return -1  # no clock: keep nothing, read every time


def _file_keys(directory: Path) -> dict[str, FileKey]:
    """The key of every file in `directory` (none if it cannot be listed)."""
    keys = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    for name in names:
        key = _file_key(directory / name)
        if key is not None:
            keys[name] = key
    return keys


def _file_key(path: Path) -> FileKey | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def read_records(directory: Path, kind: str, instance: str, *, checkpoint_id: str | None = None) -> list[Any]:
    """The records of one participant's directory, in file order, after every check `fingerprint` makes."""
    return _read_verified(Path(directory), kind, instance, checkpoint_id).records


@attrs.frozen
class _Verified:
    manifest_bytes: bytes
    manifest: dict[str, Any]
    records: list[Any]


def _read_verified(directory: Path, kind: str, instance: str, checkpoint_id: str | None) -> _Verified:
    _check_names(kind, instance)
    manifest_path = directory / MANIFEST_NAME
    manifest_bytes = _read_bytes(manifest_path, "the manifest")
    manifest = _manifest(manifest_path, manifest_bytes, kind, instance, checkpoint_id)
    records_path = directory / manifest["records_file"]
    records = _records(records_path, _read_bytes(records_path, "the records"), manifest)
    return _Verified(manifest_bytes=manifest_bytes, manifest=manifest, records=records)


def _check_names(kind: str, instance: str) -> None:
    problems = [
        f"'{field}' must match {NAME_PATTERN} (got {value!r})"
        for field, value in (("kind", kind), ("instance", instance))
        if not isinstance(value, str) or _NAME_RE.fullmatch(value) is None
    ]
    if problems:
        raise CheckpointUnreadable("; ".join(problems) + "; Gym refuses to name a participant directory so")


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise CheckpointUnreadable(f"{path}: cannot read {what} ({error})") from None


def _manifest(path: Path, data: bytes, kind: str, instance: str, checkpoint_id: str | None) -> dict[str, Any]:
    """The manifest, with every problem of its fields reported at once."""
    try:
        # Gym reads the manifest as text; `json.loads(bytes)` would also take UTF-16, UTF-32 and a BOM.
        manifest = json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise CheckpointUnreadable(f"{path}: not UTF-8 JSON") from None
    if not isinstance(manifest, dict):
        raise CheckpointUnreadable(f"{path}: must be a JSON object (got {type(manifest).__name__})")
    problems = [
        *_identity_problems(manifest, kind, instance, checkpoint_id),
        *_records_field_problems(manifest),
    ]
    if problems:
        raise CheckpointUnreadable(f"{path}: " + "; ".join(problems))
    return manifest


def _identity_problems(manifest: dict[str, Any], kind: str, instance: str, checkpoint_id: str | None) -> Iterator[str]:
    """Schema version, and whose commit this is: participant and checkpoint."""
    version = manifest.get("schema_version")
    # `type(...) is int`: `True == 1`, and `isinstance(True, int)` holds too.
    if type(version) is not int or version != SCHEMA_VERSION:
        yield f"'schema_version' must be the integer {SCHEMA_VERSION} (got {version!r})"
    if manifest.get("kind") != kind or manifest.get("instance") != instance:
        yield f"belongs to {manifest.get('kind')!r}/{manifest.get('instance')!r}, not {kind!r}/{instance!r}"
    found = manifest.get("checkpoint_id")
    if not isinstance(found, str):
        yield f"'checkpoint_id' must be a string (got {found!r})"
    elif checkpoint_id is not None and found != checkpoint_id:
        yield f"belongs to checkpoint {found!r}, not {checkpoint_id!r}"


def _records_field_problems(manifest: dict[str, Any]) -> Iterator[str]:
    """The records file's name, digest and count, and that the name carries the digest."""
    name = manifest.get("records_file")
    match = _RECORDS_FILE_RE.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        yield f"'records_file' must be a plain file name matching {RECORDS_FILE_PATTERN} (got {name!r})"
    digest = manifest.get("records_sha256")
    if not isinstance(digest, str) or _SHA256_RE.fullmatch(digest) is None:
        yield f"'records_sha256' must be 64 lowercase hex digits (got {digest!r})"
    elif match is not None and match.group(1) is not None and match.group(1) != f"-{digest}":
        yield f"'records_file' must be named after 'records_sha256' {digest} (got {name!r})"
    count = manifest.get("record_count")
    if type(count) is not int or count < 0:
        yield f"'record_count' must be a non-negative integer (got {count!r})"


def _records(path: Path, data: bytes, manifest: dict[str, Any]) -> list[Any]:
    """Digest and count first, over the whole file, so corruption is named before any line's content."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest["records_sha256"]:
        raise CheckpointUnreadable(f"{path}: SHA-256 {digest} is not the manifest's {manifest['records_sha256']}")
    lines = _lines(data)
    if len(lines) != manifest["record_count"]:
        raise CheckpointUnreadable(f"{path}: {len(lines)} records, the manifest says {manifest['record_count']}")
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise CheckpointUnreadable(f"{path}:{number}: not JSON") from None
    return records


def _lines(data: bytes) -> list[bytes]:
    """The lines as Gym counts them, iterating the file in binary: each ends at b"\\n" (not at a lone b"\\r",
    where `bytes.splitlines` also splits), and a last line without one still counts."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def _episode(record: Any) -> tuple[str, int] | None:
    """The (rollout ID, attempt) pair a record's `episode_id` names, if it names one."""
    episode = record.get("episode_id") if isinstance(record, dict) else None
    if not isinstance(episode, dict) or not isinstance(episode.get("rollout_id"), str):
        return None
    attempt = episode.get("attempt", 0)
    return (episode["rollout_id"], attempt) if isinstance(attempt, int) and not isinstance(attempt, bool) else None


def _capture_key(record: Any) -> str:
    pair = _episode(record)
    return "?" if pair is None else rollout_key(*pair)
