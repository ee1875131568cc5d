"""The resources server: Gym's weather example (`get_weather`, mode `stateless`) with session tracking, or, in
mode `exported`, Gym's counter example (`example_session_state_mgmt`, reference 8.4), whose sessions hold state a
continuation needs.

In the slow topology its `/verify` asks a judge model on the backend first (`Judge`): a verification step that
takes as long as the checker says, since the judge call waits at the backend's gate like a policy call. The
verify mode (`wait` or `replay`) is reported on every seed reply.

Sessions are bound to the episode whose `/seed_session` created them (the rollout path prefix names it) and
ended by `/verify` or `/close_session`. While a checkpoint is open every request except replayable verification
waits for re-open instead of failing (reference 8.2); retire refuses a covered session's requests until forget.

In mode `restart_only` (Gym's `restart_only_server`, the weather tools) the server cannot capture its sessions:
seed replies say `x-ng-checkpoint-restart: 1`, so each episode starts over after a crash; every live session's
episode is reported as a restart; only seeds wait while a checkpoint is open; it exports nothing (reference 8.1).

The counter: a seed sets the session's count to `initial_count`, `/increment_counter {count}` adds, and `/verify`
rewards 1.0 when the count equals `expected_count`. A session nobody seeded counts from 0, as Gym's does. A commit
exports `{"count": n}` per session; a restore validates every state before it installs any.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from typing import Any

import attrs
import httpx
from fastapi import FastAPI, Request, Response

from fakes.backend import CALL_KIND_HEADER, CAPTURE_KEY_HEADER, CLIENT_GONE_STATUS
from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import PrepareReport, ServerPlane
from fakes.gym.control.retired import covers
from fakes.gym.protocol.errors import (
    CheckpointStateError,
    ControlError,
    RetireIncompleteError,
    StaleAttemptError,
    install_error_handlers,
)
from fakes.gym.protocol.http import (
    ClientGone,
    RolloutPrefixMiddleware,
    lifespan_with_client,
    post_json,
    rollout_key,
    unless_client_gone,
)
from fakes.gym.protocol.wire import RESTART_HEADER, EpisodeId
from fakes.gym.servers.single_process import single_process_app

SESSION_COOKIE = "resources_session_id"


@attrs.define(eq=False)
class ResourcesSession:
    session_id: str
    episode_id: EpisodeId
    inflight: int = 0
    restored_pending: bool = False
    # The counter's state (mode `exported`); None until seeded or restored, which a tool call reads as 0.
    count: int | None = None


class ResourcesCore:
    """Session bookkeeping and the admission every data-plane request passes."""

    def __init__(self, config: ServerConfig, notify: Any) -> None:
        self.mode = config.resources_mode
        self.restart_only = config.resources_mode == "restart_only"
        self.verify_mode = config.verify_mode
        self.checks_only_session_cookies = "resources_checks_only_session_cookies" in config.faults
        self._notify_control_plane = notify
        self._change = asyncio.Event()
        self.admission = asyncio.Event()
        self.admission.set()
        self.sessions: dict[str, ResourcesSession] = {}
        self.retired_sessions: dict[str, EpisodeId] = {}
        self.unfreed: set[str] = set()
        self.inflight = 0
        self.served = False
        self.plane: ServerPlane | None = None

    def notify(self) -> None:
        self._change.set()
        self._notify_control_plane()

    async def wait_change(self) -> None:
        """Return at the next state change (callers re-check their condition in a loop)."""
        self._change.clear()
        await self._change.wait()

    def _retired(self, episode_id: EpisodeId) -> bool:
        assert self.plane is not None
        return self.plane.retired.is_retired(episode_id)

    @contextlib.asynccontextmanager
    async def admit(
        self, request: Request, *, replayable: bool = False, seed: bool = False
    ) -> AsyncIterator[ResourcesSession | None]:
        """Refuse retired work, wait while closed (seeds always; in mode `restart_only` nothing else), count the
        request while it runs."""
        key = rollout_key(request.state)
        episode_id = EpisodeId.from_capture_key(key) if key else None
        session_id = request.cookies.get(SESSION_COOKIE)
        # Planted `resources_checks_only_session_cookies`: a request with no session cookie is never checked.
        checks_episode = session_id is not None or not self.checks_only_session_cookies
        if session_id in self.retired_sessions or (
            checks_episode and episode_id is not None and self._retired(episode_id)
        ):
            raise StaleAttemptError(f"resources work of a retired attempt ({key or session_id})")
        waits = seed or not (replayable or self.restart_only)
        while waits and not self.admission.is_set():
            await self.admission.wait()
        if checks_episode and episode_id is not None and self._retired(episode_id):
            raise StaleAttemptError(f"attempt {key} was retired while its request waited")
        session = self.sessions.get(session_id or "")
        if session is None and session_id and episode_id is not None and not seed:
            session = self._bind(session_id, episode_id)
        # Replayable verification never holds up a checkpoint, so it is never counted (its session still is).
        counted = not replayable
        self.served = True
        if counted:
            self.inflight += 1
        if session is not None:
            session.inflight += 1
            session.restored_pending = False
        self.notify()
        try:
            yield session
        finally:
            if counted:
                self.inflight -= 1
            if session is not None:
                session.inflight -= 1
            self.notify()

    def _bind(self, session_id: str, episode_id: EpisodeId) -> ResourcesSession:
        session = ResourcesSession(session_id=session_id, episode_id=episode_id)
        self.sessions[session_id] = session
        return session

    def end(self, session: ResourcesSession | None) -> None:
        if session is not None and self.sessions.get(session.session_id) is session:
            del self.sessions[session.session_id]
            self.notify()


class ResourcesParticipant:
    """Checkpoint hooks: stateless sessions are tracked (so retire can drain them) but never exported."""

    kind = "resources"

    def __init__(self, core: ResourcesCore, faults: frozenset[str]) -> None:
        self.core = core
        self.retire_keeps_sessions = "resources_retire_keeps_sessions" in faults
        self.restore_skipped = "resources_restore_skipped" in faults

    def report(self) -> PrepareReport:
        core = self.core
        blockers = sorted({core.retired_sessions[s].capture_key for s in core.unfreed})
        ready = not blockers and (core.inflight == 0 or core.restart_only)
        return PrepareReport(
            ready=ready,
            blockers=tuple(blockers),
            counts={"inflight": core.inflight, "sessions": len(core.sessions)},
            restarts=tuple(self._restarts()),
        )

    def _restarts(self) -> list[str]:
        """Mode `restart_only`: the episode of every live session, sorted (it can continue none of them)."""
        if not self.core.restart_only:
            return []
        return sorted({session.episode_id.capture_key for session in self.core.sessions.values()})

    async def close_admission(self, deadline_ts: float | None) -> None:
        self.core.admission.clear()

    async def open_admission(self) -> None:
        self.core.admission.set()

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        return await self.export_keys(None if scope is None else {e.capture_key for e in scope})

    async def export_keys(self, keys: AbstractSet[str] | None) -> list[dict[str, Any]]:
        """Mode `exported`: every tracked session of an unretired attempt, restored-pending ones only in scope (its
        capture keys: a worker gets only those; None: no scope)."""
        core = self.core
        if core.mode != "exported":
            return []
        records = []
        for session in sorted(core.sessions.values(), key=lambda s: s.session_id):
            if self._retired_session(session):
                continue
            if session.restored_pending and keys is not None and session.episode_id.capture_key not in keys:
                continue
            records.append(
                {
                    "episode_id": session.episode_id.wire(),
                    "session_id": session.session_id,
                    "state": {"count": session.count or 0},
                }
            )
        return records

    def _retired_session(self, session: ResourcesSession) -> bool:
        return session.session_id in self.core.retired_sessions or self.core._retired(session.episode_id)

    def validate_record(self, record: dict[str, Any]) -> None:
        if self.core.mode != "exported":
            raise CheckpointStateError(
                f"resources server in mode {self.core.mode!r} exports nothing, so it cannot install a record "
                f"({record.get('episode_id')})"
            )
        if not isinstance(record.get("session_id"), str):
            raise CheckpointStateError(f"resources record {record.get('episode_id')}: 'session_id' must be a string")
        counter_state(record.get("state"), record["session_id"])

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        """Validate every state, then install them all under the next attempts (all or nothing, reference 8.1)."""
        core = self.core
        if core.served or core.inflight:
            raise ControlError("restore requires a resources server that has not served sessions")
        return await self.adopt(records)

    async def adopt(self, records: list[dict[str, Any]]) -> list[str]:
        """Install without asking for a fresh process: a worker takes a restored record its coordinator held."""
        core = self.core
        if records and core.mode != "exported":
            raise CheckpointStateError(f"resources server in mode {core.mode!r} cannot install records")
        counts = [counter_state(record.get("state"), record.get("session_id")) for record in records]
        if self.restore_skipped:
            return []  # planted fault: the sessions and their counts are never installed
        restored = []
        for record, count in zip(records, counts, strict=True):
            next_id = EpisodeId(**record["episode_id"]).next_attempt()
            session = core._bind(record["session_id"], next_id)
            session.count = count
            session.restored_pending = True
            restored.append(next_id.capture_key)
        core.notify()
        return sorted(restored)

    async def delete_restored(self, keep: AbstractSet[str]) -> None:
        core = self.core
        for session in list(core.sessions.values()):
            if session.restored_pending and session.episode_id.capture_key not in keep:
                core.end(session)

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        core = self.core
        covered = covers(episode_ids)
        victims = [s for s in core.sessions.values() if covered(s.episode_id)]
        for session in victims:
            core.retired_sessions[session.session_id] = session.episode_id
            core.unfreed.add(session.session_id)
        core.notify()
        while any(session.inflight for session in victims):
            await core.wait_change()
        for session in victims:
            if not self.retire_keeps_sessions:  # planted fault: marked and refused, but never freed
                core.end(session)
            core.unfreed.discard(session.session_id)
        core.notify()

    async def check_forget(self, rollout_ids: list[str]) -> None:
        pending = sorted(s for s in self.core.unfreed if self.core.retired_sessions[s].rollout_id in rollout_ids)
        if pending:
            raise RetireIncompleteError(f"retire has not finished freeing sessions {pending}; retire again first")

    async def forget(self, rollout_ids: list[str]) -> None:
        core = self.core
        for session_id, episode_id in list(core.retired_sessions.items()):
            if episode_id.rollout_id in rollout_ids:
                del core.retired_sessions[session_id]
        core.notify()

    def status_extras(self) -> dict[str, Any]:
        core = self.core
        return {"mode": core.mode, "verify": core.verify_mode, "retired_sessions": len(core.retired_sessions)}


def counter_state(state: Any, session_id: Any) -> int:
    """The count of an exported counter state `{"count": int}`; anything else (a bool too) is invalid state."""
    count = state.get("count") if isinstance(state, dict) else None
    if type(count) is not int:
        raise CheckpointStateError(f"invalid counter state for session {session_id!r}: {state!r}")
    return count


def session_id_for(key: str) -> str:
    return "resources-session-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def weather_reward(response: dict[str, Any]) -> float:
    """1.0 when the agent's output holds a `get_weather` function call."""
    output = response.get("output") or []
    return 1.0 if any(i.get("type") == "function_call" and i.get("name") == "get_weather" for i in output) else 0.0


