"""The controller's trace context, the calls it journals, the telemetry reader and P26's verdicts, without
servers: every verdict on hand-built calls and spans, each seen to fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_model.properties.telemetry import P26Violation, p26_metrics_agree, p26_one_span_per_call
from ckpt_model.protocol.client import ControlClient, Participant, Participants
from ckpt_model.protocol.telemetry import (
    ControlCall,
    MetricsSnapshot,
    Span,
    SpanCounts,
    call_span_id,
    trace_id_of,
    traceparent,
)
from ckpt_model.trainer.telemetry_watch import TelemetryReader

TRACE = trace_id_of("c1")


def call(participant: str = "agent", outcome: str | None = "ok", answered: bool = True, n: int = 0) -> ControlCall:
    return ControlCall(
        participant, "prepare", "c1", TRACE, call_span_id(TRACE, participant, "prepare", n), outcome, answered
    )


def span_of(made: ControlCall, **changes: Any) -> Span:
    attributes = {
        "gym.checkpoint.id": made.checkpoint_id,
        "gym.participant.instance": made.participant,
        "gym.checkpoint.outcome": made.outcome,
        **changes.pop("attributes", {}),
    }
    fields: dict[str, Any] = {
        "source": f"{made.participant}-1.jsonl",
        "name": f"gym.checkpoint.{made.operation}",
        "trace_id": made.trace_id,
        "span_id": "00000000000000aa",
        "parent_span_id": made.span_id,
        "attributes": attributes,
        **changes,
    }
    return Span(**fields)


# --- the trace context ---------------------------------------------------------------------------------------


def test_a_checkpoints_trace_is_a_function_of_its_id_and_each_call_has_its_own_parent() -> None:
    assert trace_id_of("c1") == trace_id_of("c1") != trace_id_of("c2")
    assert len(trace_id_of("c1")) == 32
    assert int(trace_id_of("c1"), 16)
    assert call_span_id(TRACE, "agent", "prepare", 0) != call_span_id(TRACE, "agent", "prepare", 1)
    assert traceparent(TRACE, "00000000000000ab") == f"00-{TRACE}-00000000000000ab-01"


def test_the_client_sends_a_traceparent_on_every_call_and_journals_what_each_reply_showed() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["traceparent"])
        if request.url.host == "env":
            return httpx.Response(409, json={"error": {"code": "stale_checkpoint", "detail": "resumed"}})
        return httpx.Response(200, json={"phase": "idle", "idempotent": False})

    members = Participants(
        (Participant("environment", "environment", "http://env"), Participant("agent", "agent", "http://ag"))
    )
    with ControlClient("t", members, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(Exception, match="stale_checkpoint"):
            client.resume("c1", 9e9)
        calls = {made.participant: made for made in client.control_calls()}
        client.begin_traces()
        assert client.control_calls() == []

    assert sorted(seen) == sorted(traceparent(TRACE, made.span_id) for made in calls.values())
    assert calls["environment"].outcome == "stale_checkpoint"
    assert calls["agent"].outcome == "ok"
    assert all(made.answered and made.trace_id == TRACE for made in calls.values())


def test_a_call_no_reply_came_to_stays_unanswered() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    members = Participants((Participant("agent", "agent", "http://ag"),))
    with ControlClient("t", members, transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(Exception, match="transport error"):
            client.resume("c1", 9e9)
        (made,) = client.control_calls()
    assert not made.answered
    assert made.expected_spans == (0, 1)


def test_how_many_spans_a_call_makes() -> None:
    assert call().expected_spans == (1, 1)
    assert call(outcome="invalid_phase").expected_spans == (1, 1)
    assert call(outcome="unauthorized").expected_spans == (0, 0)
    assert call(outcome="http_422").expected_spans == (0, 0)
    assert call(outcome=None, answered=False).expected_spans == (0, 1)


# --- P26: one span per call ----------------------------------------------------------------------------------


def test_p26_passes_one_span_per_answered_call_and_none_or_one_per_unanswered() -> None:
    ok, lost = call("agent"), call("environment", outcome=None, answered=False)
    p26_one_span_per_call([ok, lost], [span_of(ok)])
    p26_one_span_per_call([ok, lost], [span_of(ok), span_of(lost, attributes={"gym.checkpoint.outcome": "ok"})])


def test_p26_fails_a_call_without_its_span_and_says_where_it_went() -> None:
    made = call()
    elsewhere = span_of(made, trace_id="f" * 32, parent_span_id=None)
    with pytest.raises(P26Violation, match="outside the controller's trace") as caught:
        p26_one_span_per_call([made], [elsewhere])
    assert type(caught.value) is P26Violation


def test_p26_fails_two_spans_for_one_call() -> None:
    made = call()
    with pytest.raises(P26Violation, match="exactly 1 span"):
        p26_one_span_per_call([made], [span_of(made), span_of(made)])


def test_p26_fails_a_span_for_a_call_refused_before_it_ran() -> None:
    made = call(outcome="unauthorized")
    with pytest.raises(P26Violation, match="exactly 0 spans"):
        p26_one_span_per_call([made], [span_of(made)])


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attributes": {"gym.checkpoint.outcome": "ok"}}, "outcome"),
        ({"trace_id": "e" * 32}, "trace"),
        ({"name": "gym.checkpoint.commit"}, "name"),
        ({"attributes": {"gym.participant.instance": "agent"}}, "instance"),
        ({"attributes": {"gym.checkpoint.id": "c2"}}, "checkpoint"),
    ],
)
def test_p26_fails_a_span_that_does_not_tell_its_call(changes: dict[str, Any], field: str) -> None:
    made = call("environment", outcome="stale_checkpoint")
    with pytest.raises(P26Violation, match=field):
        p26_one_span_per_call([made], [span_of(made, **changes)])


def test_p26_fails_a_span_under_a_call_never_made() -> None:
    made = call()
    with pytest.raises(P26Violation, match="under a call the controller made"):
        p26_one_span_per_call([], [span_of(made)])


def test_p26_ignores_steps_and_lapses_for_the_calls() -> None:
    made = call()
    step = span_of(made, name="wait_ready", parent_span_id="00000000000000aa")
    lapse = span_of(made, name="gym.checkpoint.lease_expired", parent_span_id=None)
    p26_one_span_per_call([made], [span_of(made), step, lapse])


# --- P26: the metrics ------------------------------------------------------------------------------------------


def counted(*spans: Span) -> SpanCounts:
    counts = SpanCounts()
    for span in spans:
        counts = counts.adding(span)
    return counts


def snapshot(operations: dict[tuple[str, str], int], lease_expired: int = 0) -> MetricsSnapshot:
    durations: dict[str, int] = {}
    for (op, _), n in operations.items():
        durations[op] = durations.get(op, 0) + n
    return MetricsSnapshot("agent-1.jsonl", operations, durations, lease_expired)


def test_p26_metrics_agree_with_the_spans_before_them() -> None:
    refused = span_of(call(outcome="stale_checkpoint"))
    lapse = span_of(call(), name="gym.checkpoint.lease_expired")
    counts = counted(span_of(call()), refused, lapse)
    p26_metrics_agree(counts, snapshot({("prepare", "ok"): 1, ("prepare", "stale_checkpoint"): 1}, 1))


def test_p26_fails_metrics_that_miss_a_refusal() -> None:
    counts = counted(span_of(call()), span_of(call(outcome="stale_checkpoint")))
    with pytest.raises(P26Violation, match="operations"):
        p26_metrics_agree(counts, snapshot({("prepare", "ok"): 1}))


def test_p26_fails_metrics_that_miss_a_lapse() -> None:
    counts = counted(span_of(call(), name="gym.checkpoint.lease_expired"))
    with pytest.raises(P26Violation, match="lease_expired"):
        p26_metrics_agree(counts, snapshot({}, 0))


# --- the reader ----------------------------------------------------------------------------------------------


def line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()


def span_line(made: ControlCall) -> dict[str, Any]:
    span = span_of(made)
    return {
        "type": "span",
        "name": span.name,
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "attributes": dict(span.attributes),
    }


METRICS_OK = {
    "type": "metrics",
    "operations": [{"op": "prepare", "outcome": "ok", "count": 1}],
    "durations": [{"op": "prepare", "count": 1, "sum_s": 0.1}],
    "lease_expired": 0,
}


def test_the_reader_reads_whole_lines_once_and_judges_each_metrics_line(tmp_path: Path) -> None:
    path = tmp_path / "agent-7.jsonl"
    whole, metrics = line(span_line(call())), line(METRICS_OK)
    path.write_bytes(whole + metrics[:10])  # a metrics line still being written
    reader = TelemetryReader(tmp_path)
    reader.read_new()
    assert [span.source for span in reader.spans] == ["agent-7.jsonl"]
    with path.open("ab") as file:
        file.write(metrics[10:])
    reader.read_new()
    reader.read_new()
    assert len(reader.spans) == 1


def test_the_reader_fails_p26_on_metrics_ahead_of_the_spans(tmp_path: Path) -> None:
    (tmp_path / "agent-7.jsonl").write_bytes(line(METRICS_OK))
    with pytest.raises(P26Violation, match="operations"):
        TelemetryReader(tmp_path).read_new()


@pytest.mark.parametrize("bad", [b"not json\n", b"[1]\n", b'{"type": "log"}\n', b'{"type": "span"}\n'])
def test_the_reader_fails_p26_on_a_line_it_cannot_read(tmp_path: Path, bad: bytes) -> None:
    (tmp_path / "agent-7.jsonl").write_bytes(bad)
    with pytest.raises(P26Violation):
        TelemetryReader(tmp_path).read_new()


def test_the_reader_of_a_missing_directory_reads_nothing(tmp_path: Path) -> None:
    reader = TelemetryReader(tmp_path / "none")
    reader.read_new()
    assert reader.spans == []
