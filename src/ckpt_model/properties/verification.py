"""P11 verification: a `wait` verification blocks prepare and never runs again; a `replay` one never blocks and runs
again after a restore (a judge call made or skipped against the model is P11 in `continuation.p4_calls`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_model.errors import PropertyViolation


class P11Violation(PropertyViolation):
    property_id = "P11"
    title = "verification: a wait verify blocks prepare and never runs again; a replay verify runs again"


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
