"""The servers' properties on a collection run's journaled calls (`ckpt_model.properties.collection_calls`), judged on
hand-built journals: a clean one passes, and each check fails on the reply it exists for."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_model.errors import HarnessError
from ckpt_model.properties.collection_calls import (
    CallAudit,
    completed_calls,
    prepared_spans,
    reported_restarts,
    run_key,
    scope_keys,
)
from ckpt_model.properties.continuation import P2Violation, P3Violation, p2_no_reply_within
from ckpt_model.properties.durability import P9Violation
from ckpt_model.properties.fencing import P10Violation, p10_open_after_resume
from ckpt_model.properties.identifiers import P15Violation
from ckpt_model.properties.scope import P1Violation, p1_commit_is_its_share
from ckpt_model.protocol.history import History
from ckpt_model.protocol.storage import CheckpointUnreadable, Fingerprint

KINDS = {"environment": "environment", "agent": "agent"}
CKPT = "ckpt-1"
SCOPE = [{"rollout_id": "row-0", "attempt": 0}, {"rollout_id": "row-1", "attempt": 0}]
SCOPE_KEYS = ["row-0", "row-1"]


def share(*keys: str) -> Fingerprint:
    return Fingerprint("m" * 64, "records-" + "a" * 64 + ".jsonl", "a" * 64, len(keys), tuple(sorted(keys)))


def manifest(name: str, kind: str, of: Fingerprint, checkpoint_id: str = CKPT) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "kind": kind,
        "instance": name,
        "checkpoint_id": checkpoint_id,
        "records_file": of.records_file,
        "records_sha256": of.records_sha256,
        "record_count": of.record_count,
    }


TASK_ID = {"taskset": "collection:rows", "task_id": "row"}


class Journal:
    """A history written as the relay writes it, with the audit that judges it."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.history = History(clock=lambda: self.clock)
        self.audit = CallAudit(self.history, KINDS, reward=1.0)

    def call(self, name: str, operation: str, body: Any, reply: Any, status: int = 200, **seen: Any) -> None:
        self.clock += 0.1
        invocation = self.history.invoke(name, operation, {"body": body})
        self.clock += 0.1
        self.history.complete(invocation, "ok", {"status": status, "body": reply, **seen})

    def prepare_all(self, checkpoint_id: str = CKPT, restarts: tuple[str, ...] = ()) -> None:
        report = {"restarts": list(restarts)}
        for name in KINDS:
            self.call(name, "prepare", {"checkpoint_id": checkpoint_id}, {"phase": "prepared", "report": report})

    def commit(self, name: str, reply: Any | None = None, on_disk: Any = None) -> None:
        written = on_disk if on_disk is not None else share("row-0")
        body = {"checkpoint_id": CKPT, "checkpoint_dir": "/c/ckpt-1", "episode_ids": SCOPE}
        default = {
            "phase": "committed",
            "episode_ids": ["row-0"],
            "manifest": manifest(name, KINDS[name], share("row-0")),
        }
        self.call(name, "commit", body, reply if reply is not None else default, share=written)

    def resume(self, name: str, phase: str = "idle") -> None:
        self.call(name, "resume", {"checkpoint_id": CKPT}, {"phase": phase, "idempotent": False})

    def run_reply(self, rollout: str, reward: float = 1.0, attempt: int = 0, **outcome: Any) -> None:
        episode_id = {"rollout_id": rollout, "attempt": attempt}
        body = {"episode_id": episode_id, "task": {"task_id": TASK_ID, "task_input": {}}}
        reply = {"episode_id": episode_id, "task_id": TASK_ID, **(outcome or {"result": {"reward": reward}})}
        self.call("agent", "run", body, reply)


def clean_checkpoint(journal: Journal) -> None:
    journal.prepare_all()
    for name in KINDS:
        journal.commit(name)
    for name in KINDS:
        journal.resume(name)


def test_a_clean_checkpoint_with_replies_around_it_passes() -> None:
    journal = Journal()
    journal.run_reply("row-2")
    clean_checkpoint(journal)
    journal.run_reply("row-0", attempt=0)
    journal.call("agent", "retire", {"checkpoint_id": "retire-1", "episode_ids": SCOPE[:1]}, {"retired": ["row-0"]})
    journal.call("agent", "forget", {"checkpoint_id": "forget-1", "rollout_ids": ["row-0"]}, {"forgotten": ["row-0"]})
    journal.call("agent", "commit", {"checkpoint_id": "x"}, {"error": {"code": "invalid_phase"}}, status=409)
    journal.audit.check()
    assert journal.audit.judged == len(journal.history.events)


