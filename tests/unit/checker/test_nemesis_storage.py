"""The storage family's stalled commit on hand-built stand-ins: a commit whose write stands at the stall is
answered once the deadline passed; one that answers without its write ever reaching the stall (a writer that skips
the stalled step) is returned at once for P16 to judge, never waited on until the settle times out."""

from __future__ import annotations

import types
from concurrent.futures import Future
from typing import Any

from ckpt_model.deployments.faults import STALL
from ckpt_model.errors import ParticipantFailure
from ckpt_model.trainer.nemeses.storage import Storage
from ckpt_model.trainer.pipeline import WriteFault

FAULT = WriteFault("agent", "records.fsync", STALL, "stall at records.fsync")


class StorageState:
    """A harness whose faults role reads the victim's storage state from a list (the last value repeats) and whose
    clocks role owns time: one stand-in plays both."""

    def __init__(self, *states: dict[str, Any]) -> None:
        self.states = list(states)
        self.jumped: list[float] = []
        self.faults = self.clocks = self

    def storage_state(self, _name: str) -> dict[str, Any]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def now(self) -> float:
        return 1000.0

    def room(self, seconds: float) -> float:
        return seconds

    def jump_to(self, when_ts: float) -> bool:
        self.jumped.append(when_ts)
        return True


def storage_answering(answer: ParticipantFailure | None, harness: StorageState) -> Storage:
    """The storage family's rules on `harness`, nothing else built, whose commit answers `answer`."""
    answered: Future[ParticipantFailure | None] = Future()
    answered.set_result(answer)
    machine = object.__new__(Storage)
    machine.harness = harness  # type: ignore[assignment]
    machine.controller = types.SimpleNamespace(runs=types.SimpleNamespace(submit=lambda *_args: answered))  # type: ignore[assignment]
    # Far longer than the few polls each wait needs: a loaded machine can hold this thread for a fraction of a second.
    machine.quiescence = types.SimpleNamespace(timeout_s=30.0)  # type: ignore[assignment]
    return machine


def test_a_commit_that_answers_without_reaching_the_stall_is_returned_for_p16() -> None:
    harness = StorageState({"stalled_at": None})
    assert storage_answering(None, harness)._commit_stalled(FAULT, "c1", []) is None
    assert harness.jumped, "the deadline was passed before the answer was read"


def test_a_refused_commit_waits_until_its_write_stands_at_the_stall() -> None:
    refusal = ParticipantFailure("agent", 409, "deadline_exceeded", "still writing")
    harness = StorageState({"stalled_at": None}, {"stalled_at": None}, {"stalled_at": "records.fsync"})
    assert storage_answering(refusal, harness)._commit_stalled(FAULT, "c1", []) is refusal
    assert harness.states == [{"stalled_at": "records.fsync"}]