class Judge:
    """Asks a judge model on the backend before verifying: the slow topology's blockable verification.

    The call carries the rollout's capture key and `x-ng-call-kind: judge`, so the checker sees it in the
    backend's call list next to the rollout's policy calls and releases it like one."""

    def __init__(self, backend_url: str) -> None:
        self.url = backend_url + "/v1/chat/completions"
        self.client: httpx.AsyncClient | None = None

    async def ask(self, key: str, response: dict[str, Any]) -> None:
        assert self.client is not None, "the judge's client starts with the server"
        question = "Does this response call get_weather? " + json.dumps(response)[:2000]
        await post_json(
            self.client,
            self.url,
            {"model": "judge", "messages": [{"role": "user", "content": question}]},
            headers={CAPTURE_KEY_HEADER: key, CALL_KIND_HEADER: "judge"},
        )


def build_app(config: ServerConfig) -> FastAPI:
    """The weather (or, in mode `exported`, counter) resources server with session tracking and the checkpoint
    control routes (one process)."""
    return single_process_app(config, build_parts)


def build_parts(config: ServerConfig, plane: ServerPlane) -> tuple[FastAPI, ResourcesParticipant]:
    """The resources server's routes and participant over `plane` (a worker's, or the one process's control
    plane)."""
    core = ResourcesCore(config, notify=plane.notify)
    core.plane = plane
    participant = ResourcesParticipant(core, frozenset(config.faults))
    judge = Judge(config.backend_url) if config.verify_judge else None
    counter = config.resources_mode == "exported"
    # Planted fault: a restart-only server that forgets to tell the seeding episode it can only restart.
    says_restart = core.restart_only and "resources_restart_unreported" not in config.faults
    if judge is not None:
        app = FastAPI(lifespan=lifespan_with_client(lambda client: setattr(judge, "client", client)))
    else:
        app = FastAPI()
    app.add_middleware(RolloutPrefixMiddleware)
    install_error_handlers(app)

    @app.post("/seed_session")
    async def seed_session(request: Request, response: Response) -> dict[str, Any]:
        body = await request.json()
        key = rollout_key(request.state)
        episode_id = EpisodeId(**body["episode_id"]) if "episode_id" in body else EpisodeId.from_capture_key(key)
        async with core.admit(request, seed=True):
            session_id = body.get("resources_session_id") or session_id_for(episode_id.capture_key)
            previous = core.sessions.get(session_id)
            session = core._bind(session_id, episode_id)
            if counter:
                # Gym's `setdefault(session_id, initial_count)`: a seed run again keeps the session's count.
                kept = previous.count if previous is not None else None
                session.count = kept if kept is not None else int(body.get("initial_count", 0))
        response.set_cookie(SESSION_COOKIE, session_id)
        response.headers["x-ng-checkpoint-verify"] = core.verify_mode
        if says_restart:
            response.headers[RESTART_HEADER] = "1"
        return {"resources_session_id": session_id}

    if counter:
        add_counter_tools(app, core)

    @app.post("/get_weather")
    async def get_weather(request: Request) -> dict[str, Any]:
        body = await request.json()
        async with core.admit(request):
            city = body.get("city", "")
            return {"city": city, "weather": f"It is cold in {city}."}

    @app.post("/verify", response_model=None)
    async def verify(request: Request) -> dict[str, Any] | Response:
        body = await request.json()
        response = body.get("response") or {}
        async with core.admit(request, replayable=core.verify_mode == "replay") as session:
            if judge is not None:
                try:
                    await unless_client_gone(request, judge.ask(rollout_key(request.state) or "", response))
                except ClientGone:
                    return Response(status_code=CLIENT_GONE_STATUS)
            reward = counter_reward(session, body) if counter else weather_reward(response)
        core.end(session)
        return {"reward": reward}

    @app.post("/close_session")
    async def close_session(request: Request) -> dict[str, Any]:
        session = core.sessions.get(request.cookies.get(SESSION_COOKIE) or "")
        core.end(session)
        return {"closed": session is not None}

    return app, participant


def counter_reward(session: ResourcesSession | None, body: dict[str, Any]) -> float:
    """1.0 when the session's count equals the row's `expected_count` (a session never seen earns nothing)."""
    if session is None or session.count is None:
        return 0.0
    return 1.0 if session.count == body.get("expected_count") else 0.0


def add_counter_tools(app: FastAPI, core: ResourcesCore) -> None:
    """The counter's tools; a session nobody seeded or restored counts from 0, as Gym's `setdefault(id, 0)`."""

    @app.post("/increment_counter")
    async def increment_counter(request: Request) -> dict[str, Any]:
        body = await request.json()
        async with core.admit(request) as session:
            if session is None:
                raise ControlError("/increment_counter needs a resources session cookie")
            session.count = (session.count or 0) + int(body["count"])
            return {"success": True}

    @app.post("/get_counter_value")
    async def get_counter_value(request: Request) -> dict[str, Any]:
        async with core.admit(request) as session:
            return {"count": 0 if session is None or session.count is None else session.count}
