"""`steplog.step`: a rule that fails leaves the machine broken, so the teardown does not drain it and the failure
reported is the rule's own, even when the rule played another rule inside it first."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_model.errors import ControlCallFailed
from ckpt_model.model.contract import Model
from ckpt_model.properties.fencing import P10Violation
from ckpt_model.properties.state import P8Violation
from ckpt_model.protocol.history import History
from ckpt_model.steps.steplog import FAILED_HERE, StepLog, model_steps, step


class Machine:
    """Two rules as a composite plays them: `restore_after_crash` crashes first (a rule of its own), then fails."""

    def __init__(self) -> None:
        self.log = StepLog(harness=None, history=History(), stats=None)  # type: ignore[arg-type]
        self.model = Model(topology="native")
        self.drained: list[str] = []

    @step
    def crash(self) -> None:
        self.log.labels.append("crash()")

    @step
    def restore_after_crash(self) -> None:
        self.crash()
        raise P8Violation(rollout=None, expected="the restore refused", observed="installed")

    @step
    def restore_after_crash_quietly(self) -> None:
        self.crash()

    @step
    def plain(self) -> None:
        self.log.labels.append("plain()")

    def teardown(self) -> None:
        self.log.drain(self._drain)

    def _drain(self) -> None:
        self.drained.append("drain")
        raise P10Violation(rollout=None, expected="a status", observed="another one, of a broken machine")


@pytest.fixture(autouse=True)
def no_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure report needs a harness; what is tested here is only whether the drain runs."""
    monkeypatch.setattr(StepLog, "report", lambda self, error: None)


def test_a_rule_that_fails_after_a_rule_it_played_leaves_the_machine_broken_and_undrained() -> None:
    machine = Machine()
    with pytest.raises(P8Violation):
        machine.restore_after_crash()
    assert machine.log.broken
    machine.teardown()
    assert machine.drained == []


def test_a_rule_that_finished_is_drained_at_teardown() -> None:
    machine: Any = Machine()
    machine.plain()
    assert not machine.log.broken
    with pytest.raises(P10Violation):
        machine.teardown()
    assert machine.drained == ["drain"]


class Skewing(Machine):
    """A drawn rule that plays another inside it, whose control call fails."""

    @step
    def move_clock(self, victim: int) -> None:
        raise ControlCallFailed(doing="moving agent's clock", call="POST http://x/_ctl/clock", status=409)

    @step
    def skewed_clock(self, victim: int, behind: bool) -> None:
        self.move_clock(victim=victim)


def test_a_failed_control_call_names_the_rule_that_made_it_and_its_step() -> None:
    machine = Skewing()
    machine.plain()
    with pytest.raises(ControlCallFailed) as failed:
        machine.skewed_clock(victim=1, behind=False)

    assert failed.value.rule == "move_clock(victim=1), step 2"
    assert "  rule:  move_clock(victim=1), step 2" in str(failed.value)


# --- the steps the report prints, each naming the rule that did it ---------------------------------------------


def test_a_fault_rule_s_step_names_the_rule_call_and_its_effect() -> None:
    labels = ["dispatch() -> r0", "prepare() -> c1; prepare(other1) refused"]
    calls = [("dispatch", {"worker": 0}), ("unreachable", {"operation": 1, "then_retry": False, "victim": 0})]

    lines = model_steps(labels, calls, starts=[0, 1], failed_in_rule=True)

    assert lines == [
        "dispatch() -> r0",  # its label names the rule already
        "unreachable(operation=1, then_retry=False, victim=0): prepare() -> c1; prepare(other1) refused" + FAILED_HERE,
    ]


def test_a_rule_with_several_labels_or_none_and_the_drain_each_read_as_one_line() -> None:
    labels = ["prepare() -> c1", "commit(c1)", "-- teardown: drain --", "resume(c1)"]
    calls = [("checkpoint", {"then_resume": False}), ("failing_export", {"then_retry": False, "victim": 0})]

    lines = model_steps(labels, calls, starts=[0, 2], drain_at=2)

    assert lines == [
        "checkpoint(then_resume=False): prepare() -> c1; commit(c1)",
        "failing_export(then_retry=False, victim=0): nothing recorded",
        "-- teardown: drain --",
        "resume(c1)",
    ]


def test_the_step_log_records_where_each_drawn_rule_s_labels_start() -> None:
    machine = Machine()
    machine.plain()
    machine.restore_after_crash_quietly()

    assert machine.log.starts == [0, 1]
    assert model_steps(machine.log.labels, machine.log.rule_calls, machine.log.starts) == [
        "plain()",
        "restore_after_crash_quietly(): crash()",
    ]
