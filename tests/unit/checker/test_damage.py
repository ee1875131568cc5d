"""The damaged copies `failed_restore` restores: the original stays byte for byte, the copy's damage is exactly
the one asked for, as the checker's own reader sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_model.protocol.storage import CheckpointUnreadable, fingerprint, participant_dir, read_records
from ckpt_model.trainer.nemeses.damaged_copies import damaged_copy, holds_records
from tests.unit.checker.test_storage_reader import INSTANCE, KIND, RECORDS, _participant


def committed(tmp_path: Path) -> Path:
    """A checkpoint directory `c1` with one participant's share, written by hand."""
    _participant(tmp_path / "c1")
    return tmp_path / "c1"


def test_a_digest_damage_adds_a_line_the_manifest_does_not_cover(tmp_path: Path) -> None:
    source = committed(tmp_path)
    before = fingerprint(participant_dir(source, KIND, INSTANCE), KIND, INSTANCE)

    copy = damaged_copy(source, tmp_path / "c1-damaged", KIND, INSTANCE, "digest")

    with pytest.raises(CheckpointUnreadable, match="SHA-256"):
        read_records(participant_dir(copy, KIND, INSTANCE), KIND, INSTANCE)
    assert fingerprint(participant_dir(source, KIND, INSTANCE), KIND, INSTANCE) == before


SCOPE = ("r0", "r1-a2")


def test_a_record_damage_reads_as_sound_with_the_first_record_cut_to_its_episode_id(tmp_path: Path) -> None:
    source = committed(tmp_path)
    before = fingerprint(participant_dir(source, KIND, INSTANCE), KIND, INSTANCE)

    copy = damaged_copy(source, tmp_path / "c1-damaged", KIND, INSTANCE, "record", SCOPE)

    records = read_records(participant_dir(copy, KIND, INSTANCE), KIND, INSTANCE, checkpoint_id="c1")
    assert records == [{"episode_id": RECORDS[0]["episode_id"]}, RECORDS[1]]
    assert len(list(participant_dir(copy, KIND, INSTANCE).glob("records*"))) == 1
    assert fingerprint(participant_dir(source, KIND, INSTANCE), KIND, INSTANCE) == before


def test_a_record_damage_cuts_the_first_record_the_restore_scope_names(tmp_path: Path) -> None:
    """A restore validates only the records in its scope: a damaged record outside it would be installed."""
    copy = damaged_copy(committed(tmp_path), tmp_path / "c1-damaged", KIND, INSTANCE, "record", ("r0",))

    records = read_records(participant_dir(copy, KIND, INSTANCE), KIND, INSTANCE, checkpoint_id="c1")
    assert records == [RECORDS[0], {"episode_id": RECORDS[1]["episode_id"]}]


def test_a_record_damage_needs_a_record_in_scope(tmp_path: Path) -> None:
    _participant(tmp_path / "c1", data=b"")

    assert not holds_records(tmp_path / "c1", KIND, INSTANCE, SCOPE)
    with pytest.raises(ValueError, match="no record of"):
        damaged_copy(tmp_path / "c1", tmp_path / "c1-damaged", KIND, INSTANCE, "record", SCOPE)
    with pytest.raises(ValueError, match="no record of"):
        damaged_copy(committed(tmp_path / "other"), tmp_path / "c2-damaged", KIND, INSTANCE, "record", ("r9",))


def test_holds_records_is_false_for_a_missing_or_unreadable_share_or_none_in_scope(tmp_path: Path) -> None:
    assert holds_records(committed(tmp_path), KIND, INSTANCE, SCOPE)
    assert not holds_records(tmp_path / "c1", KIND, INSTANCE, ("r9",))
    assert not holds_records(tmp_path / "c1", KIND, "other-instance", SCOPE)
