"""The topologies of Gym's suite, each as one record of its traits, in one table.

Code asks what a topology does (who owns its episodes, whether its resources server exports state, whether it
has a judge or a restart environment, which verify modes it runs), never which one it is: a new topology is a new
row here, not a new branch wherever a name used to be compared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import attrs

from ckpt_model.protocol.gym_tasks import (
    COUNTER_SCRIPT,
    WEATHER_SCRIPT,
    Script,
    TaskName,
    counter_reward,
    counter_run_body,
    counter_state,
    legacy_run_body,
    native_run_body,
    weather_reward,
)

EpisodeOwner = Literal["environment", "agent"]


class RunBody(Protocol):
    """The `/run` body of a topology's task: (rollout ID, attempt, the task's name or None for its own) -> body."""

    def __call__(self, rollout_id: str, attempt: int, task: TaskName | None = None) -> dict[str, Any]: ...


@attrs.frozen
class Topology:
    """One topology's traits: what the checker dispatches, pins, predicts and expects in it."""

    name: str
    # The server that holds episodes and lists them in its commit reply: the agent for legacy `/run` rows.
    episode_owner: EpisodeOwner
    # The policy's tool calls, pinned on the backend at the start of every example.
    script: Script
    # The `/run` body of the task: (rollout ID, attempt, task name) -> body.
    run_body: RunBody
    # The reward an uninterrupted episode earns under a pinned script, computed from the task (P3).
    reward: Callable[[Script], float]
    # What the resources server exports for an attempt after n tool rounds (P6); None: its sessions hold nothing.
    exported_state: Callable[[int], dict[str, Any]] | None = None
    # Verification asks a judge model on the backend, which the checker holds and releases like a policy call.
    judge: bool = False
    # A second environment, bound to a `restart_only` resources server, runs restarts (two participants per kind).
    restart_environment: bool = False
    # The verify modes the topology runs in; the first is its default.
    verify_modes: tuple[str, ...] = ("wait",)

    @property
    def native_run(self) -> bool:
        """`/run` goes to an environment server, which answers with an episode response (reference 5.2); else it
        is a legacy row for the agent, which answers with its verify response (5.3)."""
        return self.episode_owner == "environment"

    @property
    def resources_exported(self) -> bool:
        """The resources server exports each session's state with the checkpoint and restores it."""
        return self.exported_state is not None

    def resources_state(self, tool_rounds: int) -> dict[str, Any] | None:
        """The state the resources server must export for an attempt that ran `tool_rounds` tool rounds."""
        return None if self.exported_state is None else self.exported_state(tool_rounds)


TOPOLOGIES: Mapping[str, Topology] = {
    row.name: row
    for row in (
        Topology("native", "environment", WEATHER_SCRIPT, native_run_body, weather_reward),
        Topology("legacy", "agent", WEATHER_SCRIPT, legacy_run_body, weather_reward),
        # Legacy rows of Gym's counter example: the resources server exports each session's count.
        Topology("counter", "agent", COUNTER_SCRIPT, counter_run_body, counter_reward, exported_state=counter_state),
        # Native, with a verification that asks a judge: `wait` blocks a prepare, `replay` runs again after restore.
        Topology(
            "slow",
            "environment",
            WEATHER_SCRIPT,
            native_run_body,
            weather_reward,
            judge=True,
            verify_modes=("wait", "replay"),
        ),
        Topology("mixed", "environment", WEATHER_SCRIPT, native_run_body, weather_reward, restart_environment=True),
    )
}


# Every server that owns episodes in some topology, in the table's order (`ckpt-model audit --episode-owner`).
EPISODE_OWNERS: tuple[EpisodeOwner, ...] = tuple(dict.fromkeys(row.episode_owner for row in TOPOLOGIES.values()))
# Every verify mode some topology runs, in the table's order (the command line's choices).
VERIFY_MODES: tuple[str, ...] = tuple(dict.fromkeys(mode for row in TOPOLOGIES.values() for mode in row.verify_modes))
# The participant kinds whose servers run `server_workers` workers each (the policy model's are `policy_workers`).
SERVER_WORKER_KINDS: tuple[str, ...] = ("environment", "agent", "resources")
