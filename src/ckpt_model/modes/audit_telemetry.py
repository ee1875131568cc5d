"""`ckpt-model audit --telemetry PATH`: what the spans and metrics of a run say about the checkpoints it left.

The live P26 holds every span to the control call the checker made; after a real preemption nobody kept the calls,
only the telemetry files and the directories. So the audit holds them to each other (P26, offline):

- every line reads (the look-alike's JSON lines or OTLP/JSON, `ckpt_model.trainer.telemetry_watch.TelemetryReader`), and
  each metrics line of the look-alike's counts exactly the spans before it in its file;
- every operation's span names its checkpoint, participant and outcome, with a status that agrees
  (`p26_span_consistent`), and every step lies inside its operation, in its trace (`p26_steps_inside`);
- for every audited checkpoint the spans name: its prepare, renew, commit and resume spans are one trace
  (`p26_one_trace_per_checkpoint`), each participant directory it holds was written by a commit whose span says
  ok after a prepare that said ok, and no commit said ok without leaving its directory (`p26_shares_committed`).

A checkpoint no span names is reported as not covered, not as a finding (telemetry may start late or be rotated);
telemetry that names none of the audited checkpoints is a finding, since then nothing was compared.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import attrs

from ckpt_model.errors import PropertyViolation
from ckpt_model.properties.telemetry import (
    P26Violation,
    p26_one_trace_per_checkpoint,
    p26_shares_committed,
    p26_span_consistent,
    p26_steps_inside,
)
from ckpt_model.trainer.telemetry_watch import OnViolation, TelemetryReader


class NoTelemetry(Exception):
    """The telemetry path names nothing to read."""


@attrs.frozen
class TelemetryRead:
    """What `--telemetry` read and which audited checkpoints it covered."""

    path: Path
    files: tuple[str, ...]
    spans: int
    operation_spans: int
    named: tuple[str, ...]  # the checkpoint IDs operation spans name, sorted
    covered: tuple[str, ...]  # those the audit holds
    not_covered: tuple[str, ...]  # audited checkpoints no span names
    metrics_judged: int
    metrics_not_judged: int

    def document(self) -> dict[str, object]:
        return attrs.asdict(
            self, value_serializer=lambda _, __, value: str(value) if isinstance(value, Path) else value
        )

    def report_line(self) -> str:
        not_judged = f", {self.metrics_not_judged} OTLP metrics line(s) not judged" if self.metrics_not_judged else ""
        uncovered = f"; no span names {', '.join(self.not_covered)}" if self.not_covered else ""
        return (
            f"telemetry {self.path}: {len(self.files)} file(s), {self.spans} span(s) ({self.operation_spans} of "
            f"operations) naming {len(self.named)} checkpoint(s), {len(self.covered)} of them audited here; "
            f"{self.metrics_judged} metrics line(s) judged{not_judged}{uncovered}"
        )


def audit_telemetry(
    path: Path, shares_by_checkpoint: Mapping[str, Collection[tuple[str, str]]], on_violation: OnViolation
) -> TelemetryRead:
    """Read `path` (a file, or a directory of `*.jsonl`/`*.json`) and judge P26 against the audited checkpoints'
    participant directories (`(kind, instance)` by checkpoint ID), handing each violation to `on_violation`;
    raises `NoTelemetry` if there is nothing."""
    if not path.exists():
        raise NoTelemetry(f"--telemetry {path}: no such file or directory")

    def judged(check: Callable[..., object], *arguments: object) -> bool:
        try:
            check(*arguments)
        except PropertyViolation as violation:
            on_violation(violation)
            return False
        return True

    reader = TelemetryReader(path, on_violation)
    reader.read_new()
    if not reader.files:
        raise NoTelemetry(f"--telemetry {path}: no *.jsonl or *.json file in it")
    spans = reader.spans
    operations = [span for span in spans if span.operation is not None]
    failed_sources: set[str] = set()
    for span in operations:  # one finding a file: a writer that gets one wrong gets them all wrong
        if span.source not in failed_sources and not judged(p26_span_consistent, span):
            failed_sources.add(span.source)
    judged(p26_steps_inside, spans)
    named = sorted({span.checkpoint_id for span in operations if isinstance(span.checkpoint_id, str)})
    covered = [checkpoint_id for checkpoint_id in named if checkpoint_id in shares_by_checkpoint]
    for checkpoint_id in covered:
        judged(p26_one_trace_per_checkpoint, checkpoint_id, operations)
        judged(p26_shares_committed, checkpoint_id, shares_by_checkpoint[checkpoint_id], operations)
    if shares_by_checkpoint and not covered:
        judged(_nothing_compared, path, sorted(shares_by_checkpoint), named)
    return TelemetryRead(
        path=path,
        files=tuple(reader.files),
        spans=len(spans),
        operation_spans=len(operations),
        named=tuple(named),
        covered=tuple(covered),
        not_covered=tuple(sorted(set(shares_by_checkpoint) - set(covered))),
        metrics_judged=reader.metrics_judged,
        metrics_not_judged=reader.metrics_not_judged,
    )


def _nothing_compared(path: Path, audited: list[str], named: list[str]) -> None:
    raise P26Violation(
        rollout=None,
        expected=f"spans in {path} naming at least one audited checkpoint ({', '.join(audited)})",
        observed=f"spans naming {', '.join(named[:5]) or 'no checkpoint'}",
    )
