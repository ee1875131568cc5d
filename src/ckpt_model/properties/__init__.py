"""The controller contract's properties (SPEC section 5), each a named check with its own violation type.

Hypothesis tells bugs apart by exception type and raise location, so every property raises its own subclass of
`PropertyViolation`; one shared `AssertionError` would merge them into one "bug" while shrinking. Each check is
a plain function over model values, observations and the history; it raises or returns None.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import attrs

from ckpt_model.errors import CoordinationError, ParticipantFailure, PropertyViolation
from ckpt_model.model.contract import RESTART_SERVERS, VERIFY, Expectation, ScriptCall, capture_key
from ckpt_model.model.lineage import P5Violation, P12Violation
from ckpt_model.model.outcome import Outcome
from ckpt_model.protocol.history import Event, History
from ckpt_model.protocol.storage import CheckpointUnreadable, Fingerprint
from ckpt_model.protocol.telemetry import SPAN_PREFIX, ControlCall, MetricsSnapshot, Span, SpanCounts
from ckpt_model.protocol.wire import BLOCKERS_SHOWN_MAX, EPISODE_TIMED_OUT, MANIFEST_SCHEMA_VERSION, EpisodeId


@attrs.frozen
class PropertyInfo:
    property_id: str
    title: str
    scope: Literal["step", "teardown", "step and teardown"]
    checked: bool


class P1Violation(PropertyViolation):
    property_id = "P1"
    title = (
        "replied or exported: at a commit every unretired attempt replied before it or is exported; "
        "a restart is reported and never exported"
    )


class P2Violation(PropertyViolation):
    property_id = "P2"
    title = "silent while prepared: no /run reply and no held model response while a checkpoint is open"


class P3Violation(PropertyViolation):
    property_id = "P3"
    title = "continuations complete: every attempt completes with the reward of an uninterrupted run"


class P4Violation(PropertyViolation):
    property_id = "P4"
    title = "continued, not redone: an attempt makes exactly the model calls its episode still needs"


class P6Violation(PropertyViolation):
    property_id = "P6"
    title = "state restored: exported resources state is written as the episode left it and comes back with it"


class P7Violation(PropertyViolation):
    property_id = "P7"
    title = "retire stops everywhere: a retired attempt is refused and leaves no state; forget clears it"


class P8Violation(PropertyViolation):
    property_id = "P8"
    title = (
        "restore is all or nothing: a restore one participant refuses is refused by it alone, and after the "
        "controller's cleanup nothing of it is installed anywhere and admission is open"
    )


class P9Violation(PropertyViolation):
    property_id = "P9"
    title = "checkpoints are durable and immutable: every committed checkpoint verifies and never changes"


class P10Violation(PropertyViolation):
    property_id = "P10"
    title = (
        "phases and fencing: status (phase, checkpoint ID, counts, admission) matches the model, resumed IDs are "
        "refused, one checkpoint at a time, a retried call returns its first result, a lapsed lease re-opens"
    )


class P11Violation(PropertyViolation):
    property_id = "P11"
    title = "verification: a wait verify blocks prepare and never runs again; a replay verify runs again"


class P15Violation(PropertyViolation):
    property_id = "P15"
    title = (
        "identifiers: every reply names what it answers (its participant, checkpoint, attempts and task) with "
        "capture keys, a restore continues each record as its next attempt, and a model call ID is never reused"
    )


class P13Violation(PropertyViolation):
    property_id = "P13"
    title = "clean end: drained, every server is idle with no episodes, sessions, in-flight work or marks"


class P14Violation(PropertyViolation):
    property_id = "P14"
    title = (
        "resumed equals uninterrupted: every completed rollout ends with the outcome of its task run once with no "
        "checkpoint, crash or fault (its /run reply and ledger chain, identifiers normalised)"
    )


class P16Violation(PropertyViolation):
    property_id = "P16"
    title = (
        "failed, stalled and paused commits: a commit whose write fails or stalls, whose export hook raises, or "
        "whose participant is frozen past its deadline, is refused with Gym's code by that participant alone, "
        "publishes no manifest, leaves it prepared for a retry that commits what the first export held, and a "
        "write stopped by a resume never publishes"
    )


class P17Violation(PropertyViolation):
    property_id = "P17"
    title = (
        "lost replies: a prepare, commit or resume whose reply was lost took effect on that participant, and the "
        "controller's retry of it is answered from the record (prepared, committed, resumed as idempotent)"
    )


class P18Violation(PropertyViolation):
    property_id = "P18"
    title = (
        "skewed clocks: a participant judges deadlines and its lease on its own clock; one ahead refuses a call "
        "whose deadline its clock passed, lapses first and then refuses the controller's commit with "
        "stale_checkpoint; against one behind, a stale controller's commit is refused by every participant whose "
        "lease lapsed, so it is never published"
    )


class P19Violation(PropertyViolation):
    property_id = "P19"
    title = (
        "unreachable participants: a prepare, commit or resume that cannot reach one participant (its connection "
        "refused) fails there alone and changes nothing there; once it is reachable again, the controller's retry "
        "completes, every participant that took the first call answering it from its record"
    )


class P20Violation(PropertyViolation):
    property_id = "P20"
    title = (
        "time passing: time an episode spends parked for a checkpoint, or in a replay step under one, never counts "
        "against its budget, so a checkpoint held open for longer than an episode's whole budget times none out"
    )


class P21Violation(PropertyViolation):
    property_id = "P21"
    title = (
        "paused participants: a participant frozen (SIGSTOP) while a prepare reaches it, until the prepare's "
        "deadline passed, refuses it on waking with deadline_exceeded and stays idle; one frozen past its lease "
        "lapses on waking, so a stale controller's commit is refused by it and never published"
    )


class P26Violation(PropertyViolation):
    property_id = "P26"
    title = (
        "telemetry tells the truth: every control call a participant ran has exactly one span gym.checkpoint.<op>, "
        "in the trace the controller sent, with the outcome its reply showed, and the metrics count what the spans "
        "show"
    )


# Every property, checked or not yet; docs/how-it-works.md's table must agree (tests/unit/checker/test_properties).
REGISTRY: dict[str, PropertyInfo] = {
    info.property_id: info
    for info in (
        PropertyInfo("P1", P1Violation.title, "step", True),
        PropertyInfo("P2", P2Violation.title, "step", True),
        PropertyInfo("P3", P3Violation.title, "step and teardown", True),
        PropertyInfo("P4", P4Violation.title, "step and teardown", True),
        PropertyInfo("P5", P5Violation.title, "step and teardown", True),
        PropertyInfo("P6", P6Violation.title, "step", True),
        PropertyInfo("P7", P7Violation.title, "step", True),
        PropertyInfo("P8", P8Violation.title, "step", True),
        PropertyInfo("P9", P9Violation.title, "step and teardown", True),
        PropertyInfo("P10", P10Violation.title, "step", True),
        PropertyInfo("P11", P11Violation.title, "step and teardown", True),
        PropertyInfo("P12", P12Violation.title, "step and teardown", True),
        PropertyInfo("P13", P13Violation.title, "teardown", True),
        PropertyInfo("P14", P14Violation.title, "teardown", True),
        PropertyInfo("P15", P15Violation.title, "step", True),
        PropertyInfo("P16", P16Violation.title, "step", True),
        PropertyInfo("P17", P17Violation.title, "step", True),
        PropertyInfo("P18", P18Violation.title, "step", True),
        PropertyInfo("P19", P19Violation.title, "step", True),
        PropertyInfo("P20", P20Violation.title, "step", True),
        PropertyInfo("P21", P21Violation.title, "step", True),
        PropertyInfo("P26", P26Violation.title, "step and teardown", True),
    )
}


def p1_exports_exact(
    checkpoint_id: str,
    participant: str,
    expected: Iterable[str],
    reply_keys: Iterable[str],
    disk_keys: Iterable[str],
    optional: Collection[str] = (),
) -> None:
    """At a commit: the participant's reply and its records on disk both name exactly the expected capture keys,
    each with or without the `optional` ones."""
    want = sorted(set(expected))
    for source, keys in (("commit reply", reply_keys), ("records on disk", disk_keys)):
        got = sorted(keys)
        if [key for key in got if key not in optional or key in want] != want:
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            raise P1Violation(
                rollout=next(iter(missing + extra), None),
                expected=f"{participant} writes exactly {want} in {checkpoint_id}",
                observed=f"its {source} names {got}"
                + (f"; lost {missing}" if missing else "")
                + (f"; not continued {extra}" if extra else ""),
            )


def p1_commit_is_its_share(
    checkpoint_id: str,
    participant: str,
    scope: Sequence[str] | None,
    restarts: Collection[str],
    reply_keys: Any,
    disk_keys: Iterable[str],
) -> None:
    """At a commit whose writes no model predicts (a controller the checker does not own): the reply's
    `episode_ids` are exactly the capture keys of the records on disk, and those lie in the commit's scope
    (when it names one), beside restarts the participants reported at prepare (an agent may keep their sessions)."""
    on_disk = sorted(disk_keys)
    if not isinstance(reply_keys, list) or sorted(reply_keys) != on_disk:
        named = set(reply_keys) if isinstance(reply_keys, list) else set()
        raise P1Violation(
            rollout=next(iter(sorted(named ^ set(on_disk))), None),
            expected=f"{participant}'s commit reply of {checkpoint_id} names the records it wrote: {on_disk}",
            observed=f"it names {reply_keys!r}",
        )
    if scope is None:
        return
    outside = sorted(set(on_disk) - set(scope) - set(restarts))
    if outside:
        raise P1Violation(
            rollout=outside[0],
            expected=f"{participant} writes only the scope of {checkpoint_id}: {sorted(scope)}",
            observed=f"its records on disk also name {outside}",
        )


def p1_replied_or_exported(
    checkpoint_id: str, continued: Iterable[str], replied: Iterable[str], exported: Iterable[str], owner: str
) -> None:
    """At a commit: every attempt the controller continues is exported by the episode owner; no replied one is."""
    continued_keys, replied_keys, exported_keys = set(continued), set(replied), set(exported)
    lost = sorted(continued_keys - exported_keys)
    if lost:
        raise P1Violation(
            rollout=lost[0],
            expected=f"{owner} exports {sorted(continued_keys)} in {checkpoint_id}",
            observed=f"{owner} exported {sorted(exported_keys)}: {lost} neither replied nor exported",
        )
    both = sorted(replied_keys & exported_keys)
    if both:
        raise P1Violation(
            rollout=both[0],
            expected=f"attempts that replied before {checkpoint_id} are not exported",
            observed=f"{owner} exported {both}, which already replied",
        )


def p1_restarts_reported(checkpoint_id: str, expected: Sequence[str], replies: Mapping[str, Any]) -> None:
    """At a prepare: the restart servers report exactly the running restarts in `restarts`, and no participant
    reports anything else as one (a restart is never continued, and nothing continued is a restart)."""
    want = sorted(expected)
    for name, reply in sorted(replies.items()):
        reported = sorted(reply.get("report", {}).get("restarts", []))
        if (name in RESTART_SERVERS and reported != want) or not set(reported) <= set(want):
            extra = sorted(set(reported) - set(want))
            missing = sorted(set(want) - set(reported)) if name in RESTART_SERVERS else []
            wanted = f"exactly {want}" if name in RESTART_SERVERS else f"nothing outside {want}"
            raise P1Violation(
                rollout=next(iter(missing + extra), None),
                expected=f"{name} reports {wanted} as restarts when {checkpoint_id} is prepared",
                observed=f"its prepare reply reports {reported}",
            )


def p1_restart_in_scope_refused(checkpoint_id: str, outcomes: Mapping[str, Any]) -> None:
    """A commit whose scope names a reported restart is refused (409 restart_in_scope) by every participant that
    reported it, and writes nothing: a restart starts over, it is never continued."""
    accepted = {
        name: outcome.describe() if isinstance(outcome, ParticipantFailure) else f"accepted: {_short(outcome, 120)}"
        for name, outcome in outcomes.items()
        if not (isinstance(outcome, ParticipantFailure) and outcome.code == "restart_in_scope")
    }
    if accepted:
        raise P1Violation(
            rollout=None,
            expected=f"a commit of {checkpoint_id} naming a restart refused with restart_in_scope",
            observed="; ".join(f"{name}: {what}" for name, what in sorted(accepted.items())),
        )


def p2_no_reply_while_prepared(history: History) -> None:
    """No `/run` completed with a reply inside a prepared interval (from prepared to resume or crash)."""
    p2_no_reply_within(history.intervals("prepared", ("resume", "crash")), history.events)


def p2_no_reply_within(spans: Sequence[tuple[float, float]], events: Iterable[Event]) -> None:
    """No `/run` completed with a reply strictly inside one of the prepared `spans` (start, end) of the history."""
    if not spans:
        return
    for event in events:
        if event.f != "run" or event.type != "ok":
            continue
        for start_s, end_s in spans:
            if start_s < event.time_s < end_s:
                raise P2Violation(
                    rollout=event.process,
                    expected=f"no /run reply between prepared at {start_s:.3f}s and the end at {end_s:.3f}s",
                    observed=f"{event.process} replied at {event.time_s:.3f}s: {event.value}",
                    history_indices=[event.index],
                )


def p2_held_responses(checkpoint_id: str, expected_held: int, observed_held: Any) -> None:
    if observed_held != expected_held:
        raise P2Violation(
            rollout=None,
            expected=f"the model server holds {expected_held} released response(s) while {checkpoint_id} is open",
            observed=f"it holds {observed_held}: a held response was delivered while prepared",
        )


def p3_reply_complete(key: str, status_code: int | None, body: Any, reward: float | None) -> None:
    """A finished attempt replied 200 with the reward an uninterrupted run gets. With `reward` None (a real model,
    whose free-text replies earn no reward the checker can predict) it replied 200 with a finite numeric reward
    and no `failure`: well formed, which is all that can be judged."""
    result = body.get("result") if isinstance(body, dict) and "result" in body else body
    got = result.get("reward") if isinstance(result, dict) else None
    if reward is None:
        failed = isinstance(body, dict) and body.get("failure") is not None
        numeric = isinstance(got, int | float) and not isinstance(got, bool) and math.isfinite(got)
        complete = status_code == 200 and numeric and not failed
    else:
        complete = status_code == 200 and got == reward
    if not complete:
        wanted = "a numeric reward and no failure" if reward is None else f"reward {reward}"
        raise P3Violation(
            rollout=key,
            expected=f"HTTP 200 with {wanted}",
            observed=f"HTTP {status_code}: {_short(body)}",
        )


def p4_calls(
    expected: Mapping[str, tuple[ScriptCall, ...]], observed: Mapping[str, tuple[ScriptCall, ...]]
) -> list[str]:
    """Raise on a call the model cannot explain; return the keys still missing calls (not yet made).

    Calls are message counts, or `verify` for a judge call; a wrong or missing judge call is a P11 violation
    (verification run again, or skipped), any other difference P4."""
    missing = []
    for key in sorted(set(expected) | set(observed)):
        want, got = expected.get(key, ()), observed.get(key, ())
        if got == want:
            continue
        if len(got) > len(want) or got != want[: len(got)]:
            first = next(i for i in range(len(got)) if i >= len(want) or got[i] != want[i])
            verification = VERIFY in (got[first], want[first] if first < len(want) else None)
            raise (P11Violation if verification else P4Violation)(
                rollout=key,
                expected=f"calls {list(want)} (policy calls by message count, judge calls as {VERIFY!r})",
                observed=f"backend calls {list(got)}",
            )
        missing.append(key)
    return missing


def p6_exported_state(
    checkpoint_id: str, participant: str, expected: Mapping[str, Any], records: Sequence[Any]
) -> None:
    """At a commit: each resources record holds the state the checker computed for its attempt (the counter's
    count at the attempt's boundary), and the records name exactly those attempts."""
    observed = {record_key(record): record.get("state") if isinstance(record, dict) else None for record in records}
    if observed != dict(expected):
        wrong = sorted(k for k in set(observed) | set(expected) if observed.get(k) != expected.get(k))
        raise P6Violation(
            rollout=wrong[0],
            expected=f"{participant} writes the states {dict(sorted(expected.items()))} in {checkpoint_id}",
            observed=f"its records on disk hold {dict(sorted(observed.items()))}",
        )


def p6_restored(restore_id: str, participant: str, expected: Iterable[str], restored: Any, sessions: Any) -> None:
    """After a restore, before the resume: the resources participant installed, under their next attempts, exactly
    the sessions its in-scope records hold. Its reply's `restored` names them, and its status counts them as its
    only sessions (the restore went into a fresh process, which served nothing before)."""
    want = sorted(expected)
    if restored != want or sessions != len(want):
        named = set(restored) if isinstance(restored, list) else set()
        raise P6Violation(
            rollout=next(iter(sorted(set(want) ^ named)), None),
            expected=f"{participant} restores the exported sessions of {want} in {restore_id}",
            observed=f"its restore reply names {restored!r} as restored; its status counts {sessions!r} session(s)",
        )


def record_key(record: Any) -> str:
    """A record's capture key (`?` when it has no valid `episode_id`)."""
    episode = record.get("episode_id") if isinstance(record, dict) else None
    if not isinstance(episode, dict) or not isinstance(episode.get("rollout_id"), str):
        return "?"
    return capture_key(episode["rollout_id"], episode.get("attempt", 0))


def error_code(body: Any) -> str | None:
    """The `code` of a `{"error": {"code", "detail"}}` envelope, or None for any other body."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def p7_refused(key: str, status_code: int | None, body: Any) -> None:
    """A `/run` of a retired attempt is refused with 409 stale_attempt until forget."""
    _refused_409(P7Violation, key, "stale_attempt", "a /run of a retired attempt", "until forget", status_code, body)


def p7_callee_refused(key: str, call: str, status_code: int | None, body: Any) -> None:
    """A call straight to a callee (`call`: its server and route) for a retired attempt is refused with 409
    stale_attempt until forget: the callee's own mark, not only its caller's, stops it."""
    what = f"{call} straight from a late caller of a retired attempt"
    _refused_409(P7Violation, key, "stale_attempt", what, "until forget", status_code, body)


def p9_unchanged(checkpoint_id: str, before: Mapping[str, Fingerprint], read: Mapping[str, Any]) -> None:
    """Every participant directory of a committed checkpoint still verifies and is byte-identical."""
    for name, fingerprint in before.items():
        now = read.get(name)
        if isinstance(now, CheckpointUnreadable):
            raise P9Violation(rollout=None, expected=f"{checkpoint_id}/{name} verifies", observed=str(now))
        if now != fingerprint:
            raise P9Violation(
                rollout=None,
                expected=f"{checkpoint_id}/{name} unchanged since its commit: {fingerprint}",
                observed=f"{now}",
            )


def p8_refused_by(
    restore_id: str,
    refusers: Collection[str],
    why: str,
    failures: Mapping[str, ParticipantFailure],
    cleanup_problems: Sequence[str],
    code: str = "invalid_checkpoint_state",
) -> None:
    """A restore that exactly the participants `refusers` cannot install (`why`: their shares are damaged or
    missing, or their install hook failed): each of them refuses it with `code` (invalid_checkpoint_state; an
    unexpected exception is 500 checkpoint_error), no other participant refuses it, and the controller's cleanup
    (retire the next attempts everywhere, resume) succeeded on every participant."""
    expected = (
        f"restore {restore_id} refused by {sorted(refusers)} ({why}) alone, with {code}, and the cleanup succeeding"
    )
    for name in sorted(refusers):
        refused = failures.get(name)
        if refused is None or refused.code != code:
            shown = refused.describe() if refused is not None else "installed it"
            raise P8Violation(rollout=None, expected=expected, observed=f"{name} {shown}")
    others = {name: failure.describe() for name, failure in failures.items() if name not in refusers}
    if others:
        raise P8Violation(rollout=None, expected=expected, observed=f"refused as well by {others}")
    if cleanup_problems:
        raise P8Violation(rollout=None, expected=expected, observed=f"the cleanup failed: {list(cleanup_problems)}")


def p8_died_in_restore(restore_id: str, victim: str, outcomes: Mapping[str, Any]) -> None:
    """A restore in which `victim` died before installing: it answered nothing (no HTTP reply), and every other
    participant installed (phase `restored`)."""
    expected = f"restore {restore_id}: {victim} died before installing, every other participant restored"
    dead = outcomes.get(victim)
    if not isinstance(dead, ParticipantFailure) or dead.http_status is not None:
        shown = dead.describe() if isinstance(dead, ParticipantFailure) else f"answered {_short(dead, 120)}"
        raise P8Violation(rollout=None, expected=expected, observed=f"{victim} {shown}")
    wrong = {
        name: outcome.describe() if isinstance(outcome, ParticipantFailure) else _short(outcome, 120)
        for name, outcome in outcomes.items()
        if name != victim and (isinstance(outcome, ParticipantFailure) or outcome.get("phase") != "restored")
    }
    if wrong:
        raise P8Violation(rollout=None, expected=expected, observed=f"not restored: {wrong}")


def p10_each_refused(operation: str, expected_code: str, outcomes: Mapping[str, Any]) -> None:
    """Every participant, asked on its own, refused `operation` with `expected_code`."""
    wrong = {
        name: outcome.describe() if isinstance(outcome, ParticipantFailure) else f"accepted: {_short(outcome, 120)}"
        for name, outcome in outcomes.items()
        if not (isinstance(outcome, ParticipantFailure) and outcome.code == expected_code)
    }
    if wrong:
        raise P10Violation(
            rollout=None,
            expected=f"{operation} refused by every participant with {expected_code}",
            observed="; ".join(f"{name}: {what}" for name, what in sorted(wrong.items())),
        )


def p10_each_replied(operation: str, expected: Mapping[str, Any], outcomes: Mapping[str, Any]) -> None:
    """Every participant answered `operation` with exactly the expected reply (a retry returns the first result)."""
    wrong = {name: outcome for name, outcome in outcomes.items() if outcome != expected.get(name)}
    if wrong:
        name = sorted(wrong)[0]
        outcome = wrong[name]
        shown = outcome.describe() if isinstance(outcome, ParticipantFailure) else _short(outcome)
        raise P10Violation(
            rollout=None,
            expected=f"{operation} answered by {name} with {_short(expected.get(name))}",
            observed=f"{name} answered {shown}" + (f" (and {sorted(wrong)[1:]} differ too)" if len(wrong) > 1 else ""),
        )


def p10_admission_refused(key: str, status_code: int | None, body: Any) -> None:
    """A new `/run` while a checkpoint is open is refused with 409 admission_closed and owns nothing."""
    what = "a new /run while a checkpoint is open"
    _refused_409(P10Violation, key, "admission_closed", what, "", status_code, body)


def p10_refused_runs_made_no_calls(refused: Iterable[str], calls: Mapping[str, tuple[ScriptCall, ...]]) -> None:
    """A `/run` sent while a checkpoint is open (capture keys `refused`) is refused at admission: it never reaches
    the backend. Judged before P4, whose "a call the model cannot explain" would otherwise name the consequence."""
    for key in sorted(set(refused)):
        if calls.get(key):
            raise P10Violation(
                rollout=key,
                expected="a new /run while a checkpoint is open is refused with 409 admission_closed, calling nothing",
                observed=f"admitted: backend calls {list(calls[key])}",
            )


def _refused_409(
    violation: type[PropertyViolation], key: str, code: str, what: str, until: str, status_code: int | None, body: Any
) -> None:
    if status_code != 409 or error_code(body) != code:
        raise violation(
            rollout=key,
            expected=f"{what} is refused with 409 {code}" + (f" {until}" if until else ""),
            observed=f"HTTP {status_code}: {_short(body)}",
        )


def p10_phase(participant: str, expected: tuple[str, str | None], status: Mapping[str, Any]) -> None:
    """The participant's phase and active checkpoint ID are the model's (changed only by control calls)."""
    observed = (status.get("phase"), status.get("checkpoint_id"))
    if observed != expected:
        raise P10Violation(
            rollout=None,
            expected=f"{participant} in phase {expected}",
            observed=f"{participant} in phase {observed}",
        )


def status_mismatches(expected: Expectation, status: Mapping[str, Any]) -> list[str]:
    """Where one participant's status disagrees with the model's counts, marks and admission (empty: agrees).

    Counts come from each kind's report (reference 2.4): environment `episodes` and `restored_pending`, agent
    `sessions` and `accepting`, resources `sessions`, model `inflight` and `held`; `retired_rollouts` everywhere."""
    counts = status.get("report", {}).get("counts", {})
    kind = status.get("kind")
    restart_server = status.get("instance") in RESTART_SERVERS
    wanted: dict[str, int] = {}
    if kind == "environment":
        wanted["episodes"] = expected.restart_episodes if restart_server else expected.episodes
    elif kind == "agent":
        wanted["sessions"] = expected.sessions
    elif kind == "resources":
        wanted["sessions"] = expected.restart_sessions if restart_server else expected.resources_sessions
    elif kind == "model":
        wanted.update(inflight=expected.inflight, held=expected.held)
    problems = [f"counts {k}={counts.get(k)} (expected {v})" for k, v in wanted.items() if counts.get(k) != v]
    retired = expected.retired_for(kind)
    if status.get("retired_rollouts") != retired:
        problems.append(f"retired_rollouts={status.get('retired_rollouts')} (expected {retired})")
    restored_pending = () if restart_server else expected.restored_pending  # a restart is never restored
    if kind == "environment" and tuple(status.get("restored_pending", ())) != restored_pending:
        problems.append(f"restored_pending={status.get('restored_pending')} (expected {list(restored_pending)})")
    if "accepting" in status and status["accepting"] is not expected.accepting:
        problems.append(f"accepting={status['accepting']} (expected {expected.accepting})")
    return problems


def p13_clean_end(statuses: Mapping[str, Mapping[str, Any]]) -> None:
    """Drained: every participant idle, admission open, nothing counted, no marks, nothing restored or retired."""
    for name, status in statuses.items():
        counts = status.get("report", {}).get("counts", {})
        leftovers = {k: v for k, v in counts.items() if v and k not in NOT_LEFTOVERS}
        dirty = status.get("phase") != "idle" or status.get("retired_rollouts") or leftovers
        dirty = dirty or status.get("restored_pending") or status.get("retired_sessions")
        dirty = dirty or status.get("accepting") is False
        if dirty:
            raise P13Violation(
                rollout=None,
                expected=f"{name} idle and accepting with nothing left after the drain",
                observed={k: status.get(k) for k in ("phase", "retired_rollouts", "restored_pending", "accepting")}
                | {"counts": counts, "retired_sessions": status.get("retired_sessions")},
            )


def p14_resumed_equals_uninterrupted(key: str, uninterrupted: Outcome, completed: Outcome) -> None:
    """A completed attempt's normalised outcome (`completed`) is byte for byte its task's uninterrupted one; the
    violation shows both and a diff of the two, line per field."""
    expected, observed = uninterrupted.text(), completed.text()
    if expected != observed:
        diff = difflib.unified_diff(
            expected.splitlines(), observed.splitlines(), "uninterrupted", key, lineterm="", n=2
        )
        raise P14Violation(
            rollout=key,
            expected=f"the outcome of the task run once uninterrupted: {_compact(uninterrupted)}",
            observed=f"{_compact(completed)}\n  diff (normalised):\n    " + "\n    ".join(diff),
        )


def _compact(outcome: Outcome) -> str:
    return json.dumps(json.loads(outcome.text()), sort_keys=True, separators=(",", ":"))


def p9_verifies(checkpoint_id: str, read: Mapping[str, Any]) -> None:
    """Every participant directory of a checkpoint just committed verifies with the checker's own reader."""
    for name, outcome in sorted(read.items()):
        if isinstance(outcome, CheckpointUnreadable):
            raise P9Violation(rollout=None, expected=f"{checkpoint_id}/{name} verifies", observed=str(outcome))


def p10_prepared_everywhere(
    checkpoint_id: str,
    prepared: bool,
    blockers: Mapping[str, Any],
    verifying: Sequence[str],
    waited_s: float | None = None,
) -> None:
    """Every rollout waits at a model call, so a prepare must become prepared on every stage; an attempt in a
    `replay` verification never blocks (P11), anything else that blocks is P10. `waited_s`: the prepare had not
    answered after that long, and `blockers` are what the participants' statuses then reported."""
    if prepared:
        return
    observed = f"not prepared; blockers {dict(blockers)}"
    if waited_s is not None:
        observed = f"still preparing after {waited_s:.1f} s; the statuses report blockers {dict(blockers)}"
    raise (P11Violation if verifying else P10Violation)(
        rollout=None,
        expected=f"{checkpoint_id} prepared everywhere (every rollout waits at a model call"
        + (f"; {list(verifying)} verify in mode replay, which never blocks)" if verifying else ")"),
        observed=observed,
    )


def p11_blocked(
    checkpoint_id: str, owner: str, expected: Sequence[str], prepared: bool, blockers: Mapping[str, Any]
) -> None:
    """A prepare meeting `wait` verifications ends unprepared with exactly those capture keys as the owner's
    blockers, and nothing else blocking."""
    if prepared or dict(blockers) != {owner: list(expected)}:
        raise P11Violation(
            rollout=expected[0] if expected else None,
            expected=f"{checkpoint_id} not prepared: {owner} blocked by {list(expected)} (verification in mode wait)",
            observed="prepared" if prepared else f"blockers {dict(blockers)}",
        )


def p11_prepared_once_verified(
    checkpoint_id: str, verified: Sequence[str], prepared: bool, blockers: Mapping[str, Any]
) -> None:
    """A prepare that waited for `wait` verifications becomes prepared once they finished."""
    if not prepared:
        raise P11Violation(
            rollout=verified[0] if verified else None,
            expected=f"{checkpoint_id} prepared once the verifications of {list(verified)} finished",
            observed=f"not prepared; blockers {dict(blockers)}",
        )


# Counts that are no work left over: calls skipped by a cut round, and a multi-worker server's live workers.
NOT_LEFTOVERS = frozenset({"cut_skipped", "workers"})
LEDGER_REMOVAL_REFUSAL = "retry ledger retire and delete after it resumes"


def p10_ledger_removal_refused(checkpoint_id: str, outcomes: Mapping[str, Any]) -> None:
    """While a checkpoint is open, the policy model refuses a ledger retire and a ledger delete with 409, saying
    to retry after the resume (reference 7.2): its export must not lose rows under the commit."""
    for operation, outcome in outcomes.items():
        status = getattr(outcome, "status", 200)
        text = getattr(outcome, "text", str(outcome))
        if status != 409 or LEDGER_REMOVAL_REFUSAL not in text:
            raise P10Violation(
                rollout=None,
                expected=f"ledger {operation} refused (409, '{LEDGER_REMOVAL_REFUSAL}') while {checkpoint_id} is open",
                observed=f"HTTP {status}: {text}",
            )


def p10_prepared_despite_hung_cut(checkpoint_id: str, deadline_s: float, error: Any) -> None:
    """A prepare whose generation cut hangs is still prepared within its deadline: the model server gives the cut
    at most half the time left (reference 7.3). Called with the prepare's refusal."""
    raise P10Violation(
        rollout=None,
        expected=f"{checkpoint_id} prepared within {deadline_s:g} s although its cut hangs",
        observed=str(error),
    )


def p10_retry_answered(
    label: str, operation: str, after_crash: bool, first: Mapping[str, Any], outcomes: Mapping[str, Any]
) -> None:
    """A retried control call: after a crash a commit is refused by the fresh processes (`invalid_phase`); a
    resume answers as an idempotent one; anything else answers exactly its first result again."""
    if after_crash:
        p10_each_refused(f"{label} after a crash", "invalid_phase", outcomes)
    elif operation == "resume":
        idempotent = {"phase": "idle", "idempotent": True}
        p10_each_replied(label, dict.fromkeys(outcomes, idempotent), outcomes)
    else:
        p10_each_replied(label, first, outcomes)


def p9_restores(checkpoint_id: str, restore_id: str, error: Any) -> None:
    """A committed checkpoint restores into fresh processes, also again after its replacement made calls. Called
    with the restore's refusal."""
    raise P9Violation(
        rollout=None,
        expected=f"committed checkpoint {checkpoint_id} restores (as {restore_id}) into fresh "
        "processes, also again after its replacement made calls",
        observed=str(error),
    )


def p8_not_refused(restore_id: str, refusers: Collection[str], why: str) -> None:
    """A restore that some participant cannot install must be refused. Called when every participant installed."""
    raise P8Violation(
        rollout=None,
        expected=f"restore {restore_id} refused by {list(refusers)} ({why})",
        observed="every participant installed it",
    )


def p8_cleanup_succeeds(restore_id: str, error: Any) -> None:
    """The cleanup of a failed restore (retire the next attempts, resume) succeeds everywhere. Called with its
    refusal."""
    raise P8Violation(
        rollout=None,
        expected=f"the cleanup of restore {restore_id} (retire the next attempts, resume) succeeds everywhere",
        observed=str(error),
    )


def _short(value: Any, limit: int = 300) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- verdicts of the settle (quiescence) and of scale mode ---------------------------------------------------------

# How a status mismatch on admission reads (`status_mismatches`), and how a refusal still to come reads among the
# settle's pending items: the settle's timeout verdicts tell them apart by these.
ADMISSION_MISMATCH = "accepting="
REFUSAL_PENDING = "refusal"
# Keys a scale verdict names before it only counts the rest.
SHOWN_MAX = 10


def p20_budget_kept(key: str, parked_for_s: float | None, status_code: int | None, body: Any) -> None:
    """A rollout that stayed parked while `parked_for_s` seconds passed (more than its whole budget; None: no time
    passed while it was parked) did not time out for it: its reply, if one came, is not Gym's `Episode timed out`."""
    if parked_for_s is None or status_code != 200 or not isinstance(body, Mapping):
        return
    failure = body.get("failure")
    if isinstance(failure, Mapping) and failure.get("failure_reason") == EPISODE_TIMED_OUT:
        raise P20Violation(
            rollout=key,
            expected=(
                f"its budget suspended while it waited out a checkpoint (parked, or in a replay step) as "
                f"{parked_for_s:g} s passed"
            ),
            observed=f"it timed out: HTTP {status_code}: {body}",
        )


def p3_still_running(
    key: str,
    calls_made: int,
    calls_total: int,
    open_checkpoint: str | None,
    status_code: int | None,
    body: Any,
    error: str | None,
) -> None:
    """An attempt the model says still runs has neither replied (`status_code`) nor failed (`error`): a failure is
    P3, a reply while a checkpoint is open P2, a 200 reply P4 (it ended without the calls the model still expects)
    and any other reply P3. Decided at once: no wait takes a reply back."""
    if error is not None:
        raise P3Violation(rollout=key, expected="the /run still running", observed=f"it failed: {error}")
    if status_code is None:
        return
    if open_checkpoint is not None:
        raise P2Violation(
            rollout=key,
            expected=f"no reply while {open_checkpoint} is open",
            observed=f"HTTP {status_code}: {body}",
        )
    raise (P4Violation if status_code == 200 else P3Violation)(
        rollout=key,
        expected=f"the /run still running at call {calls_made} of {calls_total}",
        observed=f"it ended with HTTP {status_code}: {body}",
    )


def p10_status_agrees(violation: type[PropertyViolation] | None, prediction: str, mismatches: Sequence[str]) -> None:
    """A status mismatch that is confirmed (by the step's own reply, or by outliving the settle and one fresh poll)
    breaks the step's own property (`violation`: P7 after retire and forget, P8 after a failed restore), else P10."""
    if mismatches:
        raise (violation or P10Violation)(rollout=None, expected=prediction, observed="; ".join(mismatches))


def p10_admission_agrees(prediction: str, mismatches: Sequence[str], pending: Sequence[str], timeout_s: float) -> None:
    """Once the settle timed out: no participant's admission contradicts the model (closed after a resume, open
    while prepared), since such a participant explains whatever stalled behind it."""
    admission = [item for item in mismatches if ADMISSION_MISMATCH in item]
    if admission:
        raise P10Violation(
            rollout=None,
            expected=prediction,
            observed="; ".join(admission) + f" (still pending after {timeout_s:g} s: {list(pending)})",
        )


def p10_refusal_came(
    violation: type[PropertyViolation] | None, prediction: str, pending: Sequence[str], mismatches: Sequence[str]
) -> None:
    """Once the settle timed out: a refusal that never came while the statuses show the request was taken in (an
    episode counted) breaks the step's own property (`violation`), else P10. Anything else still pending is for
    the caller to report: it is no verdict."""
    if mismatches and pending and all(REFUSAL_PENDING in item for item in pending):
        raise (violation or P10Violation)(
            rollout=None, expected=prediction, observed="; ".join([*pending, *mismatches])
        )


def p10_lease_lapsed(checkpoint_id: str, phases: Mapping[str, Any], lapsed_s: float) -> None:
    """Once the lease of `checkpoint_id` lapsed (`lapsed_s` ago, grace included) every participant is idle again,
    as a resume would leave it (reference section 2.7)."""
    if not all(phase == ("idle", None) for phase in phases.values()):
        raise P10Violation(
            rollout=None,
            expected=f"every participant idle again once the lease of {checkpoint_id} lapsed",
            observed=f"phases {dict(phases)} {lapsed_s:.1f} s after it lapsed",
        )


def p11_preparing(checkpoint_id: str, owner: str, blockers: Sequence[str], seen: Sequence[Any], returned: bool) -> None:
    """A prepare left waiting on `wait` verifications shows at the episode owner as phase `preparing` of that
    checkpoint, with exactly their capture keys as blockers (`seen`: the owner's phase, checkpoint ID and sorted
    blockers); `returned` says the prepare answered instead."""
    if list(seen) != ["preparing", checkpoint_id, list(blockers)]:
        raise P11Violation(
            rollout=blockers[0] if blockers else None,
            expected=f"{owner} preparing {checkpoint_id}, waiting for the verifications of {list(blockers)}",
            observed=f"(phase, checkpoint, blockers) {tuple(seen)}" + ("; the prepare returned" if returned else ""),
        )


def p1_finished_or_exported(rollouts: Iterable[str], finished: Iterable[str], exported: Iterable[str]) -> None:
    """Scale mode: the rollouts that replied before the checkpoint and those it exported are disjoint, together
    cover every rollout dispatched, and name no other."""
    everything, done, saved = set(rollouts), set(finished), set(exported)
    both = done & saved
    if both:
        raise P1Violation(
            rollout=min(both),
            expected="a rollout that replied before the checkpoint is not exported",
            observed=f"{len(both)} replied and were exported: {_shown(both)}",
        )
    lost = everything - done - saved
    if lost:
        raise P1Violation(
            rollout=min(lost),
            expected="every rollout replied before the checkpoint or is exported",
            observed=f"{len(lost)} neither replied nor were exported: {_shown(lost)}",
        )
    unknown = saved - everything
    if unknown:
        raise P1Violation(
            rollout=min(unknown),
            expected="only dispatched rollouts are exported",
            observed=f"{len(unknown)} exported that were never dispatched: {_shown(unknown)}",
        )


def p2_silent_while_checkpointed(replied: str | None) -> None:
    """Scale mode: no `/run` in flight at the checkpoint ended before the crash (`replied` describes one that did)."""
    if replied is not None:
        raise P2Violation(
            rollout=None,
            expected="no /run in flight replies while the checkpoint is prepared and committed",
            observed=replied,
        )


def p3_every_reply_complete(
    what: str, reward: float | None, replies: Mapping[str, tuple[int | None, Any] | None]
) -> None:
    """Scale mode: every `/run` of `what` replied (None: it never did), each with HTTP 200 and the reward of an
    uninterrupted run, or with a real model (`reward` None) well formed (`p3_reply_complete`); one violation names
    how many failed, and the first."""
    replied = {key: reply for key, reply in replies.items() if reply is not None}
    missing = sorted(set(replies) - set(replied))
    if missing:
        raise P3Violation(
            rollout=missing[0],
            expected=f"every {what} /run replies",
            observed=f"{len(missing)} never replied: {_shown(missing)}",
        )
    wrong = {}
    for key, (status_code, body) in replied.items():
        try:
            p3_reply_complete(key, status_code, body, reward)
        except P3Violation as violation:
            wrong[key] = violation
    if wrong:
        first = wrong[min(wrong)]
        raise P3Violation(
            rollout=first.rollout,
            expected=f"every {what} /run replies {first.expected}",
            observed=f"{len(wrong)} did not ({_shown(wrong)}); {first.rollout}: {first.observed}",
        )


def p4_calls_complete(
    expected: Mapping[str, tuple[ScriptCall, ...]], observed: Mapping[str, tuple[ScriptCall, ...]]
) -> None:
    """Scale mode, once every run replied: every expected capture key made exactly its calls (`p4_calls`), none
    still missing; calls of keys the plan does not name are not judged."""
    missing = p4_calls(expected, {key: calls for key, calls in observed.items() if key in expected})
    if missing:
        first = missing[0]
        raise P4Violation(
            rollout=first,
            expected=f"calls {list(expected[first])} (and the expected calls of every other key)",
            observed=f"{len(missing)} keys are missing calls once every run replied, {first}: "
            f"{list(observed.get(first, ()))}; missing: {_shown(missing)}",
        )


def _shown(keys: Iterable[str]) -> str:
    """At most `SHOWN_MAX` keys, sorted, and how many more: a scale verdict may be about thousands."""
    listed = sorted(keys)
    more = f" and {len(listed) - SHOWN_MAX} more" if len(listed) > SHOWN_MAX else ""
    return f"{listed[:SHOWN_MAX]}{more}"


# -- P15 identifiers, and the reply fields P10 holds together (docs/fields.md) -------------------------------------


def p15_status_names_participant(name: str, kind: str, status: Mapping[str, Any]) -> None:
    """A status names the participant asked: the kind it was discovered as and its own server name (the instance
    stays the server's config name across restarts, reference 2.4 and 6.1)."""
    observed = (status.get("kind"), status.get("instance"))
    if observed != (kind, name):
        raise P15Violation(
            rollout=None,
            expected=f"the status of {name} names kind {kind!r} and instance {name!r}",
            observed=f"it names kind {observed[0]!r} and instance {observed[1]!r}",
        )


def p15_capture_keys(where: str, keys: Any) -> None:
    """Blockers, restarts, restored and retired keys are capture keys: a list of `rollout[-a<N>]` names
    (reference 5.1), each naming exactly one attempt."""
    problems = [key for key in keys if not _is_capture_key(key)] if isinstance(keys, list) else [keys]
    if problems:
        raise P15Violation(
            rollout=None,
            expected=f"{where} is a list of capture keys",
            observed=f"{where} holds {problems!r}",
        )


def _is_capture_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    try:
        return EpisodeId.from_capture_key(key).capture_key == key
    except ValueError:
        return False


def p15_manifest_names_share(
    checkpoint_id: str, participant: str, kind: str, manifest: Any, on_disk: Fingerprint | Any
) -> None:
    """A commit reply's manifest echoes the commit's checkpoint ID and names the participant (kind, instance),
    with the schema version of reference 6.2, and it is the manifest written: same records file, digest, count."""
    expected: dict[str, Any] = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": kind,
        "instance": participant,
        "checkpoint_id": checkpoint_id,
    }
    if isinstance(on_disk, Fingerprint):
        expected |= {
            "records_file": on_disk.records_file,
            "records_sha256": on_disk.records_sha256,
            "record_count": on_disk.record_count,
        }
    observed = {field: manifest.get(field) for field in expected} if isinstance(manifest, Mapping) else manifest
    if observed != expected:
        raise P15Violation(
            rollout=None,
            expected=f"{participant}'s commit reply carries its manifest of {checkpoint_id}: {expected}",
            observed=f"it carries {observed}",
        )


