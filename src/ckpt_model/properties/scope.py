"""P1 replied or exported: at a commit, every unretired attempt in the scope replied before it or is exported, and a
participant writes exactly its share; a restart is reported at prepare and never exported.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ckpt_model.errors import ParticipantFailure, PropertyViolation
from ckpt_model.model.contract import RESTART_SERVERS
from ckpt_model.properties.evidence import keys_shown, shortened


class P1Violation(PropertyViolation):
    property_id = "P1"
    title = (
        "replied or exported: at a commit every unretired attempt replied before it or is exported; "
        "a restart is reported and never exported"
    )


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
        name: outcome.describe() if isinstance(outcome, ParticipantFailure) else f"accepted: {shortened(outcome, 120)}"
        for name, outcome in outcomes.items()
        if not (isinstance(outcome, ParticipantFailure) and outcome.code == "restart_in_scope")
    }
    if accepted:
        raise P1Violation(
            rollout=None,
            expected=f"a commit of {checkpoint_id} naming a restart refused with restart_in_scope",
            observed="; ".join(f"{name}: {what}" for name, what in sorted(accepted.items())),
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
            observed=f"{len(both)} replied and were exported: {keys_shown(both)}",
        )
    lost = everything - done - saved
    if lost:
        raise P1Violation(
            rollout=min(lost),
            expected="every rollout replied before the checkpoint or is exported",
            observed=f"{len(lost)} neither replied nor were exported: {keys_shown(lost)}",
        )
    unknown = saved - everything
    if unknown:
        raise P1Violation(
            rollout=min(unknown),
            expected="only dispatched rollouts are exported",
            observed=f"{len(unknown)} exported that were never dispatched: {keys_shown(unknown)}",
        )
