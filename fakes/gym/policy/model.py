"""The policy model server: a look-alike of Gym's vLLM model server with `checkpoint_policy: true`.

Generation calls (`/ng-rollout/<capture_key>/v1/chat/completions`, or untagged `/v1/chat/completions`) pass an
admission gate and are forwarded to the fake backend with the capture key in the `x-ng-capture-key` header
(reference 7.1). While a checkpoint is open new calls wait before admission, and a reply that arrives is held
until resume: a delivered reply would move its episode past the state the checkpoint saves. Retire refuses a
covered attempt's calls and cancels those already admitted (reference 10).

With token capture (`fakes.gym.policy.capture`) a tagged call carries its lineage to the backend, its row is staged in
the capture ledger before delivery, and commit and restore carry the ledger rows; with generation cuts a prepare
also freezes the prefix of every call still generating, and a restored cut continues it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from fakes.backend import CAPTURE_KEY_HEADER, POLICY_WORKER_HEADER
from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import PrepareReport
from fakes.gym.control.plane import ControlPlane
from fakes.gym.policy.capture import GenerationCutter, TokenCapture, ledger_router
from fakes.gym.policy.gate import PolicyGate
from fakes.gym.policy.ledger import FileLedger
from fakes.gym.protocol.errors import (
    CheckpointStateError,
    ControlError,
    install_error_handlers,
)
from fakes.gym.protocol.generation_cut import GenerationCutRecord
from fakes.gym.protocol.http import RolloutPrefixMiddleware, add_health, lifespan_with_client, rollout_key
from fakes.gym.protocol.wire import GENERATION_CUT_ROUTE, EpisodeId, bearer, error_body
from fakes.gym.workers.placement import CallPlacement

GENERATION_PATH = "/v1/chat/completions"
FAULT_DELIVERS_HELD = "model_delivers_held"
RECORD_LIST_FIELDS = ("rows", "generation_cuts")


class PolicyParticipant:
    """Checkpoint hooks of the policy model: held replies never block, and only a fresh process restores."""

    kind = "model"

    def __init__(
        self,
        gate: PolicyGate,
        capture: TokenCapture | None = None,
        cutter: GenerationCutter | None = None,
        faults: frozenset[str] = frozenset(),
    ) -> None:
        self.gate = gate
        self.capture = capture
        self.cutter = cutter
        # Planted `cuts_pile_up`: a call cut again at the next prepare carries both cuts into the record.
        self._open_clears_cuts = "cuts_pile_up" not in faults

    def report(self) -> PrepareReport:
        # Replies are never streamed, so no call is ever past its delivery point: always ready.
        counts = {"inflight": len(self.gate.tickets), "held": self.gate.held, **self.gate.cut_counts}
        return PrepareReport(ready=True, counts=counts)

    async def close_admission(self, deadline_ts: float | None) -> None:
        """Close the gate; a prepare (it has a deadline) also cuts the calls still generating."""
        self.gate.set_open(False)
        if self.cutter is not None and deadline_ts is not None:
            await self.cutter.cut(self.gate, deadline_ts)

    async def open_admission(self) -> None:
        self.gate.clear_cuts(per_ticket=self._open_clears_cuts)
        self.gate.set_open(True)

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        if scope is None:
            raise ControlError(
                "model commit needs the episode_ids of every episode the controller continues; "
                "send the commit scope ('episode_ids') to the model server"
            )
        if self.capture is None:
            return []  # without token capture no call leaves rows or cuts
        return await self.capture.export(self.gate, scope)

    def commit_extras(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """`staging_keys` the training framework must keep: the records' rows and cut prefixes."""
        by_episode = {
            EpisodeId.model_validate(record["episode_id"]).capture_key: sorted(
                {row["staging_key"] for row in record["rows"] if "staging_key" in row}
                | {key for cut in record["generation_cuts"] for key in cut["continuation"]["staging_keys"]}
            )
            for record in records
        }
        keys = sorted({key for keys in by_episode.values() for key in keys})
        return {"staging_keys": keys, "staging_keys_by_episode": by_episode}

    def validate_record(self, record: dict[str, Any]) -> None:
        problems = [] if "episode_id" in record else ["'episode_id' is missing"]
        for field in RECORD_LIST_FIELDS:
            if not isinstance(record.get(field), list):
                problems.append(f"'{field}' must be a list (got {record.get(field)!r})")
        if not problems:
            problems += _row_problems(record["rows"]) + _cut_problems(record["generation_cuts"])
        if problems:
            raise CheckpointStateError(
                f"model record {record.get('episode_id')!r} is not a model record: {'; '.join(problems)}"
            )

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        if self.gate.served:
            raise ControlError(
                "restore needs a freshly started model server; this one has served calls (restart it, then restore)"
            )
        if self.capture is None:
            _refuse_unrestorable(records)
        else:
            await self.capture.install(self.gate, records, scope)
        targets = {episode_id.next_attempt().capture_key for episode_id in scope}
        self.gate.restored_targets = targets
        return sorted(targets)

    async def delete_restored(self, keep: set[str]) -> None:
        for key in self.gate.restored_targets - keep:
            self.gate.restored_cuts.pop(key, None)
        self.gate.restored_targets &= keep

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        await self.gate.retire(episode_ids)
        if self.capture is not None:
            await asyncio.to_thread(self.capture.retire, episode_ids)

    async def check_forget(self, rollout_ids: list[str]) -> None:
        """Retire leaves nothing behind in this process, so forgetting is always safe."""

    async def forget(self, rollout_ids: list[str]) -> None:
        """The retired marks (owned by the control plane) are all there is to forget; retired ledgers stay."""

    def status_extras(self) -> dict[str, Any]:
        return {"restored_generation_cuts": sorted(self.gate.restored_cuts)}


