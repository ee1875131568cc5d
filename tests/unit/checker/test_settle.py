"""The settle's reads on a hand-built system: when it reads the participants' statuses, and that a wrong phase
still fails while a predicted call is pending, before the settle timeout."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from ckpt_model.model.contract import Model
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties.continuation import P3Violation
from ckpt_model.properties.fencing import P10Violation
from ckpt_model.trainer import quiescence
from ckpt_model.trainer.quiescence import Quiescence
from ckpt_model.trainer.runs import RunOutcome

# Long enough that a verdict reached at the settle timeout would need hundreds of backend polls.
TIMEOUT_S = 30.0


@attrs.frozen
class Member:
    name: str
    kind: str


class Control:
    participants = (Member("weather", "environment"),)


class Backend:
    """The backend's call list: the dispatched rollout's first call arrives (waiting) at the `arrives_at`th
    poll, or never."""

    def __init__(self, arrives_at: int | None) -> None:
        self.arrives_at = arrives_at
        self.polls = 0

    def calls(self) -> list[dict[str, Any]]:
        self.polls += 1
        arrived = self.arrives_at is not None and self.polls >= self.arrives_at
        call = {"index": 0, "capture_key": "r0", "kind": "policy", "n_messages": 2, "waiting": True}
        return [call] if arrived else []


class Harness:
    """One environment participant whose status agrees with a rollout dispatched and waiting at its first call,
    in `phase`; `backend.polls` and `status_polls` count the reads."""

    def __init__(self, arrives_at: int | None, phase: str = "idle") -> None:
        self.backend = Backend(arrives_at)
        self.control = Control()
        self.spec = DeploymentSpec("native")
        self.phase = phase
        self.status_polls: list[int] = []  # the backend polls made before each status read

    def statuses(self) -> dict[str, Any]:
        self.status_polls.append(self.backend.polls)
        report = {"ready": True, "blockers": [], "blocker_count": 0, "counts": {"episodes": 1}, "restarts": []}
        status = {
            "kind": "environment",
            "instance": "weather",
            "phase": self.phase,
            "checkpoint_id": None,
            "lease_expires_at": None if self.phase == "idle" else 1.0,
            "report": report,
            "retired_rollouts": 0,
            "restored_pending": [],
        }
        return {"weather": status}


class Runs:
    outcomes: dict[int, Any] = {}
    refused_stale: dict[int, str] = {}
    refused_closed: dict[int, str] = {}
    rejected: dict[int, tuple[str, int]] = {}


def dispatched() -> Model:
    return Model(topology="native").dispatch()[0]


def settle(harness: Harness, runs: Any = None) -> Any:
    quiet = Quiescence(harness, None, runs or Runs(), reward=1.0, timeout_s=TIMEOUT_S)  # type: ignore[arg-type]
    return quiet.settle(dispatched())


@pytest.mark.parametrize("arrives_at", [1, 3])
def test_the_statuses_are_read_once_after_the_predicted_call_arrived(
    arrives_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending calls alone never read the statuses early here: at load 9-15 the polls before the call took longer
    than `PHASES_WHILE_PENDING_AFTER_S`, and the early read (the test below) came first."""
    monkeypatch.setattr(quiescence, "PHASES_WHILE_PENDING_AFTER_S", TIMEOUT_S)
    harness = Harness(arrives_at)

    observation = settle(harness)

    assert harness.status_polls == [arrives_at]
    assert observation.waiting == {"r0": 0}


def test_a_wrong_phase_fails_while_the_predicted_call_is_still_pending() -> None:
    harness = Harness(arrives_at=None, phase="prepared")

    with pytest.raises(P10Violation, match="weather in phase"):
        settle(harness)

    # Polls back off from 1 ms, so the phases, read after 50 ms of waiting, were read within a few polls (the
    # timeout would have taken hundreds); a loaded machine polls less often, never more.
    assert len(harness.status_polls) == 1
    assert harness.status_polls[0] < 20


def test_a_native_reply_off_the_release_shape_is_p3_at_once() -> None:
    """The rollout's `/run` replied while its call is still pending, with a timeout failure the release never
    makes (a stage on `Episode timed out`): the reply's shape is judged before anything waits for the call."""
    harness = Harness(arrives_at=None)
    runs = Runs()
    episode = {"episode_id": {"rollout_id": "r0", "attempt": 0}, "task_id": {"taskset": "t:t", "task_id": "t"}}
    failure = {"failure_reason": "Episode timed out", "terminal": False, "stage": "agent"}
    runs.outcomes = {0: RunOutcome(200, {**episode, "failure": failure})}

    with pytest.raises(P3Violation, match=r"'failure\.stage': a failure 'Episode timed out' has no stage"):
        settle(harness, runs)
    assert harness.backend.polls < 20
