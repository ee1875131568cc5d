"""One participant's share of a checkpoint directory: a digest-named records file and the manifest naming it.

Layout and rules are reference section 6: `<dir>/gym/<kind>/<instance>/records-<sha256>.jsonl` plus
`manifest.json`. The manifest is the commit point: it is published only after its records file is complete,
fsynced and renamed to its digest; it is created by hard-linking (so it is never replaced, and of two racing
writers exactly one publishes); and a `StopFlag` lets a resume guarantee that no manifest appears after it
returns.

Everything here is blocking file I/O: the control plane calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
from pydantic import ValidationError

from fakes.gym.faults.power_cuts import Journal
from fakes.gym.protocol.errors import CheckpointStateError
from fakes.gym.protocol.wire import (
    MANIFEST_FILE,
    MANIFEST_SCHEMA_VERSION,
    NAME_PATTERN,
    RECORDS_FILE_RE,
    EpisodeId,
    is_valid_name,
    manifest_text,
    records_file_name,
)

MANIFEST_NAME = MANIFEST_FILE
_RECORDS_TEMP_PREFIX = ".records.jsonl."
_MANIFEST_TEMP_PREFIX = ".manifest.json."

Select = Callable[[Any], Any]
# What `json.dumps(record, allow_nan=False)` writes, made once rather than per record, and without the check for
# cycles (records are JSON values, built fresh; a cycle fails as RecursionError): 17 % less CPU a record.
_RECORD_ENCODER = json.JSONEncoder(allow_nan=False, check_circular=False)


@attrs.frozen
class EncodedRecord:
    """A record already encoded as its line of the records file, with its episode's capture key and sort order
    (rollout, attempt). A multi-worker server's workers send their records encoded, and the coordinator writes
    the lines as they came instead of decoding them and encoding them again
    (`fakes.gym.servers.participant_workers`)."""

    key: str
    order: tuple[str, int]
    line: bytes | memoryview


def record_episode(record: Any) -> EpisodeId:
    """The episode a record's `episode_id` names; a record without a valid one is corrupt state."""
    episode = record.get("episode_id") if isinstance(record, dict) else None
    try:
        return EpisodeId.model_validate(episode)
    except ValidationError as exc:
        raise CheckpointStateError(
            f"record without a valid 'episode_id' (got {episode!r}); every record must name its episode"
        ) from exc


def encode_record(record: Any, index: int) -> EncodedRecord:
    """`record` (the `index`th exported) as its line of the records file, with its episode's key and order."""
    episode = record_episode(record)
    return EncodedRecord(episode.capture_key, (episode.rollout_id, episode.attempt), record_line(record, index))


class WriteStoppedError(CheckpointStateError):
    """The write was stopped (by a resume) before it published; nothing was published."""


