"""Calls the network cuts. P17 lost replies: a call whose reply was lost took effect on that participant, and the
retry is answered from the record. P19 unreachable participants: a call that cannot reach one participant fails
there alone and changes nothing there, and the retry completes, answered from the record where the call arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_model.errors import CoordinationError, PropertyViolation
from ckpt_model.properties.evidence import shortened


class P17Violation(PropertyViolation):
    property_id = "P17"
    title = (
        "lost replies: a prepare, commit or resume whose reply was lost took effect on that participant, and the "
        "controller's retry of it is answered from the record (prepared, committed, resumed as idempotent)"
    )


class P19Violation(PropertyViolation):
    property_id = "P19"
    title = (
        "unreachable participants: a prepare, commit or resume that cannot reach one participant (its connection "
        "refused) fails there alone and changes nothing there; once it is reachable again, the controller's retry "
        "completes, every participant that took the first call answering it from its record"
    )


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
            observed=shortened(reply, 200),
        )


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
            f"{shortened(first[name], 200)}",
            observed=shortened(wrong[name], 200),
        )


def p19_first_resume(checkpoint_id: str, victim: str, reply: Mapping[str, Any]) -> None:
    """The retried resume reaches `victim` for the first time (the cut-off one never did): `idempotent: false`."""
    if reply.get("idempotent") is not False:
        raise P19Violation(
            rollout=None,
            expected=f"{victim}, which the first resume of {checkpoint_id} never reached, answers the retry with "
            "idempotent: false (its first resume)",
            observed=shortened(reply, 200),
        )
