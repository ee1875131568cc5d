"""Retired attempts (reference section 10): a retire marks them before it stops anything, so refusal starts at
once, and the marks last until a forget. Retiring (r, a) covers every attempt up to a of rollout r."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fakes.gym.protocol.wire import EpisodeId


def covers(retired: list[EpisodeId]) -> Any:
    """Retiring (r, a) covers every attempt <= a of rollout r."""
    marks = {}
    for episode_id in retired:
        marks[episode_id.rollout_id] = max(marks.get(episode_id.rollout_id, -1), episode_id.attempt)
    return lambda e: e.attempt <= marks.get(e.rollout_id, -1)


class RetiredAttempts:
    """Per rollout, the highest retired attempt: refusal starts before retire stops anything, ends at forget."""

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, episode_ids: Iterable[EpisodeId]) -> None:
        """Marks only go up, so a retire of an earlier attempt never re-admits a later retired one."""
        for episode_id in episode_ids:
            previous = self._marks.get(episode_id.rollout_id, -1)
            self._marks[episode_id.rollout_id] = max(previous, episode_id.attempt)

    def is_retired(self, episode_id: EpisodeId) -> bool:
        mark = self._marks.get(episode_id.rollout_id)
        return mark is not None and episode_id.attempt <= mark

    def forget(self, rollout_ids: Iterable[str]) -> None:
        for rollout_id in rollout_ids:
            self._marks.pop(rollout_id, None)

    def marks(self) -> dict[str, int]:
        """Per rollout, the highest retired attempt: what a joining worker of a multi-worker server starts with."""
        return dict(self._marks)
