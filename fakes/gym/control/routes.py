"""The control routes every look-alike server answers (reference section 2.1), and the look-alike's own `/_ctl`
routes for the faults the checker arms (`fakes.gym.faults`): their paths, body models and so their 422s.

A single-process server answers them with its `ControlPlane` (`fakes.gym.control.plane`); a worker of a
multi-worker server checks the bearer and forwards the operation with its validated body to its coordinator
(`fakes.gym.workers.link`), whose control plane reads the body back here (`parse_forwarded`).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header
from pydantic import BaseModel, Field

from fakes.gym.control.work_runner import Reply
from fakes.gym.faults.failpoints import Failpoint
from fakes.gym.faults.hooks import Hook
from fakes.gym.faults.lost_replies import LosableOperation
from fakes.gym.faults.storage import StorageHow, StoragePoint
from fakes.gym.protocol.errors import UnauthorizedError
from fakes.gym.protocol.wire import (
    CHECKPOINT_ROUTE_PREFIX,
    CheckpointRequest,
    CommitRequest,
    ForgetRequest,
    RestoreRequest,
    RetireRequest,
)

# Control operations whose bodies and replies name every episode in scope (thousands at scale): a multi-worker
# server's worker and coordinator handle them with the cycle collector paused (`store.collector_paused`).
BULKY_OPERATIONS = frozenset({"commit", "restore", "retire"})

Authorization = Annotated[str | None, Header()]
# W3C trace context (#3903): the caller's trace, which the operation's span joins (`fakes.gym.control.telemetry`).
Traceparent = Annotated[str | None, Header()]


class StorageFaultRequest(BaseModel):
    """`POST /_ctl/storage`: fail or stall the next checkpoint write at `point` (`fakes.gym.faults.storage`)."""

    point: StoragePoint
    how: StorageHow


class LostReplyRequest(BaseModel):
    """`POST /_ctl/lost-replies`: lose the reply to the next call of `operation` (`fakes.gym.faults.lost_replies`)."""

    operation: LosableOperation


class HookFaultRequest(BaseModel):
    """`POST /_ctl/hooks`: the next call of `hook` fails (`fakes.gym.faults.hooks`)."""

    hook: Hook


class ClockSkewRequest(BaseModel):
    """`POST /_ctl/clock`: move this server's wall clock `offset_s` seconds from the true time (`fakes.clock`)."""

    offset_s: float = Field(allow_inf_nan=False)


# What a control route hands its handler: the operation, the `Authorization` header, and the validated body (a
# request model), the failpoint's name, or None; a checkpoint route also its `traceparent` header (keyword).
ControlHandler = Callable[..., Awaitable[Reply]]
# Per operation: how a forwarded body is read back (None: no body; str: the failpoint's name).
_BODIES: dict[str, type[BaseModel] | type[str] | None] = {
    "status": None,
    "prepare": CheckpointRequest,
    "renew": CheckpointRequest,
    "commit": CommitRequest,
    "restore": RestoreRequest,
    "resume": CheckpointRequest,
    "retire": RetireRequest,
    "forget": ForgetRequest,
    "failpoints": None,
    "arm failpoint": str,
    "storage": None,
    "arm storage": StorageFaultRequest,
    "release storage": None,
    "lost replies": None,
    "lose reply": LostReplyRequest,
    "hooks": None,
    "fail hook": HookFaultRequest,
    "clock": None,
    "skew clock": ClockSkewRequest,
}


def check_bearer(authorization: str | None, expected: bytes) -> None:
    """401 unless the header is exactly `expected` (`"Bearer " + token`), compared in constant time."""
    given = (authorization or "").encode()
    if not hmac.compare_digest(given, expected):
        raise UnauthorizedError("control routes need the header 'Authorization: Bearer <control token>'")


def forwarded_body(argument: Any) -> Any:
    """A route's validated argument as JSON, for a worker to forward to its coordinator (`parse_forwarded` undoes
    it)."""
    return argument.model_dump(mode="json") if isinstance(argument, BaseModel) else argument


def parse_forwarded(op: str, body: Any) -> Any:
    """The argument of operation `op` from its forwarded JSON body."""
    if op not in _BODIES:
        raise ValueError(f"'operation' must be one of {sorted(_BODIES)} (got {op!r})")
    model = _BODIES[op]
    if model is None or model is str:
        return body
    return model.model_validate(body)