def test_a_commit_reply_with_another_phase_is_p10() -> None:
    journal = Journal()
    journal.prepare_all()
    reply = {
        "phase": "prepared",
        "episode_ids": ["row-0"],
        "manifest": manifest("agent", "agent", share("row-0")),
    }
    journal.commit("agent", reply=reply)
    with pytest.raises(P10Violation, match="phase 'committed'"):
        journal.audit.check()


def test_a_share_that_does_not_verify_is_p9() -> None:
    journal = Journal()
    journal.prepare_all()
    journal.commit("agent", on_disk=CheckpointUnreadable("records file digest mismatch"))
    with pytest.raises(P9Violation, match="digest mismatch"):
        journal.audit.check()


def test_a_commit_reply_naming_other_records_than_the_disk_is_p1() -> None:
    journal = Journal()
    journal.prepare_all()
    written = share("row-0")
    reply = {
        "phase": "committed",
        "episode_ids": ["row-0", "row-1"],
        "manifest": manifest("agent", "agent", written),
    }
    journal.commit("agent", reply=reply, on_disk=written)
    with pytest.raises(P1Violation, match="row-1"):
        journal.audit.check()


def test_records_outside_the_scope_are_p1_unless_a_reported_restart() -> None:
    outside = share("row-0", "row-9")
    reply = {
        "phase": "committed",
        "episode_ids": ["row-0", "row-9"],
        "manifest": manifest("agent", "agent", outside),
    }
    journal = Journal()
    journal.prepare_all()
    journal.commit("agent", reply=reply, on_disk=outside)
    with pytest.raises(P1Violation, match="also name"):
        journal.audit.check()

    restarted = Journal()
    restarted.prepare_all(restarts=("row-9",))
    restarted.commit("agent", reply=reply, on_disk=outside)
    restarted.audit.check()


def test_a_manifest_that_is_not_the_one_written_is_p15() -> None:
    journal = Journal()
    journal.prepare_all()
    written = share("row-0")
    wrong = manifest("agent", "agent", written, checkpoint_id="ckpt-0")
    journal.commit("agent", reply={"phase": "committed", "episode_ids": ["row-0"], "manifest": wrong})
    with pytest.raises(P15Violation, match="ckpt-0"):
        journal.audit.check()


def test_a_resume_that_does_not_leave_idle_is_p10() -> None:
    journal = Journal()
    journal.resume("environment", phase="committed")
    with pytest.raises(P10Violation, match="resume"):
        journal.audit.check()


def test_resumed_since_waits_for_every_participant_s_answer_to_a_resume_sent_after_the_mark() -> None:
    journal = Journal()
    journal.resume("environment")  # an earlier checkpoint's resume
    mark = len(journal.history.events)
    assert journal.audit.resumed_since(0) is False  # the agent never answered one
    journal.prepare_all()
    journal.resume("agent")
    assert journal.audit.resumed_since(mark) is False  # the environment's resume came before the mark
    unanswered = journal.history.invoke("environment", "resume", {"body": {"checkpoint_id": CKPT}})
    assert journal.audit.resumed_since(mark) is False  # sent, not answered
    journal.history.complete(unanswered, "info", "connection reset")
    assert journal.audit.resumed_since(mark) is False  # broken off, not answered
    journal.resume("environment")
    assert journal.audit.resumed_since(mark) is True


def restore(journal: Journal, restored: list[str], source: str = CKPT, name: str = "environment") -> None:
    body = {"checkpoint_id": "restore-1", "checkpoint_dir": "/c/ckpt-1", "episode_ids": SCOPE}
    reply = {"phase": "restored", "source_checkpoint_id": source, "restored": restored}
    journal.call(name, "restore", body, reply, share=share("row-0"), source=CKPT)


def test_a_restore_names_its_source_and_the_next_attempts_of_its_records() -> None:
    journal = Journal()
    restore(journal, ["row-0-a1"])
    journal.audit.check()

    wrong_source = Journal()
    restore(wrong_source, ["row-0-a1"], source="restore-1")
    with pytest.raises(P15Violation, match="source_checkpoint_id"):
        wrong_source.audit.check()

    wrong_attempts = Journal()
    restore(wrong_attempts, ["row-0"])
    with pytest.raises(P15Violation, match="row-0-a1"):
        wrong_attempts.audit.check()


def test_retire_and_forget_replies_echo_what_was_asked() -> None:
    retire = Journal()
    retire.call("agent", "retire", {"checkpoint_id": "retire-1", "episode_ids": SCOPE}, {"retired": ["row-0"]})
    with pytest.raises(P15Violation, match="retired"):
        retire.audit.check()

    forget = Journal()
    forget.call("agent", "forget", {"checkpoint_id": "forget-1", "rollout_ids": ["row-1", "row-0"]}, {"forgotten": []})
    with pytest.raises(P15Violation, match="forgotten"):
        forget.audit.check()


