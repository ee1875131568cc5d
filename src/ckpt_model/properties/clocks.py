"""Time as each participant sees it. P18 skewed clocks: a participant judges deadlines and its lease on its own clock.
P20 time passing: time parked for a checkpoint never counts against an episode's budget. P21 paused participants:
one frozen past a prepare's deadline refuses it on waking, one frozen past its lease lapses on waking.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ckpt_model.errors import CoordinationError, ParticipantFailure, PropertyViolation
from ckpt_model.properties.evidence import not_idle_and_open, shortened
from ckpt_model.protocol.wire import EPISODE_TIMED_OUT


class P18Violation(PropertyViolation):
    property_id = "P18"
    title = (
        "skewed clocks: a participant judges deadlines and its lease on its own clock; one ahead refuses a call "
        "whose deadline its clock passed, lapses first and then refuses the controller's commit with "
        "stale_checkpoint; against one behind, a stale controller's commit is refused by every participant whose "
        "lease lapsed, so it is never published"
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


def p18_refused_on_its_clock(operation: str, victim: str, skew_s: float, outcome: Any) -> None:
    """`victim`, whose clock runs `skew_s` ahead, refused `operation` whose deadline lies inside that skew: still
    ahead on the controller's clock, passed on its own, so 409 deadline_exceeded."""
    if isinstance(outcome, ParticipantFailure) and (outcome.http_status, outcome.code) == (409, "deadline_exceeded"):
        return
    shown = outcome.describe() if isinstance(outcome, ParticipantFailure) else f"accepted: {shortened(outcome, 160)}"
    raise P18Violation(
        rollout=None,
        expected=f"{victim}, its clock {skew_s:+g} s off, refuses {operation} with deadline_exceeded",
        observed=shown,
    )


def p18_lapsed_first(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """The controller's commit of `checkpoint_id` after `victim`'s lease lapsed on its own clock (ahead), while
    every other lease was renewed: `victim` alone refuses, with stale_checkpoint (its lapse remembered the ID)."""
    _refused_alone(P18Violation, "commit", checkpoint_id, victim, "its lease lapsed first", "stale_checkpoint", error)


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


def p21_refused_on_waking(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """A prepare of `checkpoint_id` that `victim` read only on waking, its deadline passed: `victim` alone refuses
    it, with 409 deadline_exceeded (the participants it reached before took it)."""
    _refused_alone(
        P21Violation, "prepare", checkpoint_id, victim, "woken past its deadline", "deadline_exceeded", error
    )


def p21_still_idle(checkpoint_id: str, victim: str, status: Mapping[str, Any]) -> None:
    """After refusing the prepare of `checkpoint_id` on waking, `victim` is idle, no checkpoint, admission open: a
    refused prepare closes nothing."""
    if (observed := not_idle_and_open(status)) is not None:
        raise P21Violation(
            rollout=None,
            expected=f"{victim} idle with admission open after refusing prepare {checkpoint_id} on waking",
            observed=observed,
        )


def p21_lapsed_on_waking(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """The controller's commit of `checkpoint_id` after `victim` was frozen past its lease and woke, while every
    other lease was renewed: `victim` alone refuses, with stale_checkpoint (it lapsed the moment it woke)."""
    _refused_alone(P21Violation, "commit", checkpoint_id, victim, "it lapsed on waking", "stale_checkpoint", error)


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
