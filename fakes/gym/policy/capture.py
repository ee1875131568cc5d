"""Token capture on the policy model server: lineage at admission, ledger rows at return, model records at commit
and restore, the ledger control routes, and generation cuts (reference 7.1-7.3, 10).

The gate (`fakes.gym.policy.model.PolicyGate`) owns tickets and restored cuts; this module decides what a captured call
carries to the backend, what the capture ledger (`fakes.gym.policy.ledger`) keeps of it, and what a checkpoint exports
and installs. Planted faults are read once, when the server starts.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fakes.gym.control.routes import Authorization
from fakes.gym.faults.wall_timeouts import WallTimeouts
from fakes.gym.policy.ledger import FileLedger, Row
from fakes.gym.protocol.errors import ControlError, InvalidPhaseError, InvalidRolloutIdError, UnauthorizedError
from fakes.gym.protocol.generation_cut import (
    GenerationCutInventory,
    GenerationCutPrefix,
    GenerationCutPrefixAck,
    cuttable,
    request_digest,
    validated_acks,
)
from fakes.gym.protocol.wire import EpisodeId, bearer

if TYPE_CHECKING:
    from fakes.gym.policy.gate import PolicyGate, Ticket

log = logging.getLogger(__name__)

LEDGER_ROUTE_PREFIX = "/training-token-capture/control/rollouts"
Record = dict[str, Any]


def attempts_up_to(episode_ids: list[EpisodeId]) -> list[str]:
    """Capture keys of attempts 0..a of each retired (rollout, a): everything a retire covers."""
    last: dict[str, int] = {}
    for episode in episode_ids:
        last[episode.rollout_id] = max(last.get(episode.rollout_id, -1), episode.attempt)
    return sorted(
        EpisodeId(rollout_id=rollout_id, attempt=attempt).capture_key
        for rollout_id, top in last.items()
        for attempt in range(top + 1)
    )


class TokenCapture:
    """What token capture adds to each captured call and to the model's checkpoint records."""

    def __init__(self, ledger: FileLedger, faults: frozenset[str]) -> None:
        self.ledger = ledger
        self._exports_undelivered = "ledger_exports_undelivered" in faults
        self._refuses_dead_rows = "ledger_refuses_dead_rows" in faults
        self._appends_on_restore = "ledger_appends_on_restore" in faults
        self._recounts_calls = "ledger_reuses_call_ids" in faults
        self._parent_from_own_rows = "lineage_forgets_restored_parent" in faults
        self._retires_source = "ledger_source_not_retired" not in faults
        self._retires_on_retire = "ledger_retire_skipped" not in faults
        self._attaches_cuts = "cut_not_attached" not in faults

    def begin(self, gate: PolicyGate, ticket: Ticket, request: dict[str, Any]) -> bytes:
        """The body to forward: the request with `ng_capture` (the call's ID, its parent, any restored cut)."""
        call_id, rows = self.ledger.begin_call(ticket.capture_key)
        if self._parent_from_own_rows:
            rows = [row for row in rows if "capture_key" not in row]
        ticket.model_call_id = call_id
        ticket.parent_call_id = rows[-1]["model_call_id"] if rows else None
        ticket.request_digest = request_digest(request)
        ticket.cuttable = cuttable(request)
        capture: dict[str, Any] = {
            "model_call_id": call_id,
            "parent_call_id": ticket.parent_call_id,
            "rollout_id": ticket.capture_key,
        }
        continuation = gate.claim_cut(ticket) if self._attaches_cuts else None
        if continuation is not None:
            capture["generation_cut"] = continuation
        return json.dumps({**request, "ng_capture": capture}).encode()

    def record(self, ticket: Ticket, reply: httpx.Response) -> None:
        """Append the call's row (the backend staged its tokens) before its reply is delivered: a held call has one."""
        if reply.status_code != 200:
            return
        coords = reply.json().get("ng_commit_coords")
        if coords is None:
            return
        row = {
            "model_call_id": ticket.model_call_id,
            "parent_call_id": ticket.parent_call_id,
            "staging_key": coords["staging_key"],
        }
        self.ledger.append(ticket.capture_key, [row])

    async def export(self, gate: PolicyGate, scope: list[EpisodeId]) -> list[Record]:
        """Per scoped episode its rows, minus any undelivered call's, and at most one cut; empty ones left out."""
        undelivered = set() if self._exports_undelivered else gate.undelivered_call_ids()
        keys = sorted({episode.capture_key for episode in scope})
        rows_by_key = await asyncio.to_thread(self.ledger.rows_many, keys)
        records = []
        for key in keys:
            rows = [row for row in rows_by_key[key] if row["model_call_id"] not in undelivered]
            cuts = gate.episode_cuts(key)
            if rows or cuts:
                episode = EpisodeId.from_capture_key(key).wire()
                records.append({"episode_id": episode, "rows": rows, "generation_cuts": cuts})
        return records

    async def install(self, gate: PolicyGate, records: list[Record], scope: list[EpisodeId]) -> None:
        """Rows under each next attempt, replacing a dead execution's; then the source attempts' ledgers retire."""
        by_key = {EpisodeId.model_validate(record["episode_id"]).capture_key: record for record in records}
        piled = sorted(key for key, record in by_key.items() if len(record["generation_cuts"]) > 1)
        if piled:
            raise ControlError(
                f"records of {piled} carry more than one generation cut; a record continues at most one cut "
                "(export the latest cut only)"
            )
        rows_by_target: dict[str, list[Row]] = {}
        cuts_by_target: dict[str, Record] = {}
        for episode in scope:
            record = by_key.get(episode.capture_key, {"rows": [], "generation_cuts": []})
            target = episode.next_attempt().capture_key
            rows_by_target[target] = [{"capture_key": episode.capture_key, **row} for row in record["rows"]]
            cuts_by_target.update((target, cut) for cut in record["generation_cuts"])
        await asyncio.to_thread(self._write_restored, rows_by_target, [e.capture_key for e in scope])
        gate.restore_cuts(cuts_by_target)

    def _write_restored(self, rows_by_target: dict[str, list[Row]], sources: list[str]) -> None:
        if self._refuses_dead_rows:
            holding = sorted(key for key, rows in self.ledger.rows_many(rows_by_target).items() if rows)
            if holding:
                raise ControlError(
                    f"capture ledger refused the restore: {holding} already holds rows from another execution"
                )
        if self._appends_on_restore:
            for key, rows in rows_by_target.items():
                self.ledger.append(key, rows)
        else:
            self.ledger.replace_many(rows_by_target, recount_calls=self._recounts_calls)
        if self._retires_source:
            self.ledger.retire(sources)

    def retire(self, episode_ids: list[EpisodeId]) -> None:
        """Retire the ledgers of every covered attempt, with or without rows: the manifest then answers 410."""
        if self._retires_on_retire:
            self.ledger.retire(attempts_up_to(episode_ids))


