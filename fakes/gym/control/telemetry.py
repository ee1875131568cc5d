"""Spans and metrics of the checkpoint control plane, as Gym's #3903 records them, with OpenTelemetry's Python SDK.

Every control operation a server runs (prepare, renew, commit, restore, resume, retire, forget) is one span
`gym.checkpoint.<op>` with the checkpoint ID, the participant's kind and instance, and an outcome (`ok`, or the
error code its reply carries: `invalid_phase`, `stale_checkpoint`, ...), and timed child spans for its steps
(`close_admission`, `wait_ready`, `export`, `write`, `read`, `install`, ...). The span joins the trace the
caller's W3C `traceparent` header names, so one checkpoint is one trace across every process. Durations and
outcomes are metrics (`gym.checkpoint.operation.duration`, `gym.checkpoint.operations` by op and outcome), and so
is every lease lapse (`gym.checkpoint.lease_expired`, reference 2.7), which is a span too, in its checkpoint's
trace.

Where it goes: with `ServerConfig.telemetry_dir` set, each process that runs a control plane (a single-process
server, or a multi-worker server's coordinator: its workers forward every control call to it and run none
themselves) appends JSON lines to `<telemetry_dir>/<server>-<pid>.jsonl`, through the SDK's `SpanExporter`
interface behind a `SimpleSpanProcessor`, which exports each span as it ends: the line is on disk before the
reply is sent, so a reader that has the reply finds the span. After each operation the process also writes one
metrics line, what the SDK's `InMemoryMetricReader` collects then (cumulative since the process started). A
batching processor or a periodic reader would write later, on their own schedule, and a reader could not know
when it has seen everything. The format is in docs/protocol.md. Without a directory nothing is set up and every
call here is a no-op.

The SDK is set up when the control plane is built, which for a look-alike server is in the fork server, before it
forks the server; the file is opened by the process that writes its first line (its pid names it). Each operation
costs about 0.4 ms more with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACED_OPERATIONS: frozenset[str] = frozenset({"prepare", "renew", "commit", "restore", "resume", "retire", "forget"})
SPAN_PREFIX = "gym.checkpoint."
LAPSE_SPAN = SPAN_PREFIX + "lease_expired"
OPERATIONS_METRIC = "gym.checkpoint.operations"
DURATION_METRIC = "gym.checkpoint.operation.duration"
LEASE_EXPIRED_METRIC = "gym.checkpoint.lease_expired"
OUTCOME_OK = "ok"
# The instrumentation scope every span and metric names: a name in the telemetry files, not a module path.
INSTRUMENTATION = "fakes.gym.control_plane"
_PROPAGATOR = TraceContextTextMapPropagator()
# The SDK's resource detection loads its entry points on the first `Resource.create`: about 10 ms, paid here once,
# at import, in the fork server, instead of in every server process on its first operation after each restart.
_DETECTED = Resource.create()


class JsonLinesSink:
    """Appends one JSON object per line to `<directory>/<server>-<pid>.jsonl`, the pid of the process that writes
    (opened at its first line, so a sink made before a fork writes to the child's own file); each line is one
    `write` of an `O_APPEND` descriptor, so a line is whole on disk when the call returns."""

    def __init__(self, directory: Path, server: str) -> None:
        self.directory = directory
        self.server = server
        self._fd: int | None = None
        self._pid = 0

    def write(self, record: dict[str, Any]) -> None:
        if self._fd is None or self._pid != os.getpid():
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{self.server}-{os.getpid()}.jsonl"
            self._fd, self._pid = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), os.getpid()
        os.write(self._fd, (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode())

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None


class JsonLinesSpanExporter(SpanExporter):
    """The SDK's exporter interface, writing each ended span as one `{"type": "span", ...}` line."""

    def __init__(self, sink: JsonLinesSink) -> None:
        self.sink = sink

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.sink.write(span_record(span))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.sink.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A span as the telemetry file holds it: IDs in lower-case hex, as in a `traceparent` header."""
    context = span.get_span_context()
    assert context is not None, "an ended span has a context"
    parent = span.parent
    return {
        "type": "span",
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "parent_remote": bool(parent is not None and parent.is_remote),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
    }


def metrics_record(reader: InMemoryMetricReader) -> dict[str, Any]:
    """What the reader collects now, flattened: per op and outcome the operations counted, per op the durations'
    count and sum, and the lease lapses."""
    operations: list[dict[str, Any]] = []
    durations: list[dict[str, Any]] = []
    lease_expired = 0
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if metric.name == OPERATIONS_METRIC:
                        operations.append({**attributes, "count": point.value})  # type: ignore[union-attr]
                    elif metric.name == DURATION_METRIC:
                        durations.append({**attributes, "count": point.count, "sum_s": point.sum})  # type: ignore[union-attr]
                    elif metric.name == LEASE_EXPIRED_METRIC:
                        lease_expired += int(point.value)  # type: ignore[union-attr]
    key = lambda item: sorted(item.items())  # noqa: E731 - a sort key, read once here
    return {
        "type": "metrics",
        "operations": sorted(operations, key=key),
        "durations": sorted(durations, key=key),
        "lease_expired": lease_expired,
    }


class _Recorder:
    """The SDK set up in one process: a tracer whose spans go to the file as they end, and the instruments."""

    def __init__(self, sink: JsonLinesSink, server: str, kind: str) -> None:
        self.sink = sink
        resource = _DETECTED.merge(Resource({"service.name": server, "gym.participant.kind": kind}))
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(self.sink)))
        self.tracer = self.tracer_provider.get_tracer(INSTRUMENTATION)
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self.reader])
        meter = self.meter_provider.get_meter(INSTRUMENTATION)
        self.operations = meter.create_counter(OPERATIONS_METRIC, description="control operations by op and outcome")
        self.durations = meter.create_histogram(DURATION_METRIC, unit="s", description="control operation time")
        self.lease_expired = meter.create_counter(LEASE_EXPIRED_METRIC, description="leases that lapsed")

    def snapshot(self) -> None:
        self.sink.write(metrics_record(self.reader))


class Telemetry:
    """One control plane's spans and metrics; a no-op without a directory.

    Planted faults (fakes/faults.py): `span_outcome_always_ok` (every span and count says ok), `trace_context_dropped`
    (the agent starts a trace of its own instead of joining the caller's), `lease_expired_not_counted` (a lapse
    makes its span but no count)."""

    def __init__(self, directory: str, server: str, kind: str, faults: frozenset[str] = frozenset()) -> None:
        self.directory = Path(directory) if directory else None
        self.server = server
        self.kind = kind
        # Built now, where the server's app is built (before the fork server forks it: about 3 ms a process spends
        # otherwise on its first operation after every start); the file is opened by the process that writes.
        self._recorder = _Recorder(JsonLinesSink(self.directory, server), server, kind) if self.directory else None
        self._outcome_always_ok = "span_outcome_always_ok" in faults
        self._drops_context = kind == "agent" and "trace_context_dropped" in faults
        self._counts_lapses = "lease_expired_not_counted" not in faults
        # Per checkpoint ID, the trace context of its latest operation here: a lapse joins that trace.
        self._traces: dict[str, Context] = {}

    @property
    def on(self) -> bool:
        return self.directory is not None

    def _recording(self) -> _Recorder:
        if self._recorder is None:
            assert self.directory is not None
            self._recorder = _Recorder(JsonLinesSink(self.directory, self.server), self.server, self.kind)
        return self._recorder

    @contextlib.contextmanager
    def operation(self, op: str, checkpoint_id: str, traceparent: str | None, instance: str) -> Iterator[None]:
        """One control operation's span; its outcome is `ok`, or the code of the error it raises."""
        if self.directory is None or op not in TRACED_OPERATIONS:
            yield
            return
        recorder = self._recording()
        carrier = {"traceparent": traceparent} if traceparent and not self._drops_context else {}
        parent = _PROPAGATOR.extract(carrier)
        attributes = {
            "gym.checkpoint.id": checkpoint_id,
            "gym.checkpoint.operation": op,
            "gym.participant.kind": self.kind,
            "gym.participant.instance": instance,
        }
        started_s = time.monotonic()
        outcome = OUTCOME_OK
        try:
            with recorder.tracer.start_as_current_span(
                SPAN_PREFIX + op,
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                self._traces[checkpoint_id] = trace.set_span_in_context(span)
                try:
                    yield
                except BaseException as exc:
                    outcome = outcome_of(exc)
                    raise
                finally:
                    if self._outcome_always_ok:
                        outcome = OUTCOME_OK
                    span.set_attribute("gym.checkpoint.outcome", outcome)
                    if outcome != OUTCOME_OK:
                        span.set_status(Status(StatusCode.ERROR, outcome))
        finally:
            # The span is on disk (SimpleSpanProcessor); count it, then write the counts, before the reply goes out.
            recorder.operations.add(1, {"op": op, "outcome": outcome})
            recorder.durations.record(time.monotonic() - started_s, {"op": op})
            recorder.snapshot()

    def step(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A timed child span of the operation running in this task (a no-op when off)."""
        if self.directory is None:
            return contextlib.nullcontext()
        return self._recording().tracer.start_as_current_span(name, record_exception=False)

    def lease_expired(self, checkpoint_id: str) -> None:
        """A lapse: a span in the checkpoint's trace (when an operation here named it) and the count."""
        if self.directory is None:
            return
        recorder = self._recording()
        attributes = {
            "gym.checkpoint.id": checkpoint_id,
            "gym.participant.kind": self.kind,
            "gym.participant.instance": self.server,
        }
        context = self._traces.get(checkpoint_id)
        with recorder.tracer.start_as_current_span(LAPSE_SPAN, context=context, attributes=attributes):
            pass
        if self._counts_lapses:
            recorder.lease_expired.add(1)
        recorder.snapshot()

    def shutdown(self) -> None:
        if self._recorder is not None:
            self._recorder.tracer_provider.shutdown()
            self._recorder.meter_provider.shutdown()
            self._recorder = None


def outcome_of(exc: BaseException) -> str:
    """The outcome a reply shows for an operation that raised: the error envelope's code (a lost reply's operation
    ran in full: `ok`); `checkpoint_error`, the code of the 500 an unexpected exception becomes; `cancelled` for a
    call whose connection went away."""
    code = getattr(exc, "code", None)
    if code == "reply_lost":
        return OUTCOME_OK
    if isinstance(code, str):
        return code
    if isinstance(exc, Exception):
        return "checkpoint_error"
    return "cancelled"


class _Discard(JsonLinesSink):
    """A sink that keeps nothing (the warm-up's)."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"), "warm-up")

    def write(self, record: dict[str, Any]) -> None:
        pass


def warm_up() -> None:
    """One operation, a step, a refusal and a lapse recorded to nowhere: the SDK's lazy work (its first context,
    metric storage and collection) is done in the process that imports this (the fork server), not in each server."""
    telemetry = Telemetry("", "warm-up", "environment")
    telemetry.directory = Path("/nonexistent")  # never opened: the recorder writes nowhere
    telemetry._recorder = _Recorder(_Discard(), "warm-up", "environment")
    parent = f"00-{'1' * 32}-{'1' * 16}-01"
    with telemetry.operation("prepare", "warm-up", parent, "warm-up"), telemetry.step("wait_ready"):
        pass
    with contextlib.suppress(RuntimeError), telemetry.operation("resume", "warm-up", parent, "warm-up"):
        raise RuntimeError("warm-up")
    telemetry.lease_expired("warm-up")
    telemetry.shutdown()


warm_up()
