"""The run store: each run that finds a failure keeps it in a directory of its own, with a `latest` link, and no
copy of a failure is ever replaced by a worse one. Built on hand-made harnesses and documents, no processes."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results import regression, runstore
from tests.unit.checker.fake_harness import fake_harness

SPEC = DeploymentSpec("native", faults=("resume_deletes_records",))
FOUND = [("dispatch", {}), ("release", {"pick": 3}), ("dispatch", {}), ("checkpoint", {"then_resume": True})]
MINIMAL = [("dispatch", {}), ("checkpoint", {"then_resume": False})]


def p9() -> AssertionError:
    error = AssertionError("P9")
    error.property_id = "P9"  # type: ignore[attr-defined]  # as a PropertyViolation carries it
    return error


def user_harness(tmp_path: Path) -> SimpleNamespace:
    """A harness as `check` runs it: its regression files in the user's set, a run store begun."""
    harness = fake_harness(tmp_path / "root", SPEC)
    harness.regressions_dir = None
    runstore.begin(harness, tmp_path / "runs")
    return harness


@pytest.fixture(autouse=True)
def users_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's replayable set, here."""
    monkeypatch.setenv(regression.REGRESSIONS_ENV, str(tmp_path / "regressions"))
    return tmp_path / "regressions"


def test_a_run_directory_is_named_by_the_utc_time_and_the_failure() -> None:
    zone = datetime.timezone(datetime.timedelta(hours=2))
    started = datetime.datetime(2026, 12, 6, 12, 30, 5, tzinfo=zone)

    assert runstore.run_name(started, "P9-native-resume_deletes_records") == (
        "20261206T103005Z-P9-native-resume_deletes_records"
    )


def test_a_run_directory_is_never_one_another_run_made_and_latest_names_the_newest(tmp_path: Path) -> None:
    store = tmp_path / "runs"

    first = runstore.new_run_dir(store, "20261206T103005Z-P9-native")
    (first / "kept.json").write_text("{}")
    second = runstore.new_run_dir(store, "20261206T103005Z-P9-native")  # the same second, the same failure

    assert (first.name, second.name) == ("20261206T103005Z-P9-native", "20261206T103005Z-P9-native-2")
    assert (first / "kept.json").read_text() == "{}"  # the first run's files are where they were
    assert os.readlink(store / runstore.LATEST) == second.name  # relative: the store can move
    assert (store / runstore.LATEST).resolve() == second.resolve()
    assert sorted(p.name for p in store.iterdir()) == [first.name, second.name, runstore.LATEST]  # nothing partial


def test_latest_that_is_a_directory_of_the_user_s_is_left_alone(tmp_path: Path) -> None:
    store = tmp_path / "runs"
    (store / runstore.LATEST).mkdir(parents=True)
    (store / runstore.LATEST / "mine.txt").write_text("mine")

    run_dir = runstore.new_run_dir(store, "20261206T103005Z-P9-native")

    assert run_dir.is_dir()
    assert (store / runstore.LATEST / "mine.txt").read_text() == "mine"


def test_a_failure_is_kept_in_the_user_s_set_and_in_its_run_directory(tmp_path: Path, users_set: Path) -> None:
    harness = user_harness(tmp_path)
    error = p9()

    name = runstore.name_for(harness, error, regression.DEFAULT_ORIGIN, FOUND)
    kept = runstore.keep(harness, error, regression.document(SPEC, FOUND, error), name)

    assert harness.run_dir is not None
    assert harness.run_dir.parent == tmp_path / "runs"
    assert harness.run_dir.name.endswith("-P9-native-resume_deletes_records")
    assert kept.shown == users_set.absolute() / name  # the report names the replayable set's copy
    assert kept.written == (users_set.absolute() / name, harness.run_dir / name)
    assert runstore.kept_of(error) == kept
    assert regression.load(harness.run_dir / name)["steps"] == regression.load(kept.shown)["steps"]
    note = runstore.kept_note(kept)
    assert note is not None
    assert str(harness.run_dir) in note
    assert "latest" in note


def test_a_private_harness_keeps_nothing_in_a_run_store(tmp_path: Path) -> None:
    harness = fake_harness(tmp_path, SPEC)
    error = p9()

    kept = runstore.keep(harness, error, regression.document(SPEC, FOUND, error), "P9.json")

    assert (kept.shown, kept.run_dir) == (tmp_path / "regressions" / "P9.json", None)
    assert runstore.kept_note(kept) is None


def test_a_replay_s_report_names_the_run_store_s_copy_not_its_temporary_one(tmp_path: Path) -> None:
    harness = fake_harness(tmp_path / "root", SPEC)  # its own set is private: under its temporary root
    runstore.begin(harness, tmp_path / "runs")
    error = p9()

    kept = runstore.keep(harness, error, regression.document(SPEC, FOUND, error), "P9.json")

    assert harness.run_dir is not None
    assert kept.shown == harness.run_dir / "P9.json"