def test_a_run_reply_without_the_uninterrupted_reward_is_p3() -> None:
    journal = Journal()
    journal.run_reply("row-0", reward=0.0)
    with pytest.raises(P3Violation, match="row-0"):
        journal.audit.check()


def test_a_native_run_reply_off_the_release_shape_is_p3_naming_the_field() -> None:
    journal = Journal()
    journal.run_reply("row-0", failure={"failure_reason": "Episode timed out", "terminal": False, "stage": "agent"})
    with pytest.raises(P3Violation, match=r"row-0[\s\S]*'failure.stage': a failure 'Episode timed out' has no stage"):
        journal.audit.check()


def test_a_run_reply_between_everyone_prepared_and_the_resume_is_p2() -> None:
    journal = Journal()
    journal.prepare_all()
    journal.run_reply("row-0")
    with pytest.raises(P2Violation, match="agent replied"):
        journal.audit.check()


def test_a_run_reply_before_the_last_participant_prepared_or_after_a_crash_is_no_p2() -> None:
    journal = Journal()
    journal.call("environment", "prepare", {"checkpoint_id": CKPT}, {"phase": "prepared", "report": {}})
    journal.run_reply("row-0")
    journal.call("agent", "prepare", {"checkpoint_id": CKPT}, {"phase": "prepared", "report": {}})
    journal.clock += 0.1
    journal.history.note("cluster", "crash")
    journal.run_reply("row-1")
    journal.audit.check()


def test_a_reply_the_relay_could_not_read_is_a_harness_error() -> None:
    journal = Journal()
    journal.call("agent", "commit", {"checkpoint_id": CKPT}, {}, observe_error="PermissionError: denied")
    with pytest.raises(HarnessError, match="denied"):
        journal.audit.check()


def test_spans_open_when_every_participant_prepared_and_close_at_resume_restore_or_crash() -> None:
    journal = Journal()
    journal.prepare_all()
    opened = journal.history.events[-1].time_s
    journal.resume("agent")
    closed = journal.history.events[-2].time_s  # the resume's invocation
    journal.prepare_all("ckpt-2")
    events = journal.history.events
    spans = prepared_spans(events, KINDS)
    assert spans[0] == (opened, closed)
    assert spans[1][0] == events[-1].time_s
    assert spans[1][1] > events[-1].time_s  # open-ended
    assert prepared_spans(events, [*KINDS, "model"]) == []  # a participant that never prepared


def test_keys_of_run_bodies_scopes_and_restart_reports() -> None:
    assert run_key({"episode_id": {"rollout_id": "r", "attempt": 2}}) == "r-a2"
    assert run_key({"_ng_rollout_id": "r", "_ng_attempt_index": 1, "responses_create_params": {}}) == "r-a1"
    assert scope_keys({"episode_ids": SCOPE}) == SCOPE_KEYS
    assert scope_keys({"checkpoint_id": CKPT}) is None
    journal = Journal()
    journal.prepare_all(restarts=("row-5",))
    journal.prepare_all("ckpt-2", restarts=("row-6",))
    assert reported_restarts(completed_calls(journal.history.events), CKPT) == {"row-5"}


def test_p1_commit_is_its_share_on_hand_built_values() -> None:
    p1_commit_is_its_share(CKPT, "agent", SCOPE_KEYS, (), ["row-0"], ["row-0"])
    p1_commit_is_its_share(CKPT, "agent", None, (), ["row-9"], ["row-9"])  # no scope: any records
    with pytest.raises(P1Violation, match="it names None"):
        p1_commit_is_its_share(CKPT, "agent", SCOPE_KEYS, (), None, ["row-0"])
    with pytest.raises(P1Violation, match="row-9"):
        p1_commit_is_its_share(CKPT, "agent", SCOPE_KEYS, ("row-8",), ["row-9"], ["row-9"])


def test_p2_no_reply_within_on_hand_built_values() -> None:
    journal = Journal()
    journal.run_reply("row-0")
    reply_at = journal.history.events[-1].time_s
    p2_no_reply_within([(reply_at, reply_at + 1.0)], journal.history.events)  # strictly inside only
    with pytest.raises(P2Violation):
        p2_no_reply_within([(reply_at - 0.01, reply_at + 1.0)], journal.history.events)


def test_p10_open_after_resume_on_hand_built_values() -> None:
    idle = {"phase": "idle", "checkpoint_id": None}
    p10_open_after_resume("the resume", {"environment": idle, "agent": {**idle, "accepting": True}})
    with pytest.raises(P10Violation, match="accepting False"):
        p10_open_after_resume("the resume", {"agent": {**idle, "accepting": False}})
    with pytest.raises(P10Violation, match="checkpoint 'ckpt-1'"):
        p10_open_after_resume("the resume", {"environment": {"phase": "idle", "checkpoint_id": CKPT}})