class StopFlag:
    """Stops a write; once `stop()` returns, the write it guards will never publish a manifest.

    The writer checks the flag before each record and once more under the lock right before publishing, so
    `stop()` waits only for a publication that is already under way.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._publishing = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def never_publishes(self) -> bool:
        """Stopped before its publication began: the write can end only by failing, however long it still runs
        (a stalled disk), so a resume need not wait for it."""
        with self._lock:
            return self._stopped and not self._publishing

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    def raise_if_stopped(self, what: str) -> None:
        if self._stopped:
            raise WriteStoppedError(f"the write of {what} was stopped by a resume before it published")

    @contextlib.contextmanager
    def publishing(self, what: str) -> Iterator[None]:
        with self._lock:
            self.raise_if_stopped(what)
            self._publishing = True
            yield


def participant_dir(checkpoint_dir: str | os.PathLike[str], kind: str, instance: str) -> Path:
    """`<dir>/gym/<kind>/<instance>`, refusing names that could leave the checkpoint directory."""
    for field, value in (("kind", kind), ("instance", instance)):
        if not isinstance(value, str) or not is_valid_name(value):
            raise CheckpointStateError(
                f"'{field}' must match {NAME_PATTERN} (got {value!r}); fix the server's configured name"
            )
    return Path(checkpoint_dir) / "gym" / kind / instance


def write_participant_state(
    checkpoint_dir: str | os.PathLike[str],
    kind: str,
    instance: str,
    checkpoint_id: str,
    records: Iterable[Any],
    *,
    stop: StopFlag | None = None,
    between_files: Callable[[], None] | None = None,
    manifest_first: bool = False,
    journal: Journal | None = None,
    skip_records_fsync: bool = False,
    storage_fault: Callable[[str], None] | None = None,
    faults: WriterFaults | None = None,
) -> dict[str, Any]:
    """Write the records, then publish the manifest; return the manifest (also when it already existed).

    `between_files` runs between the two publications (a failpoint). `manifest_first` publishes the manifest
    before the records (the planted fault `store_publishes_manifest_first`); `skip_records_fsync` never fsyncs the
    records file (the planted fault `store_skips_records_fsync`). `journal` records every fsync, so a power cut can
    be applied afterwards (`fakes.gym.faults.power_cuts`). `storage_fault(point)` runs at each named point of the write
    (`fakes.gym.faults.storage`), where it may raise an `OSError` or stall; `faults` are the writer's planted
    faults."""
    directory = participant_dir(checkpoint_dir, kind, instance)
    what = f"checkpoint {checkpoint_id!r} to {directory}"
    flag = stop if stop is not None else StopFlag()
    planted = faults or WriterFaults()
    publish = _Publication(
        between_files or (lambda: None),
        manifest_first,
        journal,
        skip_records_fsync,
        storage_fault or (lambda point: None),
        planted,
    )
    try:
        if journal is not None:
            journal.writing(checkpoint_dir)
        directory.mkdir(parents=True, exist_ok=True)
        return _write(directory, kind, instance, checkpoint_id, records, flag, what, publish)
    except OSError as exc:
        if planted.os_errors_escape:
            raise
        raise CheckpointStateError(
            f"cannot write {what}: {exc}; check that the directory is writable and has space, then retry the commit"
        ) from exc


def _write(
    directory: Path,
    kind: str,
    instance: str,
    checkpoint_id: str,
    records: Iterable[Any],
    flag: StopFlag,
    what: str,
    publish: _Publication,
) -> dict[str, Any]:
    temp_path, digest, count = _write_records_temp(directory, records, flag, what, publish)
    try:
        manifest = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "kind": kind,
            "instance": instance,
            "checkpoint_id": checkpoint_id,
            "records_file": records_file_name(digest),
            "records_sha256": digest,
            "record_count": count,
        }
        return _publish(directory, temp_path, manifest, flag, what, publish)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp_path.unlink()


def _write_records_temp(
    directory: Path, records: Iterable[Any], flag: StopFlag, what: str, publish: _Publication
) -> tuple[Path, str, int]:
    """Records, one JSON line each, into a fsynced temporary file, hashed as written."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=_RECORDS_TEMP_PREFIX)
    temp_path = Path(name)
    digest = hashlib.sha256()
    count = 0
    try:
        with os.fdopen(fd, "wb") as file:
            for record in records:
                flag.raise_if_stopped(what)
                line = record_line(record, count)
                digest.update(line)
                file.write(line)
                count += 1
            publish.fault("records.write")
            file.flush()
            if not publish.skip_records_fsync:
                publish.fault("records.fsync")
                _fsync(file.fileno(), publish.journal)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp_path.unlink()
        raise
    return temp_path, digest.hexdigest(), count


def record_line(record: Any, index: int) -> bytes | memoryview:
    """A record's line of the records file: its JSON and a newline (an `EncodedRecord` is one already)."""
    if isinstance(record, EncodedRecord):
        return record.line
    try:
        return (_RECORD_ENCODER.encode(record) + "\n").encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointStateError(
            f"record {index} is not JSON ({exc}); the participant's export must return JSON values only"
        ) from exc


@attrs.frozen
class WriterFaults:
    """The writer's planted faults (`fakes/faults.py` says what each plants); all off by default."""

    # `store_error_is_internal`: an OSError escapes unwrapped (the server answers 500, not 422).
    os_errors_escape: bool = False
    # `store_failed_write_leaves_manifest`: the manifest is written in place, so a failed write leaves it torn.
    manifest_in_place: bool = False
    # `stalled_write_publishes_after_resume`: the stop flag is not checked again under the publication lock.
    ignores_stop_when_publishing: bool = False


@attrs.frozen
class _Publication:
    between_files: Callable[[], None]
    manifest_first: bool
    journal: Journal | None = None
    skip_records_fsync: bool = False
    fault: Callable[[str], None] = lambda point: None
    planted: WriterFaults = WriterFaults()


