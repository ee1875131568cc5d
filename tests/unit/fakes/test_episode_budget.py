"""An episode's budget counts the time it runs, never the time it waits out a checkpoint (reference 5.4), and the
libfaketime environment that lets time pass for a server (`fakes.clock`)."""

from __future__ import annotations

import asyncio

import pytest

from fakes import clock
from fakes.gym.protocol.wire import EpisodeId
from fakes.gym.servers.steps import Episode, EpisodeOwner


def owner_with_one_episode(counts_parked_time: bool = False) -> tuple[EpisodeOwner, str, asyncio.Event]:
    """An owner of one episode, and an event it sets on every change of an episode's state (its `notify`)."""
    changed = asyncio.Event()
    owner = EpisodeOwner(notify=changed.set, counts_parked_time=counts_parked_time)
    episode = owner.begin(EpisodeId(rollout_id="r0"), "digest")
    return owner, episode.key, changed


async def parked_at_its_boundary(episode: Episode, changed: asyncio.Event) -> None:
    """Until the episode's task has parked at its boundary: woken by the owner's every change, never by a timer."""
    while episode.state != "parked":
        changed.clear()
        await changed.wait()


def test_a_replay_step_under_an_open_checkpoint_is_not_charged() -> None:
    async def scenario() -> tuple[float, float, float]:
        owner, key, _ = owner_with_one_episode()
        episode = owner.episodes[key]
        started = asyncio.Event()
        finish = asyncio.Event()

        async def work() -> None:
            started.set()
            await finish.wait()

        step = asyncio.create_task(owner.step(episode, "replay", work()))
        await started.wait()
        owner.close()
        closed_at = episode.used_now()
        await asyncio.sleep(0.05)
        while_closed = episode.used_now() - closed_at
        owner.open()
        await asyncio.sleep(0.05)
        after_open = episode.used_now() - closed_at - while_closed
        finish.set()
        await step
        return closed_at, while_closed, after_open

    _, while_closed, after_open = asyncio.run(scenario())
    assert while_closed == 0.0
    assert after_open >= 0.04


def test_a_parked_episode_is_not_charged_until_it_wakes() -> None:
    async def scenario() -> tuple[float, float]:
        owner, key, changed = owner_with_one_episode()
        episode = owner.episodes[key]
        owner.close()
        parked = asyncio.create_task(owner.boundary(episode, {"next": "seed"}))
        await parked_at_its_boundary(episode, changed)
        at_park = episode.used_now()
        await asyncio.sleep(0.05)
        while_parked = episode.used_now() - at_park
        owner.open()
        await parked
        return at_park, while_parked

    _, while_parked = asyncio.run(scenario())
    assert while_parked == 0.0


def test_the_planted_fault_charges_the_time_parked() -> None:
    async def scenario() -> float:
        owner, key, changed = owner_with_one_episode(counts_parked_time=True)
        episode = owner.episodes[key]
        owner.close()
        parked = asyncio.create_task(owner.boundary(episode, {"next": "seed"}))
        await parked_at_its_boundary(episode, changed)
        at_park = episode.used_now()
        await asyncio.sleep(0.05)
        charged = episode.used_now() - at_park
        owner.open()
        await parked
        return charged

    assert asyncio.run(scenario()) >= 0.04


@pytest.mark.skipif(clock.library() is None, reason="needs Debian's libfaketime (apt-get install faketime)")
@pytest.mark.parametrize(("monotonic", "faked"), [(False, "1"), (True, "0")])
def test_time_jumps_fake_the_monotonic_clock_too(monotonic: bool, faked: str) -> None:
    env = clock.preloaded_env({"PATH": "/usr/bin"}, monotonic=monotonic)
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == faked
    assert env["FAKETIME"] == "+0"
    assert clock.library() in env["LD_PRELOAD"]


def test_without_libfaketime_nothing_is_preloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "library", lambda: None)
    assert clock.preloaded_env({"PATH": "/usr/bin"}, monotonic=True) == {"PATH": "/usr/bin"}