def p15_restore_names_source(restore_id: str, source: str, replies: Mapping[str, Any]) -> None:
    """Every restore reply names the checkpoint whose manifest it read (`source_checkpoint_id`, reference 2.5),
    not the restore's own ID."""
    wrong = {name: reply.get("source_checkpoint_id") for name, reply in replies.items()}
    wrong = {name: named for name, named in wrong.items() if named != source}
    if wrong:
        raise P15Violation(
            rollout=None,
            expected=f"restore {restore_id} answered with source_checkpoint_id {source!r} by every participant",
            observed=f"source_checkpoint_id {wrong}",
        )


def p15_restored_next_attempts(restore_id: str, participant: str, expected: Iterable[str], restored: Any) -> None:
    """A restore installs each in-scope record under its next attempt (reference 5.1, 6.4): the reply's
    `restored` names exactly those capture keys, sorted."""
    want = sorted(expected)
    if restored != want:
        named = set(restored) if isinstance(restored, list) else set()
        raise P15Violation(
            rollout=next(iter(sorted(set(want) ^ named)), None),
            expected=f"{participant} restores {want} (the next attempts of its in-scope records) in {restore_id}",
            observed=f"its restore reply names {restored!r}",
        )


def p15_retired_echoed(retire_id: str, keys: Sequence[str], replies: Mapping[str, Any]) -> None:
    """Every retire reply echoes the capture keys as given (reference 2.5)."""
    _echoed(f"retire {retire_id}", "retired", list(keys), replies)


