"""A power cut keeps exactly what the journal says was fsynced: the store's write path survives it whole, and a
write that skipped an fsync loses what it skipped."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fakes.gym.control.store import participant_dir, write_participant_state
from fakes.gym.faults.power_cuts import Journal, lose_unsynced

RECORDS = [{"episode_id": {"rollout_id": "r0", "attempt": 0}, "boundary": None}]


def write(tmp_path: Path, journal: Journal, **options: bool) -> Path:
    write_participant_state(tmp_path / "c1", "environment", "environment", "c1", RECORDS, journal=journal, **options)
    return participant_dir(tmp_path / "c1", "environment", "environment")


def contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_a_commit_by_the_store_survives_a_power_cut_whole(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    directory = write(tmp_path, journal)
    before = contents(directory)

    assert lose_unsynced(journal.path) == []
    assert contents(directory) == before


def test_records_never_fsynced_are_cut_to_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    directory = write(tmp_path, journal, skip_records_fsync=True)
    records = next(directory.glob("records-*.jsonl"))

    changed = lose_unsynced(journal.path)

    assert changed == [f"{records}: cut to its last fsynced size 0"]
    assert records.read_bytes() == b""
    assert (directory / "manifest.json").read_bytes()  # the manifest was fsynced: it survives, naming lost records


def test_an_entry_made_after_the_directory_was_last_fsynced_is_lost(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    directory = write(tmp_path, journal)
    late = directory / "late.json"
    late.write_bytes(b"{}")
    with late.open("rb") as file:
        os.fsync(file.fileno())
        journal.file_synced(file.fileno())  # its data is durable, its directory entry is not

    assert lose_unsynced(journal.path) == [f"{late}: its entry was never made durable"]
    assert not late.exists()


def test_a_directory_written_to_but_never_fsynced_loses_every_file(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.writing(tmp_path / "c2")
    stray = tmp_path / "c2" / "gym" / "records.tmp"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"x")

    lose_unsynced(journal.path)

    assert not stray.exists()
    assert stray.parent.is_dir()  # directories are kept (Gym's layout relies on it)


def test_directories_the_journal_never_named_are_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "file"
    other.parent.mkdir()
    other.write_bytes(b"kept")
    assert lose_unsynced(tmp_path / "no-journal.jsonl") == []
    assert other.read_bytes() == b"kept"


def test_the_journal_is_rewritten_to_what_is_left_and_a_second_cut_keeps_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    gone = write(tmp_path / "gone", journal)
    directory = write(tmp_path, journal, skip_records_fsync=True)
    shutil.rmtree(tmp_path / "gone")  # an earlier example's directory, removed before the cut
    lose_unsynced(journal.path)
    after_first = contents(directory)

    text = journal.path.read_text()
    assert str(gone.parent.parent.parent) not in text
    assert str(directory) in text
    assert lose_unsynced(journal.path) == []
    assert contents(directory) == after_first
