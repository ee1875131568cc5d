"""Restart episodes and restart-only sessions, in process (reference 5.4, 8.1): what a checkpoint waits for,
exports and reports."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fakes.gym.config import ServerConfig
from fakes.gym.control.plane import ControlPlane
from fakes.gym.protocol.wire import EpisodeId
from fakes.gym.servers.agent import tools_server
from fakes.gym.servers.resources import ResourcesCore, ResourcesParticipant
from fakes.gym.servers.steps import Episode, EpisodeOwner

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("seed_request", "expected"),
    [
        ({"tool_accesses": [{"server": "restart_resources", "cookies": {}}]}, "restart_resources"),
        ({"tool_accesses": [{"cookies": {}}, {"server": "other"}]}, "other"),
        ({"tool_accesses": [{"server": ""}]}, "resources"),
        ({"tool_accesses": []}, "resources"),
        ({}, "resources"),
    ],
    ids=["named", "first-named", "empty-name", "no-access", "legacy"],
)
def test_a_sessions_tools_live_on_the_server_its_seed_names(seed_request: dict[str, Any], expected: str) -> None:
    assert tools_server(seed_request, "resources") == expected


def begin(owner: EpisodeOwner, rollout_id: str) -> Episode:
    return owner.begin(EpisodeId(rollout_id=rollout_id), "digest")


async def test_an_episode_becomes_a_restart_only_once_no_checkpoint_is_open() -> None:
    changed = asyncio.Event()
    owner = EpisodeOwner(notify=changed.set)
    episode = begin(owner, "r")
    owner.admission.clear()
    changed.clear()
    marking = asyncio.ensure_future(owner.mark_restart(episode))
    await changed.wait()  # the mark's first state change: it parks

    # Parked and not yet a restart: the checkpoint neither waits for it nor sees the restart set change.
    assert (episode.state, owner.blockers(), owner.restarts(), episode.restart) == ("parked", [], [], False)
    owner.admission.set()
    await marking
    assert (owner.restarts(), episode.restart, episode.state) == (["r"], True, "running")


@pytest.mark.parametrize("state", ["running", "wait_step", "replay_step", "parked"])
async def test_a_restart_never_blocks_and_is_never_exported(state: Any) -> None:
    owner = EpisodeOwner(notify=lambda: None)
    restart, continued = begin(owner, "restart"), begin(owner, "continued")
    await owner.mark_restart(restart)
    restart.state = continued.state = state

    assert owner.blockers() == (["continued"] if continued.blocking else [])
    assert owner.restarts() == ["restart"]
    assert [record["episode_id"]["rollout_id"] for record in owner.export(None)] == ["continued"]


def resources(mode: str) -> ResourcesParticipant:
    config = ServerConfig(name="restart_resources", role="resources", port=1, token="t", resources_mode=mode)
    core = ResourcesCore(config, notify=lambda: None)
    hooks = ResourcesParticipant(core, frozenset())
    core.plane = ControlPlane.from_config(hooks, config)
    return hooks


@pytest.mark.parametrize("mode", ["restart_only", "stateless"])
def test_a_restart_only_server_reports_every_live_session_as_a_restart_and_is_always_ready(mode: str) -> None:
    hooks = resources(mode)
    for key in ("r1-a2", "r0"):
        hooks.core._bind(f"session-{key}", EpisodeId.from_capture_key(key))
    hooks.core.inflight = 1

    report = hooks.report()
    if mode == "restart_only":
        assert (report.ready, report.restarts) == (True, ("r0", "r1-a2"))
    else:
        assert (report.ready, report.restarts) == (False, ())
    assert asyncio.run(hooks.export(None)) == []
