"""Input rows, `/run` bodies and output rows of a collection run, in Gym's native and legacy formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from fakes.collection.config import LEGACY_ATTEMPT_KEY, LEGACY_ROLLOUT_KEY
from fakes.collection.layout import json_lines

NATIVE_ROLLOUT_KEY = "rollout_id"


class RowError(ValueError):
    """An input row the collector cannot send."""


@attrs.frozen
class InputRow:
    rollout_id: str
    row: dict[str, Any]

    def run_body(self, run_format: str, attempt: int) -> dict[str, Any]:
        """The `/run` body of this row's attempt: native `{episode_id, task}`, or the legacy row with its attempt."""
        if run_format == "native":
            return {"episode_id": {"rollout_id": self.rollout_id, "attempt": attempt}, "task": self.row["task"]}
        return {**self.row, LEGACY_ROLLOUT_KEY: self.rollout_id, LEGACY_ATTEMPT_KEY: attempt}


def read_inputs(path: Path, run_format: str) -> list[InputRow]:
    """Every row of the input file, each naming a rollout no other row names."""
    rows: list[InputRow] = []
    seen: set[str] = set()
    for number, row in enumerate(json_lines(path), 1):
        key = NATIVE_ROLLOUT_KEY if run_format == "native" else LEGACY_ROLLOUT_KEY
        rollout_id = row.get(key)
        if not isinstance(rollout_id, str) or not rollout_id:
            raise RowError(f"{path}:{number} has no {key}")
        if run_format == "native" and "task" not in row:
            raise RowError(f"{path}:{number} has no task")
        if rollout_id in seen:
            raise RowError(f"{path}:{number} names rollout {rollout_id!r} again")
        seen.add(rollout_id)
        rows.append(InputRow(rollout_id, row))
    return rows


def reward_of(reply: Any) -> float | None:
    """A native reply's `result.reward`, or a legacy reply's top-level `reward`; None for a failure."""
    if not isinstance(reply, dict):
        return None
    result = reply.get("result")
    value = result.get("reward") if isinstance(result, dict) else reply.get("reward")
    return float(value) if isinstance(value, int | float) else None


def output_row(rollout_id: str, attempt: int, reply: Any) -> str:
    return json.dumps(
        {LEGACY_ROLLOUT_KEY: rollout_id, LEGACY_ATTEMPT_KEY: attempt, "reward": reward_of(reply), "response": reply}
    )


def finished_rollouts(path: Path) -> set[str]:
    """The rollouts the output file already holds a row of."""
    return {str(row[LEGACY_ROLLOUT_KEY]) for row in json_lines(path) if LEGACY_ROLLOUT_KEY in row}
