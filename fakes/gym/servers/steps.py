"""Episodes run as steps with boundaries between them (reference 5.4).

An owner (the environment server, or the agent for legacy `/run`) records a boundary, a JSON dict naming the next
step and what it needs, after every completed step. While admission is closed an episode parks at its next
boundary; a `wait` step blocks a checkpoint until it ends, a `replay` step does not (the episode counts as parked
at the boundary before it and the step re-runs after a crash). Parked time does not count against the episode
deadline. A restart (an episode a resources server cannot capture) never blocks a checkpoint and is never
exported; it still parks at its boundaries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from typing import Any, Literal

import attrs

from fakes.gym.protocol.errors import ControlError
from fakes.gym.protocol.wire import EpisodeId

EpisodeState = Literal["running", "wait_step", "replay_step", "parked"]
StepMode = Literal["wait", "replay"]
BLOCKING_STATES = frozenset({"running", "wait_step"})


@attrs.define(eq=False)
class Episode:
    """One live attempt: where it stands and the boundary a checkpoint would export."""

    episode_id: EpisodeId
    task_digest: str
    boundary: dict[str, Any] | None = None
    state: EpisodeState = "running"
    task: asyncio.Task[Any] | None = None
    finishing: bool = False
    retiring: bool = False
    restart: bool = False
    timeout_s: float = 600.0
    # The episode's budget: time used while it was charged, and since when it is charged again (None: suspended,
    # parked or in a replay step under an open checkpoint; reference 5.4).
    used_s: float = 0.0
    active_since: float | None = attrs.field(factory=time.monotonic)

    def used_now(self) -> float:
        """The time this episode has used of its budget, up to now."""
        charged = 0.0 if self.active_since is None else time.monotonic() - self.active_since
        return self.used_s + charged

    def suspend(self) -> None:
        """Stop charging the episode's time (parked, or in a replay step while a checkpoint is open)."""
        if self.active_since is not None:
            self.used_s += time.monotonic() - self.active_since
            self.active_since = None

    def rearm(self) -> None:
        """Charge the episode's time again (the checkpoint re-opened, or it woke from its park)."""
        if self.active_since is None:
            self.active_since = time.monotonic()

    @property
    def key(self) -> str:
        return self.episode_id.capture_key

    @property
    def blocking(self) -> bool:
        """Restarts never block: a checkpoint neither exports them nor waits for them."""
        return not self.restart and (self.retiring or self.state in BLOCKING_STATES)

    def record(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id.wire(), "task_digest": self.task_digest, "boundary": self.boundary}


