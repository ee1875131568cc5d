"""The minimiser's one predicate (`ckpt_model.search.minimise.Replayer`) on the collection machine's rule calls: it
replays them on that machine, settles as long as that machine does, and what it learns from a replay answers later
candidates without replaying them, on scripted outcomes (no processes)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import StepNotEnabled
from ckpt_model.properties.collection import P24Violation, P25Violation
from ckpt_model.results.report import RULE_CALLS
from ckpt_model.search import minimise as mm
from ckpt_model.search.controllers import Collection, ControllerMachine
from ckpt_model.search.minimise import Replayer, Step, Steps, minimise

START: Step = ("start_run", {})
CHECKPOINT: Step = ("request_checkpoint", {})
RELEASE: Step = ("release", {"pick": 2})
KILL: Step = ("kill_run", {})
NO_HARNESS = cast("Harness", None)  # the scripted replays below never use it
COLLECTION = Collection(("manifest_names_next_attempt",))
P24 = ("P24Violation", "P24")


def p24(ran: Steps) -> P24Violation:
    """P24 raised in the last of `ran`, carrying the rule calls that ran (as the step log attaches them)."""
    violation = P24Violation(rollout=None, expected="continued = records", observed="continued row-0-a1")
    setattr(violation, RULE_CALLS, list(ran))
    return violation


def not_enabled(steps: Steps, index: int) -> StepNotEnabled:
    """Step `index` (from 1) of `steps` was not enabled, as `playback.check_enabled` says it."""
    return StepNotEnabled(step=steps[index - 1][0], index=index, rule=steps[index - 1][0])


def scripted(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> list[tuple[Steps, float, ControllerMachine]]:
    """Replays answered by `outcome(steps)`; returns each replayed sequence with its settle timeout and machine."""
    replayed: list[tuple[Steps, float, ControllerMachine]] = []

    def replay(_harness: Any, steps: Steps, settle_timeout_s: float, controller: ControllerMachine) -> Any:
        replayed.append((tuple(steps), settle_timeout_s, controller))
        return outcome(tuple(steps))

    monkeypatch.setattr(mm, "replay_once", replay)
    return replayed


def test_a_prefix_that_failed_inside_a_step_answers_every_longer_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(steps: Steps) -> BaseException | None:
        return p24(steps[:2]) if steps[:2] == (START, CHECKPOINT) else None  # raised inside request_checkpoint

    replayed = scripted(monkeypatch, outcome)
    replayer = Replayer(NO_HARNESS, P24, controller=COLLECTION)

    assert replayer((START, CHECKPOINT, RELEASE))
    assert replayer((START, CHECKPOINT, KILL, RELEASE))  # learnt: no replay
    assert not replayer((START, RELEASE))
    assert [steps for steps, _, _ in replayed] == [(START, CHECKPOINT, RELEASE), (START, RELEASE)]
    assert isinstance(replayer.last_failure, P24Violation)


def test_each_candidate_replays_on_the_collection_machine_with_its_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    replayed = scripted(monkeypatch, lambda steps: None)

    Replayer(NO_HARNESS, P24, controller=COLLECTION).confirm((START,))

    ((_, settle_timeout_s, controller),) = replayed
    assert controller.origin.document() == {
        "controller": "collection",
        "controller_faults": ["manifest_names_next_attempt"],
    }
    assert settle_timeout_s == COLLECTION.settle_timeout_s


def test_another_property_or_a_step_not_enabled_does_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(steps: Steps) -> BaseException | None:
        if steps[0] != START:
            return not_enabled(steps, 1)
        return P25Violation(rollout="row-0", expected="one row", observed="2 rows")

    replayed = scripted(monkeypatch, outcome)
    replayer = Replayer(NO_HARNESS, P24, controller=COLLECTION)

    assert not replayer((KILL, START))
    assert not replayer((KILL, CHECKPOINT))  # learnt: kill_run is not enabled first
    assert not replayer((START, KILL))  # a P25 failure is not the P24 one
    assert [steps for steps, _, _ in replayed] == [(KILL, START), (START, KILL)]


def test_the_minimiser_cuts_a_found_sequence_to_the_steps_that_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(steps: Steps) -> BaseException | None:
        if steps and steps[0] != START:
            return not_enabled(steps, 1)
        if CHECKPOINT in steps:
            return p24(steps[: steps.index(CHECKPOINT) + 1])
        return None

    scripted(monkeypatch, outcome)
    replayer = Replayer(NO_HARNESS, P24, controller=COLLECTION)

    minimal = minimise((START, RELEASE, RELEASE, CHECKPOINT, KILL), replayer, confirm=replayer.confirm)

    assert minimal.code == ("state.start_run()", "state.request_checkpoint()")
    assert minimal.reproduced
