"""The refusals every look-alike server answers with, and the handler that renders them.

Each class is one row of reference section 2.3: an HTTP status and a `code` from the stack's own wire table
`fakes.gym.protocol.wire.ERROR_STATUS` (written from the reference; the checker keeps its own, STYLE rule 2).
Every error is rendered as `{"error": {"code", "detail"}}`, on control routes and data-plane routes alike,
so a client reads one shape.

    ControlError                      409 checkpoint_error      generic participant refusal
    +-- StaleCheckpointError          409 stale_checkpoint
    +-- CheckpointConflictError       409 checkpoint_conflict
    +-- InvalidPhaseError             409 invalid_phase
    +-- DeadlineExceededError         409 deadline_exceeded
    +-- StaleAttemptError             409 stale_attempt
    +-- AdmissionClosedError          409 admission_closed
    +-- RestartInScopeError           409 restart_in_scope
    +-- RolloutIdRequiredError        400 rollout_id_required
    +-- InvalidRolloutIdError         400 invalid_rollout_id
    +-- UnauthorizedError             401 unauthorized
    +-- CheckpointStateError          422 invalid_checkpoint_state
    +-- ActivationOutOfOrderError     409 activation_out_of_order
    +-- CoordinatorUnavailableError   503 checkpoint_coordinator_unavailable
    +-- RetireIncompleteError         409 retire_incomplete
    +-- InternalControlError          500 checkpoint_error      unexpected exception inside a control route
    +-- RolloutRetiredError           410 rollout_retired       token capture's own: a retired capture ledger
    +-- ReplyLost                     (none)                    the look-alike's lost reply: never rendered
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from fakes.gym.faults.lost_replies import cut_off_reply
from fakes.gym.protocol.wire import ERROR_STATUS, INTERNAL_ERROR_STATUS, error_body


class ControlError(Exception):
    """A refusal the caller can act on; `code` and `status_code` come from the wire table."""

    code: str = "checkpoint_error"
    status_code: int = ERROR_STATUS["checkpoint_error"]

    def __init_subclass__(cls, **kwargs: object) -> None:
        # The status follows the code from the one wire table; a typo in `code` fails at import time.
        super().__init_subclass__(**kwargs)
        if "status_code" not in cls.__dict__:
            cls.status_code = ERROR_STATUS[cls.code]

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def to_wire(self) -> dict[str, dict[str, str]]:
        return error_body(self.code, self.detail)


class StaleCheckpointError(ControlError):
    """The call names a checkpoint ID this participant already resumed (a stale controller)."""

    code = "stale_checkpoint"


class CheckpointConflictError(ControlError):
    """Another checkpoint is active, or a completed operation is retried with other arguments."""

    code = "checkpoint_conflict"


class InvalidPhaseError(ControlError):
    """The operation is not allowed in the participant's current phase."""

    code = "invalid_phase"


class DeadlineExceededError(ControlError):
    """`deadline_ts` had passed, or the work under it did not finish in time."""

    code = "deadline_exceeded"


class StaleAttemptError(ControlError):
    """A data-plane request from a retired attempt (or an earlier attempt of a retired rollout)."""

    code = "stale_attempt"


class AdmissionClosedError(ControlError):
    """New work while a checkpoint holds admission closed."""

    code = "admission_closed"


class RestartInScopeError(ControlError):
    """A commit scope names an episode this participant reported as a restart."""

    code = "restart_in_scope"


class RolloutIdRequiredError(ControlError):
    """Agent work that does not say which rollout it belongs to."""

    code = "rollout_id_required"


class InvalidRolloutIdError(ControlError):
    """A model call whose `/ng-rollout/<key>` prefix is not a valid capture key, or a legacy `/run` row whose
    `_ng_rollout_id` is not a valid rollout ID."""

    code = "invalid_rollout_id"


class UnauthorizedError(ControlError):
    """A control call without the exact bearer token."""

    code = "unauthorized"


class CheckpointStateError(ControlError):
    """Checkpoint data that is missing, corrupt, foreign, unreadable or unwritable."""

    code = "invalid_checkpoint_state"


class ActivationOutOfOrderError(ControlError):
    """An agent activation index that is neither the last completed one nor the next."""

    code = "activation_out_of_order"


class CoordinatorUnavailableError(ControlError):
    """A worker of a multi-worker server cannot reach its coordinator."""

    code = "checkpoint_coordinator_unavailable"


class RetireIncompleteError(ControlError):
    """Forget refused because a retire has not finished freeing what it must free."""

    code = "retire_incomplete"


class InternalControlError(ControlError):
    """An unexpected exception inside a control route: a bug in the server, never a refusal to act on."""

    status_code = INTERNAL_ERROR_STATUS


class RolloutRetiredError(ControlError):
    """A capture ledger that was retired: its manifest is gone (410) and it takes no more rows (reference 7.2).

    Token capture's routes are not in reference 2.3's table, so code and status are ours."""

    code = "rollout_retired"
    status_code = 410


class ReplyLost(ControlError):
    """Not a refusal: the operation ran and its reply is to be lost on the wire (`fakes.gym.faults.lost_replies`).
    Raised after the work, so it crosses a multi-worker server's channel as any error does and the worker that holds the
    caller's connection cuts the reply off."""

    code = "reply_lost"
    status_code = 200


class _CutOffResponse(Response):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await cut_off_reply(scope, receive, send)


async def _render_control_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ControlError)  # registered for ControlError only
    if exc.code == ReplyLost.code:
        return _CutOffResponse()
    return JSONResponse(status_code=exc.status_code, content=exc.to_wire())


def _json_safe(value: Any) -> Any:
    """`value` with non-finite floats written as text (`nan`, `inf`), which strict JSON cannot carry."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


async def _render_validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own 422 `{"detail": [...]}` (reference 2.2), also for a body such as `"deadline_ts": NaN`:
    FastAPI's default handler echoes the non-finite input back and fails to render it, answering 500."""
    assert isinstance(exc, RequestValidationError)  # registered for RequestValidationError only
    return JSONResponse(status_code=422, content={"detail": _json_safe(jsonable_encoder(exc.errors()))})


def install_error_handlers(app: FastAPI) -> None:
    """Render every `ControlError` raised by any route as the wire envelope with its status, and body-validation
    failures as FastAPI's standard 422."""
    app.add_exception_handler(ControlError, _render_control_error)
    app.add_exception_handler(RequestValidationError, _render_validation_error)
