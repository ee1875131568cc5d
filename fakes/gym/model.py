"""The policy model server: a look-alike of Gym's vLLM model server with `checkpoint_policy: true`.

Generation calls (`/ng-rollout/<capture_key>/v1/chat/completions`, or untagged `/v1/chat/completions`) pass an
admission gate and are forwarded to the fake backend with the capture key in the `x-ng-capture-key` header
(reference 7.1). While a checkpoint is open new calls wait before admission, and a reply that arrives is held
until resume: a delivered reply would move its episode past the state the checkpoint saves. Retire refuses a
covered attempt's calls and cancels those already admitted (reference 10).

With token capture (`fakes.gym.capture`) a tagged call carries its lineage to the backend, its row is staged in
the capture ledger before delivery, and commit and restore carry the ledger rows; with generation cuts a prepare
also freezes the prefix of every call still generating, and a restored cut continues it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from fakes.backend import CAPTURE_KEY_HEADER
from fakes.gym.capture import GenerationCutter, TokenCapture, ledger_router
from fakes.gym.config import ServerConfig
from fakes.gym.control_plane import ControlPlane
from fakes.gym.environment import covers
from fakes.gym.errors import (
    CheckpointStateError,
    ControlError,
    InvalidRolloutIdError,
    StaleAttemptError,
    install_error_handlers,
)
from fakes.gym.generation_cut import GenerationCutRecord
from fakes.gym.http import RolloutPrefixMiddleware, add_health, lifespan_with_client, rollout_key
from fakes.gym.ledger import FileLedger
from fakes.gym.participant import PrepareReport
from fakes.gym.wire import GENERATION_CUT_ROUTE, EpisodeId, bearer, error_body

GENERATION_PATH = "/v1/chat/completions"
FAULT_DELIVERS_HELD = "model_delivers_held"
RECORD_LIST_FIELDS = ("rows", "generation_cuts")
CUT_COUNTS = ("cut", "cut_failed", "cut_skipped")


def episode_of(capture_key: str | None) -> EpisodeId | None:
    """The attempt a call belongs to; None for untagged calls (evals, judges, probes)."""
    if capture_key is None:
        return None
    try:
        return EpisodeId.from_capture_key(capture_key)
    except ValidationError as exc:
        problems = "; ".join(error["msg"] for error in exc.errors())
        raise InvalidRolloutIdError(
            f"'/ng-rollout/<capture_key>' must name an episode (got {capture_key!r}: {problems}); "
            "send the capture key of the rollout attempt, or call /v1/chat/completions untagged"
        ) from None


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@attrs.define(eq=False)
class Ticket:
    """One admitted generation call; counted in flight until its handler exits."""

    ticket_id: int
    capture_key: str
    episode_id: EpisodeId | None
    admitted_at: float
    work: asyncio.Future[Any] | None = None
    held: bool = False
    retired: bool = False
    # Token capture: the call's identity and conversation, where it is, and the cuts that froze its prefix.
    model_call_id: str | None = None
    parent_call_id: str | None = None
    request_digest: str = ""
    cuttable: bool = False
    at_backend: bool = False
    delivered: bool = False
    cuts: list[dict[str, Any]] = attrs.Factory(list)
    claimed_cut: bool = False

    def stale(self, when: str) -> StaleAttemptError:
        return StaleAttemptError(
            f"attempt {self.capture_key!r} was retired {when}; its generation was cancelled and not delivered"
        )


@attrs.define(eq=False)
class RestoredCut:
    """A restored generation cut; `claimed_by` is the ticket whose call carries it until delivery."""

    record: dict[str, Any]
    claimed_by: int | None = None


class PolicyGate:
    """Admission and delivery of generation calls in one process; `changed()` wakes every wait on it."""

    def __init__(
        self,
        *,
        holds_responses: bool,
        is_retired: Callable[[EpisodeId], bool],
        notify: Callable[[], None],
    ) -> None:
        self.holds_responses = holds_responses
        self.is_retired = is_retired
        self.notify = notify
        self.open = True
        self.served = False
        self.tickets: dict[int, Ticket] = {}
        # Kept as a count: the readiness wait reads it after every change, with thousands of calls in flight.
        self.held = 0
        self.restored_targets: set[str] = set()
        # Next-attempt capture key -> a restored cut its first matching call continues (kept until delivered).
        self.restored_cuts: dict[str, RestoredCut] = {}
        # The current checkpoint's cut round; cleared when admission opens.
        self.cut_counts = dict.fromkeys(CUT_COUNTS, 0)
        self._ticket_ids = itertools.count()
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Wake the gate's own waits and the control plane's readiness wait."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        self.notify()

    def set_open(self, open_: bool) -> None:
        self.open = open_
        self.changed()

    async def admit(self, capture_key: str | None) -> Ticket:
        """Refuse invalid keys and retired attempts; wait (uncounted) while closed, re-checking retirement."""
        episode_id = episode_of(capture_key)
        while True:
            if episode_id is not None and self.is_retired(episode_id):
                raise StaleAttemptError(
                    f"attempt {capture_key!r} is retired; run a later attempt, or forget the rollout first"
                )
            if self.open:
                break
            await self._changed.wait()
        ticket = Ticket(next(self._ticket_ids), capture_key or "", episode_id, time.time())
        self.tickets[ticket.ticket_id] = ticket
        self.served = True
        self.restored_targets.discard(ticket.capture_key)
        self.changed()
        return ticket

    async def run(self, ticket: Ticket, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run the backend call as its own task, so retire can cancel it without cancelling the handler."""
        if ticket.retired:
            raise ticket.stale("before it reached the backend")
        ticket.work = asyncio.ensure_future(call())
        ticket.at_backend = True
        try:
            return await ticket.work
        except asyncio.CancelledError:
            if ticket.retired and not _being_cancelled():
                raise ticket.stale("while it generated") from None
            raise
        finally:
            ticket.at_backend = False

    async def deliver(self, ticket: Ticket) -> None:
        """Hold the reply while the gate is closed; the planted fault delivers it anyway."""
        try:
            while self.holds_responses and not self.open and not ticket.retired:
                if not ticket.held:
                    ticket.held = True
                    self.held += 1
                    self.changed()
                await self._changed.wait()
        finally:
            if ticket.held:
                ticket.held = False
                self.held -= 1
                self.changed()
        if ticket.retired:
            raise ticket.stale("while its reply was held")
        ticket.delivered = True
        if ticket.claimed_cut:
            # The continuation reached its episode: the cut is used up.
            self.restored_cuts.pop(ticket.capture_key, None)

    def exit(self, ticket: Ticket) -> None:
        del self.tickets[ticket.ticket_id]
        restored = self.restored_cuts.get(ticket.capture_key)
        if ticket.claimed_cut and not ticket.delivered and restored is not None:
            restored.claimed_by = None  # the call failed before delivery: the next matching call may use the cut
        self.changed()

    def claim_cut(self, ticket: Ticket) -> dict[str, Any] | None:
        """The continuation of the key's restored cut, if unclaimed and cut from this very conversation."""
        restored = self.restored_cuts.get(ticket.capture_key)
        if restored is None or restored.claimed_by is not None:
            return None
        if restored.record["request_digest"] != ticket.request_digest:
            return None
        restored.claimed_by = ticket.ticket_id
        ticket.claimed_cut = True
        continuation: dict[str, Any] = restored.record["continuation"]
        return continuation

    def restore_cuts(self, cuts: dict[str, dict[str, Any]]) -> None:
        self.restored_cuts = {key: RestoredCut(record) for key, record in cuts.items()}

    def undelivered_call_ids(self) -> set[str]:
        return {t.model_call_id for t in self.tickets.values() if t.model_call_id is not None and not t.delivered}

    def episode_cuts(self, capture_key: str) -> list[dict[str, Any]]:
        """The cuts of the latest-admitted call of the key that has any, else the key's unconsumed restored cut."""
        cut_tickets = [t for t in self.tickets.values() if t.capture_key == capture_key and t.cuts]
        if cut_tickets:
            return list(max(cut_tickets, key=lambda ticket: ticket.ticket_id).cuts)
        restored = self.restored_cuts.get(capture_key)
        return [] if restored is None else [restored.record]

    def clear_cuts(self, *, per_ticket: bool) -> None:
        self.cut_counts = dict.fromkeys(CUT_COUNTS, 0)
        if per_ticket:
            for ticket in self.tickets.values():
                ticket.cuts.clear()

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        """Wake waiting calls (their marks refuse them), cancel covered admitted calls, wait until gone."""
        covered = covers(episode_ids)
        victims = [t for t in self.tickets.values() if t.episode_id is not None and covered(t.episode_id)]
        for ticket in victims:
            ticket.retired = True
            if ticket.work is not None:
                ticket.work.cancel()
        self.restored_targets = {key for key in self.restored_targets if not covered(EpisodeId.from_capture_key(key))}
        self.restored_cuts = {
            key: cut for key, cut in self.restored_cuts.items() if not covered(EpisodeId.from_capture_key(key))
        }
        self.changed()
        while any(ticket.ticket_id in self.tickets for ticket in victims):
            await self._changed.wait()


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

    @property
    def url(self) -> str:
        return self.base_url + GENERATION_PATH

    async def post(self, body: bytes, capture_key: str | None) -> httpx.Response:
        assert self.client is not None, "the lifespan creates the client before the first request"
        headers = {"content-type": "application/json"}
        if capture_key is not None:
            headers[CAPTURE_KEY_HEADER] = capture_key
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
    app = generation_app(gate, forwarder, capture)
    add_health(app)
    app.include_router(control_plane.router())
    if ledger is not None:
        app.include_router(ledger_router(ledger, config.capture_token, lambda: control_plane.checkpoint_id, faults))
    return app


def backend_forwarder(config: ServerConfig) -> BackendForwarder:
    return BackendForwarder(base_url=config.backend_url.rstrip("/"), token=config.token)


def generation_app(gate: PolicyGate, forwarder: BackendForwarder, capture: TokenCapture | None = None) -> FastAPI:
    """An app serving the generation route through `gate` (with `capture`, capturing tagged calls); the caller
    adds health and the control routes (`fakes.gym.model_workers` builds a worker of a multi-worker server from
    it)."""
    app = FastAPI(lifespan=lifespan_with_client(lambda client: setattr(forwarder, "client", client)))
    app.add_middleware(RolloutPrefixMiddleware)
    install_error_handlers(app)

    @app.post(GENERATION_PATH)
    async def chat_completions(request: Request) -> Response:
        capture_key = rollout_key(request.state)
        body = await request.body()
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
