"""The environment, agent and resources servers as several uvicorn workers behind one port (reference 1.4,
Appendix B), built on the generic coordinator and worker modules (`fakes.gym.workers.coordinator_process` names them).

Each worker serves its role's routes (`build_parts` of `fakes.gym.servers.environment`, `agent`, `resources`) over its
own participant, which holds the episodes and sessions that worker serves; `fakes.gym.workers.session_routing` sends
every request of one episode to one worker. The coordinator (the server's main process) owns the control plane, and its
`CoordinatedParticipant` fans every hook out to the workers and merges what they answer:

- report and status: merged (`fakes.gym.workers.reports`); a close numbers a generation every live worker must
  report for, and a worker lost while admission is closed blocks (`<label>-worker-lost`) until it opens again;
- export: every worker's records, plus the restored records no worker has claimed yet; each worker sends its
  records as the lines of the records file (`export_wire`), which the coordinator writes as they came;
- install: only into a server whose workers are all fresh and none left since it started; the records are
  installed into the coordinator's own participant (a fresh one of the role, so the role's rules and planted faults
  apply as in one process) and stay there until the worker an episode's replacement is routed to claims its key
  (`claim`; exactly one claim wins, reference Appendix B: "claimable by key");
- retire: marks to every worker first, then every worker stops and frees its covered work, then the coordinator
  drops the covered restored records it holds; forget and its check reach every worker.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from fastapi import FastAPI, Header

from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import LatePlane, Participant, PrepareReport
from fakes.gym.control.plane import ControlPlane
from fakes.gym.control.store import EncodedRecord, collector_paused, encode_record
from fakes.gym.protocol.errors import ControlError
from fakes.gym.protocol.wire import PLACEMENT_ROUTE, WORKERS_ROUTE, EpisodeId, key_of
from fakes.gym.servers.single_process import BuildParts
from fakes.gym.workers.channel import Framed
from fakes.gym.workers.coordinator import WorkerPool
from fakes.gym.workers.link import WorkerLink
from fakes.gym.workers.placement import PlacementRequest, place_everywhere
from fakes.gym.workers.reports import merge_extras
from fakes.gym.workers.routes import add_worker_routes
from fakes.gym.workers.session_routing import SessionRouter, SessionRoutingMiddleware

# Reference 1.4: how an environment, agent or resources worker finds its coordinator's socket.
COORDINATOR_SOCKET_ENV = "NEMO_GYM_CHECKPOINT_COORDINATOR_SOCKET"


class Adopting(Participant, Protocol):
    """A role's participant that can also take restored records without asking for a fresh process."""

    async def adopt(self, records: list[dict[str, Any]]) -> list[str]: ...

    async def export_keys(self, keys: AbstractSet[str] | None) -> list[dict[str, Any]]: ...


def build_parts_for(role: str) -> BuildParts:
    """The role's routes and participant builder; imports stay local so each process loads only its role."""
    if role == "environment":
        from fakes.gym.servers.environment import build_parts as environment

        return environment
    if role == "agent":
        from fakes.gym.servers.agent import build_parts as agent

        return agent
    if role == "resources":
        from fakes.gym.servers.resources import build_parts as resources

        return resources
    raise ValueError(f"role {role!r} has no participant workers")


def keys_wire(keys: Iterable[str] | None) -> Framed:
    """Capture keys as they travel to every worker (a commit's scope, or the restored records it keeps): a line
    each, as raw bytes beside the JSON, encoded once for all the workers; None (no scope) as no keys at all.
    Thousands go to every worker with every commit, and a worker splits them only if it asks about a key
    (`WireKeys`): one without restored records never does."""
    if keys is None:
        return Framed({"keys": None}, b"")
    return Framed({"keys": "lines"}, "\n".join(keys).encode())


def keys_from_wire(message: Framed) -> WireKeys | None:
    """The capture keys `keys_wire` sent (None: none were given)."""
    return None if message.body["keys"] is None else WireKeys(message.data)


