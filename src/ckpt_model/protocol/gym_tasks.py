"""The tasks of Gym's suite the controller dispatches: the weather episode, native and legacy, and the counter row
(reference 5.2, 5.3, 8.4, 9.4): their `/run` bodies, the scripts the checker pins, their rewards and exported
state. `ckpt_model.model.topologies` says which topology runs which.

An uninterrupted native weather episode makes two model calls with 2 and 4 messages; a legacy row's calls have
1 and 3 messages (the row has no developer message). A counter row is a legacy row whose resources session counts:
seeded at 3, the policy increments it by 1 and then by 2 (its calls have 1, 3 and 5 messages), and verification
rewards a count of 6, so only a session whose count survived a crash (4 after the first increment) earns 1.0.
"""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name."}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
DEVELOPER_MESSAGE = {"role": "developer", "content": "You are a helpful assistant. Use tools when needed."}
USER_MESSAGE = {"role": "user", "content": "What is the weather in SF?"}


# A task's name, `(taskset, task_id)`: the `task.task_id` of a native `/run`, which its reply echoes.
TaskName = tuple[str, str]
WEATHER_TASK: TaskName = ("example_single_tool_call:e2e", "weather-sf")


def task_id_wire(task: TaskName | None) -> dict[str, str]:
    """`task.task_id` of a native `/run` naming `task` (None: the weather task's own name)."""
    taskset, task_id = task or WEATHER_TASK
    return {"taskset": taskset, "task_id": task_id}


def weather_task(task: TaskName | None = None) -> dict[str, Any]:
    """`task` of a native `/run`: the weather episode, named `task` (None: taskset `example_single_tool_call:e2e`,
    task `weather-sf`). The protocol sets only that both names are non-empty; the episode is the same whatever
    its name."""
    return {
        "task_id": task_id_wire(task),
        "task_input": {
            "responses_create_params": {"input": [DEVELOPER_MESSAGE, USER_MESSAGE], "tools": [WEATHER_TOOL]},
            "task_data": {},
        },
    }


def native_run_body(rollout_id: str, attempt: int, task: TaskName | None = None) -> dict[str, Any]:
    return {"episode_id": {"rollout_id": rollout_id, "attempt": attempt}, "task": weather_task(task)}


def legacy_run_body(rollout_id: str, attempt: int, task: TaskName | None = None) -> dict[str, Any]:
    """A legacy `/run` row: the agent holds the episode, keyed by the logical rollout. A row names no task
    (`task` is left out)."""
    return {
        "responses_create_params": {"input": [USER_MESSAGE], "tools": [WEATHER_TOOL]},
        "_ng_rollout_id": rollout_id,
        "_ng_attempt_index": attempt,
    }


COUNTER_INITIAL = 3
COUNTER_EXPECTED = 6
INCREMENT_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "increment_counter",
    "description": "Add count to the session's counter.",
    "parameters": {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
        "additionalProperties": False,
    },
    "strict": True,
}
GET_COUNTER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_counter_value",
    "description": "Read the session's counter.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    "strict": True,
}
COUNTER_USER_MESSAGE = {"role": "user", "content": "Add 1, then add 2 to the counter."}


def counter_run_body(rollout_id: str, attempt: int, task: TaskName | None = None) -> dict[str, Any]:
    """A legacy `/run` row of Gym's counter example: the seed sets 3, verification expects 6 (it names no task:
    `task` is left out)."""
    return {
        "responses_create_params": {"input": [COUNTER_USER_MESSAGE], "tools": [INCREMENT_TOOL, GET_COUNTER_TOOL]},
        "initial_count": COUNTER_INITIAL,
        "expected_count": COUNTER_EXPECTED,
        "_ng_rollout_id": rollout_id,
        "_ng_attempt_index": attempt,
    }


# The backend's script, pinned by the checker at the start of every example: the policy's tool calls in order.
Script = tuple[dict[str, Any], ...]
WEATHER_SCRIPT: Script = ({"name": "get_weather", "arguments": {"city": "SF"}},)
# Gym's `COUNTER_SCRIPT`: 3 + 1 + 2 = 6.
COUNTER_SCRIPT: Script = (
    {"name": "increment_counter", "arguments": {"count": 1}},
    {"name": "increment_counter", "arguments": {"count": 2}},
)


def counter_after(script: Script, tool_rounds: int) -> int:
    """The counter task's count once the first `tool_rounds` scripted calls ran: the seed plus their increments.
    What the resources server must export for an attempt at that boundary, and restore with it (P6)."""
    done = script[:tool_rounds]
    return COUNTER_INITIAL + sum(call["arguments"]["count"] for call in done if call["name"] == INCREMENT_TOOL["name"])


def counter_state(tool_rounds: int) -> dict[str, Any]:
    """What the counter's resources server exports for an attempt that ran `tool_rounds` tool rounds (P6)."""
    return {"count": counter_after(COUNTER_SCRIPT, tool_rounds)}


def weather_reward(script: Script) -> float:
    """Gym's weather verifier rewards a response that calls `get_weather`, which the task offers: 1.0 exactly
    when the script calls it. The policy makes exactly the scripted tool calls, and the agent runs them."""
    return 1.0 if any(call["name"] == WEATHER_TOOL["name"] for call in script) else 0.0


def counter_reward(script: Script) -> float:
    """1.0 exactly when the seed plus the script's increments reach `expected_count`."""
    return 1.0 if counter_after(script, len(script)) == COUNTER_EXPECTED else 0.0
