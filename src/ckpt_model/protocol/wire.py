"""Gym's partial-rollout checkpoint protocol, described once as schemas.

The controller client (`ckpt_model.protocol.client`) builds and reads these shapes. The look-alike stack in
`fakes/` has its own description (`fakes.gym.protocol.wire`), written separately from the same reference, so a
misreading cannot hide on both sides at once; `tests/contract` holds both to literal bodies from the reference. Nothing
here does I/O.
The facts come from the reference (`shared/reference/gym-checkpoint-protocol.md`, sections 2, 5 and 6) and, for
the native `/run` reply and its failures, from nemo-gym 0.7.0's episode contracts
(`shared/reference/nemo-gym-0.7-episode-contracts.md`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

CHECKPOINT_ROUTE_PREFIX = "/ng-control/v1/checkpoint"
GENERATION_CUT_ROUTE = "/ng-control/v1/generation-cut"

ParticipantKind = Literal["environment", "model", "agent", "resources"]
PREPARE_ORDER: tuple[str, ...] = ("environment", "model", "agent", "resources")
RETIRE_ORDER: tuple[tuple[str, ...], ...] = (("environment",), ("agent",), ("model", "resources"))
PHASES: tuple[str, ...] = ("idle", "preparing", "prepared", "committed", "restored")

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
CHECKPOINT_ID_MAX_CHARS = 128
_NAME_RE = re.compile(NAME_PATTERN)
# `\Z`, not `$`: `$` also matches before a trailing newline, and "r-a1\n" must not read as attempt 1.
_ATTEMPT_SUFFIX_RE = re.compile(r"-a([1-9][0-9]*)\Z")
RECORDS_FILE_RE = re.compile(r"^records(-[0-9a-f]{64})?\.jsonl$")
BLOCKERS_SHOWN_MAX = 100
# The failures an environment server makes itself (nemo-gym 0.7.0, `base_environment_server.py`): the reason, and
# the `terminal` and `stage` the release gives each. An unhandled error's reason goes on with `<type>: <message>`.
EPISODE_TIMED_OUT = "Episode timed out"
EPISODE_ADMISSION_TIMED_OUT = "Episode admission timed out"
UNHANDLED_ERROR_PREFIX = "Unhandled environment server error: "
FAILURE_REASON_MAX_CHARS = 2000
EpisodeStage = Literal["admission", "seed", "agent", "verification", "cleanup"]

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


def is_valid_checkpoint_id(value: str) -> bool:
    """A `checkpoint_id` of a control request: a name (`is_valid_name`) of at most 128 characters (reference 2.2)."""
    return is_valid_name(value) and len(value) <= CHECKPOINT_ID_MAX_CHARS


def is_valid_rollout_id(value: str) -> bool:
    """An `EpisodeId.rollout_id`: a name (`is_valid_name`) that does not end in `-a<N>`, the suffix capture keys
    reserve for the attempt number (reference 5.1)."""
    return is_valid_name(value) and _ATTEMPT_SUFFIX_RE.search(value) is None


def rollout_key(rollout_id: str, attempt: int) -> str:
    """The capture key Gym derives from a rollout ID and an attempt, whether or not the ID is valid (a refused
    name's key, or one a faulty server took in): the bare ID at attempt 0, else `<rollout_id>-a<attempt>`."""
    return rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"


def split_capture_key(key: str) -> tuple[str, int]:
    """The rollout ID and attempt a capture key names: a trailing `-a<N>` (N without a leading zero) is the
    attempt, anything else is attempt 0 (`x-a0` and `x-a01` are rollout IDs at attempt 0)."""
    match = _ATTEMPT_SUFFIX_RE.search(key)
    return (key, 0) if match is None else (key[: match.start()], int(match.group(1)))


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
        return rollout_key(self.rollout_id, self.attempt)

    @classmethod
    def from_capture_key(cls, key: str) -> EpisodeId:
        rollout_id, attempt = split_capture_key(key)
        return cls(rollout_id=rollout_id, attempt=attempt)

    def next_attempt(self) -> EpisodeId:
        return EpisodeId(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def wire(self) -> dict[str, Any]:
        return {"rollout_id": self.rollout_id, "attempt": self.attempt}


def capture_key(rollout_id: str, attempt: int) -> str:
    return EpisodeId(rollout_id=rollout_id, attempt=attempt).capture_key


class CheckpointRequest(_Strict):
    checkpoint_id: str = Field(min_length=1, max_length=CHECKPOINT_ID_MAX_CHARS, pattern=NAME_PATTERN)
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
    """A task's name (nemo-gym 0.7.0's `TaskId`): both parts non-empty, `taskset` by convention
    `<environment>:<taskset>`."""

    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class Task(_Strict):
    task_id: TaskId
    task_input: dict[str, Any]


class EpisodeRequest(_Strict):
    """Body of a native `/run` on an environment server (reference 5.2)."""

    episode_id: EpisodeId
    task: Task


# -- replies: every field of every body the checker reads (reference 2.4, 2.5, 5.2, 7.2, 7.3 and 11) -------------
#
# The table `ckpt_model.protocol.fields` says, field by field, which check compares each one or why none does; its unit
# test holds it to these models, so a field added here cannot go unlisted. The client checks replies for their required
# fields (`ckpt_model.protocol.replies.reply_problems`) and tolerates extras, as Gym's own client does; these models
# say which fields there are, with the participant extras optional.


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


# `report.counts` keys by participant kind (reference 2.4); a multi-worker coordinator adds `workers`.
REPORT_COUNT_KEYS: dict[str, tuple[str, ...]] = {
    "environment": ("episodes",),
    "agent": ("sessions", "at_boundary", "inflight"),
    "resources": ("inflight", "sessions"),
    "model": ("inflight", "held", "cut", "cut_failed", "cut_skipped"),
    "coordinator": ("workers",),
}


class StatusReply(_Reply):
    """`GET .../status`: the common fields, then every participant kind's extras (optional)."""

    kind: str
    instance: str
    phase: str
    checkpoint_id: str | None
    lease_expires_at: float | None
    retired_rollouts: int
    report: PrepareReportWire
    restored_pending: list[str] | None = None  # environment; server coordinators
    accepting: bool | None = None  # agent
    mode: str | None = None  # resources
    verify: str | None = None  # resources
    retired_sessions: int | None = None  # resources
    restored_generation_cuts: list[str] | None = None  # model; the policy coordinator
    workers: int | None = None  # any multi-worker coordinator
    expected_workers: int | None = None
    session_aliases: int | None = None  # server coordinators
    session_placements: int | None = None


class PrepareReply(_Reply):
    phase: str
    report: PrepareReportWire


class RenewReply(_Reply):
    lease_expires_at: float


class ManifestWire(_Reply):
    """A participant's `manifest.json`, as written and as a commit reply echoes it (reference 6.2)."""

    schema_version: int
    kind: str
    instance: str
    checkpoint_id: str
    records_file: str
    records_sha256: str
    record_count: int
    session_owners: dict[str, Any] | None = None  # multi-worker servers (Appendix B)
    placed_sessions: dict[str, Any] | None = None


class CommitReply(_Reply):
    phase: str
    manifest: ManifestWire
    episode_ids: list[str]
    staging_keys: list[str] | None = None  # model
    staging_keys_by_episode: dict[str, list[str]] | None = None  # model


class RestoreReply(_Reply):
    phase: str
    source_checkpoint_id: str
    restored: list[str]


class ResumeReply(_Reply):
    phase: str
    idempotent: bool


class RetireReply(_Reply):
    retired: list[str]


class ForgetReply(_Reply):
    forgotten: list[str]


class CutPrefixAckWire(_Reply):
    """One acknowledged prefix of a generation-cut receipt (reference 7.3)."""

    ticket_id: str
    rollout_id: str
    attempt: int
    model_call_id: str
    admitted_at: float
    disposition: str
    cut_kind: str | None = None
    frozen_buffer_id: str | None = None
    staging_keys: list[str] | None = None
    prefix_token_count: int | None = None
    prefix_digest: str | None = None
    effective_output_limit: int | None = None
    terminal_finish_reason: str | None = None
    terminal_stop_reason: str | None = None


class GenerationCutReceiptWire(_Reply):
    """The backend's answer to `POST /ng-control/v1/generation-cut`, which the policy model reads (7.3)."""

    checkpoint_id: str
    cut_id: str
    inventory_digest: str
    inventory: dict[str, Any]
    backend_snapshot_id: str
    prefixes: list[CutPrefixAckWire]


class LedgerRowWire(_Reply):
    model_call_id: str
    parent_call_id: str | None = None
    staging_key: str | None = None
    capture_key: str | None = None  # stamped by a restore: the attempt that staged the row


class LedgerManifestReply(_Reply):
    """`GET /training-token-capture/control/rollouts/<capture_key>/manifest` (reference 7.2)."""

    rollout_id: str
    records: list[LedgerRowWire]
    failures: list[Any] | None = None


class LedgerRetireReply(_Reply):
    retired: list[str]


class LedgerDeleteReply(_Reply):
    deleted: list[str]


class EpisodeResultWire(_Reply):
    reward: float
    ng_agent_observations: list[Any] | None = None


class EpisodeFailureWire(_Reply):
    """`EpisodeFailure`: extra fields refused, `terminal` a JSON bool, and the optional fields left out of the body
    when unset (the release never writes them as null)."""

    failure_reason: str = Field(max_length=FAILURE_REASON_MAX_CHARS)
    terminal: StrictBool
    failure_kind: str | None = None
    stage: EpisodeStage | None = None

    @model_validator(mode="before")
    @classmethod
    def _unset_fields_left_out(cls, body: Any) -> Any:
        if isinstance(body, dict):
            written_null = [field for field in ("failure_kind", "stage") if field in body and body[field] is None]
            if written_null:
                raise ValueError(f"{', '.join(map(repr, written_null))} must be left out when unset, not null")
        return body


# The environment server's own failures (EPISODE_TIMED_OUT and the rest, above) by reason (an unhandled error's: the
# start of it), each with the `terminal` and `stage` the release gives it.
GYM_OWN_FAILURES: dict[str, tuple[bool, str | None]] = {
    EPISODE_ADMISSION_TIMED_OUT: (False, "admission"),
    EPISODE_TIMED_OUT: (False, None),
    UNHANDLED_ERROR_PREFIX: (True, None),
}


def gym_own_failure(reason: str) -> str | None:
    """Which of the environment server's own failures `reason` is (its key in `GYM_OWN_FAILURES`), None for any
    other: the two timeouts by their whole text, an unhandled error by its start."""
    if reason in (EPISODE_ADMISSION_TIMED_OUT, EPISODE_TIMED_OUT):
        return reason
    return UNHANDLED_ERROR_PREFIX if reason.startswith(UNHANDLED_ERROR_PREFIX) else None


class NativeRunReply(BaseModel):
    """`BaseEpisodeResponse`, the reply of a native `/run` as the checker holds it to nemo-gym 0.7.0: the attempt
    and task it ran, and exactly one of `result` and `failure`. Extras at the top pass (the release does not say
    it refuses them); `result` is the protocol's own object, whose reward P3 compares."""

    episode_id: EpisodeId
    task_id: TaskId
    result: dict[str, Any] | None = None
    failure: EpisodeFailureWire | None = None

    @model_validator(mode="after")
    def _result_or_failure(self) -> NativeRunReply:
        if (self.result is None) == (self.failure is None):
            both = "both" if self.result is not None else "neither"
            raise ValueError(f"exactly one of 'result' and 'failure' must be set (got {both})")
        return self


class RunReply(_Reply):
    """A `/run` reply: native (`episode_id`, `task_id`, `result` or `failure`, reference 5.2) or legacy (the
    verify response with `reward` at the top, 5.3)."""

    episode_id: EpisodeId | None = None
    task_id: TaskId | None = None
    result: EpisodeResultWire | None = None
    failure: EpisodeFailureWire | None = None
    reward: float | None = None
    response: dict[str, Any] | None = None


class CaptureAdmissionWire(_Reply):
    """`ng_capture`, the capture admission the policy model attaches to a call (reference 11)."""

    model_call_id: str
    parent_call_id: str | None = None
    rollout_id: str
    mode: str | None = None
    generation_cut: dict[str, Any] | None = None


class BackendCallWire(_Reply):
    """One entry of the fake backend's `GET /_ctl/calls` (reference 11, with the look-alike's additions)."""

    index: int
    n_messages: int
    admission: CaptureAdmissionWire | None = None
    capture_key: str | None = None
    kind: str | None = None
    t: float
    returned: bool
    waiting: bool | None = None
    cancelled: bool | None = None
    continued_from: str | None = None
    reused_prefix_tokens: int | None = None
    worker: int | None = None  # the policy worker that served the call (several workers behind one port)


class StagedEntryWire(_Reply):
    """One entry of the token store (`GET /_ctl/staged`: staging key -> entry)."""

    rollout_id: str
    model_call_id: str
    parent_call_id: str | None = None
    tokens: list[int]
    continued_from: str | None = None
    prefix_staging_key: str | None = None
    checkpoint_id: str | None = None  # a cut's prefix record


class BackendStepReply(_Reply):
    """`POST /_ctl/step`: the calls released, and how many still wait."""

    released: int
    released_indices: list[int]
    waiting: int


class BackendCutStallWire(_Reply):
    """`GET /_ctl/cut_stall`: whether the cut endpoint hangs, and how many cut requests hang at it now."""

    stall: bool
    hanging: int


class ErrorDetailWire(_Reply):
    code: str | None
    detail: str


class ErrorEnvelopeWire(_Reply):
    """`{"error": {"code", "detail"}}`, the refusal of every control and data-plane route (reference 2.3)."""

    error: ErrorDetailWire
