"""The controller contract, checked by the state machine against the fault-free stack, in every topology."""

from __future__ import annotations

from hypothesis.stateful import run_state_machine_as_test

from ckpt_model.deployment import Harness
from ckpt_model.machine import machine_for
from tests.stateful.conftest import ACTIVE_SETTINGS


def test_native_stack_keeps_the_contract(native_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(native_harness), settings=ACTIVE_SETTINGS)


def test_legacy_stack_keeps_the_contract(legacy_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(legacy_harness), settings=ACTIVE_SETTINGS)


def test_counter_stack_keeps_the_contract(counter_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(counter_harness), settings=ACTIVE_SETTINGS)


def test_counter_stack_with_token_capture_keeps_the_contract(counter_capture_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(counter_capture_harness), settings=ACTIVE_SETTINGS)


def test_native_stack_with_generation_cuts_and_two_policy_workers_keeps_the_contract(
    native_cuts_two_workers_harness: Harness,
) -> None:
    run_state_machine_as_test(machine_for(native_cuts_two_workers_harness), settings=ACTIVE_SETTINGS)


def test_slow_stack_with_wait_verification_keeps_the_contract(slow_wait_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(slow_wait_harness), settings=ACTIVE_SETTINGS)


def test_slow_stack_with_replay_verification_keeps_the_contract(slow_replay_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(slow_replay_harness), settings=ACTIVE_SETTINGS)


def test_mixed_stack_with_restarts_keeps_the_contract(mixed_harness: Harness) -> None:
    run_state_machine_as_test(machine_for(mixed_harness), settings=ACTIVE_SETTINGS)
