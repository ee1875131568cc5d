"""Storage faults at the writer's named points: a real OSError once, or a stall until released; what each leaves."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest

from fakes.gym.control.store import (
    MANIFEST_NAME,
    StopFlag,
    WriterFaults,
    WriteStoppedError,
    participant_dir,
    read_participant_state,
    write_participant_state,
)
from fakes.gym.faults.storage import POINTS, STALL_POINTS, StorageFaultError, StorageFaults
from fakes.gym.protocol.errors import CheckpointStateError

KIND = "environment"
INSTANCE = "environment"
RECORDS = [{"episode_id": {"rollout_id": f"r{i}", "attempt": 0}} for i in range(3)]


def _write(checkpoint_dir: Path, storage: StorageFaults, **kwargs: Any) -> dict[str, Any]:
    return write_participant_state(checkpoint_dir, KIND, INSTANCE, "c1", RECORDS, storage_fault=storage.hit, **kwargs)


def _share(checkpoint_dir: Path) -> Path:
    return participant_dir(checkpoint_dir, KIND, INSTANCE)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize(("how", "code"), [("ENOSPC", errno.ENOSPC), ("EIO", errno.EIO)])
def test_a_failure_at_each_point_publishes_nothing_and_fails_once(
    tmp_path: Path, point: str, how: str, code: int
) -> None:
    faults = StorageFaults()
    faults.arm(point, how)

    with pytest.raises(CheckpointStateError, match=how) as failed:
        _write(tmp_path, faults)

    assert isinstance(failed.value.__cause__, OSError)
    assert failed.value.__cause__.errno == code
    assert not (_share(tmp_path) / MANIFEST_NAME).exists()
    assert not [path for path in _share(tmp_path).iterdir() if path.name.startswith(".")], "temp files left"
    manifest = _write(tmp_path, faults)  # the disk has room again: the retry in the same process publishes
    assert read_participant_state(tmp_path, KIND, INSTANCE) == (manifest, RECORDS)
    assert faults.state() == {"armed": None, "stalled_at": None, "writes": 0}


def test_an_os_error_escapes_unwrapped_under_the_planted_fault(tmp_path: Path) -> None:
    faults = StorageFaults()
    faults.arm("records.write", "ENOSPC")

    with pytest.raises(OSError, match=r"ENOSPC injected by the checker at records\.write") as failed:
        _write(tmp_path, faults, faults=WriterFaults(os_errors_escape=True))

    assert not isinstance(failed.value, CheckpointStateError)


def test_a_manifest_written_in_place_is_left_torn_by_a_failure(tmp_path: Path) -> None:
    faults = StorageFaults()
    faults.arm("manifest.write", "ENOSPC")

    with pytest.raises(CheckpointStateError):
        _write(tmp_path, faults, faults=WriterFaults(manifest_in_place=True))

    assert (_share(tmp_path) / MANIFEST_NAME).exists()
    with pytest.raises(CheckpointStateError, match="different commit"):
        _write(tmp_path, faults, faults=WriterFaults(manifest_in_place=True))


def _stalled_write(tmp_path: Path, storage: StorageFaults, stop: StopFlag, **kwargs: Any) -> tuple[Any, list[Any]]:
    outcome: list[Any] = []

    def write() -> None:
        with storage.writing():
            try:
                outcome.append(_write(tmp_path, storage, stop=stop, **kwargs))
            except Exception as error:
                outcome.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("point", STALL_POINTS)
def test_a_stalled_write_stopped_by_a_resume_never_publishes(tmp_path: Path, point: str) -> None:
    faults, stop = StorageFaults(), StopFlag()
    faults.arm(point, "stall")
    thread, outcome = _stalled_write(tmp_path, faults, stop)
    while faults.state()["stalled_at"] != point:
        thread.join(0.01)

    assert faults.state()["writes"] == 1
    stop.stop()
    assert stop.never_publishes
    faults.release()
    thread.join()

    assert isinstance(outcome[0], WriteStoppedError)
    assert not (_share(tmp_path) / MANIFEST_NAME).exists()
    assert faults.state()["writes"] == 0


def test_a_stalled_write_publishes_after_the_stop_under_the_planted_fault(tmp_path: Path) -> None:
    faults, stop = StorageFaults(), StopFlag()
    faults.arm("manifest.write", "stall")
    thread, outcome = _stalled_write(tmp_path, faults, stop, faults=WriterFaults(ignores_stop_when_publishing=True))
    while faults.state()["stalled_at"] is None:
        thread.join(0.01)

    stop.stop()
    faults.release()
    thread.join()

    assert isinstance(outcome[0], dict)
    assert (_share(tmp_path) / MANIFEST_NAME).exists()


def test_a_released_stall_publishes_and_a_stop_after_publication_is_not_never(tmp_path: Path) -> None:
    faults, stop = StorageFaults(), StopFlag()
    faults.arm("records.fsync", "stall")
    thread, outcome = _stalled_write(tmp_path, faults, stop)
    while faults.state()["stalled_at"] is None:
        thread.join(0.01)

    faults.release()
    thread.join()
    stop.stop()

    assert outcome[0]["checkpoint_id"] == "c1"
    assert not stop.never_publishes


def test_release_disarms_a_fault_no_write_met(tmp_path: Path) -> None:
    faults = StorageFaults()
    faults.arm("manifest.link", "EIO")
    faults.release()

    assert faults.state()["armed"] is None
    _write(tmp_path, faults)


@pytest.mark.parametrize(
    ("point", "how"), [("manifest.link", "stall"), ("records.read", "EIO"), ("records.write", "EBUSY")]
)
def test_arming_what_cannot_be_armed_is_refused(point: str, how: str) -> None:
    with pytest.raises(StorageFaultError):
        StorageFaults().arm(point, how)
