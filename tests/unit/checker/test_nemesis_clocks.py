"""The clocks family's judgement of a skewed-behind participant that never answered its prepare (hand-built
stand-ins): judged as the `prepare` rule judges a prepare that never answers, so P11 where a `replay` verification
runs, P10 otherwise."""

from __future__ import annotations

import types

import pytest

from ckpt_model.model.contract import Model
from ckpt_model.properties.fencing import P10Violation
from ckpt_model.properties.verification import P11Violation
from ckpt_model.trainer.audits import Audits
from ckpt_model.trainer.nemeses.clocks import Clocks


def clocks_over(model: Model, phase: str, reads: list[str] | None = None) -> Clocks:
    """The clocks family's rules and the audits that judge them, nothing else built, on `model`, whose one
    participant reports `phase` (each status read appended to `reads`)."""
    status = {"phase": phase, "checkpoint_id": "c1", "report": {"blockers": ["r0"]}}

    def statuses() -> dict[str, object]:
        (reads if reads is not None else []).append(phase)
        return {"weather": status}

    machine = object.__new__(Clocks)
    machine.model = model
    machine.quiescence = types.SimpleNamespace(timeout_s=0.0)  # type: ignore[assignment]
    machine.harness = types.SimpleNamespace(statuses=statuses)  # type: ignore[assignment]
    machine.audits = object.__new__(Audits)
    return machine


def judge_verifying() -> Model:
    """A slow-topology rollout whose judge call waits, verifying in mode `replay` (which never blocks)."""
    model, _ = Model(topology="slow", verify_mode="replay").dispatch()
    return model.release("r0").release("r0")


@pytest.mark.parametrize(
    ("model", "violation"),
    [(judge_verifying(), P11Violation), (Model(topology="native").dispatch()[0], P10Violation)],
    ids=["replay verification", "policy call"],
)
def test_a_victim_still_preparing_is_judged_as_a_prepare_that_never_answers(
    model: Model, violation: type[Exception]
) -> None:
    with pytest.raises(violation, match="still preparing"):
        clocks_over(model, "preparing")._ready_in_time("weather", "c1")


def test_a_victim_that_reports_itself_prepared_was_only_slow() -> None:
    reads: list[str] = []
    clocks_over(judge_verifying(), "prepared", reads)._ready_in_time("weather", "c1")  # no violation raised
    assert reads == ["prepared"]