def _row_problems(rows: list[Any]) -> list[str]:
    bad = [row for row in rows if not (isinstance(row, dict) and isinstance(row.get("model_call_id"), str))]
    return [f"every row must be an object with a string 'model_call_id' (got {bad[:3]})"] if bad else []


def _cut_problems(cuts: list[Any]) -> list[str]:
    problems = []
    for cut in cuts:
        try:
            GenerationCutRecord.model_validate(cut)
        except ValidationError as exc:
            problems.append(f"generation cut {cut!r} is not a cut record ({exc.error_count()} problem(s): {exc})")
    return problems


def _refuse_unrestorable(records: list[dict[str, Any]]) -> None:
    """Rows and cuts need a capture ledger; this server runs without token capture."""
    for field in RECORD_LIST_FIELDS:
        carrying = sorted(
            EpisodeId.model_validate(record["episode_id"]).capture_key for record in records if record[field]
        )
        if carrying:
            raise ControlError(
                f"records of {carrying} carry {field}, but this model server has no capture ledger; "
                "restore them on a model server started with token capture"
            )


@attrs.define
class BackendForwarder:
    """Sends generation calls and cut inventories to the backend over the one client made at startup."""

    base_url: str
    token: str
    client: httpx.AsyncClient | None = None
    # A worker of a multi-worker server names itself to the backend (its index); a single process does not.
    worker: int | None = None
    # The served model every forwarded call names ("": the caller's `model` as it is), `ServerConfig.backend_model`.
    model: str = ""

    @property
    def url(self) -> str:
        return self.base_url + GENERATION_PATH

    async def post(self, body: bytes, capture_key: str | None) -> httpx.Response:
        assert self.client is not None, "the lifespan creates the client before the first request"
        headers = {"content-type": "application/json"}
        if capture_key is not None:
            headers[CAPTURE_KEY_HEADER] = capture_key
        if self.worker is not None:
            headers[POLICY_WORKER_HEADER] = str(self.worker)
        if self.model:
            body = naming_model(body, self.model)
        return await self.client.post(self.url, content=body, headers=headers)

    async def post_cut(self, inventory: dict[str, Any]) -> httpx.Response:
        assert self.client is not None, "the lifespan creates the client before the first request"
        headers = {"authorization": bearer(self.token)}
        return await self.client.post(self.base_url + GENERATION_CUT_ROUTE, json=inventory, headers=headers)


def policy_gate(
    config: ServerConfig, *, is_retired: Callable[[EpisodeId], bool], notify: Callable[[], None]
) -> PolicyGate:
    """The gate of one serving process (the server, or one worker of a multi-worker server)."""
    return PolicyGate(
        # Read once at startup, so the fault-free server pays nothing per call.
        holds_responses=FAULT_DELIVERS_HELD not in config.faults,
        is_retired=is_retired,
        notify=notify,
    )