def test_a_run_s_later_failures_of_the_same_property_keep_its_first_name(tmp_path: Path) -> None:
    """Hypothesis's shrinks of a failure, and the minimiser's rewrite, keep the name the run gave it first; a new
    run names its failures afresh."""
    harness = user_harness(tmp_path)
    first = runstore.name_for(harness, p9(), regression.DEFAULT_ORIGIN, FOUND)

    assert runstore.name_for(harness, p9(), regression.DEFAULT_ORIGIN, MINIMAL) == first
    runstore.begin(harness, tmp_path / "runs")
    assert runstore.name_for(harness, p9(), regression.DEFAULT_ORIGIN, MINIMAL) != first
    # A harness no command began outlives many searches (a fuzz worker's, a test session's): each steps' own name.
    private = fake_harness(tmp_path, SPEC)
    assert runstore.name_for(private, p9(), regression.DEFAULT_ORIGIN, FOUND) == first
    assert runstore.name_for(private, p9(), regression.DEFAULT_ORIGIN, MINIMAL) != first


def test_a_later_run_never_replaces_a_minimised_file_with_the_steps_it_found(tmp_path: Path, users_set: Path) -> None:
    earlier = user_harness(tmp_path)
    error = p9()
    name = runstore.name_for(earlier, error, regression.DEFAULT_ORIGIN, FOUND)
    runstore.keep(earlier, error, regression.document(SPEC, FOUND, error), name)
    minimised = regression.document(SPEC, MINIMAL, error, minimised={"steps_before": 4})
    runstore.keep(earlier, error, minimised, name)
    replayable = users_set.absolute() / name
    before = replayable.read_bytes()

    later = user_harness(tmp_path)  # the same steps found again (the same seed): the same name
    again = p9()
    kept = runstore.keep(later, again, regression.document(SPEC, FOUND, again), name)

    assert replayable.read_bytes() == before  # still the minimal steps
    assert kept.held == (replayable,)
    assert later.run_dir is not None
    assert later.run_dir != earlier.run_dir
    assert kept.written == (later.run_dir / name,)  # this run's own copy holds what it found
    assert kept.shown == replayable
    note = runstore.held_note(kept)
    assert note is not None
    assert str(replayable) in note
    assert regression.load(earlier.run_dir / name)["steps"] == [[n, a] for n, a in MINIMAL]


def test_an_interrupted_run_says_what_it_kept_and_where(tmp_path: Path) -> None:
    assert runstore.interrupted_lines(None) == ["kept: nothing (no failure was found before the interrupt)"]
    harness = user_harness(tmp_path)
    assert runstore.interrupted_lines(harness) == ["kept: nothing (no failure was found before the interrupt)"]
    error = p9()
    name = runstore.name_for(harness, error, regression.DEFAULT_ORIGIN, FOUND)
    runstore.keep(harness, error, regression.document(SPEC, FOUND, error), name)

    lines = runstore.interrupted_lines(harness)

    assert lines[0] == f"kept in {harness.run_dir} ({tmp_path / 'runs' / 'latest'} links to it):"
    assert f"  {name}: 4 steps, as found, not minimised" in lines
    replayable = tmp_path / "regressions" / name
    assert lines[-1] == f"and in the replayable set: {replayable}: 4 steps, as found, not minimised"


def test_the_report_is_kept_whole_in_the_run_directory_only_once_there_is_one(tmp_path: Path) -> None:
    harness = user_harness(tmp_path)
    assert runstore.keep_report(harness.run_dir, "\n=== report ===") is None  # no failure: no run directory

    runstore.run_dir_of(harness, "P9-native")
    path = runstore.keep_report(harness.run_dir, "\n=== report ===")

    assert path is not None
    assert path.read_text() == "=== report ===\n"
    assert [p.name for p in path.parent.iterdir()] == [runstore.REPORT]  # nothing partial left


def test_a_copy_that_cannot_be_written_never_keeps_the_other_from_being_kept(tmp_path: Path) -> None:
    harness = user_harness(tmp_path)
    (tmp_path / "regressions").write_text("a file where the user's set would be")
    error = p9()

    kept = runstore.keep(harness, error, regression.document(SPEC, FOUND, error), "P9.json")

    assert harness.run_dir is not None
    assert kept.written == (harness.run_dir / "P9.json",)
    assert kept.shown == harness.run_dir / "P9.json"  # the report names the copy that exists
    note = runstore.held_note(kept)
    assert note is not None
    assert note.startswith(f"Not written: {tmp_path / 'regressions' / 'P9.json'}: ")


def test_nothing_kept_anywhere_is_an_error_the_report_says(tmp_path: Path) -> None:
    harness = fake_harness(tmp_path, SPEC)
    harness.regressions_dir.write_text("a file where the set would be")

    with pytest.raises(OSError, match=r"P9\.json"):
        runstore.keep(harness, p9(), regression.document(SPEC, FOUND, p9()), "P9.json")
