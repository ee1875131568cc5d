"""Fixed scenarios through the machine's own rules: the fault-free stack keeps the contract in each, and every
planted fault is caught by the property the catalogue names."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckpt_model import properties
from ckpt_model.deployment import Harness
from ckpt_model.errors import PropertyViolation
from ckpt_model.scenarios import FAULT_SCENARIOS, SCENARIOS, run
from fakes.faults import BY_NAME, CATALOGUE


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_native_scenario(native_harness: Harness, name: str) -> None:
    run(native_harness, SCENARIOS[name])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_legacy_scenario(legacy_harness: Harness, name: str) -> None:
    run(legacy_harness, SCENARIOS[name])


@pytest.fixture(scope="module")
def faulty_harnesses() -> Iterator[dict[str, Harness]]:
    started: dict[str, Harness] = {}
    try:
        yield started
    finally:
        for harness in started.values():
            harness.close()


def test_every_fault_has_a_scenario() -> None:
    assert sorted(FAULT_SCENARIOS) == sorted(fault.name for fault in CATALOGUE)


@pytest.mark.parametrize("fault", sorted(FAULT_SCENARIOS))
def test_the_scenario_catches_the_planted_fault(fault: str, faulty_harnesses: dict[str, Harness]) -> None:
    harness = faulty_harnesses.setdefault(fault, Harness("native", faults=(fault,)))
    expected = getattr(properties, f"{BY_NAME[fault].caught_by}Violation")
    with pytest.raises(PropertyViolation) as caught:
        run(harness, SCENARIOS[FAULT_SCENARIOS[fault]])
    assert type(caught.value) is expected, f"caught by {caught.value.property_id}:\n{caught.value}"
