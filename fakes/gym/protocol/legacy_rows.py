"""Which episode a legacy `/run` row names: its `_ng_rollout_id` and `_ng_attempt_index` (reference 5.3).

The row's rollout ID is held to `EpisodeId`'s rules, the reservation of a trailing `-a<N>` included, so every
capture key names one attempt. The planted fault `legacy_keys_skip_reservation` derives the key as nemo-gym 0.7.0's
`maybe_rollout_id_from_run_body` does instead: the ID is checked against the alphabet only, `-a<attempt>` is
appended for an attempt above 0, and the episode is the one that key reads as, so `x-a1` at attempt 0 runs as
attempt 1 of `x`.
"""

from __future__ import annotations

from typing import Any

from fakes.gym.protocol.errors import InvalidRolloutIdError, RolloutIdRequiredError
from fakes.gym.protocol.wire import EpisodeId, is_valid_name, key_of

SKIPS_RESERVATION = "legacy_keys_skip_reservation"


def legacy_episode(row: dict[str, Any], skips_reservation: bool = False) -> EpisodeId:
    """The episode a legacy row names; 400 `rollout_id_required` without a rollout ID, 400 `invalid_rollout_id` for
    one the rules reject."""
    rollout_id = row.get("_ng_rollout_id")
    if rollout_id is None or rollout_id == "":
        raise RolloutIdRequiredError("a legacy /run row needs _ng_rollout_id")
    attempt = row.get("_ng_attempt_index") or 0
    if not isinstance(rollout_id, str) or not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise InvalidRolloutIdError(f"_ng_rollout_id {rollout_id!r} at attempt {attempt!r} names no episode")
    if skips_reservation and is_valid_name(rollout_id):
        key = key_of(rollout_id, attempt)
        try:
            return EpisodeId.from_capture_key(key)
        except ValueError:  # `x-a1` at attempt 2: key `x-a1-a2`, an attempt of no valid rollout ID
            return EpisodeId.model_construct(rollout_id=rollout_id, attempt=attempt)
    try:
        return EpisodeId(rollout_id=rollout_id, attempt=attempt)
    except ValueError as error:
        raise InvalidRolloutIdError(f"_ng_rollout_id {rollout_id!r}: {error}") from None
