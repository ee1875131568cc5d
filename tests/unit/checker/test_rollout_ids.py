"""Rollout IDs at the edges of Gym's rules: the names drawn, how the model numbers them apart, and the names drawn
to be refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_model.model.contract import Model
from ckpt_model.model.rollout_names import rollout_name
from ckpt_model.protocol.wire import is_valid_rollout_id, rollout_key
from ckpt_model.trainer.rollout_ids import (
    REJECTED_ROLLOUT_IDS,
    ROLLOUT_ID_LONG,
    ROLLOUT_IDS,
    rejection_reason,
)


def test_a_drawn_name_keeps_its_edges_and_gets_the_number_after_its_letters() -> None:
    assert rollout_name(None, 3) == "r3"
    assert rollout_name("x.y_z-a0", 0) == "x0.y_z-a0"
    assert rollout_name("Run-a01", 12) == "Run12-a01"
    assert rollout_name("x0a", 1) == "x1_0a"  # a digit after the number would run into it
    with pytest.raises(ValueError, match="Gym's rules reject"):
        rollout_name("x-a1", 0)


@settings(max_examples=300, database=None, derandomize=True)
@given(st.lists(ROLLOUT_IDS, min_size=1, max_size=20))
def test_drawn_names_are_valid_and_named_apart(drawn: list[str]) -> None:
    names = [rollout_name(name, seq) for seq, name in enumerate(drawn)]
    assert all(is_valid_rollout_id(name) and len(name) <= ROLLOUT_ID_LONG for name in names)
    assert len(set(names)) == len(names)
    # Distinct rollouts never share a capture key, whatever their attempts.
    keys = {rollout_key(name, attempt) for name in names for attempt in range(3)}
    assert len(keys) == 3 * len(names)


def test_the_draws_reach_the_edges() -> None:
    """Each edge the rules draw a line at is reached within a few hundred draws (derandomized)."""
    seen: list[str] = []

    @settings(max_examples=400, database=None, derandomize=True)
    @given(ROLLOUT_IDS)
    def collect(name: str) -> None:
        seen.append(rollout_name(name, 7))

    collect()
    for ending in ("-a0", "-a01", "-a1b", "-a12_y"):
        assert any(name.endswith(ending) for name in seen), ending
    assert any(len(name) == ROLLOUT_ID_LONG - 2 for name in seen)  # the number 7 in the room left for it
    for char in "._-":
        assert any(char in name for name in seen), char


@settings(max_examples=200, database=None, derandomize=True)
@given(REJECTED_ROLLOUT_IDS)
def test_rejected_names_are_rejected(name: str) -> None:
    assert not is_valid_rollout_id(name)
    assert rejection_reason(name)


def test_the_reason_a_name_is_rejected() -> None:
    assert rejection_reason("x-a1") == "it ends in -a<N>, which capture keys reserve"
    assert rejection_reason("-x") == "it does not start alphanumeric"
    assert rejection_reason("x/y") == "it has characters outside the alphabet"
    assert rejection_reason("x\n") == "it has characters outside the alphabet"
    assert rejection_reason("") == "it is empty"
    with pytest.raises(ValueError, match="valid"):
        rejection_reason("x-a0")


def test_the_reserved_name_is_the_key_of_a_rollouts_next_attempt() -> None:
    model = Model(topology="legacy")
    assert model.reserved_name_of(0) == "x-a1"
    model, rollout = model.dispatch(drawn="x")
    assert rollout == "x0"
    assert model.reserved_name_of(5) == "x0-a1"
    refused, attempt = model.rejected_dispatch("x0-a1")
    assert (attempt.rollout, attempt.attempt, attempt.run) == ("x0-a1", 0, model.runs_sent)
    assert refused.attempts == model.attempts  # it owns nothing
    assert refused.runs_sent == model.runs_sent + 1
    assert refused.tried.rejected_ids == 1
