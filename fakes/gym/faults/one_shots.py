"""Look-alike faults armed by name that each act once: the check, the disarming and the count under one lock,
called from the event loop and from worker threads alike (`fakes.gym.faults.lost_replies`, `fakes.gym.faults.hooks`)."""

from __future__ import annotations

import threading


class OneShots:
    """The names armed in one server among `known` (said as `what` in a refusal), and how many acted, shown under
    `counted` in `state()`."""

    def __init__(self, known: tuple[str, ...], what: str, counted: str) -> None:
        self._known = known
        self._what = what
        self._counted = counted
        self._armed: set[str] = set()
        self._acted = 0
        self._lock = threading.Lock()

    def arm(self, name: str) -> None:
        if name not in self._known:
            raise ValueError(f"no {self._what} {name!r}; known: {list(self._known)}")
        with self._lock:
            self._armed.add(name)

    def take(self, name: str) -> bool:
        """Whether `name` is armed; if so it is disarmed and counted (it acts once)."""
        with self._lock:
            if name not in self._armed:
                return False
            self._armed.discard(name)
            self._acted += 1
            return True

    def state(self) -> dict[str, object]:
        with self._lock:
            return {"armed": sorted(self._armed), self._counted: self._acted}
