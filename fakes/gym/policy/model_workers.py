"""The policy model server as several uvicorn workers behind one port (reference 7.4), built on the generic
coordinator and worker modules (`fakes.gym.workers.coordinator_process` names them).

The coordinator (the server's main process) owns the control plane and a `CoordinatedPolicyParticipant`; each
worker serves generation calls through its own `PolicyGate` (`fakes.gym.policy.model`) and answers its coordinator's
requests (`PolicyWorker`). While admission is closed every worker makes new calls wait and holds replies, exactly
as one process does; a retired attempt's call is refused by whichever worker gets it.

The coordinator's participant wraps a `PolicyParticipant` of its own, over a gate that never serves a call: it is
what is server-wide rather than per worker, so it validates records, builds the commit extras, keeps the restored
targets, and, once token capture lands, reads and writes the capture ledger (one per server: the ledger lives on
disk, shared by every process) and keeps the restored cuts. What is policy-specific is kept in small functions
below, so that token capture changes only them:

- `worker_report` / `merge_reports`: a worker's GateReport as JSON, and the merge (counts summed, blockers united,
  ready only if every worker is; plus the coordinator's `<label>-workers-unreported:<n>` and `<label>-worker-lost`).
- `gate_snapshot` / `export_records`: each worker's still-undelivered calls (model call ID -> capture key) and
  cuts; the export is what the coordinator's own participant exports (the ledger rows on disk, restored cuts)
  minus the rows of calls undelivered on ANY worker, with each episode's latest-admitted worker cut.
- `install_refusal`: restore only into a fresh server (no worker served a call, none left since start); then the
  coordinator's participant installs what the coordinator keeps, and the workers are told the restored targets.
- retire: marks to every worker first, then every worker cancels its covered calls, then the coordinator drops
  what it keeps of them.
- placement (`fakes.gym.workers.placement`): the coordinator keeps the last placement a harness set and fans it out to
every
  worker before answering; a worker forwards a call placed on a sibling to that sibling's private socket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Header

from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import PrepareReport
from fakes.gym.control.plane import ControlPlane
from fakes.gym.control.store import collector_paused
from fakes.gym.policy.capture import GenerationCutter, TokenCapture, ledger_router
from fakes.gym.policy.gate import PolicyGate
from fakes.gym.policy.ledger import FileLedger
from fakes.gym.policy.model import PolicyParticipant, backend_forwarder, generation_app, policy_gate
from fakes.gym.protocol.errors import ControlError
from fakes.gym.protocol.wire import PLACEMENT_ROUTE, EpisodeId
from fakes.gym.workers.coordinator import WorkerPool
from fakes.gym.workers.link import WorkerLink
from fakes.gym.workers.placement import CallPlacement, PlacementRequest, place_everywhere
from fakes.gym.workers.routes import add_worker_routes

# Reference 1.4: how a policy worker finds its coordinator's socket.
POLICY_SOCKET_ENV = "NEMO_GYM_POLICY_CHECKPOINT_SOCKET"
# Planted: worker 1 alone delivers held replies (`model_delivers_held`, on one worker of several).
FAULT_SECOND_WORKER_DELIVERS_HELD = "second_worker_delivers_held"
SECOND_WORKER = 1

# --- policy-specific parts (pure; tests/unit/fakes/test_policy_workers.py feeds them hand-built values) ---------


def worker_report(participant: PolicyParticipant) -> dict[str, Any]:
    """A worker's report as it travels to the coordinator: every blocker (the wire's cap applies after the merge),
    and whether the worker ever served a call (a restore needs a server where none did)."""
    report = participant.report()
    return {
        "ready": report.ready,
        "blockers": list(report.blockers),
        "counts": dict(report.counts),
        "restarts": list(report.restarts),
        "served": participant.gate.served,
    }


def gate_snapshot(gate: PolicyGate) -> dict[str, Any]:
    """What a worker holds that a commit must not export as delivered (Gym's GateSnapshot).

    `undelivered` maps the model call ID of every admitted call whose response has not started to its capture key;
    `cuts` lists the gate's generation cuts as `{capture_key, record, admitted_at}` (a ticket's latest);
    `restored_cuts` the keys whose restored cut no call of this worker has used up. Without token capture no call
    has a model call ID and none is cut."""
    tickets = list(gate.tickets.values())
    return {
        "undelivered": {t.model_call_id: t.capture_key for t in tickets if t.model_call_id and not t.delivered},
        "cuts": [
            {"capture_key": t.capture_key, "record": t.cuts[-1], "admitted_at": t.admitted_at}
            for t in tickets
            if t.cuts
        ],
        "restored_cuts": sorted(gate.restored_cuts),
    }


def export_records(
    scope: Sequence[EpisodeId], records: Sequence[Mapping[str, Any]], snapshots: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The commit's records: `records` (what the coordinator's own participant exports from disk and from what it
    keeps) without the rows of calls still undelivered on ANY worker, each episode's cut replaced by the latest
    one a worker admitted; an in-scope episode with only a worker cut gets a record of its own. A record left with
    neither rows nor a cut is not exported (reference 7.2)."""
    undelivered = {call_id for snapshot in snapshots for call_id in snapshot["undelivered"]}
    cuts = latest_cuts({episode.capture_key for episode in scope}, snapshots)
    # A restored cut a worker's call used up (delivered) is gone from that worker: it is exported no more.
    restored = _restored_keys(records)
    used = {key for key in restored if any(key not in snapshot.get("restored_cuts", ()) for snapshot in snapshots)}
    exported: list[dict[str, Any]] = []
    seen: set[str] = set()
    for record in records:
        key = EpisodeId.model_validate(record["episode_id"]).capture_key
        seen.add(key)
        rows = [row for row in record["rows"] if row.get("model_call_id") not in undelivered]
        restored = [] if key in used else list(record["generation_cuts"])
        generation_cuts = [cuts[key]["record"]] if key in cuts else restored
        if rows or generation_cuts:
            exported.append({**record, "rows": rows, "generation_cuts": generation_cuts})
    for episode in scope:
        key = episode.capture_key
        if key in cuts and key not in seen:
            seen.add(key)
            exported.append({"episode_id": episode.wire(), "rows": [], "generation_cuts": [cuts[key]["record"]]})
    return exported


