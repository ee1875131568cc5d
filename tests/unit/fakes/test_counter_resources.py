"""The counter resources server's checkpoint hooks (mode `exported`, reference 8.1 and 8.4), in process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fakes.gym.config import ServerConfig
from fakes.gym.control.plane import ControlPlane
from fakes.gym.protocol.errors import CheckpointStateError
from fakes.gym.protocol.wire import EpisodeId
from fakes.gym.servers.resources import ResourcesCore, ResourcesParticipant


def participant(faults: frozenset[str] = frozenset()) -> ResourcesParticipant:
    config = ServerConfig(name="resources", role="resources", port=1, token="t", resources_mode="exported")
    core = ResourcesCore(config, notify=lambda: None)
    hooks = ResourcesParticipant(core, faults)
    core.plane = ControlPlane.from_config(hooks, config)  # export asks it for retired marks
    return hooks


def record(rollout: str, state: Any) -> dict[str, Any]:
    return {"episode_id": {"rollout_id": rollout, "attempt": 0}, "session_id": f"s-{rollout}", "state": state}


@pytest.mark.parametrize("state", [{"count": True}, {"count": "4"}, {"count": 4.0}, {}, None, [4]])
def test_a_state_that_is_not_an_integer_count_is_invalid_checkpoint_state(state: Any) -> None:
    with pytest.raises(CheckpointStateError, match="invalid counter state"):
        participant().validate_record(record("r0", state))


def test_one_invalid_state_installs_nothing() -> None:
    hooks = participant()
    records = [record("r0", {"count": 4}), record("r1", {"count": False})]
    with pytest.raises(CheckpointStateError):
        asyncio.run(hooks.install(records, [EpisodeId(rollout_id="r0"), EpisodeId(rollout_id="r1")]))
    assert hooks.core.sessions == {}


def test_a_restore_installs_every_count_under_the_next_attempt_and_a_commit_exports_it_again() -> None:
    hooks = participant()
    records = [record("r0", {"count": 4}), record("r1", {"count": 6})]
    installed = asyncio.run(hooks.install(records, [EpisodeId(rollout_id="r0"), EpisodeId(rollout_id="r1")]))

    assert installed == ["r0-a1", "r1-a1"]
    sessions = {
        s.session_id: (s.episode_id.capture_key, s.count, s.restored_pending) for s in hooks.core.sessions.values()
    }
    assert sessions == {"s-r0": ("r0-a1", 4, True), "s-r1": ("r1-a1", 6, True)}
    exported = asyncio.run(hooks.export([EpisodeId(rollout_id="r0", attempt=1)]))
    assert exported == [{"episode_id": {"rollout_id": "r0", "attempt": 1}, "session_id": "s-r0", "state": {"count": 4}}]


def test_the_planted_fault_skips_the_install() -> None:
    hooks = participant(frozenset({"resources_restore_skipped"}))
    installed = asyncio.run(hooks.install([record("r0", {"count": 4})], [EpisodeId(rollout_id="r0")]))
    assert (installed, hooks.core.sessions) == ([], {})