def _publish(
    directory: Path, temp_records: Path, manifest: dict[str, Any], flag: StopFlag, what: str, publish: _Publication
) -> dict[str, Any]:
    """Rename the records to their digest name, then create the manifest without ever replacing one."""
    manifest_bytes = (manifest_text(manifest) + "\n").encode()
    records_path = directory / manifest["records_file"]
    manifest_path = directory / MANIFEST_NAME
    if publish.planted.manifest_in_place:
        return _publish_in_place(directory, temp_records, records_path, manifest, manifest_bytes, flag, what, publish)
    publish.fault("manifest.write")
    temp_manifest = _fsynced_temp(directory, _MANIFEST_TEMP_PREFIX, manifest_bytes, publish.journal)
    renamed = published = False
    guard = contextlib.nullcontext() if publish.planted.ignores_stop_when_publishing else flag.publishing(what)
    try:
        with guard:
            # A directory that holds a manifest never changes, so an existing one is only compared with.
            if not manifest_path.exists() and publish.manifest_first:
                published = _link_new(temp_manifest, manifest_path)
                publish.between_files()
                os.replace(temp_records, records_path)
                renamed = True
                _fsync_dir(directory, publish.journal)
            elif not manifest_path.exists():
                os.replace(temp_records, records_path)
                renamed = True
                publish.between_files()
                publish.fault("manifest.link")
                published = _link_new(temp_manifest, manifest_path)
                _fsync_dir(directory, publish.journal)
    finally:
        temp_manifest.unlink()
    if published:
        return manifest
    return _existing_manifest(manifest_path, records_path if renamed else None, manifest, what)


def _publish_in_place(
    directory: Path,
    temp_records: Path,
    records_path: Path,
    manifest: dict[str, Any],
    manifest_bytes: bytes,
    flag: StopFlag,
    what: str,
    publish: _Publication,
) -> dict[str, Any]:
    """The planted fault `store_failed_write_leaves_manifest`: the manifest is created and written where it is
    read, so a write that fails half-way leaves a torn manifest behind (Gym links a complete, fsynced one)."""
    with flag.publishing(what):
        if (directory / MANIFEST_NAME).exists():
            return _existing_manifest(directory / MANIFEST_NAME, None, manifest, what)
        os.replace(temp_records, records_path)
        publish.between_files()  # the failpoint a crash inside a commit waits at, as on the writer's own path
        publish.fault("manifest.link")
        with open(directory / MANIFEST_NAME, "xb") as file:
            half = len(manifest_bytes) // 2
            file.write(manifest_bytes[:half])
            file.flush()
            publish.fault("manifest.write")
            file.write(manifest_bytes[half:])
            file.flush()
            _fsync(file.fileno(), publish.journal)
        _fsync_dir(directory, publish.journal)
    return manifest


def _link_new(source: Path, target: Path) -> bool:
    """Create `target` as a hard link; False when it exists (of two racing writers exactly one wins)."""
    try:
        os.link(source, target)
    except FileExistsError:
        return False
    return True


def _existing_manifest(
    manifest_path: Path, own_records: Path | None, manifest: dict[str, Any], what: str
) -> dict[str, Any]:
    """An identical manifest makes the write idempotent; a different one is another commit, never replaced."""
    try:
        existing = json.loads(manifest_path.read_bytes())
    except ValueError:
        existing = None
    if existing == manifest:
        return manifest
    existing_file = existing.get("records_file") if isinstance(existing, dict) else None
    if own_records is not None and existing_file != own_records.name:
        own_records.unlink(missing_ok=True)
    raise CheckpointStateError(
        f"cannot write {what}: the directory already holds a different commit; "
        "commit into a fresh checkpoint_dir (a committed checkpoint never changes)"
    )


def _fsynced_temp(directory: Path, prefix: str, content: bytes, journal: Journal | None) -> Path:
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
        file.flush()
        _fsync(file.fileno(), journal)
    return Path(name)


def _fsync(fd: int, journal: Journal | None) -> None:
    os.fsync(fd)
    if journal is not None:
        journal.file_synced(fd)


def _fsync_dir(directory: Path, journal: Journal | None) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if journal is not None:
        journal.directory_synced(directory)


