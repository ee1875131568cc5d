"""Token capture on the model server, in-process with hand-built tickets, records and receipts.

The real processes are in `test_model_server.py` and `tests/stack/test_token_capture.py`; here each rule of the
capture ledger's export and install (reference 7.2), restored cuts, and the cut round (7.3) is pinned on its own.
The cut round's transport is a stand-in coroutine, so receipts can be wrong in every way a backend could get them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.gym.policy.capture import GenerationCutter, TokenCapture, attempts_up_to
from fakes.gym.policy.gate import PolicyGate, Ticket
from fakes.gym.policy.ledger import FileLedger
from fakes.gym.policy.model import PolicyParticipant
from fakes.gym.protocol.errors import CheckpointStateError, ControlError
from fakes.gym.protocol.generation_cut import request_digest
from fakes.gym.protocol.wire import EpisodeId
from tests.unit.fakes.movable_clock import MovableClock, loop_turns

MESSAGES = [{"role": "user", "content": "Weather in SF?"}]
DIGEST = request_digest({"messages": MESSAGES})
CUT_KEY = "__generation_cut__/r0/r0.1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def policy(tmp_path: Path, *faults: str) -> PolicyParticipant:
    gate = PolicyGate(holds_responses=True, is_retired=lambda _: False, notify=lambda: None)
    return PolicyParticipant(gate, TokenCapture(FileLedger(tmp_path), frozenset(faults)), faults=frozenset(faults))


def ticket(gate: PolicyGate, key: str, call_id: str | None, **state: Any) -> Ticket:
    """An admitted call as the gate keeps it, with `state` (delivered, cuts, at_backend, ...) set by hand."""
    admitted = Ticket(len(gate.tickets), key, EpisodeId.from_capture_key(key) if key else None, 1.5, **state)
    admitted.model_call_id = call_id
    gate.tickets[admitted.ticket_id] = admitted
    return admitted


def row(call_id: str, parent: str | None = None) -> dict[str, Any]:
    return {"model_call_id": call_id, "parent_call_id": parent, "staging_key": f"r0/{call_id}"}


def cut_record(call_id: str, key: str = "r0") -> dict[str, Any]:
    return {
        "model_call_id": call_id,
        "request_digest": DIGEST,
        "continuation": {
            "source_capture_key": key,
            "source_model_call_id": call_id,
            "staging_keys": [f"__generation_cut__/{key}/{call_id}"],
            "prefix_token_count": 5,
            "prefix_digest": "ab" * 32,
            "effective_output_limit": 1024,
            "terminal_finish_reason": None,
            "terminal_stop_reason": None,
        },
    }


def record(key: str, rows: list[dict[str, Any]], cuts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"episode_id": EpisodeId.from_capture_key(key).wire(), "rows": rows, "generation_cuts": cuts}


def scope(*keys: str) -> list[EpisodeId]:
    return [EpisodeId.from_capture_key(key) for key in keys]


# -- export --------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_export_leaves_out_undelivered_calls_rows_and_carries_the_latest_cut(tmp_path: Path) -> None:
    model = policy(tmp_path)
    ledger = FileLedger(tmp_path)
    ledger.append("r0", [row("r0.0"), row("r0.1", "r0.0")])
    ticket(model.gate, "r0", "r0.1", cuts=[cut_record("r0.1")])  # held: its row is staged, its reply undelivered
    ticket(model.gate, "r0", "r0.2", cuts=[cut_record("r0.2")])  # admitted later, still generating
    model.gate.restore_cuts({"r2-a1": cut_record("r2.0", "r2")})

    records = await model.export(scope("r0", "r1", "r2-a1"))

    assert records == [
        record("r0", [row("r0.0")], [cut_record("r0.2")]),
        record("r2-a1", [], [cut_record("r2.0", "r2")]),
    ]
    assert model.commit_extras(records) == {
        "staging_keys": ["__generation_cut__/r0/r0.2", "__generation_cut__/r2/r2.0", "r0/r0.0"],
        "staging_keys_by_episode": {
            "r0": ["__generation_cut__/r0/r0.2", "r0/r0.0"],
            "r2-a1": ["__generation_cut__/r2/r2.0"],
        },
    }


@pytest.mark.anyio
async def test_the_exports_undelivered_fault_keeps_a_held_calls_row(tmp_path: Path) -> None:
    model = policy(tmp_path, "ledger_exports_undelivered")
    FileLedger(tmp_path).append("r0", [row("r0.0"), row("r0.1", "r0.0")])
    ticket(model.gate, "r0", "r0.1")

    assert await model.export(scope("r0")) == [record("r0", [row("r0.0"), row("r0.1", "r0.0")], [])]


# -- install ---------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_install_replaces_next_attempt_ledgers_and_retires_the_sources(tmp_path: Path) -> None:
    model = policy(tmp_path)
    ledger = FileLedger(tmp_path)
    ledger.append("r0-a1", [row("r0-a1.0", "r0.0")])  # a dead execution's call
    ledger.retire(["r0-a1"])
    stamped = {**row("r0.0"), "capture_key": "earlier"}

    installed = await model.install(
        [record("r0", [stamped, row("r0.1", "r0.0")], [cut_record("r0.1")])], scope("r0", "r1")
    )

    assert installed == ["r0-a1", "r1-a1"]
    assert ledger.live_rows("r0-a1") == [stamped, {"capture_key": "r0", **row("r0.1", "r0.0")}]
    assert ledger.live_rows("r1-a1") == []
    assert ledger.is_retired("r0")
    assert ledger.is_retired("r1")
    assert model.status_extras() == {"restored_generation_cuts": ["r0-a1"]}


@pytest.mark.anyio
async def test_install_refuses_a_record_with_two_cuts_before_touching_any_ledger(tmp_path: Path) -> None:
    model = policy(tmp_path)
    ledger = FileLedger(tmp_path)
    ledger.append("r0-a1", [row("r0-a1.0")])

    with pytest.raises(ControlError, match="more than one generation cut") as refused:
        await model.install([record("r0", [], [cut_record("r0.1"), cut_record("r0.1")])], scope("r0"))

    assert refused.value.status_code == 409
    assert ledger.live_rows("r0-a1") == [row("r0-a1.0")]
    assert not ledger.is_retired("r0")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fault", "next_rows", "source_retired"),
    [
        ("ledger_appends_on_restore", ["r0-a1.0", "r0.0"], True),
        ("ledger_source_not_retired", ["r0.0"], False),
    ],
)
async def test_the_restore_faults_keep_dead_rows_or_live_sources(
    tmp_path: Path, fault: str, next_rows: list[str], source_retired: bool
) -> None:
    model = policy(tmp_path, fault)
    ledger = FileLedger(tmp_path)
    ledger.append("r0-a1", [row("r0-a1.0")])

    await model.install([record("r0", [row("r0.0")], [])], scope("r0"))

    assert [r["model_call_id"] for r in ledger.live_rows("r0-a1")] == next_rows
    assert ledger.is_retired("r0") is source_retired


@pytest.mark.anyio
async def test_the_refuses_dead_rows_fault_refuses_a_restore_over_another_executions_rows(tmp_path: Path) -> None:
    model = policy(tmp_path, "ledger_refuses_dead_rows")
    FileLedger(tmp_path).append("r0-a1", [row("r0-a1.0")])

    with pytest.raises(ControlError, match=r"\['r0-a1'\] already holds rows from another execution"):
        await model.install([record("r0", [row("r0.0")], [])], scope("r0"))
    await policy(tmp_path / "fresh", "ledger_refuses_dead_rows").install([], scope("r0"))


@pytest.mark.parametrize(
    "bad",
    [{"rows": [{"staging_key": "r0/r0.0"}]}, {"rows": ["r0.0"]}, {"generation_cuts": [{"model_call_id": "r0.1"}]}],
    ids=["row-without-id", "row-not-an-object", "cut-without-continuation"],
)
def test_validate_record_refuses_rows_and_cuts_it_could_not_install(tmp_path: Path, bad: dict[str, Any]) -> None:
    with pytest.raises(CheckpointStateError):
        policy(tmp_path).validate_record({**record("r0", [], []), **bad})


# -- restored cuts: claimed by a matching call, used up by its delivery, given back by its failure ----------------


@pytest.mark.anyio
async def test_a_restored_cut_goes_to_the_first_matching_call_until_one_delivers(tmp_path: Path) -> None:
    model = policy(tmp_path)
    gate = model.gate
    gate.restore_cuts({"r0-a1": cut_record("r0.1")})
    other = ticket(gate, "r0-a1", None, request_digest="another conversation")
    first = ticket(gate, "r0-a1", None, request_digest=DIGEST)
    second = ticket(gate, "r0-a1", None, request_digest=DIGEST)

    assert gate.claim_cut(other) is None
    assert gate.claim_cut(first) == cut_record("r0.1")["continuation"]
    assert gate.claim_cut(second) is None, "one call at a time carries a cut"
    gate.exit(first)  # failed before delivery: the cut is given back
    assert gate.claim_cut(second) is not None
    await gate.deliver(second)

    assert model.status_extras() == {"restored_generation_cuts": []}
    assert gate.episode_cuts("r0-a1") == []


@pytest.mark.parametrize(("faults", "attached"), [((), True), (("cut_not_attached",), False)])
def test_begin_sends_lineage_and_attaches_a_matching_restored_cut(
    tmp_path: Path, faults: tuple[str, ...], attached: bool
) -> None:
    model = policy(tmp_path, *faults)
    assert model.capture is not None
    FileLedger(tmp_path).replace_many({"r0-a1": [{"capture_key": "r0", **row("r0.0")}]})
    model.gate.restore_cuts({"r0-a1": cut_record("r0.1")})
    call = ticket(model.gate, "r0-a1", None)

    body = json.loads(model.capture.begin(model.gate, call, {"messages": MESSAGES, "tools": []}))

    expected = {"model_call_id": "r0-a1.0", "parent_call_id": "r0.0", "rollout_id": "r0-a1"}
    if attached:
        expected["generation_cut"] = cut_record("r0.1")["continuation"]
    assert body == {"messages": MESSAGES, "tools": [], "ng_capture": expected}


def test_the_forgets_restored_parent_fault_looks_only_at_the_attempts_own_rows(tmp_path: Path) -> None:
    model = policy(tmp_path, "lineage_forgets_restored_parent")
    assert model.capture is not None
    FileLedger(tmp_path).replace_many({"r0-a1": [{"capture_key": "r0", **row("r0.0")}]})

    body = json.loads(model.capture.begin(model.gate, ticket(model.gate, "r0-a1", None), {"messages": MESSAGES}))

    assert body["ng_capture"]["parent_call_id"] is None


# -- retire, commit cleanup, open ------------------------------------------------------------------------------------


def test_a_retire_covers_every_earlier_attempt() -> None:
    assert attempts_up_to(scope("r0-a2", "r1", "r0")) == ["r0", "r0-a1", "r0-a2", "r1"]


@pytest.mark.anyio
@pytest.mark.parametrize(("faults", "retired"), [((), True), (("ledger_retire_skipped",), False)])
async def test_retire_retires_covered_ledgers_and_drops_their_restored_cuts(
    tmp_path: Path, faults: tuple[str, ...], retired: bool
) -> None:
    model = policy(tmp_path, *faults)
    model.gate.restore_cuts({"r0-a1": cut_record("r0.1"), "r1-a1": cut_record("r1.0", "r1")})

    await model.retire(scope("r0-a1"))

    assert [FileLedger(tmp_path).is_retired(key) for key in ("r0", "r0-a1", "r1-a1")] == [retired, retired, False]
    assert model.status_extras() == {"restored_generation_cuts": ["r1-a1"]}


@pytest.mark.anyio
async def test_commit_cleanup_drops_restored_cuts_of_unstarted_attempts_outside_the_scope(tmp_path: Path) -> None:
    model = policy(tmp_path)
    await model.install(
        [record("r0", [], [cut_record("r0.1")]), record("r1", [], [cut_record("r1.0", "r1")])], scope("r0", "r1")
    )

    await model.delete_restored({"r1-a1"})

    assert model.status_extras() == {"restored_generation_cuts": ["r1-a1"]}


@pytest.mark.anyio
@pytest.mark.parametrize(("faults", "kept"), [((), 0), (("cuts_pile_up",), 1)])
async def test_open_clears_the_cut_round(tmp_path: Path, faults: tuple[str, ...], kept: int) -> None:
    model = policy(tmp_path, *faults)
    cut = ticket(model.gate, "r0", "r0.1", cuts=[cut_record("r0.1")])
    model.gate.cut_counts["cut"] = 1

    await model.open_admission()

    assert model.report().counts == {"inflight": 1, "held": 0, "cut": 0, "cut_failed": 0, "cut_skipped": 0}
    assert len(cut.cuts) == kept


# -- the cut round -----------------------------------------------------------------------------------------------


Send = Callable[[dict[str, Any]], Awaitable[httpx.Response]]


def answering(
    dispositions: dict[str, str] | None = None, spoil: Callable[[dict[str, Any]], None] | None = None
) -> Send:
    """A backend stand-in that acks every prefix (durable unless `dispositions` says otherwise)."""

    async def send(inventory: dict[str, Any]) -> httpx.Response:
        acks = []
        for prefix in inventory["active_prefixes"]:
            call_id = prefix["model_call_id"]
            if (dispositions or {}).get(call_id, "durable_prefix") == "durable_failure":
                acks.append({**prefix, "disposition": "durable_failure"})
            else:
                continuation = cut_record(call_id)["continuation"]
                fields = {k: v for k, v in continuation.items() if not k.startswith("source_")}
                acks.append(
                    {**prefix, "disposition": "durable_prefix", "cut_kind": "active_prefix", "frozen_buffer_id": "b"}
                    | fields
                )
        receipt = {
            "checkpoint_id": inventory["checkpoint_id"],
            "cut_id": "cut-1",
            "inventory_digest": inventory["inventory_digest"],
            "inventory": inventory,
            "backend_snapshot_id": "fake-transfer-queue",
            "prefixes": acks,
        }
        if spoil is not None:
            spoil(receipt)
        return httpx.Response(200, json=receipt, request=httpx.Request("POST", "http://backend/cut"))

    return send


def generating(gate: PolicyGate) -> tuple[Ticket, Ticket]:
    """A cuttable and a constrained call at the backend, beside calls a cut never looks at."""
    free = ticket(gate, "r0", "r0.1", at_backend=True, cuttable=True, request_digest=DIGEST)
    constrained = ticket(gate, "r1", "r1.0", at_backend=True, cuttable=False)
    ticket(gate, "r2", "r2.0", cuttable=True)  # its reply arrived: held, no longer generating
    ticket(gate, "r3", "r3.0", at_backend=True, cuttable=True, delivered=True)
    ticket(gate, "", None, at_backend=True, cuttable=True)  # untagged: never captured
    return free, constrained


def cutter(send: Send, *faults: str, clock: Callable[[], float] = time.time) -> GenerationCutter:
    return GenerationCutter(send, "policy_model", lambda: "c1", frozenset(faults), clock)


@pytest.mark.anyio
async def test_a_cut_round_sends_one_inventory_of_the_generating_cuttable_calls(tmp_path: Path) -> None:
    model = policy(tmp_path)
    free, constrained = generating(model.gate)
    sent: list[dict[str, Any]] = []
    backend = answering()

    async def send(inventory: dict[str, Any]) -> httpx.Response:
        sent.append(inventory)
        return await backend(inventory)

    await cutter(send).cut(model.gate, time.time() + 10)

    (inventory,) = sent
    assert [prefix["model_call_id"] for prefix in inventory["active_prefixes"]] == ["r0.1"]
    assert inventory["active_prefixes"][0] == {
        "ticket_id": free.ticket_id,
        "rollout_id": "r0",
        "attempt": 0,
        "model_call_id": "r0.1",
        "admitted_at": 1.5,
    }
    assert model.gate.cut_counts == {"cut": 1, "cut_failed": 0, "cut_skipped": 1}
    assert free.cuts == [cut_record("r0.1")]
    assert constrained.cuts == []


def _drop_acks(receipt: dict[str, Any]) -> None:
    receipt["prefixes"] = []


async def _unreachable(inventory: dict[str, Any]) -> httpx.Response:
    raise httpx.ConnectError("connection refused")


async def _refusing(inventory: dict[str, Any]) -> httpx.Response:
    return httpx.Response(401, json={}, request=httpx.Request("POST", "http://backend/cut"))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "send",
    [answering({"r0.1": "durable_failure"}), answering(spoil=_drop_acks), _unreachable, _refusing],
    ids=["failure-ack", "invalid-receipt", "unreachable", "http-error"],
)
async def test_any_failure_of_the_cut_costs_only_the_cut(tmp_path: Path, send: Send) -> None:
    model = policy(tmp_path)
    free, _ = generating(model.gate)

    await cutter(send).cut(model.gate, time.time() + 10)

    assert model.gate.cut_counts == {"cut": 0, "cut_failed": 1, "cut_skipped": 1}
    assert free.cuts == []


async def _hung(inventory: dict[str, Any]) -> httpx.Response:
    await asyncio.Event().wait()
    raise AssertionError("a hung cut never answers")


@pytest.mark.anyio
async def test_a_hung_cut_gives_up_on_the_real_clock_too(tmp_path: Path) -> None:
    model = policy(tmp_path)
    generating(model.gate)
    budget_s = 1.0
    started = time.monotonic()

    await cutter(_hung).cut(model.gate, time.time() + budget_s)

    # Only the lower bound is timed (a timer never fires early); that the cut gives up at half the time left, not
    # later, is shown on a clock the test moves (the test below, whose clock jumps past the budget).
    assert time.monotonic() - started >= 0.45 * budget_s
    assert model.gate.cut_counts["cut_failed"] == 1


@pytest.mark.anyio
@pytest.mark.parametrize("moved_s", [51.0, 49.0])
async def test_a_hung_cut_gives_up_once_its_servers_clock_jumps_past_its_budget(tmp_path: Path, moved_s: float) -> None:
    model = policy(tmp_path)
    generating(model.gate)
    clock = MovableClock()
    hanging = asyncio.Event()

    async def hung(inventory: dict[str, Any]) -> httpx.Response:
        hanging.set()
        return await _hung(inventory)

    the_cutter = cutter(hung, clock=clock)
    cut = asyncio.ensure_future(the_cutter.cut(model.gate, clock() + 100.0))  # a budget of 50 s
    await hanging.wait()
    clock.now += moved_s
    await the_cutter.follow_clock(moved_s)
    await loop_turns()

    assert cut.done() == (moved_s >= 50.0)
    if cut.done():
        assert model.gate.cut_counts["cut_failed"] == 1
    cut.cancel()
    await asyncio.gather(cut, return_exceptions=True)


@pytest.mark.anyio
async def test_the_planted_cut_without_timeout_waits_for_a_hung_backend_past_the_deadline(tmp_path: Path) -> None:
    model = policy(tmp_path)
    generating(model.gate)
    budget_s = 0.2
    cut = asyncio.ensure_future(cutter(_hung, "cut_without_timeout").cut(model.gate, time.time() + budget_s))
    # Waited on the cut itself, bounded at twice its deadline: a wait that never ends is shown by outlasting it.
    done, _ = await asyncio.wait({cut}, timeout=2 * budget_s)
    assert not done, "the cut round ended although the backend never answered"
    cut.cancel()
