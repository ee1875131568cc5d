"""The controller contract, checked by the state machine against the fault-free stack, in every fault-free
deployment (`ckpt_model.spec.FAULT_FREE`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis.stateful import run_state_machine_as_test

from ckpt_model.deployment import Harness
from ckpt_model.machine import machine_for
from ckpt_model.spec import FAULT_FREE, DeploymentSpec
from tests.stateful.conftest import ACTIVE_SETTINGS


@pytest.mark.parametrize("spec", FAULT_FREE, ids=lambda spec: spec.label)
def test_the_fault_free_stack_keeps_the_contract(
    harness_of: Callable[[DeploymentSpec], Harness], spec: DeploymentSpec
) -> None:
    run_state_machine_as_test(machine_for(harness_of(spec)), settings=ACTIVE_SETTINGS)
