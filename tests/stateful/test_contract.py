"""The controller contract, checked by the state machine against the fault-free stack, in every fault-free
deployment (`ckpt_model.spec.FAULT_FREE`). Each run's coverage table goes to the JUnit report; in the nightly
(`GOALS_REQUIRED`) every coverage goal and rule that applies to the deployment must have been reached."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis.stateful import run_state_machine_as_test

from ckpt_model import goals
from ckpt_model.deployment import Harness
from ckpt_model.machine import CheckpointMachine, machine_for
from ckpt_model.spec import FAULT_FREE, DeploymentSpec
from ckpt_model.stats import SearchStats
from ckpt_model.steplog import rule_names
from tests.stateful.conftest import ACTIVE_SETTINGS, DEEP, GOALS_REQUIRED

# Deployments another fault-free deployment includes, trait for trait, apart from one option: the default run checks
# the contract on the larger one, the nightly on both (counter inside counter+capture; slow/replay inside
# slow/replay+jumps, whose one rule it cannot draw, skewed_clock, the default run draws on every other deployment).
INCLUDED = (DeploymentSpec("counter"), DeploymentSpec("slow", "replay"))


@pytest.mark.parametrize(
    "spec",
    [pytest.param(spec, marks=DEEP if spec in INCLUDED else ()) for spec in FAULT_FREE],
    ids=lambda spec: spec.label,
)
def test_the_fault_free_stack_keeps_the_contract(
    harness_of: Callable[[DeploymentSpec], Harness],
    spec: DeploymentSpec,
    record_property: Callable[[str, object], None],
) -> None:
    stats = SearchStats()
    run_state_machine_as_test(machine_for(harness_of(spec), stats), settings=ACTIVE_SETTINGS)
    rules = rule_names(CheckpointMachine)
    record_property("coverage", goals.table(stats, spec, rules))
    if GOALS_REQUIRED:
        goals.require(stats, spec, rules)
