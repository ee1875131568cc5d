"""P26 offline, as `ckpt-model audit --telemetry` judges it: spans against each other and against the participant
directories a checkpoint holds, and the OTLP/JSON reader; every verdict on hand-built spans, each seen to fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.errors import PropertyViolation
from ckpt_model.modes.audit_telemetry import NoTelemetry, audit_telemetry
from ckpt_model.properties.telemetry import (
    P26Violation,
    p26_one_trace_per_checkpoint,
    p26_shares_committed,
    p26_span_consistent,
    p26_steps_inside,
)
from ckpt_model.protocol.telemetry import Span, spans_from_otlp, trace_id_of
from ckpt_model.trainer.telemetry_watch import TelemetryReader

CHECKPOINT = "ckpt-20261205T010203-0a0b0c0d"
TRACE = trace_id_of(CHECKPOINT)
ENV = ("environment", "environment")
AGENT = ("agent", "agent")


def operation(op: str, participant: tuple[str, str] = ENV, outcome: str = "ok", at: int = 100, **changes: Any) -> Span:
    """An operation's span as the look-alike writes it, begun at `at` and 10 ns long."""
    kind, instance = participant
    attributes = {
        "gym.checkpoint.id": CHECKPOINT,
        "gym.checkpoint.operation": op,
        "gym.participant.kind": kind,
        "gym.participant.instance": instance,
        "gym.checkpoint.outcome": outcome,
        **changes.pop("attributes", {}),
    }
    fields: dict[str, Any] = {
        "source": f"{instance}-1.jsonl",
        "name": f"gym.checkpoint.{op}",
        "trace_id": TRACE,
        "span_id": f"{at:016x}",
        "parent_span_id": "00000000000000c0",
        "attributes": attributes,
        "start_ns": at,
        "end_ns": at + 10,
        "status": "UNSET" if outcome == "ok" else "ERROR",
        **changes,
    }
    return Span(**fields)


def step(parent: Span, start: int, end: int, **changes: Any) -> Span:
    fields: dict[str, Any] = {
        "source": parent.source,
        "name": "write",
        "trace_id": parent.trace_id,
        "span_id": f"{start + 7:016x}",
        "parent_span_id": parent.span_id,
        "start_ns": start,
        "end_ns": end,
        "status": "UNSET",
        **changes,
    }
    return Span(**fields)


def one_checkpoint() -> list[Span]:
    """Prepare, commit and resume of CHECKPOINT on the environment and the agent, in one trace."""
    return [
        operation(op, participant, at=at + offset)
        for offset, participant in ((0, ENV), (1, AGENT))
        for op, at in (("prepare", 100), ("commit", 200), ("resume", 300))
    ]


# --- p26_span_consistent ------------------------------------------------------------------------------------


def test_a_span_naming_its_checkpoint_participant_and_outcome_with_a_status_that_agrees_passes() -> None:
    for span in (
        operation("commit"),
        operation("commit", outcome="stale_checkpoint"),
        operation("commit", outcome="stale_checkpoint", status="UNSET"),
        operation("commit", status=None, start_ns=None),
    ):
        p26_span_consistent(span)


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({"attributes": {"gym.checkpoint.id": None}}, "gym.checkpoint.id None"),
        ({"attributes": {"gym.participant.kind": ""}}, "gym.participant.kind ''"),
        ({"attributes": {"gym.participant.instance": 3}}, "gym.participant.instance 3"),
        ({"attributes": {"gym.checkpoint.outcome": None}}, "gym.checkpoint.outcome None"),
        ({"status": "ERROR"}, "status ERROR with outcome 'ok'"),
        ({"end_ns": 50}, "ends at 50 before it begins at 100"),
    ],
)
def test_a_span_that_does_not_say_what_happened_fails(changes: dict[str, Any], shown: str) -> None:
    with pytest.raises(P26Violation, match=shown):
        p26_span_consistent(operation("commit", **changes))


def test_a_refusal_whose_status_says_ok_fails() -> None:
    with pytest.raises(P26Violation, match="status OK with outcome 'invalid_phase'"):
        p26_span_consistent(operation("commit", outcome="invalid_phase", status="OK"))