def p15_forgotten_echoed(forget_id: str, rollouts: Iterable[str], replies: Mapping[str, Any]) -> None:
    """Every forget reply names the rollout IDs, sorted and unique (reference 2.5)."""
    _echoed(f"forget {forget_id}", "forgotten", sorted(set(rollouts)), replies)


def _echoed(what: str, field: str, expected: list[str], replies: Mapping[str, Any]) -> None:
    wrong = {name: reply.get(field) for name, reply in replies.items() if reply.get(field) != expected}
    if wrong:
        raise P15Violation(
            rollout=expected[0] if expected else None,
            expected=f"{what} answered with {field} {expected} by every participant",
            observed=f"{field} {wrong}",
        )


def p15_model_call_ids_unique(calls: Sequence[Mapping[str, Any]]) -> None:
    """A model call ID names one call for good: never reused by another call, across executions, crashes and
    restores (reference 7.2), or the lineage of one would be read as the other's."""
    first: dict[str, int] = {}
    for call in calls:
        call_id = _admission(call).get("model_call_id")
        if call_id is None:
            continue
        if call_id in first:
            raise P15Violation(
                rollout=_admission(call).get("rollout_id"),
                expected=f"model call ID {call_id!r} names one call only",
                observed=f"backend calls #{first[call_id]} and #{call.get('index')} both carry it",
            )
        first[call_id] = call.get("index", -1)


