"""Placed generation calls of a multi-worker policy model server: whoever set the placement (the checker, through
its deployment) decides which worker serves each episode's calls, whichever worker the kernel hands the connection.

The placement maps capture keys to worker indices (0 .. workers - 1). It is set with `POST /_ctl/placement` on any
worker (bearer: the control token); the coordinator fans it out to every worker before it answers, so once the
route has answered every worker routes by it. Each worker also serves a private Unix socket
(`fakes.gym.workers.worker_process`); a worker that accepts a call placed on another forwards it there, marked as
placed, and relays the reply, so the placed worker's own gate admits, holds, cuts and delivers it. A call of a key the
placement does not name (an untagged call, or nothing was placed) is served where it was accepted, as before.

The worker that served a call names itself to the backend (`fakes.backend.POLICY_WORKER_HEADER: <index>`), whose
call list records it as the call's `worker`; the reply keeps the serving worker's `x-ckpt-worker` header.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, Field

from fakes.gym.protocol.errors import ControlError
from fakes.gym.protocol.http import new_client
from fakes.gym.protocol.wire import ROLLOUT_PATH_PREFIX
from fakes.gym.workers.routes import WORKER_HEADER

if TYPE_CHECKING:
    from fakes.gym.workers.coordinator import WorkerPool

# A forwarded call: served by the worker it reaches, whatever that worker's placement says (no second hop).
PLACED_HEADER = "x-ckpt-placed"
# What a forward does not pass on: the hop's own framing.
HOP_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive"})
SERVED_BY = WORKER_HEADER.decode()


class PlacementRequest(BaseModel):
    """`POST /_ctl/placement`: the whole placement, replacing the last one."""

    model_config = ConfigDict(extra="forbid")

    placement: dict[str, int] = Field(default_factory=dict)


def private_socket_path(coordinator_socket: str, index: int) -> str:
    """Worker `index`'s private Unix socket, beside its coordinator's (in the coordinator's runtime directory)."""
    return f"{coordinator_socket}.w{index}"


def placement_refusal(placement: Mapping[str, int], workers: int) -> str | None:
    """Why a placement cannot be routed (None: it can): every index must name a worker of this server."""
    bad = {key: index for key, index in placement.items() if not 0 <= index < workers}
    if bad:
        return f"placement names workers outside 0..{workers - 1}: {bad}"
    return None


class CallPlacement:
    """One worker's copy of the placement, and its clients to its siblings' private sockets."""

    def __init__(self, socket_env: str) -> None:
        self.socket_env = socket_env
        self.index: int | None = None  # set once the worker knows it (at registration, after the fork)
        self.placement: dict[str, int] = {}
        self._clients: dict[int, httpx.AsyncClient] = {}

    def elsewhere(self, capture_key: str | None, request: Request) -> int | None:
        """The worker a call must be forwarded to, or None to serve it here."""
        if capture_key is None or self.index is None or PLACED_HEADER in request.headers:
            return None
        placed = self.placement.get(capture_key)
        return None if placed is None or placed == self.index else placed

    async def forward(self, request: Request, capture_key: str, body: bytes, worker: int) -> Response:
        """Send the call to worker `worker`'s private socket and relay its reply (its `x-ckpt-worker` kept)."""
        headers = {name: value for name, value in request.headers.items() if name not in HOP_HEADERS}
        headers[PLACED_HEADER] = str(worker)
        url = f"http://worker{worker}{ROLLOUT_PATH_PREFIX}{capture_key}{request.url.path}"
        reply = await self._client(worker).post(url, content=body, headers=headers)
        served_by = {SERVED_BY: reply.headers[SERVED_BY]} if SERVED_BY in reply.headers else None
        return Response(reply.content, reply.status_code, served_by, media_type=reply.headers.get("content-type"))

    def _client(self, worker: int) -> httpx.AsyncClient:
        client = self._clients.get(worker)
        if client is None:
            path = private_socket_path(os.environ[self.socket_env], worker)
            # No read timeout: a placed call waits as long as its gate holds it, exactly as an accepted one does;
            # the servers' peer client (unlimited connections: httpx's pool holds 100 at most).
            client = self._clients[worker] = new_client(uds=path)
        return client


async def place_everywhere(pool: WorkerPool, body: Any) -> dict[str, Any]:
    """A harness's placement (`POST /_ctl/placement`, forwarded to the coordinator): checked against the server's
    workers, then set on every worker before the answer."""
    placement = PlacementRequest.model_validate(body).placement
    refusal = placement_refusal(placement, pool.expected)
    if refusal is not None:
        raise ControlError(refusal)
    await pool.fan_out("place", {"placement": placement})
    return {"placed": len(placement)}
