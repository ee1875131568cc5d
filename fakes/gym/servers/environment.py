"""The environment server (`single_agent_turn` look-alike) and the `legacy_agent` relay.

A native `/run` is an episode of five stages, seed -> invoke_agent -> close_agent -> verify -> return, with a
boundary before each (reference 5.5). A replacement attempt finds its restored record, checks the task digest and
continues from the recorded boundary, reusing the recorded session IDs and cookies. An episode whose resources
seed reply says `x-ng-checkpoint-restart: 1` becomes a restart after its seed step (reference 5.4).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Set as AbstractSet
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import PrepareReport, ServerPlane
from fakes.gym.control.retired import covers
from fakes.gym.protocol.errors import (
    AdmissionClosedError,
    CheckpointStateError,
    ControlError,
    StaleAttemptError,
    install_error_handlers,
)
from fakes.gym.protocol.http import DownstreamError, add_health, cookie_header, lifespan_with_client, post_json
from fakes.gym.protocol.wire import (
    EPISODE_TIMED_OUT,
    FAILURE_REASON_MAX_CHARS,
    RESTART_HEADER,
    EpisodeFailure,
    EpisodeId,
    EpisodeRequest,
    EpisodeResponse,
    error_body,
    task_digest,
    unhandled_error,
)
from fakes.gym.servers.single_process import single_process_app
from fakes.gym.servers.steps import Episode, EpisodeOwner

EPISODE_TIMEOUT_S = 600.0
NEXT_STAGES = ("seed", "invoke_agent", "close_agent", "verify", "return")


class EnvironmentParticipant:
    """Checkpoint hooks over the episode owner: episodes export their boundaries."""

    kind = "environment"

    def __init__(self, owner: EpisodeOwner, faults: frozenset[str]) -> None:
        self.owner = owner
        self.faults = faults
        self.drops_finished_during_prepare = "environment_drops_finished_during_prepare" in faults
        self.exports_restarts = "environment_exports_restarts" in faults
        self.restarts_block_prepare = "restarts_block_prepare" in faults
        # Planted fault only: episodes whose `wait` verification ended while admission was closed.
        self._finished_while_closed: set[str] = set()

    def report(self) -> PrepareReport:
        blockers = self.owner.blockers()
        restarts = self.owner.restarts()
        if self.restarts_block_prepare:
            blockers += restarts  # planted fault: a checkpoint waits for episodes it will never export
        return PrepareReport(
            ready=not blockers,
            blockers=tuple(blockers),
            counts={"episodes": len(self.owner.episodes)},
            restarts=tuple(restarts),
        )

    async def close_admission(self, deadline_ts: float | None) -> None:
        self.owner.close()

    async def open_admission(self) -> None:
        self._finished_while_closed.clear()
        self.owner.open()

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        return await self.export_keys(None if scope is None else {e.capture_key for e in scope})

    async def export_keys(self, keys: AbstractSet[str] | None) -> list[dict[str, Any]]:
        """`export` of the scope's capture keys (a worker gets only those; None: no scope)."""
        if "environment_drops_restored_pending" in self.faults:
            keys = set()
        records = self.owner.export(keys)
        if self.exports_restarts:  # planted fault: restarts are written as if they could continue
            records += [self.owner.episodes[key].record() for key in self.owner.restarts()]
        dropped = self._finished_while_closed
        return [r for r in records if EpisodeId(**r["episode_id"]).capture_key not in dropped] if dropped else records

    def verified(self, episode: Episode, mode: str) -> None:
        """An episode's verification step ended. Only the planted fault `environment_drops_finished_during_prepare`
        cares: a `wait` verification that a prepare waited for (admission closed) drops the episode from export."""
        if self.drops_finished_during_prepare and mode == "wait" and not self.owner.admission.is_set():
            self._finished_while_closed.add(episode.key)

    def validate_record(self, record: dict[str, Any]) -> None:
        boundary = record.get("boundary")
        if not isinstance(record.get("task_digest"), str) or not (boundary is None or isinstance(boundary, dict)):
            raise CheckpointStateError(f"environment record {record.get('episode_id')} is not an episode record")
        if boundary is not None and boundary.get("next") not in NEXT_STAGES:
            raise CheckpointStateError(f"environment record {record['episode_id']} has an unknown boundary")

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        if self.owner.episodes or self.owner.restored:
            raise ControlError("restore requires a process without live episodes")
        return await self.adopt(records)

    async def adopt(self, records: list[dict[str, Any]]) -> list[str]:
        """Install without asking for a fresh process: a worker takes a restored record its coordinator held."""
        if "environment_restore_ignores_boundary" in self.faults:
            records = [{**record, "boundary": None} for record in records]
        return self.owner.install(records)

    async def delete_restored(self, keep: AbstractSet[str]) -> None:
        self.owner.delete_restored(keep)

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        await self.owner.retire(covers(episode_ids))

    async def check_forget(self, rollout_ids: list[str]) -> None:
        return None

    async def forget(self, rollout_ids: list[str]) -> None:
        return None

    def status_extras(self) -> dict[str, Any]:
        return {"restored_pending": sorted(self.owner.restored)}