def p15_admission_names_attempt(calls: Sequence[Mapping[str, Any]]) -> None:
    """A captured call's admission names the attempt the call was routed for (its `/ng-rollout/<key>` prefix,
    reference 7.1): the capture key its rows are written under."""
    for call in calls:
        admission = _admission(call)
        if admission and call.get("capture_key") is not None and admission.get("rollout_id") != call["capture_key"]:
            raise P15Violation(
                rollout=call["capture_key"],
                expected=f"backend call #{call.get('index')} routed for {call['capture_key']!r} is admitted for it",
                observed=f"its admission names rollout_id {admission.get('rollout_id')!r}",
            )


def _admission(call: Mapping[str, Any]) -> Mapping[str, Any]:
    admission = call.get("admission")
    return admission if isinstance(admission, Mapping) else {}


def p15_ledger_identifiers(key: str, answered_for: Any, sources: Sequence[str | None]) -> None:
    """A ledger manifest answers for the capture key asked, and every row a restore stamped (`capture_key`: the
    attempt that staged it) names an earlier attempt of the same rollout (reference 7.2)."""
    episode = EpisodeId.from_capture_key(key)
    if answered_for is not None and answered_for != key:
        raise P15Violation(rollout=key, expected=f"the ledger of {key!r}", observed=f"rollout_id {answered_for!r}")
    for source in sources:
        if source is None:
            continue
        staged_by = EpisodeId.from_capture_key(source) if _is_capture_key(source) else None
        if staged_by is None or staged_by.rollout_id != episode.rollout_id or staged_by.attempt >= episode.attempt:
            raise P15Violation(
                rollout=key,
                expected=f"rows of {key!r} stamped with an earlier attempt of {episode.rollout_id!r}",
                observed=f"a row stamped capture_key {source!r}",
            )