class EpisodeOwner:
    """Tracks live episodes and restored-pending records; parks episodes while admission is closed."""

    def __init__(self, notify: Callable[[], None], *, counts_parked_time: bool = False) -> None:
        self._notify = notify
        self.admission = asyncio.Event()
        self.admission.set()
        # Planted fault `parked_time_counts`: the budget is never suspended, so time parked for a checkpoint counts.
        self._counts_parked_time = counts_parked_time
        self.episodes: dict[str, Episode] = {}
        self.restored: dict[str, dict[str, Any]] = {}

    # -- lifecycle -------------------------------------------------------------------------------------------

    def begin(self, episode_id: EpisodeId, digest: str, timeout_s: float = 600.0) -> Episode:
        """Register a new attempt, picking up its restored record if a restore installed one."""
        key = episode_id.capture_key
        if key in self.episodes:
            raise ControlError(f"episode {key} is already running; a duplicate /run owns nothing")
        boundary = None
        restored = self.restored.get(key)
        if restored is not None:
            if restored["task_digest"] != digest:
                raise ControlError(f"restored episode {key} was checkpointed for a different task; send the same task")
            boundary = restored["boundary"]
            del self.restored[key]
        episode = Episode(episode_id=episode_id, task_digest=digest, boundary=boundary, timeout_s=timeout_s)
        self.episodes[key] = episode
        self._notify()
        return episode

    def end(self, episode: Episode) -> None:
        if self.episodes.get(episode.key) is episode:
            del self.episodes[episode.key]
        self._notify()

    # -- admission -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close admission: from now on episodes park at their next boundary, and one in a replay step has its
        budget suspended where it stands (the step runs on; reference 5.4)."""
        self.admission.clear()
        for episode in self.episodes.values():
            if episode.state == "replay_step":
                self._suspend(episode)

    def open(self) -> None:
        """Re-open admission: parked episodes wake (and re-arm their budgets), replay steps are charged again."""
        self.admission.set()
        for episode in self.episodes.values():
            if episode.state == "replay_step":
                episode.rearm()

    def _suspend(self, episode: Episode) -> None:
        if not self._counts_parked_time:
            episode.suspend()

    # -- steps and boundaries ---------------------------------------------------------------------------------

    async def boundary(self, episode: Episode, boundary: dict[str, Any]) -> None:
        """Record that `boundary` is where the episode would continue from; park there while closed."""
        episode.boundary = boundary
        await self._park_while_closed(episode)

    async def step(self, episode: Episode, mode: StepMode, work: Awaitable[Any]) -> Any:
        """Run one step; a replay step that raises while closed drops the boundary (restart from input)."""
        self._set_state(episode, "wait_step" if mode == "wait" else "replay_step")
        if mode == "replay" and not self.admission.is_set():
            self._suspend(episode)
        try:
            result = await work
        except Exception:
            if mode == "replay" and not self.admission.is_set():
                episode.boundary = None
            raise
        finally:
            episode.rearm()
        self._set_state(episode, "running")
        return result

    async def mark_restart(self, episode: Episode) -> None:
        """Make the episode a restart once no checkpoint is open (it waits parked, as at a boundary), so the
        exported set and the restart set never change during a checkpoint (reference 5.4)."""
        await self._park_while_closed(episode)
        episode.restart = True
        self._notify()

    async def _park_while_closed(self, episode: Episode) -> None:
        if self.admission.is_set():
            return
        self._set_state(episode, "parked")
        self._suspend(episode)
        while not self.admission.is_set():
            await self.admission.wait()
        episode.rearm()
        self._set_state(episode, "running")

    def _set_state(self, episode: Episode, state: EpisodeState) -> None:
        episode.state = state
        self._notify()

    # -- checkpoint views ---------------------------------------------------------------------------------------

    def blockers(self) -> list[str]:
        return [key for key, episode in self.episodes.items() if episode.blocking]

    def restarts(self) -> list[str]:
        """Capture keys of the live restarts, sorted."""
        return sorted(key for key, episode in self.episodes.items() if episode.restart)

    def export(self, scope_keys: AbstractSet[str] | None) -> list[dict[str, Any]]:
        """Every live episode but restarts, plus restored-pending records the scope carries forward."""
        records = [e.record() for e in self.episodes.values() if not (e.retiring or e.restart)]
        for key, record in sorted(self.restored.items()):
            if scope_keys is not None and key in scope_keys:
                records.append(record)
        return records

    def install(self, records: list[dict[str, Any]]) -> list[str]:
        """Install every record under its next attempt as restored-pending."""
        installed: dict[str, dict[str, Any]] = {}
        for record in records:
            next_id = EpisodeId(**record["episode_id"]).next_attempt()
            installed[next_id.capture_key] = {**record, "episode_id": next_id.wire()}
        self.restored.update(installed)
        self._notify()
        return sorted(installed)

    def delete_restored(self, keep: AbstractSet[str]) -> None:
        for key in [key for key in self.restored if key not in keep]:
            del self.restored[key]
        self._notify()

    async def retire(self, covered: Callable[[EpisodeId], bool]) -> None:
        """Stop every covered episode (cancel once; wait for final cleanup), then drop covered restored records."""
        victims = [episode for episode in self.episodes.values() if covered(episode.episode_id)]
        for episode in victims:
            episode.retiring = True
            if episode.task is not None and not episode.finishing:
                episode.task.cancel()
        self._notify()
        for episode in victims:
            if episode.task is not None:
                await asyncio.gather(episode.task, return_exceptions=True)
            self.end(episode)
        for key in [key for key in self.restored if covered(EpisodeId.from_capture_key(key))]:
            del self.restored[key]
        self._notify()

    def watch_deadline(self, episode: Episode) -> asyncio.Task[None]:
        """Cancel the episode once it has used its budget: the time it ran, not the time it was parked or in a
        replay step while a checkpoint was open.

        It sleeps the whole remaining time, then looks again: charged time never outpaces the clock, so it never
        wakes late, and time suspended meanwhile only makes it sleep again. (Waking every second instead costs a
        server with thousands of episodes in flight thousands of wake-ups a second.) A clock that jumps forward
        (`fakes.clock`) wakes it at the loop's next turn."""

        async def watchdog() -> None:
            while True:
                remaining_s = episode.timeout_s - episode.used_now()
                if remaining_s <= 0:
                    if episode.task is not None and not episode.finishing:
                        episode.task.cancel(msg="Episode timed out")
                    return
                await asyncio.sleep(remaining_s)

        return asyncio.get_running_loop().create_task(watchdog())
