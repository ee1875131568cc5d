"""Durable checkpoints and failed writes. P9: every committed checkpoint verifies with the checker's own reader, never
changes and restores. P16: a commit whose write fails or stalls, whose export hook raises or whose participant is
frozen past its deadline is refused by that participant alone with Gym's code, publishes no manifest and leaves it
prepared for a retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_model.errors import ParticipantFailure, PropertyViolation
from ckpt_model.protocol.storage import CheckpointUnreadable, Fingerprint


class P9Violation(PropertyViolation):
    property_id = "P9"
    title = "checkpoints are durable and immutable: every committed checkpoint verifies and never changes"


class P16Violation(PropertyViolation):
    property_id = "P16"
    title = (
        "failed, stalled and paused commits: a commit whose write fails or stalls, whose export hook raises, or "
        "whose participant is frozen past its deadline, is refused with Gym's code by that participant alone, "
        "publishes no manifest, leaves it prepared for a retry that commits what the first export held, and a "
        "write stopped by a resume never publishes"
    )


def p9_verifies(checkpoint_id: str, read: Mapping[str, Any]) -> None:
    """Every participant directory of a checkpoint just committed verifies with the checker's own reader."""
    for name, outcome in sorted(read.items()):
        if isinstance(outcome, CheckpointUnreadable):
            raise P9Violation(rollout=None, expected=f"{checkpoint_id}/{name} verifies", observed=str(outcome))


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


def p9_restores(checkpoint_id: str, restore_id: str, error: Any) -> None:
    """A committed checkpoint restores into fresh processes, also again after its replacement made calls. Called
    with the restore's refusal."""
    raise P9Violation(
        rollout=None,
        expected=f"committed checkpoint {checkpoint_id} restores (as {restore_id}) into fresh "
        "processes, also again after its replacement made calls",
        observed=str(error),
    )


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