def session_handles(key: str) -> dict[str, Any]:
    """Session IDs derived from the capture key, so a replayed run names the same sessions."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return {
        "resources_session_id": f"resources-session-{digest}",
        "resources_cookies": {},
        "agent_session_id": f"agent-session-{digest}",
        "agent_cookies": {},
        "resources_verify": "wait",
    }


class EpisodeRunner:
    """Runs one native episode through its stages, talking to the agent and resources servers."""

    def __init__(self, client: httpx.AsyncClient, config: ServerConfig, participant: EnvironmentParticipant) -> None:
        self.client = client
        self.agent_url = config.peer("agent")
        self.resources_server = config.resources_server
        self.resources_url = config.peer(config.resources_server)
        self.participant = participant
        self.owner = participant.owner
        self.verify_never_waits = "environment_verify_never_waits" in config.faults

    async def run(self, episode: Episode, request: EpisodeRequest) -> dict[str, Any]:
        key = episode.key
        state: dict[str, Any] = dict(episode.boundary or {"next": "seed", "handles": session_handles(key)})
        params = request.task.task_input.get("responses_create_params", {})
        task_data = request.task.task_input.get("task_data", {})
        task_id = request.task.task_id.model_dump()
        while True:
            stage = state["next"]
            await self.owner.boundary(episode, state)
            if stage == "return":
                episode.finishing = True
                return state["result"]
            handles = state["handles"]
            if stage == "seed":
                seeding = self._seed(episode, handles, task_id, task_data)
                handles, restart = await self.owner.step(episode, "replay", seeding)
                if restart:
                    await self.owner.mark_restart(episode)
                state = {"next": "invoke_agent", "handles": handles}
            elif stage == "invoke_agent":
                response = await self.owner.step(episode, "replay", self._invoke(key, handles, params))
                state = {"next": "close_agent", "handles": handles, "response": response}
            elif stage == "close_agent":
                closed = await self.owner.step(episode, "wait", self._close(episode, handles))
                handles = {**handles, "resources_cookies": closed["resources_cookies"] or handles["resources_cookies"]}
                state = {**state, "next": "verify", "handles": handles, "observations": closed["agent_observations"]}
            else:
                mode = "replay" if self.verify_never_waits else handles["resources_verify"]
                result = await self.owner.step(episode, mode, self._verify(key, handles, params, state))
                self.participant.verified(episode, mode)
                state = {"next": "return", "handles": handles, "result": result, "observations": state["observations"]}

    async def _seed(
        self, episode: Episode, handles: dict[str, Any], task_id: dict[str, Any], task_data: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Seed the resources and agent sessions; the new handles, and whether the resources server said the
        episode can only restart."""
        key = episode.key
        seeded = await post_json(
            self.client,
            f"{self.resources_url}/ng-rollout/{key}/seed_session",
            {
                "resources_session_id": handles["resources_session_id"],
                "episode_id": episode.episode_id.wire(),
                "task_id": task_id,
                "task_data": task_data,
            },
        )
        resources_cookies = dict(seeded.cookies)
        verify_mode = seeded.headers.get("x-ng-checkpoint-verify", "wait")
        agent = await post_json(
            self.client,
            f"{self.agent_url}/ng-rollout/{key}/v1/agent_sessions",
            {
                "agent_session_id": handles["agent_session_id"],
                "episode_id": episode.episode_id.wire(),
                "task_id": task_id,
                "tool_accesses": [{"server": self.resources_server, "cookies": resources_cookies}],
                "sandbox_access": None,
            },
        )
        seeded_handles = {
            **handles,
            "resources_cookies": resources_cookies,
            "agent_cookies": dict(agent.cookies),
            "resources_verify": verify_mode,
        }
        return seeded_handles, seeded.headers.get(RESTART_HEADER) == "1"

    async def _invoke(self, key: str, handles: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        reply = await post_json(
            self.client,
            f"{self.agent_url}/ng-rollout/{key}/v1/responses",
            params,
            headers=cookie_header(handles["agent_cookies"]),
        )
        return reply.json()

    async def _close(self, episode: Episode, handles: dict[str, Any]) -> dict[str, Any]:
        reply = await post_json(
            self.client,
            f"{self.agent_url}/ng-rollout/{episode.key}/v1/agent_sessions/close",
            {"agent_session_id": handles["agent_session_id"], "episode_id": episode.episode_id.wire()},
            headers=cookie_header(handles["agent_cookies"]),
        )
        return reply.json()

    async def _verify(
        self, key: str, handles: dict[str, Any], params: dict[str, Any], state: dict[str, Any]
    ) -> dict[str, Any]:
        reply = await post_json(
            self.client,
            f"{self.resources_url}/ng-rollout/{key}/verify",
            {"responses_create_params": params, "response": state["response"]},
            headers=cookie_header(handles["resources_cookies"]),
        )
        verified = reply.json()
        return {"reward": verified["reward"], "ng_agent_observations": state.get("observations")}


def build_app(config: ServerConfig) -> FastAPI:
    """The `single_agent_turn` look-alike: `/run` plus the checkpoint control routes (one process)."""
    return single_process_app(config, build_parts)


def build_parts(config: ServerConfig, plane: ServerPlane) -> tuple[FastAPI, EnvironmentParticipant]:
    """The environment's `/run` and participant over `plane` (a worker's, or the one process's control plane)."""
    runner: dict[str, EpisodeRunner] = {}
    owner = EpisodeOwner(notify=plane.notify, counts_parked_time="parked_time_counts" in config.faults)
    participant = EnvironmentParticipant(owner, frozenset(config.faults))
    app = FastAPI(lifespan=lifespan_with_client(lambda c: runner.update(r=EpisodeRunner(c, config, participant))))
    install_error_handlers(app)
    # Planted fault: a new /run is admitted while a checkpoint is open (it then parks at its first boundary).
    admits_while_closed = "environment_admits_while_closed" in config.faults

    @app.post("/run")
    async def run(request: EpisodeRequest) -> JSONResponse:
        episode_id = request.episode_id
        if plane.retired.is_retired(episode_id):
            raise StaleAttemptError(f"attempt {episode_id.capture_key} was retired")
        key = episode_id.capture_key
        replacement = key in owner.restored and plane.phase != "restored"
        if not owner.admission.is_set() and not replacement and not admits_while_closed:
            raise AdmissionClosedError("a checkpoint is open; retry the /run after it resumes")
        episode = owner.begin(episode_id, task_digest(request.task.model_dump()), EPISODE_TIMEOUT_S)
        episode.task = asyncio.get_running_loop().create_task(runner["r"].run(episode, request))
        watchdog = owner.watch_deadline(episode)
        try:
            await asyncio.wait({episode.task})
        finally:
            watchdog.cancel()
            owner.end(episode)
        return episode_reply(request, episode)

    return app, participant


def episode_reply(request: EpisodeRequest, episode: Episode) -> JSONResponse:
    """How the episode ended, as the release answers it: its result; `Episode timed out` once its budget ran out;
    a terminal failure for an exception nothing handled. A retired attempt and a control refusal answer with
    their error instead."""
    task = episode.task
    assert task is not None
    if task.cancelled():
        if episode.retiring:
            raise StaleAttemptError(f"attempt {episode.key} was retired while it ran")
        return _reply(request, failure=EPISODE_TIMED_OUT)
    error = task.exception()
    if error is None:
        return _reply(request, result=task.result())
    if isinstance(error, ControlError):
        raise error
    if isinstance(error, DownstreamError) and error.code == "stale_attempt":
        raise StaleAttemptError(f"attempt {episode.key} was retired: {str(error)[:FAILURE_REASON_MAX_CHARS]}")
    return _reply(request, failure=unhandled_error(error))


def _reply(
    request: EpisodeRequest, result: dict[str, Any] | None = None, failure: EpisodeFailure | None = None
) -> JSONResponse:
    reply = EpisodeResponse(episode_id=request.episode_id, task_id=request.task.task_id, result=result, failure=failure)
    return JSONResponse(reply.wire())


def build_relay_app(config: ServerConfig) -> FastAPI:
    """The `legacy_agent` relay: forwards `/run` rows to the agent, keeps nothing, installs no participant."""
    clients: dict[str, httpx.AsyncClient] = {}
    app = FastAPI(lifespan=lifespan_with_client(lambda c: clients.update(c=c)))
    add_health(app)
    agent_url = config.peer("agent")

    @app.post("/run")
    async def run(request: Request) -> JSONResponse:
        try:
            reply = await clients["c"].post(
                f"{agent_url}/run", content=await request.body(), headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as error:
            # An answer, not an unhandled exception: that would drop the caller's keep-alive connection mid-pool.
            detail = f"the agent did not answer: {type(error).__name__}: {error}"
            return JSONResponse(error_body("downstream_unavailable", detail), status_code=502)
        try:
            body = reply.json()
        except ValueError:
            detail = f"the agent answered HTTP {reply.status_code} without JSON: {reply.text[:500]}"
            return JSONResponse(error_body("downstream_unavailable", detail), status_code=502)
        return JSONResponse(body, status_code=reply.status_code)

    return app
