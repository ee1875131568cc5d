"""The capture ledger's files: IDs never reused, rows replaced or appended, retire and delete, shared safely."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fakes.gym.policy.ledger import FileLedger
from fakes.gym.protocol.errors import RolloutRetiredError


def row(call_id: str, parent: str | None = None) -> dict[str, str | None]:
    return {"model_call_id": call_id, "parent_call_id": parent, "staging_key": f"r0/{call_id}"}


def test_call_ids_count_every_admitted_call_and_survive_a_new_process(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path)
    assert [ledger.begin_call("r0")[0] for _ in range(3)] == ["r0.0", "r0.1", "r0.2"]
    assert ledger.begin_call("r0-a1")[0] == "r0-a1.0"

    # A replacement process (a crash, then a restore) continues the count: a dead call's ID is never reused.
    assert FileLedger(tmp_path).begin_call("r0")[0] == "r0.3"


def test_begin_call_returns_the_rows_as_they_are_at_admission(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path)
    assert ledger.begin_call("r0") == ("r0.0", [])
    ledger.append("r0", [row("r0.0")])

    assert ledger.begin_call("r0") == ("r0.1", [row("r0.0")])
    assert ledger.live_rows("r0") == [row("r0.0")]
    assert ledger.rows_many(["r0", "r1"]) == {"r0": [row("r0.0")], "r1": []}


def test_a_line_cut_off_by_a_crash_is_not_a_row(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path)
    ledger.append("r0", [row("r0.0")])
    with (tmp_path / "r0.lineage.jsonl").open("a") as rows:
        rows.write('{"model_call_id": "r0.1", "parent')

    assert ledger.live_rows("r0") == [row("r0.0")]


def test_replace_drops_a_dead_executions_rows_and_retired_marker(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path)
    ledger.append("r0-a1", [row("r0-a1.0"), row("r0-a1.1")])
    ledger.retire(["r0-a1"])

    ledger.replace_many({"r0-a1": [row("r0.0")], "r1-a1": []})

    assert ledger.live_rows("r0-a1") == [row("r0.0")]
    assert ledger.live_rows("r1-a1") == []
    assert not (tmp_path / "r0-a1.lineage.retired").exists()


def test_a_retired_ledger_refuses_calls_rows_and_its_manifest(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path)
    ledger.append("r0", [row("r0.0")])

    ledger.retire(["r0", "r1"])  # r1 has no rows: retired all the same

    assert (tmp_path / "r0.lineage.retired").exists()
    assert (tmp_path / "r1.lineage.retired").exists()
    for refused in (lambda: ledger.begin_call("r0"), lambda: ledger.append("r0", [row("r0.1")])):
        with pytest.raises(RolloutRetiredError, match="rollout ledger 'r0' is retired") as error:
            refused()
        assert (error.value.status_code, error.value.code) == (410, "rollout_retired")
    with pytest.raises(RolloutRetiredError):
        ledger.live_rows("r1")
    assert ledger.rows_many(["r0"]) == {"r0": [row("r0.0")]}, "an export still reads a retired ledger"
    ledger.retire(["r0"])  # idempotent


def test_delete_leaves_no_ledger_and_no_marker_but_keeps_counting(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path)
    ledger.begin_call("r0")
    ledger.append("r0", [row("r0.0")])
    ledger.retire(["r0"])

    ledger.delete(["r0", "never-seen"])

    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("r0")) == ["r0.calls"]
    assert ledger.live_rows("r0") == []
    assert ledger.begin_call("r0")[0] == "r0.1"


def test_keys_that_are_not_capture_keys_never_name_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be a capture key"):
        FileLedger(tmp_path).begin_call("../escape")


def test_concurrent_admissions_never_share_an_id(tmp_path: Path) -> None:
    """Each call takes the directory's lock on its own descriptor: threads (and processes) exclude each other."""
    ids: list[str] = []
    lock = threading.Lock()

    def admit() -> None:
        ledger = FileLedger(tmp_path)
        for _ in range(50):
            call_id, _ = ledger.begin_call("r0")
            with lock:
                ids.append(call_id)

    threads = [threading.Thread(target=admit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(ids) == sorted(f"r0.{index}" for index in range(200))
