"""Generation cuts on the wire (reference 7.3): the inventory a policy model sends its backend when a checkpoint
closes it, the receipt it gets back, and the continuation a restored cut attaches to a re-issued call.

The model server and the fake backend both read these bodies from here (they are one system under test; the
checker keeps its own description). Validation is strict: a receipt that does not answer the inventory exactly
costs the cut, never the checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Request fields of constrained decoding: a cut prefix could break the constraint, so such calls regenerate.
GUIDED_FIELDS = (
    "guided_choice",
    "guided_grammar",
    "guided_json",
    "guided_regex",
    "guided_whitespace_pattern",
    "structural_tag",
    "structured_outputs",
)
TEXT_RESPONSE_FORMATS = (None, "text")
FREE_TOOL_CHOICES = (None, "auto", "none")
DURABLE_FIELDS = (
    "cut_kind",
    "frozen_buffer_id",
    "staging_keys",
    "prefix_token_count",
    "prefix_digest",
    "effective_output_limit",
)
TERMINAL_FIELDS = ("terminal_finish_reason", "terminal_stop_reason")
IDENTITY_FIELDS = ("ticket_id", "rollout_id", "attempt", "model_call_id", "admitted_at")
# The regex engine pydantic uses has no `$`-before-newline quirk: this is the whole value.
SHA256_HEX = r"^[0-9a-f]{64}$"


def canonical_digest(value: Any) -> str:
    """SHA-256 hex of the value's canonical JSON (sorted keys, compact separators)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def request_digest(request: dict[str, Any]) -> str:
    """The conversation digest a restored cut is matched by: the request's messages."""
    return canonical_digest(request.get("messages"))


def cuttable(request: dict[str, Any]) -> bool:
    """False for constrained decoding: a forced tool choice, a non-text response format, any guided field."""
    if request.get("tool_choice") not in FREE_TOOL_CHOICES:
        return False
    response_format = request.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else response_format
    if kind not in TEXT_RESPONSE_FORMATS:
        return False
    return not any(request.get(field) is not None for field in GUIDED_FIELDS)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerationCutPrefix(_Wire):
    ticket_id: int
    rollout_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    model_call_id: str = Field(min_length=1)
    admitted_at: float


class GenerationCutInventory(_Wire):
    checkpoint_id: str = Field(min_length=1)
    server_name: str = Field(min_length=1)
    active_prefixes: list[GenerationCutPrefix]
    inventory_digest: str

    @classmethod
    def build(cls, checkpoint_id: str, server_name: str, prefixes: list[GenerationCutPrefix]) -> GenerationCutInventory:
        """Prefixes sorted by ticket, and the digest over the other three fields."""
        ordered = sorted(prefixes, key=lambda prefix: prefix.ticket_id)
        body = {
            "checkpoint_id": checkpoint_id,
            "server_name": server_name,
            "active_prefixes": [prefix.model_dump() for prefix in ordered],
        }
        return cls.model_validate({**body, "inventory_digest": canonical_digest(body)})

    def expected_digest(self) -> str:
        return canonical_digest(self.model_dump(exclude={"inventory_digest"}))


