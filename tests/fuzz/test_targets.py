"""The fuzz targets: one per deployment, collectable by pytest and HypoFuzz, and keyed in the example database as
the checker's own state machine test is, so a failure a HypoFuzz worker saves replays under plain Hypothesis."""

from __future__ import annotations

import argparse
from typing import cast

import pytest
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import get_state_machine_test

from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import FAULT_FREE, DeploymentSpec
from ckpt_model.search import fuzz, profiles
from ckpt_model.trainer.machine import machine_for

SLOW_WAIT_WITH_FAULT = DeploymentSpec("slow", "wait", ("environment_verify_never_waits",))


def database_key(factory: object) -> bytes:
    """The key Hypothesis and HypoFuzz both use: the digest of the `@given` test built around the factory."""
    test = get_state_machine_test(cast("type", factory))
    return function_digest(test.hypothesis.inner_test)  # type: ignore[attr-defined]


def no_harness() -> Harness:
    raise AssertionError("building a target must not start a harness")


@pytest.mark.processes
def test_a_target_is_keyed_as_the_machine_of_a_real_harness_of_its_deployment() -> None:
    target = DeploymentSpec("legacy")
    with Harness.embedded(target) as harness:
        assert database_key(fuzz.lazy_machine(target, no_harness)) == database_key(machine_for(harness))


def test_each_deployment_keeps_its_own_key() -> None:
    targets = [*FAULT_FREE, SLOW_WAIT_WITH_FAULT]
    keys = {database_key(fuzz.lazy_machine(target, no_harness)) for target in targets}
    assert len(keys) == len(targets)


def test_a_target_with_options_is_keyed_with_them() -> None:
    """A target's options are part of its key, as they are of a harness's (`DeploymentSpec.key`)."""
    with_capture = DeploymentSpec("counter", token_capture=True)
    assert database_key(fuzz.lazy_machine(with_capture, no_harness)) != database_key(
        fuzz.lazy_machine(DeploymentSpec("counter"), no_harness)
    )


def test_targets_round_trip_through_the_environment() -> None:
    targets = (DeploymentSpec("native"), SLOW_WAIT_WITH_FAULT, *FAULT_FREE)
    environ = {fuzz.TARGETS_ENV: " ".join(target.words for target in targets)}
    assert fuzz.targets_of(environ) == targets
    assert fuzz.targets_of({}) == ()


def test_each_target_is_a_state_machine_test_case_named_after_its_deployment() -> None:
    namespace: dict[str, type] = {}
    fuzz.define_targets(namespace, (DeploymentSpec("native"), SLOW_WAIT_WITH_FAULT), profiles.CI)
    assert sorted(namespace) == ["FuzzNative", "FuzzSlowWait_environment_verify_never_waits"]
    run_test = namespace["FuzzNative"].runTest  # type: ignore[attr-defined]
    assert run_test.is_hypothesis_test
    assert namespace["FuzzNative"].settings is profiles.CI  # type: ignore[attr-defined]
    assert database_key(run_test._hypothesis_state_machine_class) == database_key(
        fuzz.lazy_machine(DeploymentSpec("native"), no_harness)
    )


def options(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**({"topology": None, "verify_mode": None, "faults": ""} | values))


def test_without_options_every_fault_free_deployment_is_a_target() -> None:
    assert fuzz.chosen_targets(options()) == FAULT_FREE


def test_a_target_with_options_names_its_case_after_them() -> None:
    target = DeploymentSpec("native", token_capture=True, generation_cuts=True)
    assert target.words == "native:wait::capture+cuts"
    assert fuzz.case_name(target) == "FuzzNativeCaptureCuts"


def test_a_planted_fault_is_fuzzed_in_the_deployment_it_shows_in() -> None:
    (target,) = fuzz.chosen_targets(options(faults="agent_retire_keeps_sessions"))
    assert target == DeploymentSpec("native", "wait", ("agent_retire_keeps_sessions",))
    (captured,) = fuzz.chosen_targets(options(faults="workers_export_ignores_snapshots"))
    assert captured.words == "counter:wait:workers_export_ignores_snapshots:capture+workers2"


def test_an_unknown_fault_is_a_usage_error() -> None:
    with pytest.raises(fuzz.UsageError, match="unknown fault"):
        fuzz.chosen_targets(options(faults="no_such_fault"))


def test_a_derandomized_profile_without_a_database_cannot_be_fuzzed() -> None:
    with pytest.raises(fuzz.UsageError, match="--profile ci"):
        fuzz.searching_settings("default", {"CI": "true"})
    assert not fuzz.searching_settings("ci", {"CI": "true"}).derandomize


def test_the_worker_command_usage_errors_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["worker", "--faults", "no_such_fault"]) == 3
    assert "unknown fault" in capsys.readouterr().err


def test_an_unknown_topology_in_the_targets_variable_is_refused() -> None:
    with pytest.raises(ValueError, match="'topology' must be one of"):
        fuzz.targets_of({fuzz.TARGETS_ENV: "kubernetes:wait:"})
