"""The look-alike's telemetry in one process: spans through the SDK's exporter interface, each on disk when the
operation returns, in the caller's trace, with its outcome, and a metrics line that counts them; nothing when off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fakes.gym.control.telemetry import Telemetry, outcome_of
from fakes.gym.protocol.errors import ReplyLost, StaleCheckpointError

TRACE = "ab" * 16
CALL = "cd" * 8
TRACEPARENT = f"00-{TRACE}-{CALL}-01"


def lines(directory: Path) -> list[dict[str, Any]]:
    (path,) = directory.iterdir()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_operation_is_one_span_in_the_callers_trace_then_a_metrics_line(tmp_path: Path) -> None:
    telemetry = Telemetry(str(tmp_path), "agent", "agent")
    with telemetry.operation("prepare", "c1", TRACEPARENT, "agent"), telemetry.step("wait_ready"):
        pass
    with pytest.raises(StaleCheckpointError), telemetry.operation("prepare", "c0", TRACEPARENT, "agent"):
        raise StaleCheckpointError("resumed")

    step, prepared, first_counts, refused, counts = lines(tmp_path)
    assert step["name"] == "wait_ready"
    assert step["parent_span_id"] == prepared["span_id"]
    assert prepared["name"] == "gym.checkpoint.prepare"
    assert (prepared["trace_id"], prepared["parent_span_id"], prepared["parent_remote"]) == (TRACE, CALL, True)
    assert prepared["attributes"] == {
        "gym.checkpoint.id": "c1",
        "gym.checkpoint.operation": "prepare",
        "gym.checkpoint.outcome": "ok",
        "gym.participant.instance": "agent",
        "gym.participant.kind": "agent",
    }
    assert first_counts["operations"] == [{"count": 1, "op": "prepare", "outcome": "ok"}]
    assert refused["attributes"]["gym.checkpoint.outcome"] == "stale_checkpoint"
    assert refused["status"] == "ERROR"
    assert counts["operations"] == [
        {"count": 1, "op": "prepare", "outcome": "ok"},
        {"count": 1, "op": "prepare", "outcome": "stale_checkpoint"},
    ]
    assert counts["durations"][0]["count"] == 2
    telemetry.shutdown()


def test_a_lapse_is_a_span_in_its_checkpoints_trace_and_a_count(tmp_path: Path) -> None:
    telemetry = Telemetry(str(tmp_path), "agent", "agent")
    with telemetry.operation("prepare", "c1", TRACEPARENT, "agent"):
        pass
    telemetry.lease_expired("c1")
    *_, lapse, counts = lines(tmp_path)
    assert (lapse["name"], lapse["trace_id"]) == ("gym.checkpoint.lease_expired", TRACE)
    assert counts["lease_expired"] == 1


def test_off_without_a_directory_and_status_is_never_a_span(tmp_path: Path) -> None:
    with Telemetry("", "agent", "agent").operation("prepare", "c1", TRACEPARENT, "agent"):
        pass
    telemetry = Telemetry(str(tmp_path), "agent", "agent")
    with telemetry.operation("status", "", None, "agent"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_without_a_traceparent_the_span_starts_a_trace_of_its_own(tmp_path: Path) -> None:
    with Telemetry(str(tmp_path), "agent", "agent").operation("resume", "c1", None, "agent"):
        pass
    span, _ = lines(tmp_path)
    assert span["parent_span_id"] is None
    assert span["trace_id"] != TRACE


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("span_outcome_always_ok", "ok"), ("trace_context_dropped", None), ("lease_expired_not_counted", 0)],
)
def test_the_planted_faults(tmp_path: Path, fault: str, expected: Any) -> None:
    telemetry = Telemetry(str(tmp_path), "agent", "agent", frozenset({fault}))
    with pytest.raises(StaleCheckpointError), telemetry.operation("prepare", "c1", TRACEPARENT, "agent"):
        raise StaleCheckpointError("resumed")
    telemetry.lease_expired("c1")
    span, _, _, counts = lines(tmp_path)
    shown = {
        "span_outcome_always_ok": span["attributes"]["gym.checkpoint.outcome"],
        "trace_context_dropped": span["parent_span_id"],
        "lease_expired_not_counted": counts["lease_expired"],
    }
    assert shown[fault] == expected


def test_outcomes_of_what_an_operation_raises() -> None:
    assert outcome_of(StaleCheckpointError("x")) == "stale_checkpoint"
    assert outcome_of(ReplyLost("x")) == "ok"  # it ran in full; the reply is lost on the wire
    assert outcome_of(RuntimeError("x")) == "checkpoint_error"
