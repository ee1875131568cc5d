"""The topology table: each topology's traits, read by the model and the harness instead of its name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckpt_model.model.contract import Model
from ckpt_model.model.topologies import TOPOLOGIES, Topology
from ckpt_model.protocol.gym_tasks import (
    COUNTER_SCRIPT,
    WEATHER_SCRIPT,
    counter_run_body,
    legacy_run_body,
    native_run_body,
)

SRC = Path(__file__).resolve().parents[3] / "src" / "ckpt_model"


def with_trait(trait: str) -> list[str]:
    return [name for name, topology in TOPOLOGIES.items() if getattr(topology, trait)]


def test_the_table_holds_gyms_five_topologies() -> None:
    assert list(TOPOLOGIES) == ["native", "legacy", "counter", "slow", "mixed"]
    assert all(topology.name == name for name, topology in TOPOLOGIES.items())


def test_legacy_rows_are_owned_by_the_agent() -> None:
    owners = {name: topology.episode_owner for name, topology in TOPOLOGIES.items()}
    assert owners == {
        "native": "environment",
        "legacy": "agent",
        "counter": "agent",
        "slow": "environment",
        "mixed": "environment",
    }


def test_only_the_counter_exports_resources_state_and_runs_its_own_script() -> None:
    assert with_trait("resources_exported") == ["counter"]
    counter = TOPOLOGIES["counter"]
    assert (counter.script, counter.run_body) == (COUNTER_SCRIPT, counter_run_body)
    assert [counter.resources_state(rounds) for rounds in range(3)] == [{"count": 3}, {"count": 4}, {"count": 6}]
    assert TOPOLOGIES["native"].resources_state(1) is None
    assert [name for name, topology in TOPOLOGIES.items() if topology.script == WEATHER_SCRIPT] == [
        "native",
        "legacy",
        "slow",
        "mixed",
    ]


def test_legacy_rows_and_native_episodes_have_their_own_bodies() -> None:
    bodies = {name: topology.run_body for name, topology in TOPOLOGIES.items()}
    assert bodies["legacy"] is legacy_run_body
    assert all(bodies[name] is native_run_body for name in ("native", "slow", "mixed"))


def test_only_slow_has_a_judge_and_runs_in_two_verify_modes() -> None:
    assert with_trait("judge") == ["slow"]
    assert {name: topology.verify_modes for name, topology in TOPOLOGIES.items()} == {
        "native": ("wait",),
        "legacy": ("wait",),
        "counter": ("wait",),
        "slow": ("wait", "replay"),
        "mixed": ("wait",),
    }


def test_only_mixed_has_a_restart_environment() -> None:
    assert with_trait("restart_environment") == ["mixed"]


def test_an_uninterrupted_episode_earns_its_task_reward() -> None:
    rewards = {name: topology.reward(topology.script) for name, topology in TOPOLOGIES.items()}
    assert rewards == dict.fromkeys(TOPOLOGIES, 1.0)
    assert TOPOLOGIES["native"].reward(COUNTER_SCRIPT) == 0.0
    assert TOPOLOGIES["counter"].reward(WEATHER_SCRIPT) == 0.0


@pytest.mark.parametrize("topology", TOPOLOGIES.values(), ids=lambda topology: topology.name)
def test_the_model_reads_the_traits(topology: Topology) -> None:
    model = Model(topology=topology.name)  # type: ignore[arg-type]
    assert model.episode_owner == topology.episode_owner
    assert model.can_dispatch_restart() == topology.restart_environment
    assert bool(model.exports("resources")) is False  # nothing scoped yet, whatever the topology


def test_no_module_of_the_checker_compares_a_topology_name() -> None:
    """Code asks for a trait; a comparison with a topology's name is how traits got lost before the table."""
    comparison = re.compile(r"topology (==|!=|in|not in) ")
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if comparison.search(line)
    ]
    assert found == []


def test_a_native_run_is_one_an_environment_server_answers_with_an_episode_response() -> None:
    native = {name for name, topology in TOPOLOGIES.items() if topology.native_run}
    assert native == {"native", "slow", "mixed"}
    assert all("episode_id" in TOPOLOGIES[name].run_body("r0", 0) for name in native)
    assert not any("episode_id" in row.run_body("r0", 0) for row in TOPOLOGIES.values() if not row.native_run)
