"""Generation-cut bodies: the inventory digest, which requests may be cut, and receipts that must answer exactly."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fakes.gym.protocol.generation_cut import (
    GenerationCutInventory,
    GenerationCutPrefix,
    canonical_digest,
    cuttable,
    request_digest,
    validated_acks,
)

DIGEST = "ab" * 32


def prefix(ticket_id: int, call_id: str) -> GenerationCutPrefix:
    return GenerationCutPrefix(ticket_id=ticket_id, rollout_id="r0", attempt=0, model_call_id=call_id, admitted_at=1.5)


def inventory() -> GenerationCutInventory:
    return GenerationCutInventory.build("c1", "policy_model", [prefix(10, "r0.1"), prefix(2, "r0.0")])


def durable(identity: dict[str, Any]) -> dict[str, Any]:
    return {
        **identity,
        "disposition": "durable_prefix",
        "cut_kind": "active_prefix",
        "frozen_buffer_id": "buf-1",
        "staging_keys": ["__generation_cut__/r0/" + identity["model_call_id"]],
        "prefix_token_count": 5,
        "prefix_digest": DIGEST,
        "effective_output_limit": 1024,
        "terminal_finish_reason": None,
        "terminal_stop_reason": None,
    }


def receipt(sent: GenerationCutInventory) -> dict[str, Any]:
    first, second = sent.model_dump()["active_prefixes"]
    return {
        "checkpoint_id": "c1",
        "cut_id": "cut-1",
        "inventory_digest": sent.inventory_digest,
        "inventory": sent.model_dump(),
        "backend_snapshot_id": "fake-transfer-queue",
        "prefixes": [durable(first), {**second, "disposition": "durable_failure"}],
    }


def test_the_inventory_sorts_prefixes_by_ticket_and_digests_the_canonical_json() -> None:
    sent = inventory()

    assert [p.ticket_id for p in sent.active_prefixes] == [2, 10]
    body = {key: value for key, value in sent.model_dump().items() if key != "inventory_digest"}
    assert sent.inventory_digest == canonical_digest(body) == sent.expected_digest()
    assert canonical_digest({"b": 1, "a": [1, 2]}) == canonical_digest({"a": [1, 2], "b": 1})


def test_a_receipt_that_answers_exactly_gives_one_ack_per_ticket() -> None:
    acks = validated_acks(inventory(), receipt(inventory()))

    assert {ticket: ack.disposition for ticket, ack in acks.items()} == {2: "durable_prefix", 10: "durable_failure"}
    assert acks[2].continuation("r0") == {
        "source_capture_key": "r0",
        "source_model_call_id": "r0.0",
        "staging_keys": ["__generation_cut__/r0/r0.0"],
        "prefix_token_count": 5,
        "prefix_digest": DIGEST,
        "effective_output_limit": 1024,
        "terminal_finish_reason": None,
        "terminal_stop_reason": None,
    }


def _without_echo(reply: dict[str, Any]) -> None:
    reply["inventory"]["active_prefixes"].pop()


def _other_checkpoint(reply: dict[str, Any]) -> None:
    reply["checkpoint_id"] = "c2"


def _missing_ack(reply: dict[str, Any]) -> None:
    reply["prefixes"].pop()


def _repeated_ack(reply: dict[str, Any]) -> None:
    reply["prefixes"][1] = copy.deepcopy(reply["prefixes"][0])


def _changed_identity(reply: dict[str, Any]) -> None:
    reply["prefixes"][0]["admitted_at"] = 2.5


def _durable_without_digest(reply: dict[str, Any]) -> None:
    del reply["prefixes"][0]["prefix_digest"]


def _failure_with_fields(reply: dict[str, Any]) -> None:
    reply["prefixes"][1]["staging_keys"] = ["k"]


def _bad_digest(reply: dict[str, Any]) -> None:
    reply["prefixes"][0]["prefix_digest"] = "AB" * 32


def _stop_reason_alone(reply: dict[str, Any]) -> None:
    reply["prefixes"][0]["terminal_stop_reason"] = "</tool>"


def _repeated_staging_key(reply: dict[str, Any]) -> None:
    reply["prefixes"][0]["staging_keys"] *= 2


def _unknown_field(reply: dict[str, Any]) -> None:
    reply["prefixes"][0]["extra"] = 1


@pytest.mark.parametrize(
    "spoil",
    [
        _without_echo,
        _other_checkpoint,
        _missing_ack,
        _repeated_ack,
        _changed_identity,
        _durable_without_digest,
        _failure_with_fields,
        _bad_digest,
        _stop_reason_alone,
        _repeated_staging_key,
        _unknown_field,
    ],
)
def test_a_receipt_that_does_not_answer_exactly_is_refused(spoil: Any) -> None:
    reply = receipt(inventory())
    spoil(reply)

    with pytest.raises(ValueError):  # noqa: PT011  # each spoiled receipt fails its own rule; any ValueError costs the cut
        validated_acks(inventory(), reply)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, True),
        ({"tool_choice": "auto"}, True),
        ({"tool_choice": "none"}, True),
        ({"response_format": {"type": "text"}}, True),
        ({"tool_choice": "required"}, False),
        ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, False),
        ({"response_format": {"type": "json_schema"}}, False),
        ({"guided_regex": "[0-9]+"}, False),
        ({"structured_outputs": {"json": {}}}, False),
    ],
)
def test_constrained_decoding_is_never_cut(extra: dict[str, Any], expected: bool) -> None:
    assert cuttable({"messages": [], **extra}) is expected


def test_the_request_digest_is_the_conversations() -> None:
    messages = [{"role": "user", "content": "Weather in SF?"}]
    assert request_digest({"messages": messages, "tools": [1]}) == request_digest({"messages": messages})
    assert request_digest({"messages": messages}) != request_digest({"messages": [*messages, *messages]})
