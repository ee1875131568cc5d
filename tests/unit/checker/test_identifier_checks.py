"""The identifier checks (P15) and the reply-field checks of P10 on hand-built values: each passes on a good value
and raises its own violation on a bad one (docs/fields.md lists where each is called)."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_model.errors import ParticipantFailure
from ckpt_model.properties.fencing import (
    P10Violation,
    p10_lease_held,
    p10_lease_renewed,
    p10_reply_phase,
    p10_report_consistent,
)
from ckpt_model.properties.identifiers import (
    P15Violation,
    p15_admission_names_attempt,
    p15_capture_keys,
    p15_capture_keys_unique,
    p15_forgotten_echoed,
    p15_ledger_identifiers,
    p15_manifest_names_share,
    p15_model_call_ids_unique,
    p15_rejected_checkpoint_id_changed_nothing,
    p15_rejected_checkpoint_id_refused,
    p15_rejected_id_refused,
    p15_rejected_ids_called_nothing,
    p15_restore_names_source,
    p15_restored_next_attempts,
    p15_retired_echoed,
    p15_run_names_episode,
    p15_status_names_participant,
)
from ckpt_model.protocol.storage import Fingerprint

STATUS = {"kind": "environment", "instance": "environment", "phase": "idle", "lease_expires_at": None}


def test_a_status_names_its_participant() -> None:
    p15_status_names_participant("environment", "environment", STATUS)
    with pytest.raises(P15Violation, match="instance 'agent'"):
        p15_status_names_participant("environment", "environment", {**STATUS, "instance": "agent"})
    with pytest.raises(P15Violation, match="kind 'model'"):
        p15_status_names_participant("environment", "environment", {**STATUS, "kind": "model"})


@pytest.mark.parametrize("bad", [["r0 a1"], ["r0/a1"], ["-r0"], [""], [7], "r0", ["r0\n"]])
def test_capture_keys_are_capture_keys(bad: Any) -> None:
    p15_capture_keys("blockers", ["r0", "r0-a1", "counter-1-a12"])
    with pytest.raises(P15Violation, match="list of capture keys"):
        p15_capture_keys("blockers", bad)


FINGERPRINT = Fingerprint("m" * 64, "records-" + "a" * 64 + ".jsonl", "a" * 64, 1, ("r0",))
MANIFEST = {
    "schema_version": 1,
    "kind": "agent",
    "instance": "agent",
    "checkpoint_id": "c1",
    "records_file": FINGERPRINT.records_file,
    "records_sha256": FINGERPRINT.records_sha256,
    "record_count": 1,
}


@pytest.mark.parametrize(
    "wrong",
    [
        {"checkpoint_id": "c2"},
        {"instance": "agent-2"},
        {"kind": "environment"},
        {"schema_version": 2},
        {"record_count": 2},
        {"records_sha256": "b" * 64},
    ],
)
def test_a_commit_manifest_names_its_share_and_is_the_one_on_disk(wrong: dict[str, Any]) -> None:
    p15_manifest_names_share("c1", "agent", "agent", MANIFEST, FINGERPRINT)
    with pytest.raises(P15Violation, match="manifest of c1"):
        p15_manifest_names_share("c1", "agent", "agent", MANIFEST | wrong, FINGERPRINT)


def test_a_restore_names_its_source() -> None:
    p15_restore_names_source("r1", "c1", {"agent": {"source_checkpoint_id": "c1"}})
    with pytest.raises(P15Violation, match=r"source_checkpoint_id \{'agent': 'r1'\}"):
        p15_restore_names_source("r1", "c1", {"agent": {"source_checkpoint_id": "r1"}})


@pytest.mark.parametrize("bad", [["r0"], ["r0-a1", "r1-a1"], [], ["r0-a2"], "r0-a1"])
def test_a_restore_names_the_next_attempts_of_its_records(bad: Any) -> None:
    p15_restored_next_attempts("r1", "agent", ["r0-a1"], ["r0-a1"])
    with pytest.raises(P15Violation, match=r"restores \['r0-a1'\]"):
        p15_restored_next_attempts("r1", "agent", ["r0-a1"], bad)


def test_retire_and_forget_echo_what_they_were_given() -> None:
    p15_retired_echoed("t1", ["r1", "r0-a1"], {"agent": {"retired": ["r1", "r0-a1"]}})
    with pytest.raises(P15Violation, match="retired"):
        p15_retired_echoed("t1", ["r1", "r0-a1"], {"agent": {"retired": ["r0-a1", "r1"]}})
    p15_forgotten_echoed("f1", ["r1", "r0", "r1"], {"agent": {"forgotten": ["r0", "r1"]}})
    with pytest.raises(P15Violation, match="forgotten"):
        p15_forgotten_echoed("f1", ["r1", "r0"], {"agent": {"forgotten": ["r1"]}})


def _call(index: int, call_id: str | None, key: str = "r0-a1", routed: str | None = "r0-a1") -> dict[str, Any]:
    admission = None if call_id is None else {"model_call_id": call_id, "parent_call_id": None, "rollout_id": key}
    return {"index": index, "capture_key": routed, "admission": admission}


def test_a_model_call_id_is_never_reused() -> None:
    p15_model_call_ids_unique([_call(0, "r0.0"), _call(1, None), _call(2, "r0-a1.0"), _call(3, None)])
    with pytest.raises(P15Violation, match=r"#2 and #4 both carry it"):
        p15_model_call_ids_unique([_call(2, "r0-a1.1"), _call(3, "r0-a1.2"), _call(4, "r0-a1.1")])


def test_an_admission_names_the_attempt_it_was_routed_for() -> None:
    p15_admission_names_attempt([_call(0, "r0.0", "r0", "r0"), _call(1, None, routed=None)])
    with pytest.raises(P15Violation, match="rollout_id 'r0'"):
        p15_admission_names_attempt([_call(0, "r0.0", key="r0", routed="r0-a1")])


@pytest.mark.parametrize(
    ("answered_for", "sources"),
    [("r0-a1", ["r0-a2"]), ("r0-a1", ["r0-a1"]), ("r0-a1", ["r1"]), ("r0-a1", ["bad key!"]), ("r0", [None])],
)
def test_a_ledger_answers_for_its_key_and_stamps_earlier_attempts(answered_for: str, sources: list[Any]) -> None:
    p15_ledger_identifiers("r0-a2", "r0-a2", [None, "r0", "r0-a1"])
    p15_ledger_identifiers("r0-a2", None, [])
    with pytest.raises(P15Violation):
        p15_ledger_identifiers("r0-a1", answered_for, sources)


SENT = {"episode_id": {"rollout_id": "r0", "attempt": 1}, "task": {"task_id": {"taskset": "t", "task_id": "w"}}}


@pytest.mark.parametrize(
    "bad",
    [
        {"episode_id": {"rollout_id": "r0", "attempt": 0}, "task_id": SENT["task"]["task_id"]},
        {"episode_id": SENT["episode_id"], "task_id": {"taskset": "t", "task_id": "x"}},
        {"result": {"reward": 1.0}},
        "not json",
    ],
)
def test_a_native_run_reply_names_its_attempt_and_task(bad: Any) -> None:
    good = {"episode_id": SENT["episode_id"], "task_id": SENT["task"]["task_id"], "result": {"reward": 1.0}}
    p15_run_names_episode("r0-a1", SENT, good)
    p15_run_names_episode("r0-a1", {"_ng_rollout_id": "r0"}, {"reward": 1.0})  # legacy names neither
    with pytest.raises(P15Violation, match="the /run reply names"):
        p15_run_names_episode("r0-a1", SENT, bad)


REPORT = {"ready": False, "blockers": ["r0"], "blocker_count": 1, "counts": {}, "restarts": []}


@pytest.mark.parametrize(
    ("report", "phase"),
    [
        (REPORT | {"blocker_count": 2}, None),
        (REPORT | {"blockers": [], "blocker_count": 3}, None),
        (REPORT | {"blockers": [f"r{i}" for i in range(99)], "blocker_count": 120}, None),
        (REPORT, "prepared"),
        (REPORT | {"ready": True, "blockers": [], "blocker_count": 0}, "preparing"),
    ],
)
def test_a_report_agrees_with_itself(report: dict[str, Any], phase: str | None) -> None:
    p10_report_consistent("env", REPORT, "preparing")
    p10_report_consistent("env", REPORT | {"ready": True, "blockers": [], "blocker_count": 0}, "prepared")
    many = [f"r{i}" for i in range(100)]
    p10_report_consistent("env", REPORT | {"blockers": many, "blocker_count": 120})
    p10_report_consistent("resources", REPORT | {"blockers": [], "blocker_count": 0})  # a seed runs
    with pytest.raises(P10Violation, match="agrees with itself"):
        p10_report_consistent("env", report, phase)


def test_a_reply_names_the_phase_its_call_leaves() -> None:
    p10_reply_phase("resume", "c1", "idle", {"agent": {"phase": "idle"}})
    with pytest.raises(P10Violation, match=r"phases \{'agent': 'prepared'\}"):
        p10_reply_phase("resume", "c1", "idle", {"agent": {"phase": "prepared"}})


def test_a_renewed_lease_runs_to_the_deadline_plus_grace() -> None:
    p10_lease_renewed("c1", 100.0, {"agent": {"lease_expires_at": 100.0}})
    for bad in (99.9, None, "100"):
        with pytest.raises(P10Violation, match="lease_expires_at"):
            p10_lease_renewed("c1", 100.0, {"agent": {"lease_expires_at": bad}})


def test_an_active_checkpoint_holds_a_lease() -> None:
    p10_lease_held("agent", STATUS)
    p10_lease_held("agent", {**STATUS, "phase": "prepared", "lease_expires_at": 5.0})
    for bad in (None, True, "5"):
        with pytest.raises(P10Violation, match="holds a lease"):
            p10_lease_held("agent", {**STATUS, "phase": "prepared", "lease_expires_at": bad})


def test_no_capture_key_names_two_attempts() -> None:
    """`x-a1` at attempt 0 and `x` at attempt 1 share key `x-a1` (nemo-gym 0.7.0's legacy path); `x-a0` and `x`
    do not, nor does one pair seen twice."""
    p15_capture_keys_unique("records", [("x", 0), ("x", 1), ("x-a0", 0), ("x-a0", 1), ("x", 1), ("x-a01", 2)])
    with pytest.raises(P15Violation, match=r"(?s)capture key 'x-a1' names one attempt.*'x' at attempt 1 and 'x-a1'"):
        p15_capture_keys_unique("records", [("x", 0), ("x", 1), ("x-a1", 0)])
    with pytest.raises(P15Violation, match="'r-a1-a1'"):
        p15_capture_keys_unique("the backend's calls", [("r-a1", 1), ("r-a1-a1", 0), ("r", 2)])


NATIVE_SENT = {"episode_id": {"rollout_id": "-x", "attempt": 0}, "task": {}}
LEGACY_SENT = {"_ng_rollout_id": "x-a1", "_ng_attempt_index": 0}
VALIDATION_422 = {"detail": [{"loc": ["body", "episode_id", "rollout_id"], "msg": "Value error"}]}


def test_a_rejected_rollout_id_is_refused_with_the_protocols_error() -> None:
    p15_rejected_id_refused("-x", 0, NATIVE_SENT, 422, VALIDATION_422)
    p15_rejected_id_refused("x-a1", 0, LEGACY_SENT, 400, {"error": {"code": "invalid_rollout_id", "detail": "no"}})
    p15_rejected_id_refused("", 0, LEGACY_SENT, 400, {"error": {"code": "rollout_id_required", "detail": "no"}})
    with pytest.raises(P15Violation, match="422 naming rollout_id"):
        p15_rejected_id_refused("-x", 0, NATIVE_SENT, 422, {"detail": [{"loc": ["body", "task"]}]})
    with pytest.raises(P15Violation, match="HTTP 200"):
        p15_rejected_id_refused("-x", 0, NATIVE_SENT, 200, {"result": {}})
    with pytest.raises(P15Violation, match=r"(?s)400 invalid_rollout_id.*HTTP 409"):
        p15_rejected_id_refused("x-a1", 0, LEGACY_SENT, 409, {"error": {"code": "checkpoint_error", "detail": "dup"}})
    with pytest.raises(P15Violation, match="HTTP None"):
        p15_rejected_id_refused("x-a1", 0, LEGACY_SENT, None, None)


def test_a_rejected_rollout_id_calls_nothing() -> None:
    owners = {"x": ("x", 0), "x-a1": ("x", 1)}
    expected = {"x": (2, 4), "x-a1": (4,)}
    # Calls the model's own attempts make, some still to come, are theirs.
    p15_rejected_ids_called_nothing([("x-a1", 0), ("-y", 0)], owners, expected, {"x": (2,), "x-a1": (4,)})
    with pytest.raises(P15Violation, match=r"'x-a1' names one attempt in the backend's calls"):
        p15_rejected_ids_called_nothing([("x-a1", 0)], owners, expected, {"x-a1": (4, 2)})
    with pytest.raises(P15Violation, match=r"rejected rollout ID 'y-a1' is refused and calls nothing"):
        p15_rejected_ids_called_nothing([("y-a1", 0)], owners, expected, {"y-a1": (2,)})


def _refused(name: str, status: int = 422, detail: str = "body.checkpoint_id: String should match pattern") -> Any:
    return ParticipantFailure(participant=name, http_status=status, code=None, detail=detail)


def test_a_rejected_checkpoint_id_is_refused_with_a_422_naming_it() -> None:
    p15_rejected_checkpoint_id_refused("prepare", "-c", {"agent": _refused("agent"), "env": _refused("env")})
    accepted = {"agent": _refused("agent"), "env": {"phase": "preparing", "report": {}}}
    with pytest.raises(P15Violation, match=r"env.*HTTP 200"):
        p15_rejected_checkpoint_id_refused("prepare", "-c", accepted)
    other_field = {"env": _refused("env", detail="body.deadline_ts: Field required")}
    with pytest.raises(P15Violation, match="deadline_ts"):
        p15_rejected_checkpoint_id_refused("resume", "", other_field)
    refused_by_route = {"env": ParticipantFailure("env", 409, "invalid_phase", "checkpoint_id 'c/y' is not active")}
    with pytest.raises(P15Violation, match="409 invalid_phase"):
        p15_rejected_checkpoint_id_refused("commit", "c/y", refused_by_route)


def test_a_rejected_checkpoint_id_changes_no_status() -> None:
    idle = {"phase": "idle", "checkpoint_id": None, "lease_expires_at": None, "accepting": True, "report": {"a": 1}}
    # The report is not control state: episodes move on their own.
    p15_rejected_checkpoint_id_changed_nothing("resume", "c1\n", {"agent": idle}, {"agent": {**idle, "report": {}}})
    prepared = {**idle, "phase": "preparing", "checkpoint_id": "c1", "accepting": False}
    with pytest.raises(P15Violation, match=r"agent.*phase 'idle' -> 'preparing'.*accepting True -> False"):
        p15_rejected_checkpoint_id_changed_nothing("prepare", "c1\n", {"agent": idle}, {"agent": prepared})
    resumed = {**prepared, "phase": "idle", "checkpoint_id": None, "accepting": True}
    with pytest.raises(P15Violation, match="checkpoint_id 'c1' -> None"):
        p15_rejected_checkpoint_id_changed_nothing("resume", "-c1", {"agent": prepared}, {"agent": resumed})
