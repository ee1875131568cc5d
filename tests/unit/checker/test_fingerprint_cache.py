"""The incremental fingerprint (P9's re-reads) still sees every change to a committed directory.

`FingerprintCache` hands back a kept fingerprint while neither file's key (inode, size, times) changed, and keeps
one only once the filesystem's clock has ticked past the files' change time. Each test changes a directory and
expects the next read to see it: a rewrite of the same size, a truncation, a rename, a new manifest; both right
after the first read (the same clock tick, where times alone cannot tell) and once the fingerprint is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_model.protocol.storage import CheckpointUnreadable, FingerprintCache, fingerprint
from tests.unit.checker.participant_dirs import write_participant

KIND = "environment"
INSTANCE = "env-1"
CHECKPOINT_ID = "c1"
RECORDS = b'{"episode_id": {"rollout_id": "r0", "attempt": 0}, "boundary": null}\n'
# Waiting for the filesystem's clock to tick is waiting for a condition: bounded in probes, not in seconds.
CLOCK_PROBES_MAX = 1_000_000


def _write(directory: Path, records: bytes = RECORDS, checkpoint_id: str = CHECKPOINT_ID) -> Path:
    """A committed participant directory as Gym lays it out (reference 6.1-6.2), written by hand."""
    return write_participant(directory, records, kind=KIND, instance=INSTANCE, checkpoint_id=checkpoint_id)


def _read(cache: FingerprintCache, directory: Path) -> object:
    return cache.fingerprint(directory, KIND, INSTANCE, checkpoint_id=CHECKPOINT_ID)


def _tick_past(cache: FingerprintCache, directory: Path) -> None:
    """Until the filesystem's clock reads later than every file's change time (a few milliseconds)."""
    newest_ns = max(path.stat().st_ctime_ns for path in directory.iterdir())
    for _ in range(CLOCK_PROBES_MAX):
        if cache.clock_ns() > newest_ns:
            return
    pytest.fail(f"the filesystem's clock did not pass {newest_ns} in {CLOCK_PROBES_MAX} probes")


def _same_size_rewrite(records_path: Path) -> None:
    data = records_path.read_bytes()
    records_path.write_bytes(data.replace(b'"r0"', b'"r9"'))


def _truncate(records_path: Path) -> None:
    records_path.write_bytes(records_path.read_bytes()[:-1])


def _rename(records_path: Path) -> None:
    records_path.rename(records_path.with_name("records.jsonl"))


def _manifest_of_other_checkpoint(records_path: Path) -> None:
    manifest_path = records_path.parent / "manifest.json"
    manifest_path.write_text(manifest_path.read_text().replace('"c1"', '"c2"'))


CHANGES: dict[str, Callable[[Path], None]] = {
    "same-size rewrite": _same_size_rewrite,
    "truncated": _truncate,
    "renamed": _rename,
    "manifest rewritten": _manifest_of_other_checkpoint,
}


@pytest.fixture
def cache(tmp_path: Path) -> FingerprintCache:
    return FingerprintCache(tmp_path)


def test_a_fingerprint_is_kept_once_the_clock_passed_its_files(cache: FingerprintCache, tmp_path: Path) -> None:
    directory = tmp_path / "gym" / KIND / INSTANCE
    _write(directory)
    _tick_past(cache, directory)
    first = _read(cache, directory)
    assert _read(cache, directory) == first == fingerprint(directory, KIND, INSTANCE, checkpoint_id=CHECKPOINT_ID)
    assert cache.reads == 1


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_change_after_the_fingerprint_was_kept_is_seen(
    cache: FingerprintCache, tmp_path: Path, change: Callable[[Path], None]
) -> None:
    directory = tmp_path / "gym" / KIND / INSTANCE
    records_path = _write(directory)
    _tick_past(cache, directory)
    _read(cache, directory)
    _read(cache, directory)
    assert cache.reads == 1, "kept"
    change(records_path)
    with pytest.raises(CheckpointUnreadable):
        _read(cache, directory)


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_change_in_the_same_clock_tick_is_seen(
    cache: FingerprintCache, tmp_path: Path, change: Callable[[Path], None]
) -> None:
    """Written, read and changed at once, many times over: the times alone cannot tell, the cache must."""
    for round_ in range(50):
        directory = tmp_path / str(round_) / "gym" / KIND / INSTANCE
        records_path = _write(directory)
        _read(cache, directory)
        change(records_path)
        with pytest.raises(CheckpointUnreadable):
            _read(cache, directory)


def test_a_consistent_rewrite_gives_another_fingerprint(cache: FingerprintCache, tmp_path: Path) -> None:
    """New records under a new manifest still verify, and P9 sees another fingerprint."""
    directory = tmp_path / "gym" / KIND / INSTANCE
    old_records = _write(directory)
    _tick_past(cache, directory)
    before = _read(cache, directory)
    old_records.unlink()
    _write(directory, RECORDS.replace(b'"r0"', b'"r9"'))
    assert _read(cache, directory) != before


def test_without_a_clock_nothing_is_kept(tmp_path: Path) -> None:
    directory = tmp_path / "gym" / KIND / INSTANCE
    _write(directory)
    cache = FingerprintCache(tmp_path / "missing")
    _read(cache, directory)
    _read(cache, directory)
    assert cache.reads == 2
