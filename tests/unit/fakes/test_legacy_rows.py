"""Which episode a legacy `/run` row names, with the reservation of `-a<N>` and without it (the planted fault)."""

from __future__ import annotations

import pytest

from fakes.gym.protocol.errors import InvalidRolloutIdError, RolloutIdRequiredError
from fakes.gym.protocol.legacy_rows import legacy_episode
from fakes.gym.protocol.wire import EpisodeId


def row(rollout_id: object, attempt: object = 0) -> dict[str, object]:
    return {"_ng_rollout_id": rollout_id, "_ng_attempt_index": attempt}


def test_a_valid_rollout_id_names_its_attempt() -> None:
    assert legacy_episode(row("x-a0", 2)) == EpisodeId(rollout_id="x-a0", attempt=2)
    assert legacy_episode({"_ng_rollout_id": "x.y"}) == EpisodeId(rollout_id="x.y", attempt=0)


@pytest.mark.parametrize("rollout_id", ["x-a1", "-x", "x/y", "x\n", 7])
def test_a_rejected_rollout_id_is_refused(rollout_id: object) -> None:
    with pytest.raises(InvalidRolloutIdError):
        legacy_episode(row(rollout_id))


def test_no_rollout_id_is_required() -> None:
    with pytest.raises(RolloutIdRequiredError):
        legacy_episode(row(""))
    with pytest.raises(RolloutIdRequiredError):
        legacy_episode({})


def test_without_the_reservation_x_a1_at_attempt_0_is_attempt_1_of_x() -> None:
    """nemo-gym 0.7.0's legacy path: the key `x-a1` is derived, and read back as `x` at attempt 1."""
    assert legacy_episode(row("x-a1"), skips_reservation=True) == EpisodeId(rollout_id="x", attempt=1)
    assert legacy_episode(row("x-a1", 2), skips_reservation=True).capture_key == "x-a1-a2"
    with pytest.raises(InvalidRolloutIdError):
        legacy_episode(row("-x"), skips_reservation=True)  # the alphabet still holds
