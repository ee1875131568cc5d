"""The checker's reader of a deployment's telemetry files, and P26 on them after every step.

A deployment that exports telemetry (`ckpt_model.deployment.ExportsTelemetry`: the look-alike stack) writes JSON
lines per server process into one directory (docs/protocol.md): spans, and a metrics line after each operation.
A participant writes an operation's span and its metrics before it replies, so once the controller holds a reply
the span is on disk: the watch takes the controller's calls first, then reads what the files gained since the last
read (only whole lines; a line still being written is read next time), judges each new metrics line against the
spans before it in its file, and every call against the spans (P26). Reading is incremental: each file from where
the last read stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

from ckpt_model import properties as props
from ckpt_model import timing
from ckpt_model.telemetry import MetricsSnapshot, Span, SpanCounts

TELEMETRY_SUFFIX = ".jsonl"


@attrs.define
class _FileState:
    offset: int = 0
    counts: SpanCounts = attrs.field(factory=SpanCounts)


class TelemetryReader:
    """Reads the telemetry directory incrementally; every span read so far, and each file's counts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.spans: list[Span] = []
        self._files: dict[str, _FileState] = {}

    def read_new(self) -> None:
        """Read every file's new whole lines, judging each metrics line against its file's spans before it."""
        try:
            entries = sorted(os.scandir(self.directory), key=lambda entry: entry.name)
        except FileNotFoundError:
            return  # nothing exported yet
        for entry in entries:
            if entry.name.endswith(TELEMETRY_SUFFIX):
                self._read_file(entry.name, entry.stat().st_size)

    def _read_file(self, name: str, size: int) -> None:
        state = self._files.setdefault(name, _FileState())
        if size <= state.offset:
            return
        with open(self.directory / name, "rb") as file:
            file.seek(state.offset)
            data = file.read(size - state.offset)
        whole = data[: data.rfind(b"\n") + 1]
        state.offset += len(whole)
        for line in whole.splitlines():
            self._take(name, state, _record(name, line))

    def _take(self, name: str, state: _FileState, record: dict[str, Any]) -> None:
        kind = record.get("type")
        try:
            if kind == "span":
                span = Span.from_record(name, record)
            elif kind == "metrics":
                snapshot = MetricsSnapshot.from_record(name, record)
        except (KeyError, TypeError, ValueError) as exc:
            props.p26_unreadable(name, f"a {kind} line lacks or mistypes {exc}", record)
        if kind == "span":
            self.spans.append(span)
            state.counts = state.counts.adding(span)
        elif kind == "metrics":
            props.p26_metrics_agree(state.counts, snapshot)
        else:
            props.p26_unreadable(name, f"unknown line type {kind!r}", record)


def _record(name: str, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError as exc:
        props.p26_unreadable(name, f"not JSON ({exc})", line[:200])
    if not isinstance(record, dict):
        props.p26_unreadable(name, "a line that is not a JSON object", record)
    return record


class TelemetryWatch:
    """P26 after every step of an example on a deployment that exports telemetry; nothing on one that does not."""

    def __init__(self, harness: Any) -> None:
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
            props.p26_one_span_per_call(calls, self.reader.spans)
