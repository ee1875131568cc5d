"""The look-alike stack's own description of Gym's checkpoint wire protocol.

Written from the reference (`shared/reference/gym-checkpoint-protocol.md`): routes and request bodies (2.1, 2.2),
error codes and statuses (2.3), the status report (2.4), participant kinds and orders (4), episode identity and
the native `/run` body (5.1, 5.2), and the checkpoint directory layout (6.1, 6.2); the native `/run` reply and the
failures an environment server makes itself as nemo-gym 0.7.0 has them
(`shared/reference/nemo-gym-0.7-episode-contracts.md`). The checker keeps its own
description; `fakes/` imports nothing from `ckpt_model` (STYLE rule 2), so a misreading of the protocol shows up
as a disagreement in `tests/contract/test_golden.py` instead of hiding on both sides at once.

Nothing here does I/O. Request bodies are pydantic models with `extra="forbid"`, as in Gym, so FastAPI answers a
malformed body with its standard 422 before any route code runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

# --- routes and authentication (2.1, 7.1, 7.3) ----------------------------------------------------------------

CHECKPOINT_ROUTE_PREFIX = "/ng-control/v1/checkpoint"
GENERATION_CUT_ROUTE = "/ng-control/v1/generation-cut"
# Downstream calls carry the episode's capture key as `/ng-rollout/<capture_key>/...` (5.2, 7.1).
ROLLOUT_PATH_PREFIX = "/ng-rollout/"
# Ours, on a multi-worker policy model: where the checker sets which worker serves which generation call.
PLACEMENT_ROUTE = "/_ctl/placement"
# Ours, on any multi-worker server: which worker process has which index (a harness kills one worker by it).
WORKERS_ROUTE = "/_ctl/workers"
BEARER_PREFIX = "Bearer "


def bearer(token: str) -> str:
    """The exact `Authorization` value a control route accepts: `"Bearer " + token`."""
    return BEARER_PREFIX + token


# --- participants, phases, orders (1.1, 3, 4) -----------------------------------------------------------------

PARTICIPANT_KINDS: tuple[str, ...] = ("environment", "model", "agent", "resources")
# Prepare closes the stages in this order; resume re-opens them in reverse.
PREPARE_ORDER: tuple[str, ...] = ("environment", "model", "agent", "resources")
RESUME_ORDER: tuple[str, ...] = tuple(reversed(PREPARE_ORDER))
# Retire and forget go callers before callees; kinds within one stage are contacted together.
RETIRE_ORDER: tuple[tuple[str, ...], ...] = (("environment",), ("agent",), ("model", "resources"))
PHASES: tuple[str, ...] = ("idle", "preparing", "prepared", "committed", "restored")

# --- names (2.2, 5.1, 6.1) -------------------------------------------------------------------------------------

# Checkpoint IDs, rollout IDs, participant kinds and instances: alphanumeric first, then `[A-Za-z0-9._-]`.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
CHECKPOINT_ID_MAX_CHARS = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A capture key's attempt suffix: `-a<N>`, N positive without a leading zero. A rollout ID must not end in one.
_ATTEMPT_SUFFIX = re.compile(r"-a([1-9][0-9]*)\Z")


def is_valid_name(value: str) -> bool:
    """Whether `value` is a whole name (no trailing newline slips through, unlike `re.match` with `$`)."""
    return _NAME.fullmatch(value) is not None


# --- episode identity (5.1) ------------------------------------------------------------------------------------


class EpisodeId(BaseModel):
    """`{rollout_id, attempt}`: one attempt of one rollout. Frozen, extra fields refused, attempt defaults to 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1)
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _check_rollout_id(cls, rollout_id: str) -> str:
        if not is_valid_name(rollout_id):
            raise ValueError(f"rollout_id {rollout_id!r} must match {NAME_PATTERN}")
        if _ATTEMPT_SUFFIX.search(rollout_id) is not None:
            raise ValueError(
                f"rollout_id {rollout_id!r} ends in -a<N>, which capture keys reserve for the attempt number"
            )
        return rollout_id

    @property
    def capture_key(self) -> str:
        """`rollout_id` for attempt 0, else `<rollout_id>-a<attempt>` (e.g. `counter-1-a1`)."""
        return key_of(self.rollout_id, self.attempt)

    @classmethod
    def from_capture_key(cls, key: str) -> EpisodeId:
        """Inverse of `capture_key`: a trailing `-a<N>` is the attempt, anything else is attempt 0."""
        suffix = _ATTEMPT_SUFFIX.search(key)
        if suffix is None:
            return cls(rollout_id=key)
        return cls(rollout_id=key[: suffix.start()], attempt=int(suffix.group(1)))

    def next_attempt(self) -> EpisodeId:
        """Same rollout, attempt + 1: where a restore installs this episode's records."""
        return type(self)(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def wire(self) -> dict[str, Any]:
        """The JSON object, with `attempt` always written out."""
        return {"rollout_id": self.rollout_id, "attempt": self.attempt}


def capture_key(rollout_id: str, attempt: int = 0) -> str:
    return EpisodeId(rollout_id=rollout_id, attempt=attempt).capture_key


def key_of(rollout_id: str, attempt: int) -> str:
    """The capture key of an episode already validated (no model built: thousands at a time at scale)."""
    return rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"


# --- control request bodies (2.2) ------------------------------------------------------------------------------


class CheckpointRequest(BaseModel):
    """prepare, renew and resume; every other body extends it."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_id: str = Field(min_length=1, max_length=CHECKPOINT_ID_MAX_CHARS, pattern=NAME_PATTERN)
    deadline_ts: float

    @field_validator("deadline_ts")
    @classmethod
    def _check_deadline(cls, deadline_ts: float) -> float:
        if not math.isfinite(deadline_ts):
            raise ValueError(f"deadline_ts must be a finite absolute Unix time in seconds (got {deadline_ts!r})")
        return deadline_ts


class CommitRequest(CheckpointRequest):
    """`episode_ids` is the scope the controller continues; null means no scope given (the model refuses it)."""

    checkpoint_dir: str = Field(min_length=1)
    episode_ids: list[EpisodeId] | None = None


class RestoreRequest(CheckpointRequest):
    """Both fields required; the scope may be empty."""

    checkpoint_dir: str = Field(min_length=1)
    episode_ids: list[EpisodeId]


class RetireRequest(CheckpointRequest):
    episode_ids: list[EpisodeId] = Field(min_length=1)


class ForgetRequest(CheckpointRequest):
    rollout_ids: list[str] = Field(min_length=1)


# --- error envelope (2.3) --------------------------------------------------------------------------------------

# code -> HTTP status, one row per error class of the reference's table.
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
    # Not known from Gym's source (the reference gives neither code nor status, "likely 409"): our own choice.
    "retire_incomplete": 409,
}
# An unexpected exception inside a control route: `checkpoint_error`, but with this status.
INTERNAL_ERROR_STATUS = 500


def error_body(code: str, detail: str) -> dict[str, Any]:
    """`{"error": {"code": ..., "detail": ...}}`, on control and data-plane routes alike."""
    return {"error": {"code": code, "detail": detail}}


# --- status and prepare report (2.4) ---------------------------------------------------------------------------

BLOCKERS_SHOWN_MAX = 100  # `report.blockers` shows at most this many; `blocker_count` counts them all

# --- checkpoint directory (6.1, 6.2) ---------------------------------------------------------------------------

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
MANIFEST_FIELDS: tuple[str, ...] = (
    "schema_version",
    "kind",
    "instance",
    "checkpoint_id",
    "records_file",
    "records_sha256",
    "record_count",
)
# Digest-named records files, and the fixed name older checkpoints used; readers accept both.
RECORDS_FILE_RE = re.compile(r"^records(-[0-9a-f]{64})?\.jsonl$")


def records_file_name(sha256_hex: str) -> str:
    return f"records-{sha256_hex}.jsonl"


def manifest_text(manifest: dict[str, Any]) -> str:
    """How a manifest is serialised on disk: sorted keys, indent 1."""
    return json.dumps(manifest, sort_keys=True, indent=1)


# --- seed-reply headers (5.4) ----------------------------------------------------------------------------------

# Set to "1" by a server that cannot capture the session it seeded: the episode becomes a restart.
RESTART_HEADER = "x-ng-checkpoint-restart"

# --- native /run (5.2) -----------------------------------------------------------------------------------------


def task_digest(task: Any) -> str:
    """SHA-256 hex of the task's JSON with sorted keys and compact separators; a restored record must match it."""
    canonical = json.dumps(task, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class TaskId(BaseModel):
    """nemo-gym 0.7.0's `TaskId`: `taskset` (by convention `<environment>:<taskset>`) and `task_id`, both non-empty;
    nothing else is set on either, so any other string is a task's name."""

    model_config = ConfigDict(extra="forbid")

    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: TaskId
    task_input: dict[str, Any]


class EpisodeRequest(BaseModel):
    """`BaseEpisodeRequest`: the body of a native `/run` on an environment server."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task: Task


# --- native /run reply (5.2; nemo-gym 0.7.0 `episode_types`) ---------------------------------------------------

FAILURE_REASON_MAX_CHARS = 2000
Stage = Literal["admission", "seed", "agent", "verification", "cleanup"]
OPTIONAL_FAILURE_FIELDS = ("failure_kind", "stage")


class EpisodeFailure(BaseModel):
    """`EpisodeFailure`: why an episode failed, and whether collection may attempt it again (`terminal`). Frozen,
    extra fields refused; `failure_kind` and `stage` are left out of the body when unset, never written null."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_reason: str = Field(max_length=FAILURE_REASON_MAX_CHARS)
    terminal: StrictBool
    failure_kind: str | None = None
    stage: Stage | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_no_nulls(cls, body: Any) -> Any:
        if isinstance(body, dict):
            nulls = [name for name in OPTIONAL_FAILURE_FIELDS if name in body and body[name] is None]
            if nulls:
                raise ValueError(f"{nulls} are left out of a failure when unset, never null")
        return body

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# The failures the environment server makes itself, as the release makes them. An admission timeout needs an
# admission queue, which the look-alike does not have; it is described here with the others all the same.
ADMISSION_TIMED_OUT = EpisodeFailure(failure_reason="Episode admission timed out", terminal=False, stage="admission")
EPISODE_TIMED_OUT = EpisodeFailure(failure_reason="Episode timed out", terminal=False)


def unhandled_error(error: BaseException) -> EpisodeFailure:
    """An exception nothing in the episode handled: terminal, its type and message cut to the reason's limit."""
    reason = f"Unhandled environment server error: {type(error).__name__}: {error}"
    return EpisodeFailure(failure_reason=reason[:FAILURE_REASON_MAX_CHARS], terminal=True)


class EpisodeResponse(BaseModel):
    """`BaseEpisodeResponse`: the attempt and task the episode ran, and exactly one of `result` and `failure`."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task_id: TaskId
    result: dict[str, Any] | None = None
    failure: EpisodeFailure | None = None

    @model_validator(mode="after")
    def _check_one_outcome(self) -> EpisodeResponse:
        if (self.result is None) == (self.failure is None):
            raise ValueError("a reply carries exactly one of result and failure")
        return self

    def wire(self) -> dict[str, Any]:
        """The body, with only the outcome that is set."""
        body: dict[str, Any] = {"episode_id": self.episode_id.wire(), "task_id": self.task_id.model_dump()}
        if self.failure is not None:
            body["failure"] = self.failure.wire()
        else:
            body["result"] = self.result
        return body
