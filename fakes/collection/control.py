"""The collector's side of the checkpoint control plane: find the participants, then prepare, commit, resume,
restore, retire and forget across them in Gym's order (reference sections 2 and 4).

Its own small client: `fakes` imports nothing of the checker, and a collection run must drive the servers through
the same wire routes a real controller uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import httpx

from fakes.collection.layout import Episode
from fakes.collection.tracing import ControllerTracing
from fakes.gym.protocol.wire import CHECKPOINT_ROUTE_PREFIX

PREPARE_ORDER = ("environment", "model", "agent", "resources")
RETIRE_ORDER = (("environment",), ("agent",), ("model", "resources"))
# Beyond a call's deadline, how long its reply may take to arrive.
CALL_MARGIN_S = 5.0
PROBE_TIMEOUT_S = 5.0

Reply = dict[str, Any]


class ControlFailed(RuntimeError):
    """A control call some participant refused or never answered; `failures` maps each to what happened."""

    def __init__(self, operation: str, failures: Mapping[str, str]) -> None:
        self.operation = operation
        self.failures = dict(failures)
        said = "; ".join(f"{name}: {why}" for name, why in sorted(failures.items()))
        super().__init__(f"{operation} failed: {said}")


@attrs.frozen
class Member:
    name: str
    kind: str
    url: str


class Control:
    """The deployment's participants and the coordination calls over them."""

    def __init__(
        self,
        servers: Mapping[str, str],
        token: str,
        clock: Callable[[], float] = time.time,
        tracing: ControllerTracing | None = None,
    ) -> None:
        self.token = token
        self.clock = clock
        self.tracing = tracing or ControllerTracing()
        self.http = httpx.Client(timeout=PROBE_TIMEOUT_S)
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="collection-control")
        self.members = self._discover(servers)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        self.tracing.close()

    def _discover(self, servers: Mapping[str, str]) -> tuple[Member, ...]:
        """Every server whose status route answers the bearer; one that answers 404 takes no part (a relay)."""
        found: list[Member] = []
        for name, url in sorted(servers.items()):
            response = self.http.get(f"{url.rstrip('/')}{CHECKPOINT_ROUTE_PREFIX}/status", headers=self._headers())
            if response.status_code == 404:
                continue
            if response.status_code != 200:
                raise ControlFailed("discover", {name: f"HTTP {response.status_code} {response.text[:200]}"})
            found.append(Member(name, str(response.json()["kind"]), url.rstrip("/")))
        if not found:
            raise ControlFailed("discover", {name: "not a participant" for name in servers})
        return tuple(sorted(found, key=lambda m: (PREPARE_ORDER.index(m.kind), m.name)))

    def of_kinds(self, kinds: Iterable[str]) -> list[Member]:
        wanted = set(kinds)
        return [member for member in self.members if member.kind in wanted]

    # --- coordination ---------------------------------------------------------------------------------------

    def prepare(self, checkpoint_id: str, deadline_ts: float) -> tuple[bool, dict[str, Reply]]:
        """Stage by stage in PREPARE_ORDER, stopping at the first stage not fully prepared: (prepared, replies)."""
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline_ts}
        replies: dict[str, Reply] = {}
        with self.tracing.coordinate("prepare", checkpoint_id):
            for kind in PREPARE_ORDER:
                with self.tracing.coordinate(f"prepare.{kind}", checkpoint_id):
                    stage = self._stage("prepare", self.of_kinds([kind]), body, deadline_ts)
                replies.update(stage)
                if any(reply.get("phase") != "prepared" for reply in stage.values()):
                    return False, replies
        return True, replies

    def commit(
        self, checkpoint_id: str, checkpoint_dir: str, scope: Sequence[Episode], deadline_ts: float
    ) -> dict[str, Reply]:
        with self.tracing.coordinate("commit", checkpoint_id):
            return self._stage(
                "commit", self.members, _scoped(checkpoint_id, checkpoint_dir, scope, deadline_ts), deadline_ts
            )

    def resume(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Reply]:
        """Reverse PREPARE_ORDER; every stage is tried, failures raised together."""
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline_ts}
        replies: dict[str, Reply] = {}
        failures: dict[str, str] = {}
        with self.tracing.coordinate("resume", checkpoint_id):
            for kind in reversed(PREPARE_ORDER):
                try:
                    replies.update(self._stage("resume", self.of_kinds([kind]), body, deadline_ts))
                except ControlFailed as exc:
                    failures.update(exc.failures)
        if failures:
            raise ControlFailed("resume", failures)
        return replies

    def restore(
        self, checkpoint_id: str, checkpoint_dir: str, scope: Sequence[Episode], deadline_ts: float
    ) -> dict[str, Reply]:
        with self.tracing.coordinate("restore", checkpoint_id):
            return self._stage(
                "restore", self.members, _scoped(checkpoint_id, checkpoint_dir, scope, deadline_ts), deadline_ts
            )

    def retire(self, checkpoint_id: str, episodes: Sequence[Episode], deadline_ts: float) -> dict[str, Reply]:
        body = {
            "checkpoint_id": checkpoint_id,
            "deadline_ts": deadline_ts,
            "episode_ids": [episode.wire() for episode in episodes],
        }
        return self._retire_order("retire", body, deadline_ts)

    def forget(self, checkpoint_id: str, rollout_ids: Iterable[str], deadline_ts: float) -> dict[str, Reply]:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline_ts, "rollout_ids": sorted(set(rollout_ids))}
        return self._retire_order("forget", body, deadline_ts)

    def _retire_order(self, operation: str, body: Reply, deadline_ts: float) -> dict[str, Reply]:
        replies: dict[str, Reply] = {}
        with self.tracing.coordinate(operation, str(body["checkpoint_id"])):
            for kinds in RETIRE_ORDER:
                replies.update(self._stage(operation, self.of_kinds(kinds), body, deadline_ts))
        return replies

    # --- transport ------------------------------------------------------------------------------------------

    def _stage(self, operation: str, members: Sequence[Member], body: Reply, deadline_ts: float) -> dict[str, Reply]:
        """POST to `members` at once, under the current span; raise with every failure once all have answered."""
        headers = {**self._headers(), **self.tracing.headers()}  # here: the pool's threads lack the context
        outcomes = list(
            self.pool.map(lambda member: self._post(member, operation, body, deadline_ts, headers), members)
        )
        failures = {m.name: outcome for m, outcome in zip(members, outcomes, strict=True) if isinstance(outcome, str)}
        if failures:
            raise ControlFailed(operation, failures)
        return {m.name: outcome for m, outcome in zip(members, outcomes, strict=True) if isinstance(outcome, dict)}

    def _post(
        self, member: Member, operation: str, body: Reply, deadline_ts: float, headers: Mapping[str, str]
    ) -> Reply | str:
        """The reply, or what went wrong in one line."""
        timeout_s = max(deadline_ts - self.clock(), 0.0) + CALL_MARGIN_S
        try:
            response = self.http.post(
                f"{member.url}{CHECKPOINT_ROUTE_PREFIX}/{operation}",
                json=body,
                headers=headers,
                timeout=timeout_s,
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return f"HTTP {response.status_code} {response.text[:300]}"
        reply = response.json()
        return reply if isinstance(reply, dict) else f"a reply that is not an object: {reply!r}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def _scoped(checkpoint_id: str, checkpoint_dir: str, scope: Sequence[Episode], deadline_ts: float) -> Reply:
    """The body of a commit or a restore: the checkpoint, its directory and the episodes in scope."""
    return {
        "checkpoint_id": checkpoint_id,
        "deadline_ts": deadline_ts,
        "checkpoint_dir": checkpoint_dir,
        "episode_ids": [episode.wire() for episode in scope],
    }