def build_app(config: ServerConfig) -> FastAPI:
    """The policy model server with the checkpoint control routes, and the ledger routes with token capture."""
    faults = frozenset(config.faults)
    control_plane: ControlPlane
    gate = policy_gate(
        config,
        is_retired=lambda episode_id: control_plane.retired.is_retired(episode_id),
        notify=lambda: control_plane.notify(),
    )
    forwarder = backend_forwarder(config)
    ledger = FileLedger(config.capture_dir) if config.token_capture else None
    capture = TokenCapture(ledger, faults) if ledger is not None else None
    cutter = None
    if config.generation_cuts:
        cutter = GenerationCutter(forwarder.post_cut, config.name, lambda: control_plane.checkpoint_id, faults)
    control_plane = ControlPlane.from_config(PolicyParticipant(gate, capture, cutter, faults), config)
    if cutter is not None:
        control_plane.clock_followers.append(cutter.follow_clock)
    app = generation_app(gate, forwarder, capture)
    add_health(app)
    app.include_router(control_plane.router())
    if ledger is not None:
        app.include_router(ledger_router(ledger, config.capture_token, lambda: control_plane.checkpoint_id, faults))
    return app


def backend_forwarder(config: ServerConfig) -> BackendForwarder:
    return BackendForwarder(base_url=config.backend_url.rstrip("/"), token=config.token, model=config.backend_model)


def naming_model(body: bytes, model: str) -> bytes:
    """A chat request with its `model` field set to `model`; a body that is not a JSON object goes unchanged (the
    backend answers it as it would have)."""
    try:
        chat = json.loads(body)
    except ValueError:
        return body
    if not isinstance(chat, dict):
        return body
    return json.dumps({**chat, "model": model}).encode()


def generation_app(
    gate: PolicyGate,
    forwarder: BackendForwarder,
    capture: TokenCapture | None = None,
    placement: CallPlacement | None = None,
) -> FastAPI:
    """An app serving the generation route through `gate` (with `capture`, capturing tagged calls); the caller
    adds health and the control routes (`fakes.gym.policy.model_workers` builds a worker of a multi-worker server from
    it, with its `placement`: a call placed on a sibling worker is forwarded there, `fakes.gym.workers.placement`)."""
    app = FastAPI(lifespan=lifespan_with_client(lambda client: setattr(forwarder, "client", client)))
    app.add_middleware(RolloutPrefixMiddleware)
    install_error_handlers(app)

    @app.post(GENERATION_PATH)
    async def chat_completions(request: Request) -> Response:
        capture_key = rollout_key(request.state)
        body = await request.body()
        if placement is not None and (placed := placement.elsewhere(capture_key, request)) is not None:
            assert capture_key is not None, "only a tagged call is placed"
            try:
                return await placement.forward(request, capture_key, body, placed)
            except httpx.TransportError as exc:
                detail = f"worker {placed}, which this call is placed on, did not answer ({exc!r}); see the server log"
                return JSONResponse(error_body("backend_unavailable", detail), status_code=502)
        # Untagged calls (evals, judges, probes) belong to no episode: nothing of them is captured.
        tracker = capture if capture_key is not None else None
        chat: dict[str, Any] = {}
        if tracker is not None:
            try:
                chat = _json_object(body)
            except ValueError as exc:
                return JSONResponse(error_body("invalid_request", str(exc)), status_code=422)
        ticket = await gate.admit(capture_key)
        try:
            if tracker is not None:
                body = tracker.begin(gate, ticket, chat)
            reply = await gate.run(ticket, lambda: forwarder.post(body, capture_key))
            if tracker is not None:
                tracker.record(ticket, reply)
            await gate.deliver(ticket)
        except httpx.TransportError as exc:
            detail = f"the backend at {forwarder.url} did not answer ({exc!r}); check that it is running"
            return JSONResponse(error_body("backend_unavailable", detail), status_code=502)
        finally:
            gate.exit(ticket)
        return Response(reply.content, reply.status_code, media_type=reply.headers.get("content-type"))

    return app


def _json_object(body: bytes) -> dict[str, Any]:
    """A captured call's request, which token capture extends with `ng_capture`."""
    parsed = json.loads(body)
    if not isinstance(parsed, dict):
        raise ValueError(f"a captured call's body must be a JSON object, an OpenAI chat request (got {parsed!r:.80})")
    return parsed