def read_participant_state(
    checkpoint_dir: str | os.PathLike[str],
    kind: str,
    instance: str,
    select: Select | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Verify and read one participant's commit; `select(record)` returns what to keep, or None to drop it.

    The digest and the count always cover the whole file, whatever `select` keeps. A `CheckpointStateError`
    raised by `select` is reported only after the whole file verified, so corruption is named first.
    """
    directory = participant_dir(checkpoint_dir, kind, instance)
    try:
        manifest = _read_manifest(directory, kind, instance)
        records = _read_records(directory, manifest, select)
    except OSError as exc:
        raise CheckpointStateError(
            f"cannot read the checkpoint of {kind}/{instance} in {directory}: {exc}; "
            "check that checkpoint_dir names a committed checkpoint visible to this server"
        ) from exc
    return manifest, records


def _read_manifest(directory: Path, kind: str, instance: str) -> dict[str, Any]:
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise CheckpointStateError(
            f"{path} does not exist: this directory holds no commit of {kind}/{instance}; "
            "restore from a checkpoint whose commit succeeded on this participant"
        )
    try:
        manifest = json.loads(path.read_bytes())
    except ValueError as exc:
        raise CheckpointStateError(f"{path} is not JSON ({exc}); the checkpoint is corrupt") from exc
    if not isinstance(manifest, dict):
        raise CheckpointStateError(f"{path} must hold a JSON object (got {type(manifest).__name__})")
    problems = list(_manifest_problems(manifest, kind, instance))
    if problems:
        raise CheckpointStateError(
            f"{path}: {'; '.join(problems)}; the checkpoint is corrupt or belongs to another server"
        )
    return manifest


def _manifest_problems(manifest: dict[str, Any], kind: str, instance: str) -> Iterator[str]:
    version = manifest.get("schema_version")
    if type(version) is not int or version != MANIFEST_SCHEMA_VERSION:
        yield f"'schema_version' must be {MANIFEST_SCHEMA_VERSION} (got {version!r})"
    for field, expected in (("kind", kind), ("instance", instance)):
        if manifest.get(field) != expected:
            yield f"'{field}' must be {expected!r} (got {manifest.get(field)!r})"
    if not isinstance(manifest.get("checkpoint_id"), str):
        yield f"'checkpoint_id' must be a string (got {manifest.get('checkpoint_id')!r})"
    records_file = manifest.get("records_file")
    name_ok = isinstance(records_file, str) and RECORDS_FILE_RE.fullmatch(records_file) is not None
    if not name_ok:
        yield f"'records_file' must match {RECORDS_FILE_RE.pattern} (got {records_file!r})"
    digest = manifest.get("records_sha256")
    if not isinstance(digest, str):
        yield f"'records_sha256' must be a hex string (got {digest!r})"
    elif name_ok and records_file not in ("records.jsonl", records_file_name(digest)):
        yield f"'records_file' must be named after 'records_sha256' (got {records_file!r} and {digest!r})"
    count = manifest.get("record_count")
    if type(count) is not int or count < 0:
        yield f"'record_count' must be a non-negative integer (got {count!r})"


def _read_records(directory: Path, manifest: dict[str, Any], select: Select | None) -> list[Any]:
    path = directory / manifest["records_file"]
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last record
    kept: list[Any] = []
    deferred: CheckpointStateError | None = None
    with collector_paused():
        for number, line in enumerate(lines, start=1):
            record = _parse_line(line, path, number)
            try:
                chosen = record if select is None else select(record)
            except CheckpointStateError as exc:
                deferred = deferred or exc
                continue
            if chosen is not None:
                kept.append(chosen)
    _check_totals(path, manifest, hashlib.sha256(data).hexdigest(), len(lines))
    if deferred is not None:
        raise deferred
    return kept


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a checkpoint's records are built, written, read or installed.

    Thousands of records allocate hundreds of thousands of dicts and lists, and every 700 allocations start a
    collection; in a server holding thousands of requests in flight those collections walk millions of objects.
    Reading 9,800 agent records next to as many live ones cost 550 ms of CPU with the collector on, 200 ms with it
    off. Records are JSON and hold no cycles; cycles others make meanwhile are collected once it is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse_line(line: bytes, path: Path, line_number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise CheckpointStateError(
            f"line {line_number} of {path} is not JSON ({exc}); the checkpoint is corrupt"
        ) from exc


def _check_totals(path: Path, manifest: dict[str, Any], digest: str, count: int) -> None:
    if digest != manifest["records_sha256"]:
        raise CheckpointStateError(
            f"SHA-256 of {path} is {digest}, but the manifest says {manifest['records_sha256']}; "
            "the records were changed or truncated after the commit"
        )
    if count != manifest["record_count"]:
        raise CheckpointStateError(
            f"{path} holds {count} records, but the manifest says {manifest['record_count']}; the checkpoint is corrupt"
        )