# --- p26_steps_inside -----------------------------------------------------------------------------------------


def test_steps_inside_their_operation_pass() -> None:
    commit = operation("commit", at=200)
    p26_steps_inside([commit, step(commit, 201, 205), step(commit, 205, 210)])
    # a span whose parent is not an operation of its file (a lapse, a remote parent) is no step
    p26_steps_inside([commit, step(commit, 0, 1, source="other-2.jsonl")])


@pytest.mark.parametrize("changes", [{"start_ns": 150, "end_ns": 205}, {"end_ns": 211}, {"trace_id": "e" * 32}])
def test_a_step_outside_its_operation_fails(changes: dict[str, Any]) -> None:
    commit = operation("commit", at=200)
    with pytest.raises(P26Violation, match=r"the step write inside gym\.checkpoint\.commit"):
        p26_steps_inside([commit, step(commit, 201, 205, **changes)])


# --- p26_one_trace_per_checkpoint -----------------------------------------------------------------------------


def test_one_checkpoints_operations_in_one_trace_pass_and_its_restore_may_begin_another() -> None:
    restore = operation("restore", at=900, trace_id="d" * 32)
    p26_one_trace_per_checkpoint(CHECKPOINT, [*one_checkpoint(), restore])


def test_a_commit_in_another_trace_fails() -> None:
    spans = [*one_checkpoint(), operation("commit", AGENT, at=201, trace_id="e" * 32)]
    with pytest.raises(P26Violation, match="2 traces"):
        p26_one_trace_per_checkpoint(CHECKPOINT, spans)


def test_a_resume_in_a_restores_trace_passes_and_in_any_other_fails() -> None:
    restore = operation("restore", at=900, trace_id="d" * 32)
    after_restore = operation("resume", at=950, trace_id="d" * 32)
    p26_one_trace_per_checkpoint(CHECKPOINT, [*one_checkpoint(), restore, after_restore])
    astray = operation("resume", AGENT, at=301, trace_id="e" * 32)
    with pytest.raises(P26Violation, match=r"each resume of .* in its trace"):
        p26_one_trace_per_checkpoint(CHECKPOINT, [*one_checkpoint(), restore, astray])


# --- p26_shares_committed -------------------------------------------------------------------------------------


def test_each_share_written_by_a_commit_that_said_ok_after_a_prepare_that_did_passes() -> None:
    refused_first = operation("commit", AGENT, outcome="lease_expired", at=150)
    p26_shares_committed(CHECKPOINT, {ENV, AGENT}, [refused_first, *one_checkpoint()])


def test_a_share_without_an_ok_commit_fails() -> None:
    spans = [span for span in one_checkpoint() if span.participant != AGENT or span.operation != "commit"]
    with pytest.raises(P26Violation, match=r"the share agent/agent of .* written by a commit"):
        p26_shares_committed(CHECKPOINT, {ENV, AGENT}, spans)


def test_a_commit_before_any_prepare_fails() -> None:
    spans = [span for span in one_checkpoint() if span.participant != ENV or span.operation != "prepare"]
    spans.append(operation("prepare", ENV, at=250))  # after its commit
    with pytest.raises(P26Violation, match=r"a prepare of .* on environment/environment that says ok, begun before"):
        p26_shares_committed(CHECKPOINT, {ENV, AGENT}, spans)


def test_an_ok_commit_that_left_no_directory_fails() -> None:
    with pytest.raises(P26Violation, match="no gym/<kind>/<instance> for agent/agent"):
        p26_shares_committed(CHECKPOINT, {ENV}, one_checkpoint())


# --- the OTLP/JSON reader -------------------------------------------------------------------------------------


