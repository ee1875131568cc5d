"""The properties of rollout collection as a controller (reference Appendix C), each a named check with its own
violation type, over what `ckpt_model.protocol.collection_files` reads; they raise or return None.

What rollout collection must never do is where RL infrastructure keeps losing data: point `LATEST` at a checkpoint
that is not complete, say "checkpointed" on preemption without a published checkpoint, damage the last good
checkpoint with a failed save, name in `collection.json` rollouts nobody exported, and skip, duplicate or redo rows
across preemptions and reruns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from ckpt_model.errors import PropertyViolation
from ckpt_model.protocol.collection_files import (
    CollectionCheckpoint,
    CollectionUnreadable,
    OutputRow,
    latest_id,
    participant_fingerprints,
    read_checkpoint,
)
from ckpt_model.protocol.storage import CheckpointUnreadable, Fingerprint

EXIT_PREEMPTED = 75
PUBLISHED_KEPT = 2


class P22Violation(PropertyViolation):
    property_id = "P22"
    title = "LATEST: always absent or naming a complete checkpoint that verifies, and it only moves forward"


class P23Violation(PropertyViolation):
    property_id = "P23"
    title = (
        "stops and saves: exit 75 only with a checkpoint published for that stop; a failed or cut-short save never "
        "removes or changes a checkpoint published before it; at most the two newest kept, no partial one left"
    )


class P24Violation(PropertyViolation):
    property_id = "P24"
    title = "collection.json continues exactly the rollouts the episode owner exported, and restarts none of them"


class P25Violation(PropertyViolation):
    property_id = "P25"
    title = (
        "every row once: across preemptions and reruns every input row is in the output exactly once, with the "
        "reward of an uninterrupted run and the attempt the continuation rules predict"
    )


def p22_latest_complete(root: Path, kinds: Collection[str]) -> CollectionCheckpoint | None:
    """`LATEST` is absent, or names a checkpoint whose `collection.json` reads and names it, whose every
    participant directory verifies with the checker's reader, and which holds a directory of every kind in
    `kinds`; the checkpoint it names (None when absent)."""
    try:
        checkpoint_id = latest_id(root)
        if checkpoint_id is None:
            return None
        checkpoint = read_checkpoint(root, checkpoint_id)
        found = participant_fingerprints(root, checkpoint_id)
    except (CollectionUnreadable, CheckpointUnreadable) as exc:
        raise P22Violation(rollout=None, expected="LATEST names a complete checkpoint", observed=str(exc)) from None
    missing = sorted(set(kinds) - {key.split("/")[0] for key in found})
    if missing:
        raise P22Violation(
            rollout=None,
            expected=f"{checkpoint_id} holds a directory of every participant kind {sorted(kinds)}",
            observed=f"none of kind {missing} (found {sorted(found)})",
        )
    return checkpoint


def p22_latest_forward(before: CollectionCheckpoint | None, after: CollectionCheckpoint | None) -> None:
    """Once `LATEST` named a checkpoint it never disappears, and never names one created before it."""
    if before is None:
        return
    if after is None:
        expected = f"LATEST names {before.checkpoint_id} or a newer one"
        raise P22Violation(rollout=None, expected=expected, observed="no LATEST")
    if after.created_at < before.created_at:
        raise P22Violation(
            rollout=None,
            expected=f"LATEST moves forward from {before.checkpoint_id} (created {before.created_at})",
            observed=f"{after.checkpoint_id}, created {after.created_at}",
        )


def p23_stop_published(exit_code: int, latest_before: str | None, latest_after: str | None) -> None:
    """Exit 75 says "checkpointed, then stopped": the stop must have published a new checkpoint."""
    if exit_code == EXIT_PREEMPTED and (latest_after is None or latest_after == latest_before):
        raise P23Violation(
            rollout=None,
            expected="exit 75 only after a checkpoint published for the stop",
            observed=f"exit 75 with LATEST {latest_after or 'absent'} (before the stop: {latest_before or 'absent'})",
        )


def p23_earlier_intact(
    before: Mapping[str, Mapping[str, Fingerprint]], root: Path, published_since: Collection[str]
) -> None:
    """A checkpoint published before (`before`: its participants' fingerprints) is still there, byte for byte,
    unless the checkpoints published since (`published_since`) pushed it out of the two newest."""
    for checkpoint_id, fingerprints in sorted(before.items()):
        newer = [name for name in published_since if name != checkpoint_id]
        if len(newer) >= PUBLISHED_KEPT:
            continue  # out of the two newest: a prune may remove it at any time
        if not (root / checkpoint_id).exists():
            raise P23Violation(
                rollout=None,
                expected=f"{checkpoint_id} kept (only {len(newer)} published since)",
                observed="its directory is gone",
            )
        try:
            now = participant_fingerprints(root, checkpoint_id)
        except CheckpointUnreadable as exc:
            raise P23Violation(rollout=None, expected=f"{checkpoint_id} unchanged", observed=str(exc)) from None
        if now != dict(fingerprints):
            changed = sorted(key for key in set(now) | set(fingerprints) if now.get(key) != fingerprints.get(key))
            raise P23Violation(rollout=None, expected=f"{checkpoint_id} unchanged", observed=f"changed: {changed}")


def p23_kept(published: Sequence[str], partial: Sequence[str], partial_allowed: Collection[str] = ()) -> None:
    """After a successful checkpoint: at most the two newest published checkpoints, and no partial one but those
    the caller knows began after it (`partial_allowed`)."""
    left = sorted(set(partial) - set(partial_allowed))
    if len(published) > PUBLISHED_KEPT or left:
        raise P23Violation(
            rollout=None,
            expected=f"at most {PUBLISHED_KEPT} published checkpoints and no partial one",
            observed=f"published {sorted(published)}, partial {left}",
        )


def p24_continued_exported(checkpoint: CollectionCheckpoint, exported: Collection[str]) -> None:
    """`continued` names exactly the episodes (capture keys) the episode owner's records hold; no restarted
    episode was exported."""
    continued = sorted(episode.capture_key for episode in checkpoint.continued)
    restarted = {episode.capture_key for episode in checkpoint.restarted}
    if continued != sorted(exported) or restarted & set(exported):
        raise P24Violation(
            rollout=None,
            expected=f"{checkpoint.checkpoint_id}: continued = the owner's records {sorted(exported)}, none restarted",
            observed=f"continued {continued}, restarted {sorted(restarted)}",
        )


def p25_rows(inputs: Sequence[str], rows: Sequence[OutputRow], reward: float, attempts: Mapping[str, int]) -> None:
    """Every input rollout has exactly one output row, with `reward` and the attempt `attempts` predicts, and no
    row names a rollout that is not an input."""
    counted = Counter(row.rollout_id for row in rows)
    for rollout_id in inputs:
        if counted[rollout_id] != 1:
            raise P25Violation(
                rollout=rollout_id,
                expected="exactly one output row",
                observed=f"{counted[rollout_id]} rows" + ("" if counted[rollout_id] == 0 else " (duplicated)"),
            )
    unknown = sorted(set(counted) - set(inputs))
    if unknown:
        raise P25Violation(rollout=unknown[0], expected="rows of input rollouts only", observed=f"rows of {unknown}")
    for row in rows:
        if row.reward != reward or row.attempt != attempts.get(row.rollout_id, 0):
            raise P25Violation(
                rollout=row.rollout_id,
                expected=f"reward {reward} at attempt {attempts.get(row.rollout_id, 0)}",
                observed=f"reward {row.reward} at attempt {row.attempt}",
            )
