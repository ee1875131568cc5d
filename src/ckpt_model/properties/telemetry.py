"""P26 telemetry tells the truth. Live, against the controller's calls: every control call a participant ran has
exactly one span `gym.checkpoint.<op>` in the trace the controller sent, with the outcome its reply showed, and the
metrics count what the spans show. Offline (`ckpt-model audit --telemetry`): the spans agree with each other and
with the checkpoint directories.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NoReturn

from ckpt_model.errors import PropertyViolation
from ckpt_model.protocol.telemetry import OUTCOME_OK, SPAN_PREFIX, ControlCall, MetricsSnapshot, Span, SpanCounts


class P26Violation(PropertyViolation):
    property_id = "P26"
    title = (
        "telemetry tells the truth: every control call a participant ran has exactly one span gym.checkpoint.<op>, "
        "in the trace the controller sent, with the outcome its reply showed, and the metrics count what the spans "
        "show"
    )


def p26_one_span_per_call(calls: Sequence[ControlCall], spans: Sequence[Span]) -> None:
    """Every control call has as many spans of its operation under it (the span its `traceparent` names as
    parent) as `ControlCall.expected_spans` says (one for a call the participant ran and answered, none for one it
    refused before running it, at most one for one no reply came to), each in the call's trace, on the participant
    called, naming the call's checkpoint, with the outcome the reply showed; and no span of an operation stands
    under a call the controller never made."""
    operation_spans = [span for span in spans if span.operation is not None]
    made = {call.span_id for call in calls}
    strays = [span for span in operation_spans if span.parent_span_id not in made]
    under: dict[str | None, list[Span]] = {}
    for span in operation_spans:
        under.setdefault(span.parent_span_id, []).append(span)
    for call in calls:
        found = under.get(call.span_id, [])
        low, high = call.expected_spans
        if not low <= len(found) <= high:
            raise P26Violation(
                rollout=None,
                expected=f"{_span_count(low, high)} for the call {call.describe()}",
                observed=_found_spans(call, found, strays),
            )
        for span in found:
            _p26_span_matches(call, span)
    if strays:
        raise P26Violation(
            rollout=None,
            expected="every span of a control operation under a call the controller made",
            observed="; ".join(span.describe() for span in strays[:5]),
        )


def _p26_span_matches(call: ControlCall, span: Span) -> None:
    shown: dict[str, Any] = {
        "name": span.name,
        "trace": span.trace_id,
        "instance": span.attributes.get("gym.participant.instance"),
        "checkpoint": span.attributes.get("gym.checkpoint.id"),
    }
    wanted: dict[str, Any] = {
        "name": SPAN_PREFIX + call.operation,
        "trace": call.trace_id,
        "instance": call.participant,
        "checkpoint": call.checkpoint_id,
    }
    if call.answered:
        shown["outcome"], wanted["outcome"] = span.outcome, call.outcome
    wrong = {field: shown[field] for field in wanted if shown[field] != wanted[field]}
    if wrong:
        raise P26Violation(
            rollout=None,
            expected=f"the span of {call.describe()}: " + ", ".join(f"{k} {wanted[k]!r}" for k in wrong),
            observed=f"{span.describe()}: " + ", ".join(f"{k} {v!r}" for k, v in wrong.items()),
        )


def _span_count(low: int, high: int) -> str:
    if low == high:
        return f"exactly {low} span{'s' if low != 1 else ''}"
    return f"{low} to {high} spans"


def _found_spans(call: ControlCall, found: Sequence[Span], strays: Sequence[Span]) -> str:
    """The spans under the call, or where a span of the same operation on the same participant went instead."""
    if found:
        return f"{len(found)}: " + "; ".join(span.describe() for span in found)
    elsewhere = [
        span
        for span in strays
        if span.operation == call.operation
        and span.attributes.get("gym.participant.instance") == call.participant
        and span.attributes.get("gym.checkpoint.id") == call.checkpoint_id
    ]
    if elsewhere:
        return "none under the call; outside the controller's trace: " + "; ".join(s.describe() for s in elsewhere[:3])
    return "none"


def p26_unreadable(source: str, problem: str, line: object) -> NoReturn:
    """A telemetry line the checker cannot read is telemetry that says nothing true."""
    raise P26Violation(
        rollout=None, expected=f"every line of {source} a span or a metrics record", observed=f"{problem}: {line!r}"
    )


def p26_metrics_agree(counts: SpanCounts, snapshot: MetricsSnapshot) -> None:
    """A metrics line counts exactly the spans its file holds before it: operations by op and outcome, durations
    by op, and lease lapses."""
    observed = {
        "operations": {key: n for key, n in snapshot.operations.items() if n},
        "durations": {op: n for op, n in snapshot.durations.items() if n},
        "lease_expired": snapshot.lease_expired,
    }
    expected = {
        "operations": {key: n for key, n in counts.operations.items() if n},
        "durations": counts.durations(),
        "lease_expired": counts.lapses,
    }
    wrong = [name for name in expected if expected[name] != observed[name]]
    if wrong:
        raise P26Violation(
            rollout=None,
            expected=f"metrics in {snapshot.source} counting its spans: "
            + "; ".join(f"{name} {expected[name]}" for name in wrong),
            observed="; ".join(f"{name} {observed[name]}" for name in wrong),
        )


# The operations that write one checkpoint: one trace (#3903). A resume closes either that checkpoint or a restore
# of it, which comes from the run after a preemption and begins its own trace.
CHECKPOINT_TRACE_OPERATIONS: frozenset[str] = frozenset({"prepare", "renew", "commit"})


def p26_span_consistent(span: Span) -> None:
    """An operation's span names its checkpoint, its participant's kind and instance and an outcome, each a
    string; its status is not `ERROR` when the outcome is `ok`, nor `OK` when it is not (`UNSET` says nothing); it
    ends no earlier than it begins (where the file gives both)."""
    problems = [
        f"{name} {value!r}"
        for name, value in (
            ("gym.checkpoint.id", span.checkpoint_id),
            ("gym.participant.kind", span.participant[0]),
            ("gym.participant.instance", span.participant[1]),
            ("gym.checkpoint.outcome", span.outcome),
        )
        if not isinstance(value, str) or not value
    ]
    failed = span.outcome != OUTCOME_OK
    if (span.status == "ERROR" and not failed) or (span.status == "OK" and failed):
        problems.append(f"status {span.status} with outcome {span.outcome!r}")
    if span.start_ns is not None and span.end_ns is not None and span.end_ns < span.start_ns:
        problems.append(f"ends at {span.end_ns} before it begins at {span.start_ns}")
    if problems:
        raise P26Violation(
            rollout=None,
            expected=f"{span.name} naming its checkpoint, participant and outcome, its status saying whether it "
            "failed, its end after its start",
            observed=f"{span.describe()}: " + ", ".join(problems),
        )


def p26_steps_inside(spans: Sequence[Span]) -> None:
    """A step (any span whose parent is an operation's span of the same file) is in its operation's trace and
    lies within it in time: it is part of the operation, not a neighbour's work filed under it."""
    operations = {(span.source, span.span_id): span for span in spans if span.operation is not None}
    for span in spans:
        parent = operations.get((span.source, span.parent_span_id or ""))
        if parent is None or span.operation is not None:
            continue
        inside = None in (span.start_ns, span.end_ns, parent.start_ns, parent.end_ns) or (
            parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns  # type: ignore[operator]
        )
        if span.trace_id != parent.trace_id or not inside:
            raise P26Violation(
                rollout=None,
                expected=f"the step {span.name} inside {parent.describe()}, in its trace and its time "
                f"[{parent.start_ns}, {parent.end_ns}]",
                observed=f"trace {span.trace_id}, time [{span.start_ns}, {span.end_ns}]",
            )


def p26_one_trace_per_checkpoint(checkpoint_id: str, spans: Sequence[Span]) -> None:
    """Every prepare, renew and commit span of one checkpoint, on every participant, is in one trace (the
    controller sent every call that wrote it in the trace it began, #3903), and each resume of it is in that trace
    or in the trace of a restore of it."""
    mine = [span for span in spans if span.checkpoint_id == checkpoint_id]
    traces: dict[str, list[Span]] = {}
    for span in mine:
        if span.operation in CHECKPOINT_TRACE_OPERATIONS:
            traces.setdefault(span.trace_id, []).append(span)
    if len(traces) > 1:
        raise P26Violation(
            rollout=None,
            expected=f"one trace for the prepare, renew and commit spans of {checkpoint_id}",
            observed=f"{len(traces)} traces: "
            + "; ".join(f"{trace}: {', '.join(s.describe() for s in found[:2])}" for trace, found in traces.items()),
        )
    allowed = set(traces) | {span.trace_id for span in mine if span.operation == "restore"}
    astray = [span for span in mine if span.operation == "resume" and traces and span.trace_id not in allowed]
    if astray:
        raise P26Violation(
            rollout=None,
            expected=f"each resume of {checkpoint_id} in its trace ({', '.join(sorted(traces))}) or a restore's "
            f"({', '.join(sorted(allowed - set(traces))) or 'none'})",
            observed="; ".join(span.describe() for span in astray[:3]),
        )


def p26_shares_committed(checkpoint_id: str, shares: Collection[tuple[str, str]], spans: Sequence[Span]) -> None:
    """For a checkpoint the telemetry names: each participant directory `gym/<kind>/<instance>` it holds has a
    commit span of that participant with outcome `ok`, after a prepare span of it with outcome `ok` (a share no
    reported commit wrote, or a commit no prepare opened); and each `ok` commit span names a participant whose
    directory the checkpoint holds (a participant that said it committed and wrote nothing)."""
    mine = [span for span in spans if span.checkpoint_id == checkpoint_id and span.outcome == OUTCOME_OK]
    commits = [span for span in mine if span.operation == "commit"]
    prepares = [span for span in mine if span.operation == "prepare"]
    for kind, instance in sorted(shares):
        committed = [span for span in commits if span.participant == (kind, instance)]
        if not committed:
            raise P26Violation(
                rollout=None,
                expected=f"the share {kind}/{instance} of {checkpoint_id} written by a commit whose span says ok",
                observed=_spans_of(checkpoint_id, (kind, instance), spans),
            )
        opened = [span for span in prepares if span.participant == (kind, instance) and _before(span, committed[0])]
        if not opened:
            raise P26Violation(
                rollout=None,
                expected=f"a prepare of {checkpoint_id} on {kind}/{instance} that says ok, begun before its commit",
                observed=_spans_of(checkpoint_id, (kind, instance), spans),
            )
    unwritten = sorted({span.participant for span in commits} - set(shares), key=str)
    if unwritten:
        raise P26Violation(
            rollout=None,
            expected=f"a directory in {checkpoint_id} for every participant whose commit span says ok",
            observed=f"no gym/<kind>/<instance> for {', '.join(f'{k}/{i}' for k, i in unwritten)}; "
            f"the checkpoint holds {', '.join(f'{k}/{i}' for k, i in sorted(shares)) or 'none'}",
        )


def _before(first: Span, then: Span) -> bool:
    return first.start_ns is None or then.start_ns is None or first.start_ns <= then.start_ns


def _spans_of(checkpoint_id: str, participant: tuple[str, str], spans: Sequence[Span]) -> str:
    found = [s for s in spans if s.checkpoint_id == checkpoint_id and s.participant == participant and s.operation]
    return "; ".join(span.describe() for span in found[:5]) or "no span of it on that participant"