def otlp_line(spans: list[Span]) -> dict[str, Any]:
    """The spans as one OTLP/JSON `ExportTraceServiceRequest` (a Collector's file exporter line), each span's
    participant kind on its resource, as an SDK's resource attributes would carry it."""

    def value(item: Any) -> dict[str, Any]:
        return {"intValue": str(item)} if isinstance(item, int) else {"stringValue": item}

    def attributes(pairs: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": key, "value": value(item)} for key, item in pairs.items()]

    return {
        "resourceSpans": [
            {
                "resource": {"attributes": attributes({"gym.participant.kind": span.participant[0]})},
                "scopeSpans": [
                    {
                        "scope": {"name": "gym"},
                        "spans": [
                            {
                                "traceId": span.trace_id.upper(),
                                "spanId": span.span_id,
                                "parentSpanId": span.parent_span_id or "",
                                "name": span.name,
                                "kind": 2,
                                "startTimeUnixNano": str(span.start_ns),
                                "endTimeUnixNano": str(span.end_ns),
                                "attributes": attributes(
                                    {k: v for k, v in span.attributes.items() if k != "gym.participant.kind"}
                                ),
                                "status": {"code": 2} if span.status == "ERROR" else {},
                            }
                        ],
                    }
                ],
            }
            for span in spans
        ]
    }


def test_otlp_json_reads_as_the_same_spans() -> None:
    spans = [*one_checkpoint(), operation("commit", outcome="invalid_phase", at=400)]
    read = spans_from_otlp("traces.json", otlp_line(spans))
    assert [attrs_of(span) for span in read] == [attrs_of(span) for span in spans]


def attrs_of(span: Span) -> tuple[Any, ...]:
    return (
        span.name,
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        dict(span.attributes),
        span.start_ns,
        span.end_ns,
        span.status,
    )


def test_the_reader_reads_one_otlp_file_and_counts_its_metrics_lines_unjudged(tmp_path: Path) -> None:
    path = tmp_path / "traces.json"
    lines = [otlp_line(one_checkpoint()), {"resourceMetrics": []}]
    path.write_text("".join(json.dumps(each) + "\n" for each in lines))
    reader = TelemetryReader(path)
    reader.read_new()
    assert len(reader.spans) == 6
    assert (reader.metrics_judged, reader.metrics_not_judged) == (0, 1)


# --- audit_telemetry --------------------------------------------------------------------------------------------


def collected() -> tuple[list[PropertyViolation], Any]:
    """A list of violations and the callback that records each into it."""
    found: list[PropertyViolation] = []
    return found, found.append


def test_audit_telemetry_covers_the_checkpoints_its_spans_name(tmp_path: Path) -> None:
    (tmp_path / "gym.json").write_text(json.dumps(otlp_line(one_checkpoint())) + "\n")
    found, record = collected()
    read = audit_telemetry(tmp_path, {CHECKPOINT: {ENV, AGENT}, "ckpt-other": {ENV}}, record)
    assert found == []
    assert read.covered == (CHECKPOINT,)
    assert read.not_covered == ("ckpt-other",)
    assert (read.spans, read.operation_spans) == (6, 6)


def test_audit_telemetry_reads_on_after_a_bad_line_and_reports_each_finding(tmp_path: Path) -> None:
    good = otlp_line(one_checkpoint())
    (tmp_path / "gym.jsonl").write_text("not json\n" + json.dumps(good) + "\n")
    found, record = collected()
    audit_telemetry(tmp_path, {CHECKPOINT: {ENV}}, record)
    assert [v.property_id for v in found] == ["P26", "P26"]
    assert "not JSON" in str(found[0].observed)
    assert "no gym/<kind>/<instance> for agent/agent" in str(found[1].observed)


def test_telemetry_naming_no_audited_checkpoint_is_a_finding(tmp_path: Path) -> None:
    (tmp_path / "gym.jsonl").write_text(json.dumps(otlp_line(one_checkpoint())) + "\n")
    found, record = collected()
    audit_telemetry(tmp_path, {"ckpt-other": {ENV}}, record)
    assert len(found) == 1
    assert "naming at least one audited checkpoint" in found[0].expected


def test_a_path_with_nothing_to_read_is_refused(tmp_path: Path) -> None:
    _, record = collected()
    with pytest.raises(NoTelemetry, match="no such file"):
        audit_telemetry(tmp_path / "none", {}, record)
    with pytest.raises(NoTelemetry, match=r"no \*.jsonl or \*.json file"):
        audit_telemetry(tmp_path, {}, record)