class GenerationCutPrefixAck(GenerationCutPrefix):
    disposition: Literal["durable_prefix", "durable_failure"]
    cut_kind: Literal["active_prefix", "terminal_completion"] | None = None
    frozen_buffer_id: str | None = Field(default=None, min_length=1)
    staging_keys: list[str] | None = Field(default=None, min_length=1)
    prefix_token_count: int | None = Field(default=None, ge=0)
    prefix_digest: str | None = Field(default=None, pattern=SHA256_HEX)
    effective_output_limit: int | None = Field(default=None, ge=1)
    terminal_finish_reason: Literal["stop", "length"] | None = None
    terminal_stop_reason: str | None = None

    @field_validator("staging_keys")
    @classmethod
    def _unique(cls, keys: list[str] | None) -> list[str] | None:
        if keys is not None and len(set(keys)) != len(keys):
            raise ValueError(f"'staging_keys' must not repeat a key (got {keys})")
        return keys

    @model_validator(mode="after")
    def _fields_match_disposition(self) -> GenerationCutPrefixAck:
        present = [field for field in (*DURABLE_FIELDS, *TERMINAL_FIELDS) if getattr(self, field) is not None]
        if self.disposition == "durable_failure" and present:
            raise ValueError(f"a durable_failure ack must carry none of the cut's fields (got {present})")
        missing = [field for field in DURABLE_FIELDS if getattr(self, field) is None]
        if self.disposition == "durable_prefix" and missing:
            raise ValueError(f"a durable_prefix ack must carry {list(DURABLE_FIELDS)} (missing {missing})")
        if self.terminal_stop_reason is not None and self.terminal_finish_reason is None:
            raise ValueError("'terminal_stop_reason' needs a 'terminal_finish_reason'")
        return self

    def identity(self) -> dict[str, Any]:
        return {field: getattr(self, field) for field in IDENTITY_FIELDS}

    def continuation(self, source_capture_key: str) -> dict[str, Any]:
        """What a re-issued call needs to continue this prefix (`GenerationCutContinuation`)."""
        carried = self.model_dump(include={*DURABLE_FIELDS, *TERMINAL_FIELDS} - {"cut_kind", "frozen_buffer_id"})
        return GenerationCutContinuation(
            source_capture_key=source_capture_key, source_model_call_id=self.model_call_id, **carried
        ).model_dump()


class GenerationCutReceipt(_Wire):
    checkpoint_id: str
    cut_id: str = Field(min_length=1)
    inventory_digest: str
    inventory: dict[str, Any]
    backend_snapshot_id: str
    prefixes: list[GenerationCutPrefixAck]


class GenerationCutContinuation(_Wire):
    source_capture_key: str = Field(min_length=1)
    source_model_call_id: str = Field(min_length=1)
    staging_keys: list[str] = Field(min_length=1)
    prefix_token_count: int = Field(ge=0)
    prefix_digest: str
    effective_output_limit: int = Field(ge=1)
    terminal_finish_reason: Literal["stop", "length"] | None = None
    terminal_stop_reason: str | None = None


class GenerationCutRecord(_Wire):
    """A cut as a model record carries it: the call, its conversation digest, and how to continue it."""

    model_call_id: str = Field(min_length=1)
    request_digest: str
    continuation: GenerationCutContinuation


def validated_acks(inventory: GenerationCutInventory, reply: Any) -> dict[int, GenerationCutPrefixAck]:
    """The receipt's acks by ticket_id, if it answers `inventory` exactly; ValueError naming what is wrong."""
    receipt = GenerationCutReceipt.model_validate(reply)
    sent = inventory.model_dump()
    if receipt.inventory != sent:
        raise ValueError(f"the receipt's 'inventory' does not echo the inventory sent (got {receipt.inventory})")
    if (receipt.checkpoint_id, receipt.inventory_digest) != (inventory.checkpoint_id, inventory.inventory_digest):
        raise ValueError(
            f"the receipt names checkpoint {receipt.checkpoint_id!r} and digest {receipt.inventory_digest!r}, "
            f"not {inventory.checkpoint_id!r} and {inventory.inventory_digest!r}"
        )
    expected = {prefix["ticket_id"]: prefix for prefix in sent["active_prefixes"]}
    acks: dict[int, GenerationCutPrefixAck] = {}
    for ack in receipt.prefixes:
        if ack.ticket_id in acks or expected.get(ack.ticket_id) != ack.identity():
            raise ValueError(f"ack {ack.identity()} is repeated or matches no prefix of the inventory")
        acks[ack.ticket_id] = ack
    if acks.keys() != expected.keys():
        raise ValueError(f"the receipt acks no prefix for tickets {sorted(expected.keys() - acks.keys())}")
    return acks