def p15_run_names_episode(key: str, sent: Mapping[str, Any], body: Any) -> None:
    """A native `/run` reply names the attempt and the task it ran (reference 5.2: `episode_id`, `task_id`)."""
    if "episode_id" not in sent:
        return  # legacy: the reply is the verify response, which names neither
    task = sent.get("task")
    expected = {"episode_id": sent["episode_id"], "task_id": task.get("task_id") if isinstance(task, dict) else None}
    observed = {field: body.get(field) for field in expected} if isinstance(body, dict) else body
    if observed != expected:
        raise P15Violation(rollout=key, expected=f"the /run reply names {expected}", observed=f"it names {observed}")


def p10_report_consistent(where: str, report: Mapping[str, Any], phase: str | None = None) -> None:
    """A readiness report agrees with itself: `blocker_count` counts the blockers (shown up to 100), and a
    prepare's phase is `prepared` exactly when it is ready (2.4, 2.5). A participant may be unready with no
    blocker to name (a resources seed in progress), so `ready` is not held to the count."""
    blockers, count, ready = report.get("blockers", []), report.get("blocker_count"), report.get("ready")
    shown = min(count, BLOCKERS_SHOWN_MAX) if isinstance(count, int) else None
    problems = []
    if shown != len(blockers):
        problems.append(f"blocker_count {count!r} for {len(blockers)} blocker(s) shown")
    if phase is not None and (phase == "prepared") is not ready:
        problems.append(f"phase {phase!r} with ready {ready!r}")
    if problems:
        raise P10Violation(
            rollout=None, expected=f"{where}: a report that agrees with itself", observed="; ".join(problems)
        )


