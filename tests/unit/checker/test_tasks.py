"""The rewards and resources states the checker computes from a task and the script it pins (P3, P6), read from
the topology table as the checker reads them."""

from __future__ import annotations

from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.protocol.gym_tasks import COUNTER_SCRIPT, WEATHER_SCRIPT, counter_after, counter_run_body


def script_for(topology: str) -> tuple:
    return TOPOLOGIES[topology].script


def expected_reward(topology: str, script: tuple) -> float:
    return TOPOLOGIES[topology].reward(script)


def resources_state(topology: str, tool_rounds: int) -> object:
    return TOPOLOGIES[topology].resources_state(tool_rounds)


def run_body(topology: str, rollout_id: str, attempt: int) -> dict:
    return TOPOLOGIES[topology].run_body(rollout_id, attempt)


def test_each_topology_pins_its_own_script() -> None:
    assert script_for("counter") == COUNTER_SCRIPT
    assert [script_for(t) for t in ("native", "legacy", "slow")] == [WEATHER_SCRIPT] * 3


def test_the_counter_reaches_its_expected_count_only_with_both_increments() -> None:
    assert [counter_after(COUNTER_SCRIPT, rounds) for rounds in range(3)] == [3, 4, 6]
    assert expected_reward("counter", COUNTER_SCRIPT) == 1.0
    assert expected_reward("counter", COUNTER_SCRIPT[:1]) == 0.0
    doubled = ({"name": "increment_counter", "arguments": {"count": 2}},) * 2
    assert expected_reward("counter", doubled) == 0.0


def test_a_weather_episode_earns_its_reward_only_when_the_script_calls_get_weather() -> None:
    assert expected_reward("native", WEATHER_SCRIPT) == 1.0
    assert expected_reward("legacy", ()) == 0.0
    assert expected_reward("native", COUNTER_SCRIPT) == 0.0


def test_only_the_counter_exports_resources_state() -> None:
    assert resources_state("counter", 1) == {"count": 4}
    assert resources_state("native", 1) is None


def test_a_counter_row_is_a_legacy_row_with_its_counts() -> None:
    body = run_body("counter", "r0", 1)
    assert body == counter_run_body("r0", 1)
    assert (body["initial_count"], body["expected_count"], body["_ng_attempt_index"]) == (3, 6, 1)
    assert [tool["name"] for tool in body["responses_create_params"]["tools"]] == [
        "increment_counter",
        "get_counter_value",
    ]