class WireKeys(AbstractSet[str]):
    """Capture keys from `keys_wire`, split into a set the first time they are asked about (`in`, iterating,
    `len`; truth is `len`, so test `is None` where that is what is meant). Capture keys are names (reference 5.1:
    no newline), so a line each is unambiguous."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._keys: frozenset[str] | None = None

    @classmethod
    def _from_iterable(cls, keys: Iterable[str]) -> frozenset[str]:
        return frozenset(keys)

    def _split(self) -> frozenset[str]:
        if self._keys is None:
            self._keys = frozenset(self._data.decode().split("\n")) if self._data else frozenset()
        return self._keys

    def __contains__(self, key: object) -> bool:
        return key in self._split()

    def __iter__(self) -> Iterator[str]:
        return iter(self._split())

    def __len__(self) -> int:
        return len(self._split())


def record_order(record: EncodedRecord) -> tuple[str, int]:
    """Records sort by rollout and attempt, as one process exports them in the order its episodes sort."""
    return record.order


def export_wire(records: list[EncodedRecord], index: int) -> Framed:
    """A worker's export as it travels to the coordinator: each record's episode and line length as JSON, the lines
    themselves as raw bytes (the records file's own), so the coordinator neither decodes nor re-encodes them."""
    return Framed(
        {
            "index": index,
            "rollout_ids": [record.order[0] for record in records],
            "attempts": [record.order[1] for record in records],
            "lengths": [len(record.line) for record in records],
        },
        b"".join(record.line for record in records),
    )


def records_from_wire(reply: Framed) -> list[EncodedRecord]:
    """The records of a worker's export (`export_wire`)."""
    body, data = reply.body, memoryview(reply.data)  # each record's line a view of the frame's data, not a copy
    records = []
    start = 0
    for rollout_id, attempt, length in zip(body["rollout_ids"], body["attempts"], body["lengths"], strict=True):
        records.append(EncodedRecord(key_of(rollout_id, attempt), (rollout_id, attempt), data[start : start + length]))
        start += length
    return records


def worker_report(participant: Participant) -> dict[str, Any]:
    """A worker's report as it travels to the coordinator: readiness (every blocker; the wire's cap applies after
    the merge) and its status extras."""
    report = participant.report()
    return {
        "ready": report.ready,
        "blockers": list(report.blockers),
        "counts": dict(report.counts),
        "restarts": list(report.restarts),
        "extras": participant.status_extras(),
    }


def restore_refusal(*, left: bool, unreported: int) -> str | None:
    """Why a restore must be refused before any worker is asked (None: ask them)."""
    if left:
        return "restore needs a freshly started server; a worker of this one left since it started (restart it)"
    if unreported:
        return (
            f"restore needs every worker of the server to close admission; {unreported} did not answer "
            "(see the server log; restart it, then restore)"
        )
    return None


# --- the coordinator --------------------------------------------------------------------------------------------


class CoordinatedParticipant:
    """The participant of a multi-worker environment, agent or resources server (the module docstring says how)."""

    def __init__(
        self,
        local: Adopting,
        pool: WorkerPool,
        *,
        label: str,
        checkpoint_id: Callable[[], str | None],
        faults: frozenset[str] = frozenset(),
    ):
        self.local = local
        self.kind = local.kind
        self.pool = pool
        self.label = label
        self.checkpoint_id = checkpoint_id
        # Restored records no worker has claimed yet, by the next attempt's capture key (`local` holds them too).
        self.held: dict[str, dict[str, Any]] = {}
        # Planted: the export asks the first worker alone; a worker that left once blocks readiness for good.
        self.exports_first_only = "workers_export_first_worker_only" in faults
        self.any_loss_blocks = "lost_worker_blocks_prepare" in faults

    def report(self) -> PrepareReport:
        lost = self.pool.lost_while_closed or (self.any_loss_blocks and self.pool.left)
        return self.pool.merged_report(self.local.report(), label=self.label, lost=lost)

    async def close_admission(self, deadline_ts: float | None) -> None:
        await self.local.close_admission(deadline_ts)
        # Only a restore closes without a deadline: until the resume, a replacement is refused as in one process.
        body = {"checkpoint_id": self.checkpoint_id(), "deadline_ts": deadline_ts, "restoring": deadline_ts is None}
        await self.pool.close(body)

    async def open_admission(self) -> None:
        await self.local.open_admission()
        await self.pool.reopen()

    async def export(self, scope: list[EpisodeId] | None) -> list[EncodedRecord]:
        held = [encode_record(record, index) for index, record in enumerate(await self.local.export(scope))]
        scope_keys = None if scope is None else (episode.capture_key for episode in scope)
        replies = await self.pool.fan_out("export", keys_wire(scope_keys))
        if self.exports_first_only:
            replies = [reply for reply in replies if reply.body["index"] == 0]
        records = [record for reply in replies for record in records_from_wire(reply)]
        return sorted([*held, *records], key=record_order)

    def validate_record(self, record: dict[str, Any]) -> None:
        self.local.validate_record(record)

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        refusal = restore_refusal(left=self.pool.left, unreported=self.pool.unreported())
        if refusal is not None:
            raise ControlError(refusal)
        await self.pool.fan_out("check_fresh", {})  # each worker refuses as one process would
        installed = await self.local.install(records, scope)
        by_next = {EpisodeId.model_validate(r["episode_id"]).next_attempt().capture_key: r for r in records}
        self.held = {key: by_next[key] for key in installed if key in by_next}
        await self.pool.fan_out("held", {"keys": sorted(self.held)})
        return installed

    async def claim(self, body: Any) -> dict[str, Any]:
        """A worker serves key `body["key"]` first: hand it the key's restored record (once; None after)."""
        key = str(body["key"])
        record = self.held.pop(key, None)
        if record is not None:
            await self.local.delete_restored(set(self.held))
        return {"record": record}

    async def delete_restored(self, keep: AbstractSet[str]) -> None:
        self.held = {key: record for key, record in self.held.items() if key in keep}
        await self.local.delete_restored(keep)
        await self.pool.fan_out("delete_restored", keys_wire(sorted(keep)))

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        await self.pool.retire({"episode_ids": [episode.wire() for episode in episode_ids]})
        await self.local.retire(episode_ids)
        covered = {episode.rollout_id: episode.attempt for episode in episode_ids}
        self.held = {
            key: record
            for key, record in self.held.items()
            if (episode := EpisodeId.from_capture_key(key)).attempt > covered.get(episode.rollout_id, -1)
        }

    async def check_forget(self, rollout_ids: list[str]) -> None:
        await self.local.check_forget(rollout_ids)
        await self.pool.fan_out("check_forget", {"rollout_ids": rollout_ids})

    async def forget(self, rollout_ids: list[str]) -> None:
        await self.pool.fan_out("forget", {"rollout_ids": rollout_ids})
        await self.local.forget(rollout_ids)

    def status_extras(self) -> dict[str, Any]:
        extras = [report.get("extras", {}) for report in self.pool.reports()]
        merged = merge_extras(self.local.status_extras(), extras)
        if "accepting" in merged:  # the agent's admission is the server's, which the coordinator sets
            merged["accepting"] = self.pool.open
        return {**merged, "workers": len(self.pool.workers), "expected_workers": self.pool.expected}


def coordinator_control_plane(config: ServerConfig, pool: WorkerPool) -> ControlPlane:
    """The coordinator's control plane over its workers (`serve_with_workers`' `assemble`)."""
    plane = LatePlane()
    _, local = build_parts_for(config.role)(config, plane)
    participant = CoordinatedParticipant(
        local,  # type: ignore[arg-type]  # every role's participant adopts
        pool,
        label=config.name,
        checkpoint_id=lambda: control_plane.checkpoint_id,
        faults=frozenset(config.faults),
    )
    control_plane = ControlPlane.from_config(participant, config)
    plane.target = control_plane
    pool.on_change = control_plane.notify
    control_plane.clock_followers.append(pool.move_clock)
    pool.state = lambda: {"retired": control_plane.retired.marks(), "held": sorted(participant.held)}
    pool.run_control = control_plane.run_forwarded
    pool.handlers["claim"] = participant.claim
    pool.handlers["place"] = lambda body: place_everywhere(pool, body)
    pool.handlers["workers"] = lambda body: workers_by_index(pool)
    return control_plane


async def workers_by_index(pool: WorkerPool) -> dict[str, Any]:
    """Every live worker's index and pid (`GET /_ctl/workers`)."""
    replies = await pool.fan_out("whoami", {})
    return {"workers": sorted(replies, key=lambda reply: reply["index"]), "expected_workers": pool.expected}


# --- a worker ---------------------------------------------------------------------------------------------------


class WorkerPlane:
    """A worker's `ServerPlane`: the marks its coordinator sent, whether admission was closed by a restore (the
    phase one process would call `restored`), and a report to its coordinator on every change."""

    def __init__(self, link: WorkerLink) -> None:
        self.link = link
        self.closed_by_restore = False

    @property
    def retired(self) -> Any:
        return self.link.retired

    @property
    def phase(self) -> str:
        return "restored" if self.closed_by_restore else "open"

    def notify(self) -> None:
        self.link.report_soon()


class ParticipantWorker:
    """One worker's routes and participant, driven by its coordinator through `link`."""

    def __init__(self, config: ServerConfig, link: WorkerLink) -> None:
        self.link = link
        self.plane = WorkerPlane(link)
        self.app, participant = build_parts_for(config.role)(config, self.plane)
        self.participant: Adopting = participant  # type: ignore[assignment]  # every role's participant adopts
        self.router = SessionRouter(config.name, config.workers, COORDINATOR_SOCKET_ENV)
        self.router.claim = self._claim
        self.router.retired = lambda capture_key: link.retired.is_retired(EpisodeId.from_capture_key(capture_key))
        self.held: set[str] = set()
        # Planted: only the first worker claims restored records; another serves a replacement as a new episode.
        self.claims = "restored_records_claimed_by_first_worker_only" not in config.faults
        self._claims: dict[str, asyncio.Future[None]] = {}
        link.close_admission = self._close_admission
        link.open_admission = self._open_admission
        link.report = lambda: worker_report(self.participant)
        link.on_register = self._on_register
        link.handlers.update(
            export=self._export,
            check_fresh=self._check_fresh,
            held=self._held,
            delete_restored=self._delete_restored,
            retire=self._retire,
            check_forget=self._check_forget,
            forget=self._forget,
            place=self._place,
            whoami=self._whoami,
        )

    async def _close_admission(self, body: dict[str, Any]) -> None:
        self.plane.closed_by_restore = bool(body.get("restoring"))
        await self.participant.close_admission(body.get("deadline_ts"))
        self.link.report_soon()  # admission is in the status extras (the agent's `accepting`), changed or not

    async def _open_admission(self) -> None:
        self.plane.closed_by_restore = False
        await self.participant.open_admission()
        self.link.report_soon()

    async def _on_register(self, state: dict[str, Any]) -> None:
        self.router.index = self.link.index
        self.held = set(state.get("held", ()))

    async def _claim(self, capture_key: str) -> None:
        """Before serving `capture_key` here, take its restored record if the coordinator still holds it."""
        if not self.claims and self.link.index != 0:
            return
        claim = self._claims.get(capture_key)
        if claim is None:
            if capture_key not in self.held:
                return
            self.held.discard(capture_key)  # a second request for the key waits for this claim
            claim = self._claims[capture_key] = asyncio.ensure_future(self._take(capture_key))
        await asyncio.shield(claim)

    async def _take(self, capture_key: str) -> None:
        reply = await self.link.ask("claim", {"key": capture_key})
        if reply["record"] is not None:
            await self.participant.adopt([reply["record"]])

    async def _export(self, body: Any) -> dict[str, Any]:
        # The collector paused as the coordinator's is (`store.collector_paused`): a worker's share of thousands of
        # records, next to thousands of live requests, cost a full collection or two (0.2-0.5 CPU s each at scale).
        with collector_paused():
            records = await self.participant.export_keys(keys_from_wire(body))
            reply = export_wire([encode_record(record, index) for index, record in enumerate(records)], self.link.index)
            del records  # freed now, not walked by the first collection once the collector is back
        return reply

    async def _check_fresh(self, body: Any) -> None:
        await self.participant.install([], [])  # installs nothing; refuses a process with live state

    async def _held(self, body: Any) -> None:
        self.held = set(body["keys"])

    async def _delete_restored(self, body: Any) -> None:
        keep = keys_from_wire(body)  # never None: delete_restored always names what it keeps
        assert keep is not None
        self.held = {key for key in self.held if key in keep}
        await self.participant.delete_restored(keep)

    async def _retire(self, body: Any) -> None:
        await self.participant.retire([EpisodeId.model_validate(episode) for episode in body["episode_ids"]])

    async def _check_forget(self, body: Any) -> None:
        await self.participant.check_forget(body["rollout_ids"])

    async def _forget(self, body: Any) -> None:
        self.link.retired.forget(body["rollout_ids"])
        await self.participant.forget(body["rollout_ids"])

    async def _place(self, body: Any) -> None:
        self.router.placement = dict(body["placement"])

    async def _whoami(self, body: Any) -> dict[str, Any]:
        return {"index": self.link.index, "pid": os.getpid()}


def build_worker_app(config: ServerConfig) -> FastAPI:
    """A worker's app: its role's routes, session routing, and health and control through the coordinator."""
    link = WorkerLink(config, socket_env=COORDINATOR_SOCKET_ENV)
    worker = ParticipantWorker(config, link)
    app = worker.app
    app.add_middleware(SessionRoutingMiddleware, router=worker.router)
    add_worker_routes(app, link)

    @app.post(PLACEMENT_ROUTE)
    async def place(body: PlacementRequest, authorization: str | None = Header(default=None)) -> Any:
        """The harness's placement of episodes on workers, set on every worker before it answers."""
        return await link.ask_coordinator("place", authorization, body.model_dump())

    @app.get(WORKERS_ROUTE)
    async def workers(authorization: str | None = Header(default=None)) -> Any:
        """Every live worker's index and pid, for a harness that kills one worker."""
        return await link.ask_coordinator("workers", authorization, {})

    return app
