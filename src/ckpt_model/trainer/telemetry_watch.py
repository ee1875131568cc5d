"""The checker's reader of a deployment's telemetry files, and P26 on them after every step.

A deployment that exports telemetry (`ckpt_model.deployments.observe.ExportsTelemetry`: the look-alike stack) writes
JSON lines per server process into one directory (docs/protocol.md): spans, and a metrics line after each operation.
A participant writes an operation's span and its metrics before it replies, so once the controller holds a reply
the span is on disk: the watch takes the controller's calls first, then reads what the files gained since the last
read (only whole lines; a line still being written is read next time), judges each new metrics line against the
spans before it in its file, and every call against the spans (P26). Reading is incremental: each file from where
the last read stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ckpt_model import timing
from ckpt_model.deployments.observe import Observes
from ckpt_model.errors import PropertyViolation
from ckpt_model.properties.telemetry import p26_metrics_agree, p26_one_span_per_call, p26_unreadable
from ckpt_model.protocol.telemetry import OTLP_METRICS, OTLP_SPANS, MetricsSnapshot, Span, SpanCounts, spans_from_otlp

TELEMETRY_SUFFIXES = (".jsonl", ".json")
# What to do with a violation the files show: the live watch lets it rise, the offline audit records it.
OnViolation = Callable[[PropertyViolation], None]


def raise_violation(violation: PropertyViolation) -> None:
    raise violation


@attrs.define
class _FileState:
    offset: int = 0
    counts: SpanCounts = attrs.field(factory=SpanCounts)


class TelemetryReader:
    """Reads a telemetry directory (every `*.jsonl` and `*.json` file in it) or one file incrementally: every span
    read so far, and each file's counts. Lines are the look-alike's (`{"type": "span"|"metrics", ...}`) or
    OTLP/JSON's (`{"resourceSpans": ...}`, what a Collector's file exporter writes); OTLP metrics lines are counted,
    not judged (they are exported on the SDK's schedule, not after each operation, so no line says which spans it
    has counted). `on_violation` gets each violation: by default it rises; the audit records it and reads on,
    past a line that does not read."""

    def __init__(self, path: Path, on_violation: OnViolation = raise_violation) -> None:
        self.path = path
        self.on_violation = on_violation
        self.spans: list[Span] = []
        self.metrics_judged = 0
        self.metrics_not_judged = 0
        self._files: dict[str, _FileState] = {}

    @property
    def files(self) -> list[str]:
        return sorted(self._files)

    def read_new(self) -> None:
        """Read every file's new whole lines, judging each metrics line against its file's spans before it."""
        if self.path.is_file():
            self._read_file(self.path, self.path.stat().st_size)
            return
        try:
            entries = sorted(os.scandir(self.path), key=lambda entry: entry.name)
        except FileNotFoundError:
            return  # nothing exported yet
        for entry in entries:
            if entry.name.endswith(TELEMETRY_SUFFIXES):
                self._read_file(Path(entry.path), entry.stat().st_size)

    def _read_file(self, path: Path, size: int) -> None:
        state = self._files.setdefault(path.name, _FileState())
        if size <= state.offset:
            return
        with open(path, "rb") as file:
            file.seek(state.offset)
            data = file.read(size - state.offset)
        whole = data[: data.rfind(b"\n") + 1]
        state.offset += len(whole)
        for line in whole.splitlines():
            if line.strip():
                self._take(path.name, state, line)

    def _take(self, name: str, state: _FileState, line: bytes) -> None:
        try:
            read = _read_line(name, line)
            if isinstance(read, MetricsSnapshot):
                self.metrics_judged += 1
                p26_metrics_agree(state.counts, read)
        except PropertyViolation as violation:
            self.on_violation(violation)
            return
        if read is None:
            self.metrics_not_judged += 1
        elif not isinstance(read, MetricsSnapshot):
            self.spans.extend(read)
            for span in read:
                state.counts = state.counts.adding(span)


def _read_line(name: str, line: bytes) -> list[Span] | MetricsSnapshot | None:
    """A line's spans, or its metrics snapshot, or None for OTLP metrics (not judged); P26 if it does not read."""
    record = _record(name, line)
    kind = record.get("type")
    try:
        if kind == "span":
            return [Span.from_record(name, record)]
        if OTLP_SPANS in record:
            return spans_from_otlp(name, record)
        if kind == "metrics":
            return MetricsSnapshot.from_record(name, record)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        p26_unreadable(name, f"a line lacks or mistypes {exc}", line[:200])
    if OTLP_METRICS in record:
        return None
    p26_unreadable(name, f"unknown line type {kind!r}", record)


def _record(name: str, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError as exc:
        p26_unreadable(name, f"not JSON ({exc})", line[:200])
    if not isinstance(record, dict):
        p26_unreadable(name, "a line that is not a JSON object", record)
    return record


class TelemetryWatch:
    """P26 after every step of an example on a deployment that exports telemetry; nothing on one that does not."""

    def __init__(self, harness: Observes) -> None:
        self.harness = harness
        directory = harness.telemetry_dir
        self.reader = TelemetryReader(directory) if directory is not None else None

    def check(self) -> None:
        control = self.harness.control
        if self.reader is None or control is None:
            return
        with timing.span("p26_telemetry"):
            calls = control.control_calls()  # first: a call answered by now has its span on disk
            self.reader.read_new()
            p26_one_span_per_call(calls, self.reader.spans)