def control_router(handle: ControlHandler) -> APIRouter:
    """The control routes and the failpoint routes, each answered by `handle(op, authorization, argument)`.

    A single-process server's handler is its `ControlPlane`; a worker of a multi-worker server checks the bearer
    and forwards to its coordinator's. Either way the routes, their body models and so their 422s are these."""
    router = APIRouter()
    router.include_router(_checkpoint_router(handle))
    router.include_router(_failpoint_router(handle))
    router.include_router(_storage_router(handle))
    router.include_router(_lost_reply_router(handle))
    router.include_router(_hook_router(handle))
    router.include_router(_clock_router(handle))
    return router


def _storage_router(handle: ControlHandler) -> APIRouter:
    router = APIRouter(prefix="/_ctl/storage")

    @router.get("")
    async def storage(authorization: Authorization = None) -> Reply:
        return await handle("storage", authorization, None)

    @router.post("")
    async def arm(body: StorageFaultRequest, authorization: Authorization = None) -> Reply:
        return await handle("arm storage", authorization, body)

    @router.post("/release")
    async def release(authorization: Authorization = None) -> Reply:
        return await handle("release storage", authorization, None)

    return router


def _lost_reply_router(handle: ControlHandler) -> APIRouter:
    router = APIRouter(prefix="/_ctl/lost-replies")

    @router.get("")
    async def lost_replies(authorization: Authorization = None) -> Reply:
        return await handle("lost replies", authorization, None)

    @router.post("")
    async def lose(body: LostReplyRequest, authorization: Authorization = None) -> Reply:
        return await handle("lose reply", authorization, body)

    return router


def _clock_router(handle: ControlHandler) -> APIRouter:
    router = APIRouter(prefix="/_ctl/clock")

    @router.get("")
    async def clock_state(authorization: Authorization = None) -> Reply:
        return await handle("clock", authorization, None)

    @router.post("")
    async def skew(body: ClockSkewRequest, authorization: Authorization = None) -> Reply:
        return await handle("skew clock", authorization, body)

    return router


def _hook_router(handle: ControlHandler) -> APIRouter:
    router = APIRouter(prefix="/_ctl/hooks")

    @router.get("")
    async def hooks(authorization: Authorization = None) -> Reply:
        return await handle("hooks", authorization, None)

    @router.post("")
    async def fail(body: HookFaultRequest, authorization: Authorization = None) -> Reply:
        return await handle("fail hook", authorization, body)

    return router


def _failpoint_router(handle: ControlHandler) -> APIRouter:
    router = APIRouter(prefix="/_ctl/failpoints")

    @router.get("")
    async def failpoints(authorization: Authorization = None) -> Reply:
        return await handle("failpoints", authorization, None)

    @router.post("/{point}")
    async def arm(point: Failpoint, authorization: Authorization = None) -> Reply:
        return await handle("arm failpoint", authorization, point)

    return router


def _checkpoint_router(handle: ControlHandler) -> APIRouter:
    """The control routes; bodies are validated (422) before the bearer is checked (401), as in Gym."""
    router = APIRouter(prefix=CHECKPOINT_ROUTE_PREFIX)

    @router.get("/status")
    async def status(authorization: Authorization = None) -> Reply:
        return await handle("status", authorization, None)

    @router.post("/prepare")
    async def prepare(
        body: CheckpointRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("prepare", authorization, body, traceparent=traceparent)

    @router.post("/renew")
    async def renew(
        body: CheckpointRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("renew", authorization, body, traceparent=traceparent)

    @router.post("/commit")
    async def commit(
        body: CommitRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("commit", authorization, body, traceparent=traceparent)

    @router.post("/restore")
    async def restore(
        body: RestoreRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("restore", authorization, body, traceparent=traceparent)

    @router.post("/resume")
    async def resume(
        body: CheckpointRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("resume", authorization, body, traceparent=traceparent)

    @router.post("/retire")
    async def retire(
        body: RetireRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("retire", authorization, body, traceparent=traceparent)

    @router.post("/forget")
    async def forget(
        body: ForgetRequest, authorization: Authorization = None, traceparent: Traceparent = None
    ) -> Reply:
        return await handle("forget", authorization, body, traceparent=traceparent)

    return router
