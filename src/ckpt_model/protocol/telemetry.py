"""Telemetry as values: the trace context the controller sends, the calls it made, and the spans and metrics a
deployment exported (P26). Pure: no I/O (the files are read by `ckpt_model.trainer.telemetry_watch`).

The controller's side (Gym's #3903, W3C Trace Context): every control call carries a `traceparent` header,
`00-<trace ID>-<parent span ID>-01`. The trace ID is a function of the checkpoint ID the call names (the first 16
bytes of SHA-256 over `TRACE_SALT/<checkpoint ID>`), so prepare, commit and resume of one checkpoint share one
trace, each retire, forget and restore (each names its own ID) has its own, and a replay of the same steps sends
the very same trace IDs: a failure report's trace ID is found again in the replay's files. The parent span ID
names the one call (the first 8 bytes of SHA-256 over the trace ID, the participant, the operation and how many
times this client sent that operation of that checkpoint to that participant since the example began), so the
participant's span for it is found by its parent, whatever else ran.

The format is written by hand (four fields, documented at https://www.w3.org/TR/trace-context/): the checker
makes no spans of its own, so it needs no context machinery, and `src/` stays free of an OpenTelemetry
dependency. The look-alike reads it with OpenTelemetry's own propagator, which is what keeps the two honest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import attrs

TRACE_SALT = "ckpt-model"
TRACEPARENT_HEADER = "traceparent"
SPAN_PREFIX = "gym.checkpoint."
LAPSE_SPAN = SPAN_PREFIX + "lease_expired"
TRACED_OPERATIONS: frozenset[str] = frozenset({"prepare", "renew", "commit", "restore", "resume", "retire", "forget"})
OUTCOME_OK = "ok"
# Refusals a participant gives before its control plane runs the operation, so no span is made: a bad bearer, and
# a multi-worker server's worker that cannot reach its coordinator, or whose episode's worker is gone.
NOT_RUN_CODES: frozenset[str] = frozenset({"unauthorized", "checkpoint_coordinator_unavailable", "worker_lost"})


def trace_id_of(checkpoint_id: str, salt: str = TRACE_SALT) -> str:
    """The trace every call naming `checkpoint_id` carries: 32 lower-case hex digits, never all zero."""
    return _nonzero(hashlib.sha256(f"{salt}/{checkpoint_id}".encode()).hexdigest()[:32])


def call_span_id(trace_id: str, participant: str, operation: str, number: int) -> str:
    """The parent span ID of the `number`th call of `operation` in trace `trace_id` to `participant`: 16 hex."""
    return _nonzero(hashlib.sha256(f"{trace_id}/{participant}/{operation}/{number}".encode()).hexdigest()[:16])


def traceparent(trace_id: str, span_id: str) -> str:
    """A W3C `traceparent` value: version 00, sampled."""
    return f"00-{trace_id}-{span_id}-01"


def _nonzero(digits: str) -> str:
    # All zeros is an invalid ID in W3C Trace Context; one chance in 2^64 or more.
    return digits if digits.strip("0") else digits[:-1] + "1"


@attrs.frozen
class ControlCall:
    """One control call the controller sent to one participant, and what its reply showed: `outcome` is `ok`, the
    error envelope's code, `http_<status>` for a reply without one (FastAPI's 422), or None while no reply came (a
    transport failure, a call still in flight)."""

    participant: str
    operation: str
    checkpoint_id: str
    trace_id: str
    span_id: str
    outcome: str | None = None
    answered: bool = False

    @property
    def expected_spans(self) -> tuple[int, int]:
        """How many spans the participant makes for it, at least and at most."""
        if not self.answered:
            return (0, 1)  # the call may or may not have reached it, or may still run
        if self.outcome is not None and (self.outcome in NOT_RUN_CODES or self.outcome.startswith("http_")):
            return (0, 0)
        return (1, 1)

    def describe(self) -> str:
        shown = self.outcome if self.answered else "no reply"
        return f"{self.operation} {self.checkpoint_id} to {self.participant} (call {self.span_id}: {shown})"


@attrs.frozen
class Span:
    """One span from a telemetry file (`source`: the file's name): IDs in lower-case hex; `start_ns`/`end_ns`
    and `status` (`UNSET`, `OK` or `ERROR`) where the file gives them."""

    source: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    attributes: Mapping[str, Any] = attrs.field(factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    status: str | None = None

    @classmethod
    def from_record(cls, source: str, record: Mapping[str, Any]) -> Span:
        """A `{"type": "span", ...}` line of the look-alike's files (docs/protocol.md)."""
        return cls(
            source=source,
            name=str(record["name"]),
            trace_id=str(record["trace_id"]),
            span_id=str(record["span_id"]),
            parent_span_id=record.get("parent_span_id"),
            attributes=dict(record.get("attributes") or {}),
            start_ns=_optional_int(record.get("start_ns")),
            end_ns=_optional_int(record.get("end_ns")),
            status=_optional_str(record.get("status")),
        )

    @property
    def operation(self) -> str | None:
        """The control operation this span is of, or None (a step, a lapse)."""
        suffix = self.name.removeprefix(SPAN_PREFIX)
        return suffix if self.name.startswith(SPAN_PREFIX) and suffix in TRACED_OPERATIONS else None

    @property
    def outcome(self) -> Any:
        return self.attributes.get("gym.checkpoint.outcome")

    @property
    def checkpoint_id(self) -> Any:
        return self.attributes.get("gym.checkpoint.id")

    @property
    def participant(self) -> tuple[Any, Any]:
        """(kind, instance): the participant directory `gym/<kind>/<instance>` its operation reads or writes."""
        return (self.attributes.get("gym.participant.kind"), self.attributes.get("gym.participant.instance"))

    def describe(self) -> str:
        return (
            f"{self.name} in {self.source} (trace {self.trace_id}, parent {self.parent_span_id}, "
            f"checkpoint {self.attributes.get('gym.checkpoint.id')!r}, instance "
            f"{self.attributes.get('gym.participant.instance')!r}, outcome {self.outcome!r})"
        )


@attrs.frozen
class MetricsSnapshot:
    """One metrics line: per (op, outcome) the operations counted, per op the durations recorded, the lapses."""

    source: str
    operations: Mapping[tuple[str, str], int]
    durations: Mapping[str, int]
    lease_expired: int

    @classmethod
    def from_record(cls, source: str, record: Mapping[str, Any]) -> MetricsSnapshot:
        operations = {(str(p["op"]), str(p["outcome"])): int(p["count"]) for p in record.get("operations", ())}
        durations = {str(p["op"]): int(p["count"]) for p in record.get("durations", ())}
        return cls(source, operations, durations, int(record.get("lease_expired", 0)))


@attrs.frozen
class SpanCounts:
    """What a file's spans up to some line say the metrics must count."""

    operations: Mapping[tuple[str, str], int] = attrs.field(factory=dict)
    lapses: int = 0

    def adding(self, span: Span) -> SpanCounts:
        if span.name == LAPSE_SPAN:
            return attrs.evolve(self, lapses=self.lapses + 1)
        if span.operation is None:
            return self
        key = (span.operation, str(span.outcome))
        return attrs.evolve(self, operations={**self.operations, key: self.operations.get(key, 0) + 1})

    def durations(self) -> dict[str, int]:
        by_op: dict[str, int] = {}
        for (op, _outcome), count in self.operations.items():
            by_op[op] = by_op.get(op, 0) + count
        return by_op


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


# --- OTLP/JSON --------------------------------------------------------------------------------------------------
# What an OpenTelemetry Collector's file exporter (or any OTLP/JSON writer) keeps: one `ExportTraceServiceRequest`
# a line, `{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"spans": [...]}]}]}`, IDs in hex,
# times as decimal strings of nanoseconds, attributes as `{"key": k, "value": {"stringValue": v}}`
# (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding). A real Gym's exporter writes this.

OTLP_SPANS = "resourceSpans"
OTLP_METRICS = "resourceMetrics"
_OTLP_STATUS = {
    0: "UNSET",
    1: "OK",
    2: "ERROR",
    "STATUS_CODE_UNSET": "UNSET",
    "STATUS_CODE_OK": "OK",
    "STATUS_CODE_ERROR": "ERROR",
}


def spans_from_otlp(source: str, record: Mapping[str, Any]) -> list[Span]:
    """Every span of one OTLP/JSON traces line; a span's own attributes win over its resource's (a participant's
    kind may be either). Raises KeyError, TypeError or ValueError on a line that is not one."""
    spans: list[Span] = []
    for resource_spans in record[OTLP_SPANS]:
        resource = otlp_attributes((resource_spans.get("resource") or {}).get("attributes") or [])
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for span in scope_spans.get("spans") or []:
                status = (span.get("status") or {}).get("code", 0)
                spans.append(
                    Span(
                        source=source,
                        name=str(span["name"]),
                        trace_id=str(span["traceId"]).lower(),
                        span_id=str(span["spanId"]).lower(),
                        parent_span_id=str(span["parentSpanId"]).lower() if span.get("parentSpanId") else None,
                        attributes={**resource, **otlp_attributes(span.get("attributes") or [])},
                        start_ns=_optional_int(span.get("startTimeUnixNano")),
                        end_ns=_optional_int(span.get("endTimeUnixNano")),
                        status=_OTLP_STATUS[status],
                    )
                )
    return spans


def otlp_attributes(pairs: Any) -> dict[str, Any]:
    """OTLP/JSON's `[{"key": k, "value": {"stringValue": v}}, ...]` as a plain mapping (scalar values)."""
    attributes: dict[str, Any] = {}
    for pair in pairs:
        value = pair["value"]
        if "intValue" in value:
            attributes[pair["key"]] = int(value["intValue"])  # a decimal string in OTLP/JSON
        else:
            attributes[pair["key"]] = next(iter(value.values()), None)
    return attributes
