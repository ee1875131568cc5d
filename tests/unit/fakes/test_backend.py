"""The fake backend in-process: scripted turns, calls recorded before waiting, hold, gate and step, reset."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from fakes.backend import FINAL_TEXT, build_app, tokens_from_text
from fakes.gym.protocol.generation_cut import (
    GenerationCutInventory,
    GenerationCutPrefix,
    canonical_digest,
    validated_acks,
)

POLL_INTERVAL_S = 0.005
TIMEOUT_S = 5.0
DEVELOPER_USER = [
    {"role": "developer", "content": "You answer."},
    {"role": "user", "content": "Weather in SF?"},
]


def after_tool_rounds(rounds: int) -> list[dict[str, Any]]:
    """The conversation of a weather episode after `rounds` tool rounds (2 + 2 * rounds messages)."""
    messages = list(DEVELOPER_USER)
    for index in range(rounds):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{index}"}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": "cold"})
    return messages


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://backend") as http:
        yield http


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = TIMEOUT_S) -> None:
    """Poll `predicate` until it holds; fail with a timeout rather than hang."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s} s")
        await asyncio.sleep(POLL_INTERVAL_S)


async def calls(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await client.get("/_ctl/calls")
    response.raise_for_status()
    return response.json()


async def wait_for_waiting(client: httpx.AsyncClient, indices: list[int]) -> None:
    async def reached() -> bool:
        return [call["index"] for call in await calls(client) if call["waiting"]] == indices

    await wait_until(reached)


def chat(client: httpx.AsyncClient, messages: list[dict[str, Any]], **extra: Any) -> Awaitable[httpx.Response]:
    return client.post("/v1/chat/completions", json={"model": "fake-model", "messages": messages, **extra})


async def start_waiting_call(client: httpx.AsyncClient, index: int) -> asyncio.Task[httpx.Response]:
    """Start a call in the background and return once the backend shows it waiting as call `index`."""
    task = asyncio.ensure_future(chat(client, DEVELOPER_USER))

    async def recorded() -> bool:
        return any(call["index"] == index and call["waiting"] for call in await calls(client))

    await wait_until(recorded)
    return task


def tool_name(reply: dict[str, Any]) -> str:
    return reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"]


@pytest.mark.anyio
async def test_models_lists_the_fake_model(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    assert response.json() == {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}


@pytest.mark.anyio
async def test_first_turn_gets_the_scripted_tool_call_and_second_the_final_answer(
    client: httpx.AsyncClient,
) -> None:
    first = (await chat(client, after_tool_rounds(0))).json()
    second = (await chat(client, after_tool_rounds(1))).json()

    assert first["object"] == "chat.completion"
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    tool_call = first["choices"][0]["message"]["tool_calls"][0]
    assert tool_call == {
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "SF"}'},
    }
    assert second["choices"][0]["finish_reason"] == "stop"
    assert second["choices"][0]["message"] == {"role": "assistant", "content": FINAL_TEXT}
    assert second["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert [(call["n_messages"], call["returned"]) for call in await calls(client)] == [(2, True), (4, True)]


@pytest.mark.anyio
async def test_call_records_capture_key_header_and_admission(client: httpx.AsyncClient) -> None:
    admission = {"model_call_id": "m0", "rollout_id": "r0"}
    await client.post(
        "/v1/chat/completions",
        json={"messages": DEVELOPER_USER, "ng_capture": admission},
        headers={"x-ng-capture-key": "r0-a1"},
    )
    await chat(client, DEVELOPER_USER)

    recorded = await calls(client)
    assert [(call["capture_key"], call["admission"]) for call in recorded] == [
        ("r0-a1", admission),
        (None, None),
    ]
    assert all(call["cancelled"] is False for call in recorded)


@pytest.mark.anyio
async def test_held_call_is_recorded_before_it_waits_and_answers_after_release(
    client: httpx.AsyncClient,
) -> None:
    await chat(client, DEVELOPER_USER)
    assert (await client.post("/_ctl/hold", json={"after_calls": 1})).status_code == 200

    held = await start_waiting_call(client, index=1)
    [_, recorded] = await calls(client)
    assert (recorded["returned"], recorded["waiting"]) == (False, True)
    assert not held.done()

    assert (await client.post("/_ctl/release")).json() == {"released": 1}
    assert (await held).status_code == 200
    assert [call["returned"] for call in await calls(client)] == [True, True]
    # Release clears the hold: the next call answers at once.
    assert (await chat(client, DEVELOPER_USER)).status_code == 200


@pytest.mark.anyio
async def test_release_accepts_an_empty_json_body(client: httpx.AsyncClient) -> None:
    assert (await client.post("/_ctl/release", json={})).json() == {"released": 0}


@pytest.mark.anyio
async def test_step_by_count_releases_the_longest_waiting_gated_calls(client: httpx.AsyncClient) -> None:
    await client.post("/_ctl/gate")
    tasks = [await start_waiting_call(client, index) for index in range(3)]

    reply = (await client.post("/_ctl/step", json={"calls": 2})).json()

    assert reply == {"released": 2, "released_indices": [0, 1], "waiting": 1}
    await asyncio.gather(*tasks[:2])
    await wait_for_waiting(client, [2])
    assert not tasks[2].done()
    assert (await client.post("/_ctl/step", json={"calls": 5})).json()["released"] == 1
    await tasks[2]


@pytest.mark.anyio
async def test_step_by_indices_releases_exactly_those_calls(client: httpx.AsyncClient) -> None:
    await client.post("/_ctl/gate")
    tasks = [await start_waiting_call(client, index) for index in range(3)]

    reply = (await client.post("/_ctl/step", json={"indices": [2, 0]})).json()

    assert reply == {"released": 2, "released_indices": [2, 0], "waiting": 1}
    await asyncio.gather(tasks[0], tasks[2])
    await wait_for_waiting(client, [1])
    await client.post("/_ctl/release")
    await tasks[1]


@pytest.mark.anyio
async def test_step_by_indices_refuses_calls_that_do_not_wait_and_releases_nothing(
    client: httpx.AsyncClient,
) -> None:
    await chat(client, DEVELOPER_USER)
    await client.post("/_ctl/gate")
    waiting = await start_waiting_call(client, index=1)

    refused = await client.post("/_ctl/step", json={"indices": [1, 0, 7]})

    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "not_waiting"
    assert "[0, 7]" in refused.json()["error"]["detail"]
    await wait_for_waiting(client, [1])
    await client.post("/_ctl/step", json={"indices": [1]})
    await waiting


@pytest.mark.anyio
@pytest.mark.parametrize("body", [{}, {"calls": 1, "indices": [0]}, {"indices": [0, 0]}, {"calls": -1}])
async def test_step_needs_exactly_one_valid_selector(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    assert (await client.post("/_ctl/step", json=body)).status_code == 422


@pytest.mark.anyio
async def test_a_call_whose_client_goes_away_is_marked_cancelled(client: httpx.AsyncClient) -> None:
    await client.post("/_ctl/gate")
    task = await start_waiting_call(client, index=0)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    [recorded] = await calls(client)
    assert (recorded["cancelled"], recorded["waiting"], recorded["returned"]) == (True, False, False)
    assert (await client.post("/_ctl/step", json={"calls": 1})).json()["released"] == 0


@pytest.mark.anyio
async def test_reset_releases_waiters_and_forgets_calls_gate_hold_and_script(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/_ctl/script", json={"tool_calls": []})
    await client.post("/_ctl/gate")
    await client.post("/_ctl/hold", json={"after_calls": 0})
    waiting = await start_waiting_call(client, index=0)

    assert (await client.post("/_ctl/reset")).json() == {"released": 1}

    assert (await waiting).status_code == 200
    assert await calls(client) == []
    assert (await client.get("/_ctl/cuts")).json() == []
    # Neither gate nor hold survives, and the default script is back.
    assert tool_name((await chat(client, DEVELOPER_USER)).json()) == "get_weather"


@pytest.mark.anyio
async def test_script_replaces_the_scripted_tool_calls(client: httpx.AsyncClient) -> None:
    script = [{"name": "lookup", "arguments": {"q": "SF"}}, {"name": "convert", "arguments": {"unit": "C"}}]
    assert (await client.post("/_ctl/script", json={"tool_calls": script})).status_code == 200

    replies = [(await chat(client, after_tool_rounds(rounds))).json() for rounds in range(3)]

    assert [tool_name(reply) for reply in replies[:2]] == ["lookup", "convert"]
    assert replies[1]["choices"][0]["message"]["tool_calls"][0]["id"] == "call_1"
    assert replies[2]["choices"][0]["message"]["content"] == FINAL_TEXT


@pytest.mark.anyio
async def test_script_refuses_unknown_fields(client: httpx.AsyncClient) -> None:
    response = await client.post("/_ctl/script", json={"tool_calls": [{"name": "x", "extra": 1}]})
    assert response.status_code == 422


def test_tokens_are_a_deterministic_function_of_text_capped_at_64() -> None:
    assert tokens_from_text("Ab") == [ord("A") % 250 + 1, ord("b") % 250 + 1]
    assert tokens_from_text("x" * 100) == [ord("x") % 250 + 1] * 64
    assert tokens_from_text("\u00fa") == [ord("\u00fa") % 250 + 1]


# -- token capture: the token store, the cut endpoint and continued calls -----------------------------------------


def captured(call_id: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    """`ng_capture` of a call whose model_call_id is `<capture key>.<n>`."""
    return {"model_call_id": call_id, "parent_call_id": parent, "rollout_id": call_id.rpartition(".")[0], **extra}


def captured_chat(client: httpx.AsyncClient, messages: list[dict[str, Any]], capture: dict[str, Any]) -> Any:
    return chat(client, messages, ng_capture=capture)


async def staged(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/_ctl/staged")).json()


def inventory(*call_ids: str, checkpoint_id: str = "c1") -> dict[str, Any]:
    prefixes = [
        GenerationCutPrefix(ticket_id=n, rollout_id="r0", attempt=0, model_call_id=call_id, admitted_at=1.0)
        for n, call_id in enumerate(call_ids)
    ]
    return GenerationCutInventory.build(checkpoint_id, "policy_model", prefixes).model_dump()


def cut(client: httpx.AsyncClient, body: dict[str, Any]) -> Any:
    return client.post("/ng-control/v1/generation-cut", json=body, headers={"authorization": "Bearer t"})


TOOL_CALL_TOKENS = tokens_from_text(
    json.dumps({"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "SF"}'}})
)


@pytest.mark.anyio
async def test_a_captured_call_is_staged_when_it_returns_and_its_reply_names_the_row(
    client: httpx.AsyncClient,
) -> None:
    first = (await captured_chat(client, after_tool_rounds(0), captured("r0.0"))).json()
    second = (await captured_chat(client, after_tool_rounds(1), captured("r0.1", "r0.0"))).json()
    plain = (await chat(client, DEVELOPER_USER)).json()

    assert first["ng_commit_coords"] == {"staging_key": "r0/r0.0"}
    assert second["ng_commit_coords"] == {"staging_key": "r0/r0.1"}
    assert "ng_commit_coords" not in plain
    store = await staged(client)
    assert store == {
        "r0/r0.0": {
            "rollout_id": "r0",
            "model_call_id": "r0.0",
            "parent_call_id": None,
            "tokens": TOOL_CALL_TOKENS,
            "continued_from": None,
            "prefix_staging_key": None,
        },
        "r0/r0.1": {
            "rollout_id": "r0",
            "model_call_id": "r0.1",
            "parent_call_id": "r0.0",
            "tokens": tokens_from_text(FINAL_TEXT),
            "continued_from": None,
            "prefix_staging_key": None,
        },
    }
    recorded = await calls(client)
    assert [(call["continued_from"], call["reused_prefix_tokens"]) for call in recorded] == [(None, None)] * 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    "capture",
    [
        {"rollout_id": "r0"},
        {"model_call_id": "", "rollout_id": "r0"},
        {"model_call_id": "r0.0", "rollout_id": ""},
        {"model_call_id": "r0.0", "rollout_id": "r0", "parent_call_id": 3},
        {"model_call_id": "r0.0", "rollout_id": "r0", "generation_cut": "yes"},
        {"model_call_id": "r0.0", "rollout_id": "r0", "generation_cut": {"source_capture_key": "r0"}},
    ],
)
async def test_a_malformed_ng_capture_is_refused_before_the_call_is_recorded(
    client: httpx.AsyncClient, capture: dict[str, Any]
) -> None:
    response = await captured_chat(client, DEVELOPER_USER, capture)

    assert response.status_code == 422
    assert await calls(client) == []


@pytest.mark.anyio
async def test_the_cut_endpoint_needs_a_bearer_and_the_inventorys_own_digest(client: httpx.AsyncClient) -> None:
    body = inventory("r0.0")
    unauthorized = await client.post("/ng-control/v1/generation-cut", json=body)
    tampered = await cut(client, {**body, "checkpoint_id": "c2"})

    assert (unauthorized.status_code, unauthorized.json()["error"]["code"]) == (401, "unauthorized")
    assert (tampered.status_code, tampered.json()["error"]["code"]) == (422, "invalid_inventory")
    assert (await client.get("/_ctl/cuts")).json() == []


@pytest.mark.anyio
async def test_a_cut_stages_the_prefix_of_an_active_call_and_fails_the_rest(client: httpx.AsyncClient) -> None:
    await client.post("/_ctl/gate")
    waiting = asyncio.ensure_future(captured_chat(client, after_tool_rounds(1), captured("r0.1")))
    await wait_for_waiting(client, [0])
    body = inventory("r0.1", "r0.9")

    reply = (await cut(client, body)).json()

    prefix = tokens_from_text(FINAL_TEXT)[:5]
    key = "__generation_cut__/r0/r0.1"
    acks = validated_acks(GenerationCutInventory.model_validate(body), reply)
    assert (acks[0].disposition, acks[1].disposition) == ("durable_prefix", "durable_failure")
    assert reply["prefixes"][0] == {
        **body["active_prefixes"][0],
        "disposition": "durable_prefix",
        "cut_kind": "active_prefix",
        "frozen_buffer_id": "buf-r0.1",
        "staging_keys": [key],
        "prefix_token_count": 5,
        "prefix_digest": canonical_digest(prefix),
        "effective_output_limit": 1024,
        "terminal_finish_reason": None,
        "terminal_stop_reason": None,
    }
    assert reply["prefixes"][1] == {**body["active_prefixes"][1], "disposition": "durable_failure"}
    assert (reply["backend_snapshot_id"], reply["inventory"]) == ("fake-transfer-queue", body)
    assert (await client.get("/_ctl/cuts")).json() == [["r0.1"]]
    assert (await staged(client))[key]["tokens"] == prefix
    await client.post("/_ctl/release")
    await waiting
    # A call that returned is no longer active: a later round cannot cut it.
    assert (await cut(client, inventory("r0.1", checkpoint_id="c2"))).json()["prefixes"][0]["disposition"] == (
        "durable_failure"
    )
    assert (await client.get("/_ctl/cuts")).json() == [["r0.1"], []]


async def cut_continuation(client: httpx.AsyncClient) -> dict[str, Any]:
    """Cut call r0.1 while it waits, let it end, and return the continuation a restored cut would carry."""
    await client.post("/_ctl/gate")
    waiting = asyncio.ensure_future(captured_chat(client, after_tool_rounds(1), captured("r0.1")))
    await wait_for_waiting(client, [0])
    body = inventory("r0.1")
    (ack,) = validated_acks(GenerationCutInventory.model_validate(body), (await cut(client, body)).json()).values()
    await client.post("/_ctl/release")
    await waiting
    return ack.continuation("r0")


@pytest.mark.anyio
async def test_a_continued_call_generates_only_the_rest_of_its_cut(client: httpx.AsyncClient) -> None:
    continuation = await cut_continuation(client)

    reply = await captured_chat(client, after_tool_rounds(1), captured("r0-a1.0", "r0.0", generation_cut=continuation))

    assert reply.json()["ng_commit_coords"] == {"staging_key": "r0-a1/r0-a1.0"}
    continued = (await calls(client))[-1]
    assert (continued["continued_from"], continued["reused_prefix_tokens"]) == ("r0.1", 5)
    assert continued["admission"]["generation_cut"] == continuation
    entry = (await staged(client))["r0-a1/r0-a1.0"]
    assert entry["tokens"] == tokens_from_text(FINAL_TEXT), "the prefix once, then the rest"
    assert (entry["continued_from"], entry["prefix_staging_key"]) == ("r0.1", "__generation_cut__/r0/r0.1")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"staging_keys": ["__generation_cut__/r0/r0.7"]}, "not in the token store"),
        ({"prefix_digest": "0" * 64}, "digest"),
        ({"prefix_token_count": 4}, "4"),
    ],
)
async def test_a_continuation_that_does_not_match_its_staged_cut_is_refused(
    client: httpx.AsyncClient, change: dict[str, Any], problem: str
) -> None:
    continuation = {**(await cut_continuation(client)), **change}
    recorded = len(await calls(client))

    reply = await captured_chat(client, after_tool_rounds(1), captured("r0-a1.0", generation_cut=continuation))

    assert reply.status_code == 409
    assert reply.json()["error"]["code"] == "invalid_generation_cut"
    assert problem in reply.json()["error"]["detail"]
    assert len(await calls(client)) == recorded


@pytest.mark.anyio
async def test_reset_forgets_the_token_store_and_the_cut_stall(client: httpx.AsyncClient) -> None:
    await captured_chat(client, DEVELOPER_USER, captured("r0.0"))
    assert (await client.post("/_ctl/cut_stall", json={"stall": True})).json() == {"stall": True}

    await client.post("/_ctl/reset")

    assert await staged(client) == {}
    body = inventory("r0.0")
    assert (await cut(client, body)).json()["prefixes"][0]["disposition"] == "durable_failure"


# --- ungated: the OpenAI API as a real model server serves it -------------------------------------------------


@pytest.fixture
async def ungated() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app(ungated=True, latency_s=0.05, served_model="org/served"))
    async with httpx.AsyncClient(transport=transport, base_url="http://backend") as http:
        yield http


@pytest.mark.anyio
async def test_ungated_serves_the_model_routes_and_no_control_route(ungated: httpx.AsyncClient) -> None:
    assert (await ungated.get("/v1/models")).json()["data"] == [{"id": "org/served", "object": "model"}]
    for path in ("/_ctl/gate", "/_ctl/hold", "/_ctl/release", "/_ctl/reset"):
        assert (await ungated.post(path, json={})).status_code == 404, path
    assert (await ungated.get("/_ctl/calls")).status_code == 404


@pytest.mark.anyio
async def test_ungated_answers_the_script_after_its_latency_and_only_for_the_served_model(
    ungated: httpx.AsyncClient,
) -> None:
    started = time.monotonic()
    reply = await ungated.post("/v1/chat/completions", json={"model": "org/served", "messages": DEVELOPER_USER})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert time.monotonic() - started >= 0.05
    refused = await ungated.post("/v1/chat/completions", json={"model": "fake-model", "messages": DEVELOPER_USER})
    assert refused.status_code == 404
    assert refused.json()["message"] == "The model `fake-model` does not exist."


def test_a_negative_latency_is_refused() -> None:
    with pytest.raises(ValueError, match="'latency_s' must be a finite number of seconds >= 0"):
        build_app(ungated=True, latency_s=-1.0)
