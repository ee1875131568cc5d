"""The look-alike's native `/run` takes any non-empty task name and refuses an empty one, as nemo-gym 0.7.0's
`TaskId` does."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fakes.gym.protocol.wire import EpisodeRequest


def run_body(taskset: str, task_id: str) -> dict[str, object]:
    task = {"task_id": {"taskset": taskset, "task_id": task_id}, "task_input": {}}
    return {"episode_id": {"rollout_id": "r0", "attempt": 0}, "task": task}


@pytest.mark.parametrize(
    ("taskset", "task_id"), [("ünï-env:天気", "task 1"), ("no-colon", " "), ("a:b:c", "z" * 500), (":", "x\n")]
)
def test_any_non_empty_task_name_is_taken(taskset: str, task_id: str) -> None:
    request = EpisodeRequest.model_validate(run_body(taskset, task_id))
    assert (request.task.task_id.taskset, request.task.task_id.task_id) == (taskset, task_id)


@pytest.mark.parametrize(("taskset", "task_id"), [("", "weather-sf"), ("example_single_tool_call:e2e", "")])
def test_an_empty_task_name_is_refused(taskset: str, task_id: str) -> None:
    with pytest.raises(ValidationError, match="at least 1 character"):
        EpisodeRequest.model_validate(run_body(taskset, task_id))
