"""`ckpt-model replay` names the file it replayed by a path that outlives the run."""

from __future__ import annotations

from pathlib import Path

from ckpt_model.commands.replay import lasting_path


def test_a_file_named_through_the_run_store_s_latest_link_is_named_by_its_own_directory(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20261206T121644Z-P9-native"
    run.mkdir(parents=True)
    (run / "P9-native-2239b385.json").write_text("{}")
    (tmp_path / "runs" / "latest").symlink_to(run.name)

    named = lasting_path(tmp_path / "runs" / "latest" / "P9-native-2239b385.json")
    (tmp_path / "runs" / "latest").unlink()  # the replay's own failure moves `latest` to another run
    (tmp_path / "runs" / "latest").symlink_to("20261206T121748Z-P9-native")

    assert named == run / "P9-native-2239b385.json"
    assert named.is_file()