def p10_reply_phase(operation: str, checkpoint_id: str, expected: str, replies: Mapping[str, Any]) -> None:
    """Every participant's reply to `operation` names the phase the call leaves it in (reference 2.5)."""
    wrong = {name: reply.get("phase") for name, reply in replies.items() if reply.get("phase") != expected}
    if wrong:
        raise P10Violation(
            rollout=None,
            expected=f"{operation} {checkpoint_id} answered with phase {expected!r} by every participant",
            observed=f"phases {wrong}",
        )


# A resume is accepted in every phase (reference 2.6 and 3): with the active ID, idle with nothing active
# (idempotent, the ID remembered), or an ID already resumed (idempotent). Refusals a resume never gets.
RESUME_NEVER_REFUSED_WITH = ("invalid_phase", "stale_checkpoint")


def p10_resume_accepted(checkpoint_id: str, error: CoordinationError) -> None:
    """No participant refused the controller's resume with a code the protocol never gives a resume; any other
    failure (no reply, a deadline passed, a server error) is left to the caller."""
    refused = {
        name: failure.describe()
        for name, failure in error.failures.items()
        if failure.code in RESUME_NEVER_REFUSED_WITH
    }
    if refused:
        raise P10Violation(
            rollout=None,
            expected=(
                f"resume {checkpoint_id} accepted by every participant: idempotent by one idle with nothing active "
                "or that resumed the ID already, which remembers it"
            ),
            observed="; ".join(f"{name}: {what}" for name, what in sorted(refused.items())),
        )


