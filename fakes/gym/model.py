"""The policy model server: a look-alike of Gym's vLLM model server with `checkpoint_policy: true`.

Generation calls (`/ng-rollout/<capture_key>/v1/chat/completions`, or untagged `/v1/chat/completions`) pass an
admission gate and are forwarded to the fake backend with the capture key in the `x-ng-capture-key` header
(reference 7.1). While a checkpoint is open new calls wait before admission, and a reply that arrives is held
until resume: a delivered reply would move its episode past the state the checkpoint saves. Retire refuses a
covered attempt's calls and cancels those already admitted (reference 10).

Token capture (the capture ledger, its rows in commit records, ledger control routes) and generation cuts come in a
later issue; the seams are `PolicyParticipant.ledger_records`, `commit_extras` and the `cut*` counts.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from fakes.backend import CAPTURE_KEY_HEADER
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
from fakes.gym.http import RolloutPrefixMiddleware, add_health, lifespan_with_client, rollout_key
from fakes.gym.participant import PrepareReport
from fakes.gym.wire import EpisodeId, error_body

GENERATION_PATH = "/v1/chat/completions"
FAULT_DELIVERS_HELD = "model_delivers_held"
RECORD_LIST_FIELDS = ("rows", "generation_cuts")


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

    def stale(self, when: str) -> StaleAttemptError:
        return StaleAttemptError(
            f"attempt {self.capture_key!r} was retired {when}; its generation was cancelled and not delivered"
        )


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
        ticket = Ticket(next(self._ticket_ids), capture_key or "", episode_id, time.monotonic())
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
        try:
            return await ticket.work
        except asyncio.CancelledError:
            if ticket.retired and not _being_cancelled():
                raise ticket.stale("while it generated") from None
            raise

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

    def exit(self, ticket: Ticket) -> None:
        del self.tickets[ticket.ticket_id]
        self.changed()

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        """Wake waiting calls (their marks refuse them), cancel covered admitted calls, wait until gone."""
        covered = covers(episode_ids)
        victims = [t for t in self.tickets.values() if t.episode_id is not None and covered(t.episode_id)]
        for ticket in victims:
            ticket.retired = True
            if ticket.work is not None:
                ticket.work.cancel()
        self.restored_targets = {key for key in self.restored_targets if not covered(EpisodeId.from_capture_key(key))}
        self.changed()
        while any(ticket.ticket_id in self.tickets for ticket in victims):
            await self._changed.wait()


class PolicyParticipant:
    """Checkpoint hooks of the policy model: held replies never block, and only a fresh process restores."""

    kind = "model"

    def __init__(self, gate: PolicyGate) -> None:
        self.gate = gate

    def report(self) -> PrepareReport:
        # Replies are never streamed, so no call is ever past its delivery point: always ready.
        counts = {
            "inflight": len(self.gate.tickets),
            "held": self.gate.held,
            "cut": 0,
            "cut_failed": 0,
            "cut_skipped": 0,
        }
        return PrepareReport(ready=True, counts=counts)

    async def close_admission(self) -> None:
        self.gate.set_open(False)

    async def open_admission(self) -> None:
        self.gate.set_open(True)

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        if scope is None:
            raise ControlError(
                "model commit needs the episode_ids of every episode the controller continues; "
                "send the commit scope ('episode_ids') to the model server"
            )
        return self.ledger_records(scope)

    def ledger_records(self, scope: list[EpisodeId]) -> list[dict[str, Any]]:
        """Records of the scoped episodes' capture-ledger rows; without token capture no call leaves rows."""
        return []

    def commit_extras(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """`staging_keys` the training framework must keep, from the rows the records carry."""
        by_episode = {
            EpisodeId.model_validate(record["episode_id"]).capture_key: sorted(
                {row["staging_key"] for row in record["rows"] if "staging_key" in row}
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
        if problems:
            raise CheckpointStateError(
                f"model record {record.get('episode_id')!r} is not a model record: {'; '.join(problems)}"
            )

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        if self.gate.served:
            raise ControlError(
                "restore needs a freshly started model server; this one has served calls (restart it, then restore)"
            )
        _refuse_unrestorable(records)
        targets = {episode_id.next_attempt().capture_key for episode_id in scope}
        self.gate.restored_targets = targets
        return sorted(targets)

    async def delete_restored(self, keep: set[str]) -> None:
        self.gate.restored_targets &= keep

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        await self.gate.retire(episode_ids)

    async def check_forget(self, rollout_ids: list[str]) -> None:
        """Retire leaves nothing behind in this process, so forgetting is always safe."""

    async def forget(self, rollout_ids: list[str]) -> None:
        """The retired marks (owned by the control plane) are all there is to forget."""

    def status_extras(self) -> dict[str, Any]:
        return {"restored_generation_cuts": []}


def _refuse_unrestorable(records: list[dict[str, Any]]) -> None:
    """Rows need a capture ledger and cuts need token capture; this server has neither yet."""
    for field, needs in (("rows", "a capture ledger"), ("generation_cuts", "generation cuts")):
        carrying = sorted(
            EpisodeId.model_validate(record["episode_id"]).capture_key for record in records if record[field]
        )
        if carrying:
            raise ControlError(
                f"records of {carrying} carry {field}, but this model server has no {needs}; "
                "restore them on a model server started with token capture"
            )


@attrs.define
class BackendForwarder:
    """Sends generation calls to the backend over the one client made at startup."""

    url: str
    client: httpx.AsyncClient | None = None

    async def post(self, body: bytes, capture_key: str | None) -> httpx.Response:
        assert self.client is not None, "the lifespan creates the client before the first request"
        headers = {"content-type": "application/json"}
        if capture_key is not None:
            headers[CAPTURE_KEY_HEADER] = capture_key
        return await self.client.post(self.url, content=body, headers=headers)


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
    """The policy model server with the checkpoint control routes."""
    control_plane: ControlPlane
    gate = policy_gate(
        config,
        is_retired=lambda episode_id: control_plane.retired.is_retired(episode_id),
        notify=lambda: control_plane.notify(),
    )
    control_plane = ControlPlane.from_config(PolicyParticipant(gate), config)
    app = generation_app(config, gate)
    add_health(app)
    app.include_router(control_plane.router())
    return app


def generation_app(config: ServerConfig, gate: PolicyGate) -> FastAPI:
    """An app serving the generation route through `gate`; the caller adds health and the control routes
    (`fakes.gym.model_workers` builds a worker of a multi-worker server from it)."""
    forwarder = BackendForwarder(url=config.backend_url.rstrip("/") + GENERATION_PATH)
    app = FastAPI(lifespan=lifespan_with_client(lambda client: setattr(forwarder, "client", client)))
    app.add_middleware(RolloutPrefixMiddleware)
    install_error_handlers(app)

    @app.post(GENERATION_PATH)
    async def chat_completions(request: Request) -> Response:
        capture_key = rollout_key(request.state)
        body = await request.body()
        ticket = await gate.admit(capture_key)
        try:
            reply = await gate.run(ticket, lambda: forwarder.post(body, capture_key))
            await gate.deliver(ticket)
        except httpx.TransportError as exc:
            detail = f"the backend at {forwarder.url} did not answer ({exc!r}); check that it is running"
            return JSONResponse(error_body("backend_unavailable", detail), status_code=502)
        finally:
            gate.exit(ticket)
        return Response(reply.content, reply.status_code, media_type=reply.headers.get("content-type"))

    return app
