"""The tasks the controller dispatches: Gym's weather episode, native and legacy (reference 5.2, 5.3, 9.4).

An uninterrupted native weather episode makes two model calls with 2 and 4 messages; a legacy row's calls have
1 and 3 messages (the row has no developer message).
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


def weather_task() -> dict[str, Any]:
    """`task` of a native `/run`: taskset `example_single_tool_call:e2e`, task `weather-sf`."""
    return {
        "task_id": {"taskset": "example_single_tool_call:e2e", "task_id": "weather-sf"},
        "task_input": {
            "responses_create_params": {"input": [DEVELOPER_MESSAGE, USER_MESSAGE], "tools": [WEATHER_TOOL]},
            "task_data": {},
        },
    }


def native_run_body(rollout_id: str, attempt: int) -> dict[str, Any]:
    return {"episode_id": {"rollout_id": rollout_id, "attempt": attempt}, "task": weather_task()}


def legacy_run_body(rollout_id: str, attempt: int) -> dict[str, Any]:
    """A legacy `/run` row: the agent holds the episode, keyed by the logical rollout."""
    return {
        "responses_create_params": {"input": [USER_MESSAGE], "tools": [WEATHER_TOOL]},
        "_ng_rollout_id": rollout_id,
        "_ng_attempt_index": attempt,
    }


# The backend's script, pinned by the checker at the start of every example: the policy's one tool call.
WEATHER_SCRIPT: tuple[dict[str, Any], ...] = ({"name": "get_weather", "arguments": {"city": "SF"}},)


def task_tools(topology: str) -> tuple[str, ...]:
    """Names of the tools the dispatched task offers the policy (both weather tasks offer `get_weather`)."""
    del topology  # native, legacy and slow rows all carry the one weather tool
    return (WEATHER_TOOL["name"],)


def expected_reward(tools: tuple[str, ...], script: tuple[dict[str, Any], ...]) -> float:
    """The reward an uninterrupted weather episode earns, computed by the checker, not read from the system.

    Gym's weather verifier rewards a response that calls `get_weather`; the policy makes exactly the scripted
    tool calls, and the agent runs those the task offers. So the reward is 1.0 exactly when the script calls
    `get_weather` and the task offers it."""
    offered = {call["name"] for call in script} & set(tools)
    return 1.0 if "get_weather" in offered else 0.0