def _restored_keys(records: Sequence[Mapping[str, Any]]) -> set[str]:
    """Keys of the coordinator's records that carry a cut: its restored cuts (its own gate never cuts a call)."""
    return {EpisodeId.model_validate(r["episode_id"]).capture_key for r in records if r["generation_cuts"]}


def latest_cuts(scope_keys: set[str], snapshots: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Per in-scope capture key, the cut admitted last on any worker (at most one cut per episode is valid)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for snapshot in snapshots:
        for cut in snapshot["cuts"]:
            key = cut["capture_key"]
            if key in scope_keys and (key not in latest or cut["admitted_at"] > latest[key]["admitted_at"]):
                latest[key] = cut
    return latest


def install_refusal(*, served: Sequence[int], left: bool, unreported: int) -> str | None:
    """Why a restore must be refused (None: it may install): only a freshly started server restores."""
    if served:
        return (
            f"restore needs a freshly started model server; its worker(s) {sorted(served)} have served calls "
            "(restart it, then restore)"
        )
    if left:
        return (
            "restore needs a freshly started model server; a worker of this one left since it started "
            "(restart it, then restore)"
        )
    if unreported:
        return (
            f"restore needs every worker of the model server to close admission; {unreported} did not answer "
            "(see the server log; restart it, then restore)"
        )
    return None


# --- the coordinator --------------------------------------------------------------------------------------------


class CoordinatedPolicyParticipant:
    """The policy participant of a multi-worker server: its hooks fan out to the workers (`WorkerPool`), and
    what is server-wide goes through the coordinator's own `PolicyParticipant` (`policy`)."""

    kind = "model"

    def __init__(
        self,
        policy: PolicyParticipant,
        pool: WorkerPool,
        *,
        label: str,
        checkpoint_id: Callable[[], str | None],
        faults: frozenset[str] = frozenset(),
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.label = label
        self.checkpoint_id = checkpoint_id
        # Planted `workers_export_ignores_snapshots`: the export never asks the workers what they still hold.
        self.ignores_snapshots = "workers_export_ignores_snapshots" in faults

    def report(self) -> PrepareReport:
        return self.pool.merged_report(self.policy.report(), label=self.label)

    async def close_admission(self, deadline_ts: float | None) -> None:
        """Close everywhere; with a prepare's deadline each worker cuts the calls it has generating."""
        await self.policy.close_admission(deadline_ts)
        await self.pool.close({"checkpoint_id": self.checkpoint_id(), "deadline_ts": deadline_ts})

    async def open_admission(self) -> None:
        await self.policy.open_admission()
        await self.pool.reopen()

    async def export(self, scope: list[EpisodeId] | None) -> list[dict[str, Any]]:
        records = await self.policy.export(scope)  # refuses a commit without a scope
        assert scope is not None
        snapshots = await self.pool.fan_out("snapshot", {})
        if self.ignores_snapshots:
            snapshots = [{"undelivered": {}, "cuts": [], "restored_cuts": sorted(self.policy.gate.restored_cuts)}]
        return export_records(scope, records, snapshots)

    def commit_extras(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return self.policy.commit_extras(records)

    def validate_record(self, record: dict[str, Any]) -> None:
        self.policy.validate_record(record)

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        # Admission closed before the install (the control plane closes it), and every worker answered that close
        # with its report: no call can have been admitted since, so `served` is exact here.
        served = [worker.pid for worker in self.pool.workers.values() if (worker.report or {}).get("served")]
        refusal = install_refusal(served=served, left=self.pool.left, unreported=self.pool.unreported())
        if refusal is not None:
            raise ControlError(refusal)
        targets = await self.policy.install(records, scope)
        restored_cuts = {key: cut.record for key, cut in self.policy.gate.restored_cuts.items()}
        try:
            await self.pool.fan_out("install", {"restored_targets": targets, "restored_cuts": restored_cuts})
        except BaseException:
            await self.policy.delete_restored(set())
            raise
        return targets

    async def delete_restored(self, keep: set[str]) -> None:
        await self.policy.delete_restored(keep)
        await self.pool.fan_out("delete_restored", {"keep": sorted(keep)})

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        await self.pool.retire({"episode_ids": [episode.wire() for episode in episode_ids]})
        await self.policy.retire(episode_ids)

    async def check_forget(self, rollout_ids: list[str]) -> None:
        await self.policy.check_forget(rollout_ids)
        await self.pool.fan_out("check_forget", {"rollout_ids": rollout_ids})

    async def forget(self, rollout_ids: list[str]) -> None:
        await self.pool.fan_out("forget", {"rollout_ids": rollout_ids})
        await self.policy.forget(rollout_ids)

    def status_extras(self) -> dict[str, Any]:
        return {
            **self.policy.status_extras(),
            "workers": len(self.pool.workers),
            "expected_workers": self.pool.expected,
        }

    def register_state(self) -> dict[str, Any]:
        """What a joining worker learns besides admission and the marks."""
        return {"restored_targets": sorted(self.policy.gate.restored_targets)}


def coordinator_control_plane(config: ServerConfig, pool: WorkerPool) -> ControlPlane:
    """The coordinator's control plane over its workers (`serve_with_workers`' `assemble`)."""
    control_plane: ControlPlane
    gate = policy_gate(
        config,
        is_retired=lambda episode_id: control_plane.retired.is_retired(episode_id),
        notify=lambda: control_plane.notify(),
    )
    faults = frozenset(config.faults)
    # The ledger is on disk, shared by every process: the coordinator exports and installs it once for all.
    capture = TokenCapture(FileLedger(config.capture_dir), faults) if config.token_capture else None
    participant = CoordinatedPolicyParticipant(
        PolicyParticipant(gate, capture, None, faults),
        pool,
        label=config.name,
        checkpoint_id=lambda: control_plane.checkpoint_id,
        faults=faults,
    )
    control_plane = ControlPlane.from_config(participant, config)
    pool.on_change = control_plane.notify
    control_plane.clock_followers.append(pool.move_clock)
    pool.state = lambda: {"retired": control_plane.retired.marks(), **participant.register_state()}
    pool.run_control = control_plane.run_forwarded
    pool.handlers["place"] = lambda body: place_everywhere(pool, body)
    return control_plane


# --- a worker ---------------------------------------------------------------------------------------------------


class PolicyWorker:
    """One worker's gate and participant, driven by its coordinator through `link`."""

    def __init__(self, config: ServerConfig, link: WorkerLink) -> None:
        self.gate = policy_gate(config, is_retired=link.retired.is_retired, notify=link.report_soon)
        self.gate.open = False  # nothing is admitted before the coordinator says whether admission is open
        faults = frozenset(config.faults)
        self.forwarder = backend_forwarder(config)
        self.link = link
        self.placement = CallPlacement(link.socket_env)
        self.faults = faults
        # The checkpoint whose close this worker last took: what its cut round names.
        self.checkpoint_id: str | None = None
        self.ledger = FileLedger(config.capture_dir) if config.token_capture else None
        self.capture = TokenCapture(self.ledger, faults) if self.ledger is not None else None
        cutter = None
        if config.generation_cuts:
            cutter = GenerationCutter(self.forwarder.post_cut, config.name, lambda: self.checkpoint_id, faults)
            link.clock_followers.append(cutter.follow_clock)
        self.participant = PolicyParticipant(self.gate, self.capture, cutter, faults)
        link.close_admission = self._close_admission
        link.open_admission = self.participant.open_admission
        link.report = lambda: worker_report(self.participant)
        link.on_register = self._on_register
        link.handlers.update(
            retire=self._retire,
            check_forget=self._check_forget,
            snapshot=self._snapshot,
            install=self._install,
            delete_restored=self._delete_restored,
            place=self._place,
        )

    async def _close_admission(self, body: dict[str, Any]) -> None:
        self.checkpoint_id = body.get("checkpoint_id")
        await self.participant.close_admission(body.get("deadline_ts"))

    def open_checkpoint(self) -> str | None:
        """The checkpoint open on the server, as this worker knows it: its gate stays closed until the resume."""
        return None if self.gate.open else (self.checkpoint_id or "(restore)")

    async def _on_register(self, state: dict[str, Any]) -> None:
        # After the fork: the worker knows its index, which it routes by and names to the backend.
        self.placement.index = self.forwarder.worker = self.link.index
        if FAULT_SECOND_WORKER_DELIVERS_HELD in self.faults and self.link.index == SECOND_WORKER:
            self.gate.holds_responses = False
        self.gate.restored_targets = set(state["restored_targets"])

    async def _place(self, body: Any) -> None:
        self.placement.placement = dict(body["placement"])

    async def _retire(self, body: Any) -> None:
        await self.participant.retire([EpisodeId.model_validate(episode) for episode in body["episode_ids"]])

    async def _check_forget(self, body: Any) -> None:
        await self.participant.check_forget(body["rollout_ids"])

    async def _snapshot(self, body: Any) -> dict[str, Any]:
        with collector_paused():  # as a commit's export is everywhere (`store.collector_paused`)
            return gate_snapshot(self.gate)

    async def _install(self, body: Any) -> None:
        self.gate.restored_targets = set(body["restored_targets"])
        self.gate.restore_cuts(body.get("restored_cuts", {}))

    async def _delete_restored(self, body: Any) -> None:
        await self.participant.delete_restored(set(body["keep"]))


def build_worker_app(config: ServerConfig) -> FastAPI:
    """A worker's app: generation calls through its own gate, health and control routes through the coordinator."""
    link = WorkerLink(config, socket_env=POLICY_SOCKET_ENV)
    worker = PolicyWorker(config, link)
    app = generation_app(worker.gate, worker.forwarder, worker.capture, worker.placement)
    add_worker_routes(app, link)

    @app.post(PLACEMENT_ROUTE)
    async def place(body: PlacementRequest, authorization: str | None = Header(default=None)) -> Any:
        """The harness's placement of generation calls on workers, set on every worker before it answers."""
        return await link.ask_coordinator("place", authorization, body.model_dump())

    if worker.ledger is not None:
        # The trainer's ledger routes, on whichever worker gets them; refused while the server's checkpoint is open.
        faults = frozenset(config.faults)
        app.include_router(ledger_router(worker.ledger, config.capture_token, worker.open_checkpoint, faults))
    return app
