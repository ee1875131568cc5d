"""The rewards and resources states the checker computes from a task and the script it pins (P3, P6), read from
the topology table as the checker reads them; the task names a rollout's `/run`s carry (P15's echo, P14)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from ckpt_model.model.abstract import abstract
from ckpt_model.model.contract import Model
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.protocol.gym_tasks import COUNTER_SCRIPT, WEATHER_SCRIPT, counter_after, counter_run_body
from ckpt_model.protocol.wire import EpisodeRequest, TaskId
from ckpt_model.trainer.task_names import TASK_NAMES


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


def test_every_attempt_of_a_rollout_names_the_task_it_was_dispatched_with() -> None:
    """The task drawn at dispatch is what each later `/run` of the rollout names (a start over, a restored
    continuation, a burned attempt), so the echo P15 compares is against what was sent; the abstract state leaves
    it out."""
    task = ("env.v1:set.a", "天気/サンフランシスコ")
    model, rollout = Model(topology="native").dispatch(task=task)
    assert abstract(model) == abstract(Model(topology="native").dispatch()[0])
    committed = model.prepare()[0].commit()[0].resume()
    restored = committed.crash().restore(committed.committed[0].checkpoint_id)[0]
    assert restored.current()[rollout].task == task
    assert restored.retire(rollout).start_over(rollout).current()[rollout].task == task
    failed = committed.crash().failed_restore(committed.committed[0].checkpoint_id)[0]
    assert {a.task for a in failed.attempts} == {task}
    body = TOPOLOGIES["native"].run_body(rollout, 1, task)
    assert body["task"]["task_id"] == {"taskset": "env.v1:set.a", "task_id": "天気/サンフランシスコ"}
    assert "task" not in TOPOLOGIES["legacy"].run_body(rollout, 1, task)


@settings(max_examples=200, database=None, derandomize=True)
@given(TASK_NAMES)
def test_drawn_task_names_are_non_empty_and_the_wire_takes_them(task: tuple[str, str]) -> None:
    EpisodeRequest.model_validate(TOPOLOGIES["native"].run_body("r0", 0, task))


def test_an_empty_task_name_is_refused_by_the_wire() -> None:
    for taskset, task_id in (("", "weather-sf"), ("example_single_tool_call:e2e", "")):
        with pytest.raises(ValueError, match="at least 1 character"):
            TaskId(taskset=taskset, task_id=task_id)
