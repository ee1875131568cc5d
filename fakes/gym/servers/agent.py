"""The agent server (Simple Agent look-alike): sessions, activations with loop boundaries, legacy `/run`.

Loop boundaries sit before each model call and after each tool round (reference 9.1, 9.3). While a model call is
awaited the session counts as at its boundary; a checkpoint exports the snapshot taken there, so a restored
session re-issues exactly the calls it still needs. Legacy `/run` episodes are owned here, keyed by the logical
rollout (`run:<rollout_id>`), so a replacement attempt finds the restored state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Set as AbstractSet
from typing import Any, Literal

import attrs
import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import PrepareReport, ServerPlane
from fakes.gym.control.retired import covers
from fakes.gym.faults.stripped_ids import STRIPS_CHECKPOINT_IDS, StripsCheckpointIds
from fakes.gym.protocol.errors import (
    ActivationOutOfOrderError,
    AdmissionClosedError,
    CheckpointStateError,
    ControlError,
    StaleAttemptError,
    install_error_handlers,
)
from fakes.gym.protocol.http import (
    DownstreamError,
    RolloutPrefixMiddleware,
    cookie_header,
    lifespan_with_client,
    post_json,
)
from fakes.gym.protocol.legacy_rows import SKIPS_RESERVATION, legacy_episode
from fakes.gym.protocol.wire import EpisodeId, task_digest
from fakes.gym.servers.single_process import single_process_app
from fakes.gym.servers.steps import Episode, EpisodeOwner

SessionState = Literal["idle", "running", "at_boundary", "parked", "closing", "retiring"]
BLOCKING = frozenset({"running", "closing", "retiring"})
MODEL_NAME = "fake-model"


class SeedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_session_id: str
    episode_id: EpisodeId
    task_id: dict[str, Any] | None = None
    tool_accesses: list[dict[str, Any]] = []
    sandbox_access: dict[str, Any] | None = None


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_session_id: str
    episode_id: EpisodeId


@attrs.define(eq=False)
class AgentSession:
    """One agent session; `loop` is the last loop boundary, `continuation` a restored one not yet used."""

    key: str
    episode_id: EpisodeId
    request: dict[str, Any]
    resources_cookies: dict[str, str] = attrs.field(factory=dict)
    observations: list[Any] = attrs.field(factory=list)
    activations: int = 0
    completed_activation: int = 0
    completed_reply: dict[str, Any] | None = None
    loop: dict[str, Any] | None = None
    continuation: dict[str, Any] | None = None
    state: SessionState = "idle"
    task: asyncio.Task[Any] | None = None
    restored_pending: bool = False

    def responses_delivered(self) -> bool:
        """Whether any model response reached this session (a completed activation, or a loop past call 0)."""
        boundary = self.loop or self.continuation or {}
        return self.completed_activation > 0 or boundary.get("model_calls", 0) > 0

    def exported_boundary(self) -> dict[str, Any] | None:
        if self.state in ("at_boundary", "parked"):
            return self.loop
        return self.continuation

    def hook_state(self) -> dict[str, Any]:
        if self.key.startswith("run:"):
            return {}
        return {
            "request": self.request,
            "resources_cookies": self.resources_cookies,
            "observations": self.observations,
            "activations": self.activations,
            "completed_activation": self.completed_activation,
            "completed_reply": self.completed_reply,
        }


def tools_server(seed_request: dict[str, Any], default: str) -> str:
    """The resources server a session's tool calls go to: the one its seed's `tool_accesses` names (the
    environment writes its own resources server's instance name there), else `default` (legacy sessions)."""
    for access in seed_request.get("tool_accesses") or []:
        server = access.get("server")
        if isinstance(server, str) and server:
            return server
    return default


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses-API function tools as chat-completions tools."""
    return [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tools
        if tool.get("type") == "function"
    ]


def initial_loop(params: dict[str, Any]) -> dict[str, Any]:
    messages = [{"role": item["role"], "content": item["content"]} for item in params.get("input", [])]
    return {"step": 0, "messages": messages, "new_outputs": [], "pending_tools": [], "turns": 0, "model_calls": 0}


class AgentCore:
    """Sessions, seeds and the Simple Agent loop; the participant and the routes both work through it."""

    def __init__(self, config: ServerConfig, notify: Any) -> None:
        self.config = config
        self.notify = notify
        self.admission = asyncio.Event()
        self.admission.set()
        self.sessions: dict[str, AgentSession] = {}
        self.seeds_in_progress: dict[str, EpisodeId] = {}
        self.episodes = EpisodeOwner(notify=notify)
        self.client: httpx.AsyncClient | None = None
        self.plane: ServerPlane | None = None

    # -- the loop ----------------------------------------------------------------------------------------------

    async def run_loop(self, session: AgentSession, params: dict[str, Any]) -> dict[str, Any]:
        state = session.continuation or initial_loop(params)
        session.continuation = None
        tools = chat_tools(params.get("tools", []))
        while True:
            if state["pending_tools"]:
                self._set(session, "running")
                state = await self._run_tools(session, state)
            await self._at_boundary(session, state)
            reply = await self._awaiting_model(session, state, tools)
            message = reply["choices"][0]["message"]
            tool_calls = message.get("tool_calls") or []
            if not tool_calls:
                text = message.get("content") or ""
                item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
                return self._response(session, state, [*state["new_outputs"], item])
            calls = [
                {
                    "type": "function_call",
                    "call_id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in tool_calls
            ]
            state = {
                **state,
                "messages": [*state["messages"], {"role": "assistant", "content": None, "tool_calls": tool_calls}],
                "new_outputs": [*state["new_outputs"], *calls],
                "pending_tools": calls,
                "last_model_response": reply,
                "model_calls": state["model_calls"] + 1,
            }
            await self._at_boundary(session, state)

    async def _run_tools(self, session: AgentSession, state: dict[str, Any]) -> dict[str, Any]:
        messages = list(state["messages"])
        outputs = list(state["new_outputs"])
        resources_url = self.config.peer(tools_server(session.request, self.config.resources_server))
        for call in state["pending_tools"]:
            reply = await post_json(
                self._client(),
                f"{resources_url}/ng-rollout/{session.episode_id.capture_key}/{call['name']}",
                json.loads(call["arguments"] or "{}"),
                headers=cookie_header(session.resources_cookies),
            )
            output = reply.text
            session.observations.append({"tool": call["name"], "output": output})
            messages.append({"role": "tool", "tool_call_id": call["call_id"], "content": output})
            outputs.append({"type": "function_call_output", "call_id": call["call_id"], "output": output})
        return {
            **state,
            "messages": messages,
            "new_outputs": outputs,
            "pending_tools": [],
            "turns": state["turns"] + 1,
            "step": state["step"] + 1,
        }

    async def _at_boundary(self, session: AgentSession, state: dict[str, Any]) -> None:
        session.loop = state
        if not self.admission.is_set():
            self._set(session, "parked")
            await self._wait_open()
        self._set(session, "running")

    async def _awaiting_model(
        self, session: AgentSession, state: dict[str, Any], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self._set(session, "at_boundary")
        reply = await post_json(
            self._client(),
            f"{self.config.peer('policy_model')}/ng-rollout/{session.episode_id.capture_key}/v1/chat/completions",
            {"model": MODEL_NAME, "messages": state["messages"], "tools": tools},
        )
        if not self.admission.is_set():
            self._set(session, "parked")
            await self._wait_open()
        self._set(session, "running")
        return reply.json()

    def _response(self, session: AgentSession, state: dict[str, Any], output: list[Any]) -> dict[str, Any]:
        return {
            "id": f"resp-{session.episode_id.capture_key}-{session.activations}",
            "object": "response",
            "model": MODEL_NAME,
            "output": output,
            "usage": {"model_calls": state["model_calls"] + 1, "turns": state["turns"]},
        }

    async def _wait_open(self) -> None:
        while not self.admission.is_set():
            await self.admission.wait()

    def _set(self, session: AgentSession, state: SessionState) -> None:
        if session.state not in ("closing", "retiring"):
            session.state = state
        self.notify()

    def _client(self) -> httpx.AsyncClient:
        assert self.client is not None, "the agent's HTTP client starts with the app"
        return self.client

    def _retired(self, episode_id: EpisodeId) -> bool:
        assert self.plane is not None
        return self.plane.retired.is_retired(episode_id)

    # -- sessions ------------------------------------------------------------------------------------------------

    async def seed(self, request: SeedRequest) -> AgentSession:
        if self._retired(request.episode_id):
            raise StaleAttemptError(f"attempt {request.episode_id.capture_key} was retired")
        await self._wait_open()
        existing = self.sessions.get(request.agent_session_id)
        if existing is not None:
            if existing.episode_id != request.episode_id:
                raise StaleAttemptError(f"session {existing.key} belongs to {existing.episode_id.capture_key}")
            return existing
        self.seeds_in_progress[request.agent_session_id] = request.episode_id
        try:
            cookies = {}
            for access in request.tool_accesses:
                cookies.update(access.get("cookies") or {})
            session = AgentSession(
                key=request.agent_session_id,
                episode_id=request.episode_id,
                request=request.model_dump(mode="json"),
                resources_cookies=cookies,
            )
            if self._retired(request.episode_id):
                raise StaleAttemptError(f"attempt {request.episode_id.capture_key} was retired while seeding")
            self.sessions[session.key] = session
        finally:
            del self.seeds_in_progress[request.agent_session_id]
            self.notify()
        return session

    async def activate(self, session: AgentSession, params: dict[str, Any], index: int | None) -> dict[str, Any]:
        if self._retired(session.episode_id):
            raise StaleAttemptError(f"attempt {session.episode_id.capture_key} was retired")
        if index is not None:
            if index == session.completed_activation and session.completed_reply is not None:
                return session.completed_reply
            if index != session.completed_activation + 1:
                raise ActivationOutOfOrderError(
                    f"activation {index} of {session.key}: expected {session.completed_activation + 1}"
                )
        if session.task is not None and not session.task.done():
            raise ControlError(f"session {session.key} already has a running activation")
        session.activations += 1
        session.restored_pending = False
        session.task = asyncio.get_running_loop().create_task(self.run_loop(session, params))
        try:
            reply = await session.task
        finally:
            self._set(session, "idle")
        session.completed_activation = session.activations
        session.completed_reply = reply
        return reply

    async def close(self, session: AgentSession) -> dict[str, Any]:
        session.state = "closing"
        self.notify()
        if session.task is not None and not session.task.done():
            session.task.cancel()
            await asyncio.gather(session.task, return_exceptions=True)
        self.sessions.pop(session.key, None)
        self.notify()
        return {"agent_observations": session.observations, "resources_cookies": session.resources_cookies}

    def lookup(self, session_key: str | None) -> AgentSession:
        session = self.sessions.get(session_key or "")
        if session is None:
            raise ControlError(f"agent session {session_key!r} is not open; seed it with /v1/agent_sessions")
        return session


class AgentParticipant:
    """Checkpoint hooks over the agent's sessions and its legacy episodes."""

    kind = "agent"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        faults = core.config.faults
        self.drops_unstarted = "agent_export_drops_unstarted" in faults
        self.stays_closed_after_commit = "agent_stays_closed_after_commit" in faults
        # Set by a commit's export, cleared when admission closes: whether the open checkpoint was committed.
        self._exported = False

    def report(self) -> PrepareReport:
        core = self.core
        blockers = [s.episode_id.capture_key for s in core.sessions.values() if s.state in BLOCKING]
        blockers += [e.capture_key for e in core.seeds_in_progress.values()]
        blockers += core.episodes.blockers()
        at_boundary = sum(1 for s in core.sessions.values() if s.state in ("at_boundary", "parked"))
        return PrepareReport(
            ready=not blockers,
            blockers=tuple(sorted(set(blockers))),
            counts={"sessions": len(core.sessions), "at_boundary": at_boundary},
        )

    async def close_admission(self, deadline_ts: float | None) -> None:
        self._exported = False
        self.core.admission.clear()
        self.core.episodes.close()

    async def open_admission(self) -> None:
        self.core.episodes.open()
        if self.stays_closed_after_commit and self._exported:
            return  # planted fault: after a committed checkpoint, session seeds and activations keep waiting
        self.core.admission.set()

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        return await self.export_keys(None if scope is None else {e.capture_key for e in scope})

    async def export_keys(self, keys: AbstractSet[str] | None) -> list[dict[str, Any]]:
        """`export` of the scope's capture keys (a worker gets only those; None: no scope)."""
        self._exported = True
        legacy = {EpisodeId(**r["episode_id"]).rollout_id: r for r in self.core.episodes.export(keys)}
        records = []
        for session in sorted(self.core.sessions.values(), key=lambda s: s.key):
            if session.state == "retiring" or self.core._retired(session.episode_id):
                continue
            if session.restored_pending and keys is not None and session.episode_id.capture_key not in keys:
                continue
            if self.drops_unstarted and not session.responses_delivered():
                continue  # planted fault: a session still waiting for its first model response is lost
            episode = legacy.get(session.episode_id.rollout_id) if session.key.startswith("run:") else None
            records.append(
                {
                    "episode_id": session.episode_id.wire(),
                    "session_key": session.key,
                    "session": session.hook_state(),
                    "boundary": session.exported_boundary(),
                    "episode": None if episode is None else {k: episode[k] for k in ("task_digest", "boundary")},
                }
            )
        return records

    def validate_record(self, record: dict[str, Any]) -> None:
        if not isinstance(record.get("session_key"), str) or not isinstance(record.get("session"), dict):
            raise CheckpointStateError(f"agent record {record.get('episode_id')} is not a session record")
        for field in ("boundary", "episode"):
            if record.get(field) is not None and not isinstance(record[field], dict):
                raise CheckpointStateError(f"agent record {record['episode_id']}: {field} must be an object")

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        core = self.core
        if core.sessions or core.seeds_in_progress or core.episodes.episodes or core.episodes.restored:
            raise ControlError("restore requires a process without live sessions or seeds in progress")
        return await self.adopt(records)

    async def adopt(self, records: list[dict[str, Any]]) -> list[str]:
        """Install without asking for a fresh process: a worker takes a restored record its coordinator held."""
        core = self.core
        restored = []
        for record in records:
            next_id = EpisodeId(**record["episode_id"]).next_attempt()
            hook = record["session"]
            session = AgentSession(
                key=record["session_key"],
                episode_id=next_id,
                request={**hook.get("request", {}), "episode_id": next_id.wire()},
                resources_cookies=hook.get("resources_cookies", {}),
                observations=hook.get("observations", []),
                activations=hook.get("activations", 0),
                completed_activation=hook.get("completed_activation", 0),
                completed_reply=hook.get("completed_reply"),
                continuation=self._continuation(record["boundary"]),
                restored_pending=True,
            )
            core.sessions[session.key] = session
            if record.get("episode") is not None:
                core.episodes.install([{"episode_id": record["episode_id"], **record["episode"]}])
            restored.append(next_id.capture_key)
        core.notify()
        return sorted(restored)

    def _continuation(self, boundary: dict[str, Any] | None) -> dict[str, Any] | None:
        faults = self.core.config.faults
        if boundary is not None and "agent_restore_drops_outputs" in faults:
            return {**boundary, "new_outputs": []}
        if boundary is not None and "agent_restore_drops_tool_results" in faults:
            kept = [item for item in boundary["new_outputs"] if item.get("type") != "function_call_output"]
            return {**boundary, "new_outputs": kept}
        return boundary

    async def delete_restored(self, keep: AbstractSet[str]) -> None:
        core = self.core
        for session in list(core.sessions.values()):
            if session.restored_pending and session.episode_id.capture_key not in keep:
                del core.sessions[session.key]
        core.episodes.delete_restored(keep)
        core.notify()

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        core = self.core
        covered = covers(episode_ids)
        victims = [s for s in core.sessions.values() if covered(s.episode_id)]
        if "agent_retire_skips_failed_sessions" in core.config.faults:
            victims = [s for s in victims if not failed(s.task)]
        for session in victims:
            session.state = "retiring"
            if session.task is not None and not session.task.done():
                session.task.cancel()
        core.notify()
        for session in victims:
            if session.task is not None:
                await asyncio.gather(session.task, return_exceptions=True)
            if "agent_retire_keeps_sessions" not in core.config.faults:
                core.sessions.pop(session.key, None)
        await core.episodes.retire(covered)
        core.notify()

    async def check_forget(self, rollout_ids: list[str]) -> None:
        return None

    async def forget(self, rollout_ids: list[str]) -> None:
        return None

    def status_extras(self) -> dict[str, Any]:
        return {"accepting": self.core.admission.is_set()}


def failed(task: asyncio.Task[Any] | None) -> bool:
    """The task ended with an error (not cancelled)."""
    return task is not None and task.done() and not task.cancelled() and task.exception() is not None


class LegacyEpisodes:
    """Legacy `/run`: seed -> loop -> verify -> return, owned by the agent (reference 9.3)."""

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.resources_url = core.config.peer(core.config.resources_server)

    async def run(self, episode: Episode, row: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        key = episode.key
        state: dict[str, Any] = dict(episode.boundary or {"next": "seed"})
        params = row.get("responses_create_params", {})
        while True:
            stage = state["next"]
            await core.episodes.boundary(episode, state)
            if stage == "return":
                episode.finishing = True
                session = core.sessions.get(f"run:{episode.episode_id.rollout_id}")
                if session is not None and session.episode_id == episode.episode_id:
                    del core.sessions[session.key]
                    core.notify()
                return {**state["result"], "response": state["response"]}
            if stage == "seed":
                state = await core.episodes.step(episode, "replay", self._seed(episode, row))
            elif stage == "loop":
                session = self._session(episode, state)
                response = await core.episodes.step(episode, "replay", core.activate(session, params, None))
                state = {**state, "next": "verify", "response": response}
            else:
                result = await core.episodes.step(episode, state["verify_mode"], self._verify(key, state, row))
                state = {"next": "return", "response": state["response"], "result": result}

    async def _seed(self, episode: Episode, row: dict[str, Any]) -> dict[str, Any]:
        seeded = await post_json(
            self.core._client(),
            f"{self.resources_url}/ng-rollout/{episode.key}/seed_session",
            {"episode_id": episode.episode_id.wire(), "task_data": {}, **task_fields(row)},
        )
        return {
            "next": "loop",
            "cookies": dict(seeded.cookies),
            "verify_mode": seeded.headers.get("x-ng-checkpoint-verify", "wait"),
        }

    def _session(self, episode: Episode, state: dict[str, Any]) -> AgentSession:
        key = f"run:{episode.episode_id.rollout_id}"
        session = self.core.sessions.get(key)
        if session is None or session.episode_id != episode.episode_id:
            session = AgentSession(key=key, episode_id=episode.episode_id, request={})
            self.core.sessions[key] = session
        # A restored legacy session exports no hook state (`{}`); its resources session is the episode's, whose
        # cookies the episode boundary keeps (Gym's loop boundary carries `resources_server_cookies`, 9.3).
        session.resources_cookies = state["cookies"]
        return session

    async def _verify(self, key: str, state: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        params = row.get("responses_create_params", {})
        reply = await post_json(
            self.core._client(),
            f"{self.resources_url}/ng-rollout/{key}/verify",
            {"responses_create_params": params, "response": state["response"], **task_fields(row)},
            headers=cookie_header(state["cookies"]),
        )
        return reply.json()


def task_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A legacy row's task fields (the counter's `initial_count`, `expected_count`): seed and verify get them."""
    return {k: v for k, v in row.items() if k != "responses_create_params" and not k.startswith("_ng_")}


def legacy_digest(row: dict[str, Any]) -> str:
    return task_digest({k: v for k, v in row.items() if k != "_ng_attempt_index"})


def build_app(config: ServerConfig) -> FastAPI:
    """The Simple Agent look-alike with the checkpoint control routes (one process)."""
    return single_process_app(config, build_parts)


def build_parts(config: ServerConfig, plane: ServerPlane) -> tuple[FastAPI, AgentParticipant]:
    """The Simple Agent's routes and participant over `plane` (a worker's, or the one process's control plane)."""
    core = AgentCore(config, notify=plane.notify)
    core.plane = plane
    participant = AgentParticipant(core)
    legacy = LegacyEpisodes(core)
    app = FastAPI(lifespan=lifespan_with_client(lambda c: setattr(core, "client", c)))
    app.add_middleware(RolloutPrefixMiddleware)
    if STRIPS_CHECKPOINT_IDS in config.faults:
        app.add_middleware(StripsCheckpointIds)
    install_error_handlers(app)

    @app.post("/v1/agent_sessions")
    async def seed_session(request: SeedRequest, response: Response) -> dict[str, Any]:
        session = await core.seed(request)
        response.set_cookie("agent_session_id", session.key)
        return {"agent_session_id": session.key}

    @app.post("/v1/agent_sessions/close")
    async def close_session(request: CloseRequest) -> dict[str, Any]:
        session = core.lookup(request.agent_session_id)
        if session.episode_id != request.episode_id:
            raise StaleAttemptError(f"session {session.key} belongs to {session.episode_id.capture_key}")
        return await core.close(session)

    @app.post("/v1/responses")
    async def responses(request: Request) -> dict[str, Any]:
        session = core.lookup(request.cookies.get("agent_session_id"))
        header = request.headers.get("x-ng-agent-activation")
        return await core.activate(session, await request.json(), int(header) if header else None)

    skips_reservation = SKIPS_RESERVATION in config.faults

    @app.post("/run")
    async def run(request: Request) -> JSONResponse:
        row = await request.json()
        episode_id = legacy_episode(row, skips_reservation)
        if plane.retired.is_retired(episode_id):
            raise StaleAttemptError(f"attempt {episode_id.capture_key} was retired")
        replacement = episode_id.capture_key in core.episodes.restored and plane.phase != "restored"
        if not core.episodes.admission.is_set() and not replacement:
            raise AdmissionClosedError("a checkpoint is open; retry the /run after it resumes")
        episode = core.episodes.begin(episode_id, legacy_digest(row))
        episode.task = asyncio.get_running_loop().create_task(legacy.run(episode, row))
        try:
            await asyncio.wait({episode.task})
        finally:
            core.episodes.end(episode)
        return legacy_reply(episode)

    return app, participant


def legacy_reply(episode: Episode) -> JSONResponse:
    task = episode.task
    assert task is not None
    if task.cancelled():
        raise StaleAttemptError(f"attempt {episode.key} was retired while it ran")
    error = task.exception()
    if error is None:
        return JSONResponse(task.result())
    if isinstance(error, ControlError):
        raise error
    if isinstance(error, DownstreamError):
        if error.code == "stale_attempt":
            raise StaleAttemptError(f"attempt {episode.key} was retired: {error}")
        return JSONResponse({"error": {"code": "checkpoint_error", "detail": str(error)}}, status_code=502)
    raise error
