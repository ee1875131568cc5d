"""Where `ckpt-model audit` looks for checkpoints: a path that does not exist is named as such, and a tree
`check --keep-artifacts DIR` kept is audited at the depth its checkpoints are, or the usage error lists where to
point it. (What the audit judges in the checkpoints: tests/stateful/test_audit.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_model.modes.audit import NothingToAudit, audit


def checkpoint(path: Path) -> Path:
    """A checkpoint directory as far as finding it goes: it holds `gym/`."""
    (path / "gym").mkdir(parents=True)
    return path


def kept_tree(directory: Path, examples: tuple[int, ...] = (3,)) -> Path:
    """What `--keep-artifacts DIR` leaves: DIR/checkpoints/example-N/checkpoints/<checkpoint>, and DIR/logs."""
    (directory / "logs").mkdir(parents=True)
    for number in examples:
        checkpoint(directory / "checkpoints" / f"example-{number}" / "checkpoints" / "c1")
    return directory


def test_a_path_that_does_not_exist_is_named_as_such(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(NothingToAudit, match=f"^{missing} does not exist"):
        audit(missing)


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NothingToAudit, match="is not a directory"):
        audit(tmp_path / "a-file")


@pytest.mark.parametrize("named", [".", "checkpoints", "checkpoints/example-3"])
def test_a_kept_tree_is_audited_where_its_checkpoints_are(tmp_path: Path, named: str) -> None:
    kept = kept_tree(tmp_path / "kept")

    result = audit(kept / named)

    checkpoints = kept / "checkpoints" / "example-3" / "checkpoints"
    assert (result.asked, result.root) == (kept / named, checkpoints)
    assert [checkpoint.path for checkpoint in result.checkpoints] == [checkpoints / "c1"]
    assert result.report().splitlines()[0] == (
        f"{kept / named} holds no checkpoint itself; the one directory of checkpoints under it is {checkpoints}"
    )
    assert result.document()["asked"] == str(kept / named)


def test_a_directory_of_checkpoints_is_audited_as_it_is(tmp_path: Path) -> None:
    checkpoint(tmp_path / "c1")

    result = audit(tmp_path)

    assert (result.asked, result.root) == (None, tmp_path)
    assert result.report().startswith(f"audit of {tmp_path}:")


def test_several_directories_of_checkpoints_are_listed_to_choose_from(tmp_path: Path) -> None:
    kept = kept_tree(tmp_path / "kept", examples=(2, 5))

    with pytest.raises(NothingToAudit) as nothing:
        audit(kept)

    said = str(nothing.value)
    assert "holds no checkpoint itself, and 2 directories of checkpoints under it" in said
    assert str(kept / "checkpoints" / "example-2" / "checkpoints") in said
    assert str(kept / "checkpoints" / "example-5" / "checkpoints") in said


def test_a_kept_tree_whose_example_wrote_no_checkpoint_says_where_they_would_be(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "example-1" / "checkpoints").mkdir(parents=True)

    with pytest.raises(NothingToAudit, match="holds no checkpoint") as nothing:
        audit(tmp_path)

    assert "DIR/checkpoints/example-N/checkpoints" in str(nothing.value)
