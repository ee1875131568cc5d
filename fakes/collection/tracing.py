"""The collector's spans, as Gym's controller makes them (#3903, reference section 4: "spans
`gym.checkpoint.coordinate.<op>` with per-stage children `gym.checkpoint.coordinate.prepare.<kind>`").

One checkpoint is one trace: writing a checkpoint (prepare, commit, resume) runs under one root span
`gym.checkpoint.collection.checkpoint`, a restore after a restart (restore, retire, resume) under
`gym.checkpoint.collection.restore`; each coordination operation is a child span, and every control call carries
the W3C `traceparent` of the span it was sent under, so each participant's span joins the trace. The context is
injected in the calling thread: the control pool's threads do not inherit it.

Spans exist whether or not they are written (the context must travel either way). With a telemetry directory they
are also written, one JSON line each as it ends, to `<directory>/collection-<pid>.jsonl`, the format the servers
write (docs/protocol.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fakes.gym.control.telemetry import JsonLinesSink, JsonLinesSpanExporter

ROOT_PREFIX = "gym.checkpoint.collection."
COORDINATE_PREFIX = "gym.checkpoint.coordinate."
TELEMETRY_NAME = "collection"
_PROPAGATOR = TraceContextTextMapPropagator()


class ControllerTracing:
    """A tracer whose spans go to `directory` (when given) as they end."""

    def __init__(self, directory: Path | None = None) -> None:
        self.provider = TracerProvider(resource=Resource({"service.name": TELEMETRY_NAME}))
        if directory is not None:
            exporter = JsonLinesSpanExporter(JsonLinesSink(directory, TELEMETRY_NAME))
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("fakes.collection")

    @contextlib.contextmanager
    def trace(self, what: str, checkpoint_id: str) -> Iterator[None]:
        """A new trace for one checkpoint's (or one restore's) coordination."""
        with self.tracer.start_as_current_span(
            ROOT_PREFIX + what, context=Context(), attributes={"gym.checkpoint.id": checkpoint_id}
        ):
            yield

    def coordinate(self, operation: str, checkpoint_id: str) -> contextlib.AbstractContextManager[object]:
        """A span for one coordination operation or stage (`prepare`, `prepare.environment`, ...), in the current
        trace, or a trace of its own where none is current (a retire outside a checkpoint)."""
        return self.tracer.start_as_current_span(
            COORDINATE_PREFIX + operation, kind=SpanKind.CLIENT, attributes={"gym.checkpoint.id": checkpoint_id}
        )

    def headers(self) -> dict[str, str]:
        """The `traceparent` of the current span, for the calls about to be sent."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier

    def close(self) -> None:
        self.provider.shutdown()
