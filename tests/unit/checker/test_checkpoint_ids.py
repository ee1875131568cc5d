"""Checkpoint IDs at the edges of Gym's rules: the stems drawn, how the model numbers them apart (and names a
restore), the IDs drawn to be refused, and the abstract state, which the names never change."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_model.model.abstract import abstract
from ckpt_model.model.checkpoint_names import checkpoint_name, probe_name, restore_name
from ckpt_model.model.contract import Model
from ckpt_model.protocol.wire import CHECKPOINT_ID_MAX_CHARS, CheckpointRequest, is_valid_checkpoint_id
from ckpt_model.trainer.checkpoint_ids import CHECKPOINT_STEMS, REJECTED_CHECKPOINT_IDS, rejection_reason


def test_a_stem_keeps_its_edges_and_gets_the_number_after_its_letters() -> None:
    assert checkpoint_name(None, 3) == "c3"
    assert checkpoint_name("ck.y_z-a1", 2) == "ck2.y_z-a1"
    assert checkpoint_name("z-", 12) == "z12-"
    assert checkpoint_name("c0a", 1) == "c1_0a"  # a digit after the number would run into it
    long = "c." + "x" * (CHECKPOINT_ID_MAX_CHARS - 4) + "-a"
    assert [len(checkpoint_name(long, seq)) for seq in (1, 10, 1000)] == [CHECKPOINT_ID_MAX_CHARS] * 3
    assert checkpoint_name(long, 1000).startswith("c1000x")
    assert checkpoint_name(long, 1000).endswith("x-a")
    with pytest.raises(ValueError, match="cannot use"):
        checkpoint_name("c-restore", 1)


def test_a_restore_id_stays_within_128_characters_and_apart() -> None:
    assert restore_name("c1", 2) == "c1-restore2"
    long = "c1" + "x" * (CHECKPOINT_ID_MAX_CHARS - 2)
    restores = {restore_name(long, seq) for seq in (2, 3, 10)}
    assert len(restores) == 3
    assert all(len(name) == CHECKPOINT_ID_MAX_CHARS and is_valid_checkpoint_id(name) for name in restores)


def test_a_probe_beside_a_128_character_checkpoint_stays_valid_and_apart() -> None:
    """The skewed clock's probe (`skew-<checkpoint>`) of a checkpoint named with a long stem: once a checker bug
    (a 133-character ID its own schema refused to build)."""
    first, second = checkpoint_name("z." + "x" * 200, 4), checkpoint_name("z." + "x" * 200, 5)
    probes = [probe_name("skew", first), probe_name("skew", second)]

    assert all(len(probe) == CHECKPOINT_ID_MAX_CHARS and is_valid_checkpoint_id(probe) for probe in probes)
    assert probes[0] != probes[1]
    assert probe_name("skew", "c1") == "skew-c1"


@settings(max_examples=300, database=None, derandomize=True)
@given(st.lists(CHECKPOINT_STEMS, min_size=1, max_size=12))
def test_drawn_ids_are_valid_and_named_apart(stems: list[str]) -> None:
    """Every stem drawn names valid IDs, its restores too, and no two of an example's IDs are one."""
    names = [checkpoint_name(stem, seq) for seq, stem in enumerate(stems, start=1)]
    names += [restore_name(name, len(names) + seq) for seq, name in enumerate(names, start=1)]
    for name in names:
        CheckpointRequest.model_validate({"checkpoint_id": name, "deadline_ts": 1.0})
    assert len(set(names)) == len(names)


def test_the_draws_reach_the_edges() -> None:
    """Each edge the rules draw a line at is reached within a few hundred draws (derandomized)."""
    seen: list[str] = []

    @settings(max_examples=400, database=None, derandomize=True)
    @given(CHECKPOINT_STEMS)
    def collect(stem: str) -> None:
        seen.append(checkpoint_name(stem, 7))

    collect()
    for ending in ("-a1", ".", "_", "-", ".."):
        assert any(name.endswith(ending) for name in seen), ending
    assert any(len(name) == CHECKPOINT_ID_MAX_CHARS for name in seen)


@settings(max_examples=200, database=None, derandomize=True)
@given(REJECTED_CHECKPOINT_IDS)
def test_rejected_ids_are_rejected(checkpoint_id: str) -> None:
    assert not is_valid_checkpoint_id(checkpoint_id)
    assert rejection_reason(checkpoint_id)


def test_the_reason_an_id_is_rejected() -> None:
    assert rejection_reason("") == "it is empty"
    assert rejection_reason("c" * 129) == "it is longer than 128 characters"
    assert rejection_reason("-c") == "it does not start alphanumeric"
    assert rejection_reason("c/y") == "it has characters outside the alphabet"
    assert rejection_reason("cé") == "it has characters outside the alphabet"
    assert rejection_reason("c1\n") == "it has characters outside the alphabet"
    with pytest.raises(ValueError, match="valid"):
        rejection_reason("c" * 128)


def test_a_drawn_stem_names_the_examples_later_checkpoints() -> None:
    model = Model(topology="native").dispatch()[0]
    model, first = model.prepare("ck.a-")
    model, second = model.resume().prepare()
    blocked = model.resume().prepare_blocked()[1]
    assert (first, second, blocked) == ("ck1.a-", "ck2.a-", "ck3.a-")


def test_the_names_leave_the_abstract_state_as_it_was() -> None:
    """A checkpoint named at the edges, committed, restored (its restore ID trimmed) and restored again, reaches the
    abstract states the plain names do: what the explorer predicted is what a run with drawn names executes."""
    long = "z." + "x" * (CHECKPOINT_ID_MAX_CHARS - 2)

    def walk(stem: str | None) -> list[object]:
        model = Model(topology="native").dispatch()[0]
        model = model.prepare(stem)[0]
        model = model.commit()[0].resume()
        states = [abstract(model)]
        restored, restore_id = model.crash().restore(model.committed[0].checkpoint_id)
        assert len(restore_id) <= CHECKPOINT_ID_MAX_CHARS
        states.append(abstract(restored))
        assert restored.last_restored() == 0
        states.append(abstract(restored.crash().restore(model.committed[0].checkpoint_id)[0]))
        return states

    assert walk(long) == walk("ck-a1.") == walk(None)
