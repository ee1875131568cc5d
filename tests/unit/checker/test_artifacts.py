"""`--keep-artifacts DIR`: a directory made ready without touching the user's files, the history as JSON lines, the
logs copied whole, and the report's note of what was kept (or that nothing was)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.deployments import artifacts
from ckpt_model.deployments.artifacts import ArtifactsError, copy_logs, prepare, write_history
from ckpt_model.protocol.history import History
from ckpt_model.results.report import keep_artifacts


def test_prepare_creates_a_missing_directory_and_returns_it_absolute(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)

    kept = prepare(Path("new") / "kept")

    assert kept == tmp_path / "new" / "kept"
    assert kept.is_dir()


def test_prepare_takes_an_empty_directory(tmp_path: Path) -> None:
    assert prepare(tmp_path) == tmp_path


def test_prepare_refuses_a_directory_that_holds_anything_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("the user's")

    with pytest.raises(ArtifactsError, match="is not empty"):
        prepare(tmp_path)

    assert [path.name for path in tmp_path.iterdir()] == ["mine.txt"]
    assert (tmp_path / "mine.txt").read_text() == "the user's"


@pytest.mark.parametrize(("name", "message"), [("a-file", "is not a directory"), ("a-file/below", "cannot be created")])
def test_prepare_refuses_a_path_it_cannot_use(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "a-file").write_text("")

    with pytest.raises(ArtifactsError, match=message):
        prepare(tmp_path / name)


def test_write_history_writes_one_json_object_per_event_in_order(tmp_path: Path) -> None:
    history = History(clock=iter([0.0, 1.0, 1.5, 2.0]).__next__)
    invoke = history.invoke("r0", "run", {"attempt": 0})
    history.complete(invoke, "ok", {"reward": 1.0})
    history.note("controller", "prepared", object())  # no JSON for it: its repr

    write_history(tmp_path / "history.jsonl", history.events)

    lines = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [(line["index"], line["process"], line["f"], line["type"]) for line in lines] == [
        (0, "r0", "run", "invoke"),
        (1, "r0", "run", "ok"),
        (2, "controller", "prepared", "ok"),
    ]
    assert lines[1]["value"] == {"reward": 1.0}
    assert lines[1]["invoke_index"] == 0
    assert lines[2]["value"].startswith("<object object at")


def test_copy_logs_copies_every_log_whole(tmp_path: Path) -> None:
    source = tmp_path / "logs"
    source.mkdir()
    (source / "environment.log").write_text("--- start\nline 2\n")

    copy_logs(source, tmp_path / "kept" / "logs")

    assert (tmp_path / "kept" / "logs" / "environment.log").read_text() == "--- start\nline 2\n"


def test_copy_logs_of_a_deployment_that_wrote_none_leaves_an_empty_directory(tmp_path: Path) -> None:
    copy_logs(tmp_path / "never-written", tmp_path / "kept")

    assert list((tmp_path / "kept").iterdir()) == []


class KeepingHarness:
    """What `report.keep_artifacts` reads of a harness: where artefacts go, and keeping the current example."""

    def __init__(self, kept: Path | None, example_dir: Path) -> None:
        self.artifacts, self.example_dir, self.kept_examples = kept, example_dir, 0

    def keep_example(self) -> Path:
        self.kept_examples += 1
        return self.example_dir


def events() -> tuple[Any, ...]:
    history = History(clock=iter([0.0, 0.5]).__next__)
    history.note("controller", "crash")
    return history.events


def test_without_artifacts_the_report_says_the_paths_are_temporary_and_how_to_keep_them(tmp_path: Path) -> None:
    harness = KeepingHarness(None, tmp_path / "example-3")

    note = keep_artifacts(harness, events(), tmp_path / "P9.json")  # type: ignore[arg-type]

    assert note is not None
    assert "removed when the run exits" in note
    assert "--keep-artifacts DIR" in note
    assert harness.kept_examples == 0


def test_the_run_s_own_failure_keeps_its_example_and_history_and_says_where(tmp_path: Path) -> None:
    harness = KeepingHarness(tmp_path, tmp_path / "checkpoints" / "example-3")

    note = keep_artifacts(harness, events(), tmp_path / "P9-native.json")  # type: ignore[arg-type]

    assert note is not None
    assert note.startswith(f"Kept in {tmp_path} (valid after the run): history.jsonl")
    assert str(tmp_path / "checkpoints" / "example-3") in note
    assert harness.kept_examples == 1
    assert json.loads((tmp_path / artifacts.HISTORY).read_text())["f"] == "crash"


def test_a_candidate_s_failure_whose_file_went_elsewhere_keeps_nothing(tmp_path: Path) -> None:
    harness = KeepingHarness(tmp_path, tmp_path / "checkpoints" / "example-9")
    elsewhere = tmp_path / "checkpoints" / "minimise-candidates" / "P9-native.json"

    assert keep_artifacts(harness, events(), elsewhere) is None  # type: ignore[arg-type]
    assert keep_artifacts(harness, events(), None) is None  # type: ignore[arg-type]
    assert harness.kept_examples == 0
    assert not (tmp_path / artifacts.HISTORY).exists()
