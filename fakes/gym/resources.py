"""The resources server: Gym's weather example (`get_weather`, mode `stateless`) with session tracking.

Sessions are bound to the episode whose `/seed_session` created them (the rollout path prefix names it) and
ended by `/verify` or `/close_session`. While a checkpoint is open every request except replayable verification
waits for re-open instead of failing (reference 8.2); retire refuses a covered session's requests until forget.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
from fastapi import FastAPI, Request, Response

from ckpt_model.wire import EpisodeId
from fakes.gym.config import ServerConfig
from fakes.gym.control_plane import ControlPlane
from fakes.gym.environment import covers
from fakes.gym.errors import (
    CheckpointStateError,
    ControlError,
    RetireIncompleteError,
    StaleAttemptError,
    install_error_handlers,
)
from fakes.gym.http import RolloutPrefixMiddleware, add_health, rollout_key
from fakes.gym.participant import PrepareReport

SESSION_COOKIE = "resources_session_id"


@attrs.define(eq=False)
class ResourcesSession:
    session_id: str
    episode_id: EpisodeId
    inflight: int = 0
    restored_pending: bool = False


class ResourcesCore:
    """Session bookkeeping and the admission every data-plane request passes."""

    def __init__(self, config: ServerConfig, notify: Any) -> None:
        self.mode = config.resources_mode
        self.verify_mode = config.verify_mode
        self._notify_control_plane = notify
        self._change = asyncio.Event()
        self.admission = asyncio.Event()
        self.admission.set()
        self.sessions: dict[str, ResourcesSession] = {}
        self.retired_sessions: dict[str, EpisodeId] = {}
        self.unfreed: set[str] = set()
        self.inflight = 0
        self.served = False
        self.control_plane: ControlPlane | None = None

    def notify(self) -> None:
        self._change.set()
        self._notify_control_plane()

    async def wait_change(self) -> None:
        """Return at the next state change (callers re-check their condition in a loop)."""
        self._change.clear()
        await self._change.wait()

    def _retired(self, episode_id: EpisodeId) -> bool:
        assert self.control_plane is not None
        return self.control_plane.retired.is_retired(episode_id)

    @contextlib.asynccontextmanager
    async def admit(
        self, request: Request, *, replayable: bool = False, seed: bool = False
    ) -> AsyncIterator[ResourcesSession | None]:
        """Refuse retired work, wait while closed (seeds always), count the request while it runs."""
        key = rollout_key(request.state)
        episode_id = EpisodeId.from_capture_key(key) if key else None
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id in self.retired_sessions or (episode_id is not None and self._retired(episode_id)):
            raise StaleAttemptError(f"resources work of a retired attempt ({key or session_id})")
        while not self.admission.is_set() and (seed or not replayable):
            await self.admission.wait()
        if episode_id is not None and self._retired(episode_id):
            raise StaleAttemptError(f"attempt {key} was retired while its request waited")
        session = self.sessions.get(session_id or "")
        if session is None and session_id and episode_id is not None and not seed:
            session = self._bind(session_id, episode_id)
        counted = not (replayable and not self.admission.is_set())
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

    def __init__(self, core: ResourcesCore) -> None:
        self.core = core

    def report(self) -> PrepareReport:
        core = self.core
        blockers = sorted({core.retired_sessions[s].capture_key for s in core.unfreed})
        ready = not blockers and (core.inflight == 0 or core.mode == "restart_only")
        return PrepareReport(
            ready=ready, blockers=tuple(blockers), counts={"inflight": core.inflight, "sessions": len(core.sessions)}
        )

    async def close_admission(self) -> None:
        self.core.admission.clear()

    async def open_admission(self) -> None:
        self.core.admission.set()

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        return []

    def validate_record(self, record: dict[str, Any]) -> None:
        raise CheckpointStateError(
            f"resources server in mode {self.core.mode!r} exports nothing, so it cannot install a record "
            f"({record.get('episode_id')})"
        )

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        if self.core.served or self.core.inflight:
            raise ControlError("restore requires a resources server that has not served sessions")
        if records:
            raise CheckpointStateError(f"resources server in mode {self.core.mode!r} cannot install records")
        return []

    async def delete_restored(self, keep: set[str]) -> None:
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


def session_id_for(key: str) -> str:
    return "resources-session-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def weather_reward(response: dict[str, Any]) -> float:
    """1.0 when the agent's output holds a `get_weather` function call."""
    output = response.get("output") or []
    return 1.0 if any(i.get("type") == "function_call" and i.get("name") == "get_weather" for i in output) else 0.0


def build_app(config: ServerConfig) -> FastAPI:
    """The weather resources server with session tracking and the checkpoint control routes."""
    control_plane: ControlPlane
    core = ResourcesCore(config, notify=lambda: control_plane.notify())
    control_plane = ControlPlane.from_config(ResourcesParticipant(core), config)
    core.control_plane = control_plane
    app = FastAPI()
    app.add_middleware(RolloutPrefixMiddleware)
    install_error_handlers(app)
    add_health(app)
    app.include_router(control_plane.router())

    @app.post("/seed_session")
    async def seed_session(request: Request, response: Response) -> dict[str, Any]:
        body = await request.json()
        key = rollout_key(request.state)
        episode_id = EpisodeId(**body["episode_id"]) if "episode_id" in body else EpisodeId.from_capture_key(key)
        async with core.admit(request, seed=True):
            session_id = body.get("resources_session_id") or session_id_for(episode_id.capture_key)
            core._bind(session_id, episode_id)
        response.set_cookie(SESSION_COOKIE, session_id)
        response.headers["x-ng-checkpoint-verify"] = core.verify_mode
        return {"resources_session_id": session_id}

    @app.post("/get_weather")
    async def get_weather(request: Request) -> dict[str, Any]:
        body = await request.json()
        async with core.admit(request):
            city = body.get("city", "")
            return {"city": city, "weather": f"It is cold in {city}."}

    @app.post("/verify")
    async def verify(request: Request) -> dict[str, Any]:
        body = await request.json()
        async with core.admit(request, replayable=core.verify_mode == "replay") as session:
            reward = weather_reward(body.get("response") or {})
        core.end(session)
        return {"reward": reward}

    @app.post("/close_session")
    async def close_session(request: Request) -> dict[str, Any]:
        session = core.sessions.get(request.cookies.get(SESSION_COOKIE) or "")
        core.end(session)
        return {"closed": session is not None}

    return app