def p10_lease_renewed(checkpoint_id: str, lease_until: float, replies: Mapping[str, Any]) -> None:
    """A renew extends every participant's lease to at least its deadline plus the lease grace (reference 2.7)."""
    short = {
        name: reply.get("lease_expires_at")
        for name, reply in replies.items()
        if not isinstance(reply.get("lease_expires_at"), int | float) or reply["lease_expires_at"] < lease_until
    }
    if short:
        raise P10Violation(
            rollout=None,
            expected=f"renew of {checkpoint_id} answered with lease_expires_at >= {lease_until:.3f}",
            observed=f"lease_expires_at {short}",
        )


def p10_lease_held(name: str, status: Mapping[str, Any]) -> None:
    """While a checkpoint is active on a participant (any phase but idle) its lease runs: `lease_expires_at` is
    a time (reference 2.4, 2.7)."""
    lease = status.get("lease_expires_at")
    if status.get("phase") != "idle" and (not isinstance(lease, int | float) or isinstance(lease, bool)):
        raise P10Violation(
            rollout=None,
            expected=f"{name}, in phase {status.get('phase')!r}, holds a lease",
            observed=f"lease_expires_at {lease!r}",
        )


def p10_failed_close_refused(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """The prepare of `checkpoint_id`, whose close of admission failed on `victim` after it closed, failed there
    with 500 checkpoint_error (an unexpected exception inside the route) and nowhere else."""
    expected = f"prepare {checkpoint_id} refused by {victim} alone (its close failed), with HTTP 500 checkpoint_error"
    if error is None:
        raise P10Violation(rollout=None, expected=expected, observed="every participant prepared")
    refused = error.failures.get(victim)
    wrong = {name: failure.describe() for name, failure in sorted(error.failures.items()) if name != victim}
    if refused is None or (refused.http_status, refused.code) != (500, "checkpoint_error"):
        wrong[victim] = refused.describe() if refused is not None else "prepared"
    if wrong:
        raise P10Violation(rollout=None, expected=expected, observed="; ".join(f"{n}: {w}" for n, w in wrong.items()))


def p10_reopened_after_failed_close(checkpoint_id: str, victim: str, status: Mapping[str, Any]) -> None:
    """After its close failed, `victim` is idle with no checkpoint and admission open again (reference section 3:
    if closing raises, admission is re-opened and the phase is idle)."""
    if (observed := _not_idle_and_open(status)) is not None:
        raise P10Violation(
            rollout=None,
            expected=f"{victim} idle with admission open again after its close for {checkpoint_id} failed",
            observed=observed,
        )


def _not_idle_and_open(status: Mapping[str, Any]) -> str | None:
    """What a status shows that is not idle, with no checkpoint and admission open (`accepting` true where the
    status has it); None when it is all three."""
    shown = (status.get("phase"), status.get("checkpoint_id"), status.get("accepting", True))
    if shown == ("idle", None, True):
        return None
    return f"phase {shown[0]!r}, checkpoint {shown[1]!r}, accepting {shown[2]!r}"


# -- P16: failed, stalled and paused commits ---------------------------------------------------------------------------

# How each storage fault must be answered (reference sections 2.3, 2.6 and 6.2): an OSError is a
# CheckpointStateError (422 invalid_checkpoint_state); a write still running at the deadline is 409
# deadline_exceeded, and the write runs on; a participant frozen until its commit's deadline passed refuses the
# commit when it wakes, as any call past its deadline, with 409 deadline_exceeded; an export hook that raises is an
# unexpected exception in the control route, 500 checkpoint_error.
WRITE_REFUSAL: dict[str, tuple[int, str]] = {
    "ENOSPC": (422, "invalid_checkpoint_state"),
    "EIO": (422, "invalid_checkpoint_state"),
    "stall": (409, "deadline_exceeded"),
    "pause": (409, "deadline_exceeded"),
    "export": (500, "checkpoint_error"),
}


def p16_write_refused(
    checkpoint_id: str, victim: str, fault: str, how: str, failures: Mapping[str, ParticipantFailure]
) -> None:
    """The commit of `checkpoint_id`, which met `fault` on `victim` (`how` it failed: a key of `WRITE_REFUSAL`), is
    refused by `victim` with the status and code Gym gives that failure, and by nobody else (`failures`: the
    refusals of the commit that reached it)."""
    status, code = WRITE_REFUSAL[how]
    expected = f"commit {checkpoint_id}: {victim} ({fault}) alone refuses it with HTTP {status} {code}"
    refused = failures.get(victim)
    if refused is None:
        raise P16Violation(rollout=None, expected=expected, observed=f"{victim} committed it")
    if (refused.http_status, refused.code) != (status, code):
        raise P16Violation(rollout=None, expected=expected, observed=f"{victim}: {refused.describe()}")
    also = {name: failure.describe() for name, failure in sorted(failures.items()) if name != victim}
    if also:
        raise P16Violation(rollout=None, expected=expected, observed=f"refused as well by {also}")


def p16_no_manifest(checkpoint_id: str, victim: str, when: str, published: bool) -> None:
    """`victim`'s share of `checkpoint_id` holds no manifest (`published` says whether it does), `when` its write
    failed or was stopped: the manifest is the commit point, and that write never reached it."""
    if published:
        raise P16Violation(
            rollout=None,
            expected=f"no manifest in {victim}'s share of {checkpoint_id} {when}",
            observed="manifest.json is there",
        )


def p16_still_prepared(checkpoint_id: str, victim: str, status: Mapping[str, Any]) -> None:
    """After its failed write, `victim` is still prepared for `checkpoint_id`, so the controller can retry the
    commit in the same process (reference section 2.6: a retry stores the first export)."""
    shown = (status.get("phase"), status.get("checkpoint_id"))
    if shown != ("prepared", checkpoint_id):
        raise P16Violation(
            rollout=None,
            expected=f"{victim} still prepared for {checkpoint_id} after its write failed, ready for a retry",
            observed=f"phase {shown[0]!r}, checkpoint {shown[1]!r}",
        )


def p16_retry_commits(checkpoint_id: str, fault: str, error: Exception) -> None:
    """The controller's retry of the commit after `fault` was refused (`error`): a failed write must leave every
    participant able to commit the same checkpoint again."""
    raise P16Violation(
        rollout=None,
        expected=f"the retried commit of {checkpoint_id} after {fault} committed on every participant",
        observed=str(error),
    ) from error


# -- P17: lost replies -------------------------------------------------------------------------------------------

# What a participant shows once a call of each operation took effect: its phase, and whether it holds the ID.
TOOK_EFFECT: dict[str, tuple[str, bool]] = {
    "prepare": ("prepared", True),
    "commit": ("committed", True),
    "resume": ("idle", False),
}


def p17_only_reply_lost(operation: str, checkpoint_id: str, victim: str, error: CoordinationError) -> None:
    """`operation` of `checkpoint_id` failed only for want of `victim`'s reply, which the deployment lost after the
    call ran: no participant refused it (a refusal means the call itself failed, which nothing here explains)."""
    refused = {
        name: failure.describe()
        for name, failure in sorted(error.failures.items())
        if failure.http_status is not None or name != victim
    }
    if refused:
        raise P17Violation(
            rollout=None,
            expected=f"{operation} of {checkpoint_id} runs on every participant; only {victim}'s reply is lost",
            observed="; ".join(f"{name}: {what}" for name, what in refused.items()),
        )


def p17_took_effect(
    operation: str, checkpoint_id: str, victim: str, status: Mapping[str, Any], published: bool | None = None
) -> None:
    """`victim` ran `operation` of `checkpoint_id` although its reply was lost: its status shows the phase the call
    leads to (holding the ID, or none after a resume), and after a commit its share's manifest is there
    (`published`)."""
    phase, holds_id = TOOK_EFFECT[operation]
    expected = f"{victim} shows its {operation} of {checkpoint_id} done although the reply was lost: phase {phase!r}"
    shown = (status.get("phase"), status.get("checkpoint_id"))
    if shown != (phase, checkpoint_id if holds_id else None):
        raise P17Violation(
            rollout=None,
            expected=expected + (f" under {checkpoint_id}" if holds_id else ", no checkpoint active"),
            observed=f"phase {shown[0]!r}, checkpoint {shown[1]!r}",
        )
    if published is False:
        raise P17Violation(
            rollout=None, expected=expected + ", its manifest published", observed="no manifest.json in its share"
        )


def p17_retry_answered(operation: str, checkpoint_id: str, error: Exception) -> None:
    """The controller's retry of `operation` after its reply was lost (`error`): a call that took effect must be
    answered from the record, never refused as if it were new."""
    raise P17Violation(
        rollout=None,
        expected=f"the retried {operation} of {checkpoint_id}, whose first reply was lost, answered everywhere",
        observed=str(error),
    ) from error


def p17_resume_replayed(checkpoint_id: str, victim: str, reply: Mapping[str, Any]) -> None:
    """A retried resume reaches a participant that already resumed (its reply was lost): `idempotent: true`."""
    if reply.get("idempotent") is not True:
        raise P17Violation(
            rollout=None,
            expected=f"{victim} answers the retried resume of {checkpoint_id} with idempotent: true",
            observed=_short(reply, 200),
        )


# -- P18: skewed clocks ------------------------------------------------------------------------------------------


def p18_refused_on_its_clock(operation: str, victim: str, skew_s: float, outcome: Any) -> None:
    """`victim`, whose clock runs `skew_s` ahead, refused `operation` whose deadline lies inside that skew: still
    ahead on the controller's clock, passed on its own, so 409 deadline_exceeded."""
    if isinstance(outcome, ParticipantFailure) and (outcome.http_status, outcome.code) == (409, "deadline_exceeded"):
        return
    shown = outcome.describe() if isinstance(outcome, ParticipantFailure) else f"accepted: {_short(outcome, 160)}"
    raise P18Violation(
        rollout=None,
        expected=f"{victim}, its clock {skew_s:+g} s off, refuses {operation} with deadline_exceeded",
        observed=shown,
    )


def p18_lapsed_first(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """The controller's commit of `checkpoint_id` after `victim`'s lease lapsed on its own clock (ahead), while
    every other lease was renewed: `victim` alone refuses, with stale_checkpoint (its lapse remembered the ID)."""
    _refused_alone(P18Violation, "commit", checkpoint_id, victim, "its lease lapsed first", "stale_checkpoint", error)


def p21_lapsed_on_waking(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """The controller's commit of `checkpoint_id` after `victim` was frozen past its lease and woke, while every
    other lease was renewed: `victim` alone refuses, with stale_checkpoint (it lapsed the moment it woke)."""
    _refused_alone(P21Violation, "commit", checkpoint_id, victim, "it lapsed on waking", "stale_checkpoint", error)


def p21_refused_on_waking(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """A prepare of `checkpoint_id` that `victim` read only on waking, its deadline passed: `victim` alone refuses
    it, with 409 deadline_exceeded (the participants it reached before took it)."""
    _refused_alone(
        P21Violation, "prepare", checkpoint_id, victim, "woken past its deadline", "deadline_exceeded", error
    )


# What a participant that took a call did, as a failure message says it.
TOOK = {"commit": "committed it", "prepare": "prepared"}


def _refused_alone(
    violation: type[PropertyViolation],
    operation: str,
    checkpoint_id: str,
    victim: str,
    why: str,
    code: str,
    error: CoordinationError | None,
) -> None:
    expected = f"{operation} {checkpoint_id} refused by {victim} alone ({why}), with {code}"
    took = TOOK[operation]
    if error is None:
        raise violation(rollout=None, expected=expected, observed=f"every participant {took}")
    wrong = {name: failure.describe() for name, failure in sorted(error.failures.items()) if name != victim}
    refused = error.failures.get(victim)
    if refused is None or refused.code != code:
        wrong[victim] = refused.describe() if refused is not None else took
    if wrong:
        raise violation(rollout=None, expected=expected, observed="; ".join(f"{n}: {w}" for n, w in wrong.items()))


def p10_open_after_resume(operation: str, statuses: Mapping[str, Mapping[str, Any]]) -> None:
    """After a controller's `operation` resumed every participant: each idle, with no checkpoint, and admission
    open (`accepting` where the status has it), as a resume leaves it (reference section 3)."""
    for name, status in sorted(statuses.items()):
        if (observed := _not_idle_and_open(status)) is not None:
            raise P10Violation(
                rollout=None,
                expected=f"{name} idle with no checkpoint and admission open after {operation}",
                observed=observed,
            )


def p21_still_idle(checkpoint_id: str, victim: str, status: Mapping[str, Any]) -> None:
    """After refusing the prepare of `checkpoint_id` on waking, `victim` is idle, no checkpoint, admission open: a
    refused prepare closes nothing."""
    if (observed := _not_idle_and_open(status)) is not None:
        raise P21Violation(
            rollout=None,
            expected=f"{victim} idle with admission open after refusing prepare {checkpoint_id} on waking",
            observed=observed,
        )


def p18_stale_commit_refused(checkpoint_id: str, lapsed: Collection[str], error: CoordinationError | None) -> None:
    """A stale controller's commit of `checkpoint_id`, sent once the leases of `lapsed` lapsed (a participant behind
    still holds its own): every one of `lapsed` refuses it with stale_checkpoint, so the commit fails."""
    expected = f"commit {checkpoint_id} refused with stale_checkpoint by every participant whose lease lapsed"
    failures = {} if error is None else error.failures
    wrong = {
        name: failures[name].describe() if name in failures else "committed it"
        for name in sorted(lapsed)
        if name not in failures or failures[name].code != "stale_checkpoint"
    }
    if wrong:
        raise P18Violation(rollout=None, expected=expected, observed="; ".join(f"{n}: {w}" for n, w in wrong.items()))


# -- P19: a participant the controller cannot reach ----------------------------------------------------------------


def p19_only_unreached(operation: str, checkpoint_id: str, victim: str, error: CoordinationError) -> None:
    """`operation` of `checkpoint_id` failed on `victim` alone, whose connection was refused (the call never reached
    it): a refusal by anyone, or a failure after connecting, is something the partition does not explain."""
    wrong = {
        name: failure.describe()
        for name, failure in sorted(error.failures.items())
        if name != victim or failure.http_status is not None or "ConnectError" not in failure.detail
    }
    if victim not in error.failures:
        wrong[victim] = "answered"
    if wrong:
        raise P19Violation(
            rollout=None,
            expected=f"{operation} of {checkpoint_id} fails only on {victim}, whose connection is refused",
            observed="; ".join(f"{name}: {what}" for name, what in sorted(wrong.items())),
        )


def p19_untouched(
    operation: str,
    checkpoint_id: str,
    victim: str,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    published: bool = False,
) -> None:
    """`victim`, which `operation` of `checkpoint_id` never reached, shows what it showed before the call (`before`,
    `after`: its status; its phase and the checkpoint it holds), and no manifest of its own (`published`)."""
    shown = {
        when: (status.get("phase"), status.get("checkpoint_id"))
        for when, status in (("before", before), ("after", after))
    }
    expected = (
        f"{victim}, which {operation} of {checkpoint_id} never reached, unchanged: phase {shown['before'][0]!r}, "
    )
    expected += f"checkpoint {shown['before'][1]!r}, no manifest of its own"
    if shown["after"] != shown["before"]:
        observed = f"phase {shown['after'][0]!r}, checkpoint {shown['after'][1]!r}"
        raise P19Violation(rollout=None, expected=expected, observed=observed)
    if published:
        raise P19Violation(rollout=None, expected=expected, observed="manifest.json is in its share")


def p19_retry_completes(operation: str, checkpoint_id: str, error: Exception) -> None:
    """The controller's retry of `operation` once the unreachable participant is back (`error`): the first call's
    partial effect must never stand in the way of the whole."""
    raise P19Violation(
        rollout=None,
        expected=f"the retried {operation} of {checkpoint_id}, once every participant is reachable, completes",
        observed=str(error),
    ) from error


def p19_answered_from_record(
    operation: str, checkpoint_id: str, first: Mapping[str, Any], retried: Mapping[str, Any]
) -> None:
    """Every participant that answered the first `operation` of `checkpoint_id` (`first`) answers the retry with the
    very same reply (`retried`): it took the call once, and a repeat replays the recorded result."""
    wrong = {name: retried.get(name) for name in sorted(first) if retried.get(name) != first[name]}
    if wrong:
        name = sorted(wrong)[0]
        raise P19Violation(
            rollout=None,
            expected=f"{name} answers the retried {operation} of {checkpoint_id} with its first reply "
            f"{_short(first[name], 200)}",
            observed=_short(wrong[name], 200),
        )


def p19_first_resume(checkpoint_id: str, victim: str, reply: Mapping[str, Any]) -> None:
    """The retried resume reaches `victim` for the first time (the cut-off one never did): `idempotent: false`."""
    if reply.get("idempotent") is not False:
        raise P19Violation(
            rollout=None,
            expected=f"{victim}, which the first resume of {checkpoint_id} never reached, answers the retry with "
            "idempotent: false (its first resume)",
            observed=_short(reply, 200),
        )


# --- P26: telemetry ----------------------------------------------------------------------------------------


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


# --- P26 offline: what telemetry files say about checkpoint directories (`ckpt-model audit --telemetry`) ---------

# The operations that write one checkpoint: one trace (#3903). A resume closes either that checkpoint or a restore
# of it, which comes from the run after a preemption and begins its own trace.
CHECKPOINT_TRACE_OPERATIONS: frozenset[str] = frozenset({"prepare", "renew", "commit"})
OUTCOME_OK = "ok"


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
