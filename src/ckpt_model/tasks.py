"""Each topology's task as the state machine reads it, by topology name: one trait of
`ckpt_model.topologies.TOPOLOGIES` per function. The tasks themselves are `ckpt_model.gym_tasks` (the table is built
from them, so they live apart from these views); the two `scale.py` imports from here are re-exported.
"""

from __future__ import annotations

from typing import Any

from ckpt_model.gym_tasks import WEATHER_SCRIPT as WEATHER_SCRIPT
from ckpt_model.gym_tasks import Script
from ckpt_model.gym_tasks import native_run_body as native_run_body
from ckpt_model.topologies import TOPOLOGIES


def run_body(topology: str, rollout_id: str, attempt: int) -> dict[str, Any]:
    """The `/run` body of a topology's task."""
    return TOPOLOGIES[topology].run_body(rollout_id, attempt)


def script_for(topology: str) -> Script:
    """The script the checker pins on the backend for a topology's task."""
    return TOPOLOGIES[topology].script


def resources_state(topology: str, tool_rounds: int) -> dict[str, Any] | None:
    """The state the resources server must export for an attempt that ran `tool_rounds` tool rounds (None: its
    sessions hold nothing to export, as the weather server's): the counter's `{"count": n}`."""
    return TOPOLOGIES[topology].resources_state(tool_rounds)


def expected_reward(topology: str, script: Script) -> float:
    """The reward an uninterrupted episode earns, computed by the checker from the task and the pinned script,
    not read from the system."""
    return TOPOLOGIES[topology].reward(script)
