"""Gym's partial-rollout checkpoint protocol, described once as schemas.

The controller client (`ckpt_model.coordination`) builds and reads these shapes. The look-alike stack in
`fakes/` has its own description (`fakes.gym.wire`), written separately from the same reference, so a misreading
cannot hide on both sides at once; `tests/contract` holds both to literal bodies from the reference. Nothing here
does I/O.
The facts come from the reference (`shared/reference/gym-checkpoint-protocol.md`, sections 2, 5 and 6).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CHECKPOINT_ROUTE_PREFIX = "/ng-control/v1/checkpoint"
GENERATION_CUT_ROUTE = "/ng-control/v1/generation-cut"

ParticipantKind = Literal["environment", "model", "agent", "resources"]
PREPARE_ORDER: tuple[str, ...] = ("environment", "model", "agent", "resources")
RETIRE_ORDER: tuple[tuple[str, ...], ...] = (("environment",), ("agent",), ("model", "resources"))
PHASES: tuple[str, ...] = ("idle", "preparing", "prepared", "committed", "restored")

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_NAME_RE = re.compile(NAME_PATTERN)
# `\Z`, not `$`: `$` also matches before a trailing newline, and "r-a1\n" must not read as attempt 1.
_ATTEMPT_SUFFIX_RE = re.compile(r"-a([1-9][0-9]*)\Z")
RECORDS_FILE_RE = re.compile(r"^records(-[0-9a-f]{64})?\.jsonl$")
BLOCKERS_SHOWN_MAX = 100
MANIFEST_SCHEMA_VERSION = 1

# HTTP status of every error code the control plane and data plane answer with (reference 2.3).
ERROR_STATUS: dict[str, int] = {
    "checkpoint_error": 409,
    "stale_checkpoint": 409,
    "checkpoint_conflict": 409,
    "invalid_phase": 409,
    "deadline_exceeded": 409,
    "stale_attempt": 409,
    "admission_closed": 409,
    "restart_in_scope": 409,
    "rollout_id_required": 400,
    "invalid_rollout_id": 400,
    "unauthorized": 401,
    "invalid_checkpoint_state": 422,
    "activation_out_of_order": 409,
    "checkpoint_coordinator_unavailable": 503,
    # Not known from Gym's source (reference 2.3: "likely 409"); a guess both sides share, not a fact.
    "retire_incomplete": 409,
}


def is_valid_name(value: str) -> bool:
    """A checkpoint ID, instance or kind name: starts alphanumeric, then `[A-Za-z0-9._-]`."""
    # fullmatch: with `match`, `$` would also accept a trailing newline ("r1\n").
    return bool(_NAME_RE.fullmatch(value))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EpisodeId(_Strict):
    """One attempt of one rollout; its capture key names it everywhere on the wire."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1)
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _rollout_id_shape(cls, value: str) -> str:
        if not is_valid_name(value):
            raise ValueError(f"'rollout_id' must match {NAME_PATTERN} (got {value!r})")
        if _ATTEMPT_SUFFIX_RE.search(value):
            raise ValueError(f"'rollout_id' must not end in -a<N>, which capture keys reserve (got {value!r})")
        return value

    @property
    def capture_key(self) -> str:
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"

    @classmethod
    def from_capture_key(cls, key: str) -> EpisodeId:
        match = _ATTEMPT_SUFFIX_RE.search(key)
        if match is None:
            return cls(rollout_id=key, attempt=0)
        return cls(rollout_id=key[: match.start()], attempt=int(match.group(1)))

    def next_attempt(self) -> EpisodeId:
        return EpisodeId(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def wire(self) -> dict[str, Any]:
        return {"rollout_id": self.rollout_id, "attempt": self.attempt}


def capture_key(rollout_id: str, attempt: int) -> str:
    return EpisodeId(rollout_id=rollout_id, attempt=attempt).capture_key


class CheckpointRequest(_Strict):
    checkpoint_id: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    deadline_ts: float

    @field_validator("deadline_ts")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"'deadline_ts' must be a finite Unix time (got {value!r})")
        return value


class CommitRequest(CheckpointRequest):
    checkpoint_dir: str = Field(min_length=1)
    episode_ids: list[EpisodeId] | None = None


class RestoreRequest(CheckpointRequest):
    checkpoint_dir: str = Field(min_length=1)
    episode_ids: list[EpisodeId]


class RetireRequest(CheckpointRequest):
    episode_ids: list[EpisodeId] = Field(min_length=1)


class ForgetRequest(CheckpointRequest):
    rollout_ids: list[str] = Field(min_length=1)


class PrepareReportWire(_Strict):
    """`report` in status and prepare replies. Strict: the reference says bool and int, so "yes" or "2" is a
    malformed reply, not a coerced one."""

    model_config = ConfigDict(extra="allow", strict=True)

    ready: bool
    blockers: list[str]
    blocker_count: int
    counts: dict[str, int]
    restarts: list[str]


def task_digest(task: Any) -> str:
    """SHA-256 hex of the task JSON with sorted keys and compact separators (reference 5.2)."""
    text = json.dumps(task, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def error_body(code: str, detail: str) -> dict[str, Any]:
    return {"error": {"code": code, "detail": detail}}


class TaskId(_Strict):
    taskset: str
    task_id: str


class Task(_Strict):
    task_id: TaskId
    task_input: dict[str, Any]


class EpisodeRequest(_Strict):
    """Body of a native `/run` on an environment server (reference 5.2)."""

    episode_id: EpisodeId
    task: Task