class GenerationCutter:
    """One cut round when a prepare closes the gate: never blocks or fails the prepare, at worst costs the cut."""

    def __init__(
        self,
        send: Callable[[dict[str, Any]], Awaitable[httpx.Response]],
        server_name: str,
        checkpoint_id: Callable[[], str | None],
        faults: frozenset[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.send = send
        self._clock = clock
        self.server_name = server_name
        self.checkpoint_id = checkpoint_id
        # Planted `cut_without_timeout`: the cut waits for the backend however long it takes.
        self._bounded = "cut_without_timeout" not in faults
        # The cut's budget falls at a wall time: a jump of this server's clock past it ends the cut at once.
        self.timeouts = WallTimeouts(clock)

    async def follow_clock(self, offset_s: float) -> None:
        """This server's clock moved (`POST /_ctl/clock`): a cut whose budget it jumped past gives up now."""
        self.timeouts.clock_moved()

    async def cut(self, gate: PolicyGate, deadline_ts: float) -> None:
        """Cut every captured call still generating; constrained ones are skipped and will regenerate."""
        in_progress = [t for t in gate.tickets.values() if t.model_call_id and t.at_backend and not t.delivered]
        chosen = [ticket for ticket in in_progress if ticket.cuttable]
        gate.cut_counts["cut_skipped"] += len(in_progress) - len(chosen)
        if chosen:
            await self._cut_round(gate, chosen, deadline_ts)
        gate.changed()

    async def _cut_round(self, gate: PolicyGate, chosen: list[Ticket], deadline_ts: float) -> None:
        checkpoint_id = self.checkpoint_id()
        assert checkpoint_id is not None, "a prepare names its checkpoint before it closes the gate"
        inventory = GenerationCutInventory.build(checkpoint_id, self.server_name, [_prefix(t) for t in chosen])
        acks = await self._acks(inventory, deadline_ts)
        for ticket in chosen:
            ack = acks.get(ticket.ticket_id)
            if ack is None or ack.disposition != "durable_prefix":
                gate.cut_counts["cut_failed"] += 1
                continue
            ticket.cuts.append(_cut_record(ticket, ack))
            gate.cut_counts["cut"] += 1

    async def _acks(self, inventory: GenerationCutInventory, deadline_ts: float) -> dict[int, GenerationCutPrefixAck]:
        """The receipt's acks, or none at all when it is late, refused or does not answer the inventory."""
        timeout_s = (deadline_ts - self._clock()) / 2 if self._bounded else None
        try:
            if timeout_s is not None and timeout_s <= 0:
                raise TimeoutError("no prepare time left for a cut")
            async with self.timeouts.within(timeout_s):
                response = await self.send(inventory.model_dump())
            response.raise_for_status()
            return validated_acks(inventory, response.json())
        except (httpx.HTTPError, TimeoutError, ValueError) as exc:
            calls = len(inventory.active_prefixes)
            log.warning(
                "generation cut of %s failed (%r); its %d call(s) will regenerate", inventory.checkpoint_id, exc, calls
            )
            return {}


def _prefix(ticket: Ticket) -> GenerationCutPrefix:
    # Only captured calls are cut, and only tagged calls are captured.
    assert ticket.episode_id is not None
    assert ticket.model_call_id is not None
    return GenerationCutPrefix(
        ticket_id=ticket.ticket_id,
        rollout_id=ticket.episode_id.rollout_id,
        attempt=ticket.episode_id.attempt,
        model_call_id=ticket.model_call_id,
        admitted_at=ticket.admitted_at,
    )


def _cut_record(ticket: Ticket, ack: GenerationCutPrefixAck) -> Record:
    return {
        "model_call_id": ticket.model_call_id,
        "request_digest": ticket.request_digest,
        "continuation": ack.continuation(ticket.capture_key),
    }


class LedgerRolloutsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_ids: list[str] = Field(min_length=1)


def _capture_key(key: str) -> str:
    try:
        return EpisodeId.from_capture_key(key).capture_key
    except ValidationError as exc:
        problems = "; ".join(error["msg"] for error in exc.errors())
        raise InvalidRolloutIdError(f"{key!r} is not a capture key ({problems}); name a rollout attempt") from None


def ledger_router(
    ledger: FileLedger,
    capture_token: str,
    open_checkpoint: Callable[[], str | None],
    faults: frozenset[str],
) -> APIRouter:
    """The ledger control routes, under their own bearer; retire and delete wait for any open checkpoint."""
    router = APIRouter(prefix=LEDGER_ROUTE_PREFIX)
    expected = bearer(capture_token).encode()
    refuses_while_open = "ledger_removal_while_open" not in faults

    def authorize(authorization: str | None) -> None:
        if not hmac.compare_digest((authorization or "").encode(), expected):
            raise UnauthorizedError(
                "ledger control routes need the header 'Authorization: Bearer <capture control token>'"
            )

    def removable(authorization: str | None, body: LedgerRolloutsRequest, op: str) -> list[str]:
        authorize(authorization)
        keys = [_capture_key(key) for key in body.rollout_ids]
        checkpoint_id = open_checkpoint()
        if refuses_while_open and checkpoint_id is not None:
            raise InvalidPhaseError(
                f"ledger {op} of {keys} refused: checkpoint {checkpoint_id!r} is open on this model server and its "
                "records may name these ledgers; retry ledger retire and delete after it resumes"
            )
        return keys

    @router.get("/{capture_key}/manifest")
    async def manifest(capture_key: str, authorization: Authorization = None) -> dict[str, Any]:
        authorize(authorization)
        key = _capture_key(capture_key)
        return {"rollout_id": key, "records": ledger.live_rows(key), "failures": []}

    @router.post("/retire")
    async def retire(body: LedgerRolloutsRequest, authorization: Authorization = None) -> dict[str, Any]:
        keys = removable(authorization, body, "retire")
        ledger.retire(keys)
        return {"retired": keys}

    @router.post("/delete")
    async def delete(body: LedgerRolloutsRequest, authorization: Authorization = None) -> dict[str, Any]:
        keys = removable(authorization, body, "delete")
        ledger.delete(keys)
        return {"deleted": keys}

    return router
