"""What participants hold. P6 state restored: exported resources state is written as the episode left it and comes
back with it. P7 retire stops everywhere: a retired attempt is refused and leaves no state. P8 restore is all or
nothing: a refused restore installs nothing anywhere. P13 clean end: drained, every server is idle and empty.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ckpt_model.errors import ParticipantFailure, PropertyViolation
from ckpt_model.model.contract import capture_key
from ckpt_model.properties.evidence import refused_409, shortened


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


class P13Violation(PropertyViolation):
    property_id = "P13"
    title = "clean end: drained, every server is idle with no episodes, sessions, in-flight work or marks"


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


def p7_refused(key: str, status_code: int | None, body: Any) -> None:
    """A `/run` of a retired attempt is refused with 409 stale_attempt until forget."""
    refused_409(P7Violation, key, "stale_attempt", "a /run of a retired attempt", "until forget", status_code, body)


def p7_callee_refused(key: str, call: str, status_code: int | None, body: Any) -> None:
    """A call straight to a callee (`call`: its server and route) for a retired attempt is refused with 409
    stale_attempt until forget: the callee's own mark, not only its caller's, stops it."""
    what = f"{call} straight from a late caller of a retired attempt"
    refused_409(P7Violation, key, "stale_attempt", what, "until forget", status_code, body)


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
        shown = dead.describe() if isinstance(dead, ParticipantFailure) else f"answered {shortened(dead, 120)}"
        raise P8Violation(rollout=None, expected=expected, observed=f"{victim} {shown}")
    wrong = {
        name: outcome.describe() if isinstance(outcome, ParticipantFailure) else shortened(outcome, 120)
        for name, outcome in outcomes.items()
        if name != victim and (isinstance(outcome, ParticipantFailure) or outcome.get("phase") != "restored")
    }
    if wrong:
        raise P8Violation(rollout=None, expected=expected, observed=f"not restored: {wrong}")


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


# Counts that are no work left over: calls skipped by a cut round, and a multi-worker server's live workers.
NOT_LEFTOVERS = frozenset({"cut_skipped", "workers"})


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
