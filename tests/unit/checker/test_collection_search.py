"""The collection minimiser's predicate (`ckpt_model.search.collection_search.CollectionReplayer`): what it learns from
a replay answers later candidates without replaying them, on scripted outcomes (no processes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import StepNotEnabled
from ckpt_model.properties.collection import P24Violation, P25Violation
from ckpt_model.search import collection_search
from ckpt_model.search.collection_search import CollectionReplayer, Replayed
from ckpt_model.search.minimise import Step, minimise

START: Step = ("start_run", {})
CHECKPOINT: Step = ("request_checkpoint", {})
RELEASE: Step = ("release", {"pick": 2})
KILL: Step = ("kill_run", {})
NO_HARNESS = cast("Harness", None)  # the scripted replays below never use it


def p24() -> P24Violation:
    return P24Violation(rollout=None, expected="continued = records", observed="continued row-0-a1")


def scripted(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> list[tuple[Step, ...]]:
    """Replays answered by `outcome(steps)`; returns the list of replayed sequences."""
    replayed: list[tuple[Step, ...]] = []

    def replay(_harness: Any, _faults: Sequence[str], steps: Sequence[Step]) -> Replayed:
        replayed.append(tuple(steps))
        return outcome(tuple(steps))

    monkeypatch.setattr(collection_search, "replay", replay)
    return replayed


def test_a_prefix_that_failed_inside_a_step_answers_every_longer_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(steps: tuple[Step, ...]) -> Replayed:
        if steps[:2] == (START, CHECKPOINT):
            return Replayed(p24(), 1)  # raised inside request_checkpoint
        return Replayed(None, len(steps))

    replayed = scripted(monkeypatch, outcome)
    replayer = CollectionReplayer(NO_HARNESS, (), ("P24Violation", "P24"))

    assert replayer((START, CHECKPOINT, RELEASE))
    assert replayer((START, CHECKPOINT, KILL, RELEASE))  # learnt: no replay
    assert not replayer((START, RELEASE))
    assert replayed == [(START, CHECKPOINT, RELEASE), (START, RELEASE)]
    assert isinstance(replayer.last_failure, P24Violation)


def test_another_property_or_a_step_not_enabled_does_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(steps: tuple[Step, ...]) -> Replayed:
        if steps[0] != START:
            return Replayed(StepNotEnabled(step=steps[0][0], index=0, rule=steps[0][0]), 0)
        return Replayed(P25Violation(rollout="row-0", expected="one row", observed="2 rows"), len(steps))

    replayed = scripted(monkeypatch, outcome)
    replayer = CollectionReplayer(NO_HARNESS, (), ("P24Violation", "P24"))

    assert not replayer((KILL, START))
    assert not replayer((KILL, CHECKPOINT))  # learnt: kill_run is not enabled first
    assert not replayer((START, KILL))  # a P25 failure is not the P24 one
    assert replayed == [(KILL, START), (START, KILL)]


def test_the_minimiser_cuts_a_found_sequence_to_the_steps_that_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(steps: tuple[Step, ...]) -> Replayed:
        if steps and steps[0] != START:
            return Replayed(StepNotEnabled(step=steps[0][0], index=0, rule=steps[0][0]), 0)
        if CHECKPOINT in steps:
            return Replayed(p24(), steps.index(CHECKPOINT))
        return Replayed(None, len(steps))

    scripted(monkeypatch, outcome)
    replayer = CollectionReplayer(NO_HARNESS, (), ("P24Violation", "P24"))

    minimal = minimise((START, RELEASE, RELEASE, CHECKPOINT, KILL), replayer, confirm=replayer.confirm)

    assert minimal.code == ("state.start_run()", "state.request_checkpoint()")
    assert minimal.reproduced
