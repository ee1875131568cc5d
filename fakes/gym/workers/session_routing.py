"""Session routing on a multi-worker environment, agent or resources server: every request of one episode is
served by one worker, whichever worker the kernel hands the connection (reference 1.4, Appendix B).

An episode's requests name its capture key: in the path (`/ng-rollout/<key>/...`) or, for `/run`, in the body (a
native `episode_id`, or a legacy row's `_ng_rollout_id` and `_ng_attempt_index`). The key's worker is the one the
placement names (set by the checker through `POST /_ctl/placement`, as on the policy model), else a fixed function
of the key (`default_worker`), so every worker agrees on the owner without asking anyone. A worker that accepts a
request owned by a sibling forwards it to the sibling's private socket, marked as placed, and relays the reply with
its headers (cookies, the verify and restart headers). Requests that name no episode (health, control routes) are
served where they land.

A request whose worker is gone (killed, its socket refuses or drops the forward) is answered 410 `worker_lost`:
the episode's state died with that worker, as Gym's session-routing scenario expects of a killed worker's
sessions. Before the owner serves a key it may claim the key's restored record from its coordinator
(`claim`, given by `fakes.gym.servers.participant_workers`), so a restored episode continues on whichever worker its
replacement is routed to.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fakes.gym.protocol.errors import ControlError
from fakes.gym.protocol.http import new_client
from fakes.gym.protocol.legacy_rows import legacy_episode
from fakes.gym.protocol.wire import ROLLOUT_PATH_PREFIX, EpisodeId, error_body
from fakes.gym.workers.placement import HOP_HEADERS, PLACED_HEADER, private_socket_path

WORKER_LOST_STATUS = 410
_PLACED = PLACED_HEADER.encode()


def default_worker(capture_key: str, workers: int) -> int:
    """The worker of a key the placement does not name: the same on every worker, and spread over them."""
    return zlib.crc32(capture_key.encode()) % workers


def key_in_path(path: str) -> str | None:
    """The capture key of a `/ng-rollout/<key>/...` path, else None."""
    if not path.startswith(ROLLOUT_PATH_PREFIX):
        return None
    key = path[len(ROLLOUT_PATH_PREFIX) :].partition("/")[0]
    return key or None


def key_in_run_body(body: bytes) -> str | None:
    """The capture key a `/run` body names (native `episode_id`, or a legacy row's rollout and attempt); None if it
    names none (the route itself then answers the bad request)."""
    try:
        row = json.loads(body)
        if not isinstance(row, dict):
            return None
        if isinstance(row.get("episode_id"), dict):
            return EpisodeId.model_validate(row["episode_id"]).capture_key
        if "_ng_rollout_id" in row:
            return legacy_episode(row).capture_key
    except (ValueError, TypeError, ControlError):
        return None
    return None


class SessionRouter:
    """One worker's routing state: its index, the placement, and its clients to its siblings' private sockets."""

    def __init__(self, name: str, workers: int, socket_env: str) -> None:
        self.name = name
        self.workers = workers
        self.socket_env = socket_env
        self.index: int | None = None  # known once the worker registers (after the fork)
        self.placement: dict[str, int] = {}
        # Set by the worker: take the key's restored record from the coordinator, if it holds one.
        self.claim: Callable[[str], Awaitable[None]] = _nothing
        # Set by the worker: whether the key's attempt is retired (every worker refuses it alike).
        self.retired: Callable[[str], bool] = lambda capture_key: False
        self._clients: dict[int, httpx.AsyncClient] = {}

    def owner(self, capture_key: str) -> int:
        placed = self.placement.get(capture_key)
        return placed if placed is not None else default_worker(capture_key, self.workers)

    def client(self, worker: int) -> httpx.AsyncClient:
        client = self._clients.get(worker)
        if client is None:
            path = private_socket_path(os.environ[self.socket_env], worker)
            # The servers' own peer client (no cookie jar, unlimited connections, O(1) a request; httpx's pool caps
            # them at 100 and rescans all it holds on every request); a relayed request waits as long as its
            # episode runs (no read timeout), exactly as an accepted one does.
            client = new_client(uds=path)
            self._clients[worker] = client
        return client


class SessionRoutingMiddleware:
    """Serve an episode's request on its worker: here (after claiming its restored record), or forwarded."""

    def __init__(self, app: ASGIApp, router: SessionRouter) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.router.index is None:
            await self.app(scope, receive, send)
            return
        body: bytes | None = None
        key = key_in_path(scope["path"])
        if key is None and scope["path"] == "/run" and scope["method"] == "POST":
            body = await _read_body(receive)
            key = key_in_run_body(body)
        if body is not None:
            receive = _replay(body, receive)
        if key is None:
            await self.app(scope, receive, send)
            return
        placed = any(name == _PLACED for name, _ in scope["headers"])
        owner = self.router.owner(key)
        if self.router.retired(key):
            # Refused here as on its own worker, which may be gone: a retired attempt's request is no session's.
            await self.app(scope, receive, send)
            return
        if placed or owner == self.router.index:
            await self.router.claim(key)
            await self.app(scope, receive, send)
            return
        if body is None:
            body = await _read_body(receive)
        await self._forward(scope, body, key, owner, send)

    async def _forward(self, scope: Scope, body: bytes, key: str, owner: int, send: Send) -> None:
        """Send the request to worker `owner`'s private socket and relay its reply; 410 if that worker is gone."""
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name.decode("latin-1") not in HOP_HEADERS
        ]
        headers.append((PLACED_HEADER, str(owner)))
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"http://worker{owner}{scope['raw_path'].decode('latin-1')}" + (f"?{query}" if query else "")
        try:
            reply = await self.router.client(owner).request(scope["method"], url, content=body, headers=headers)
        except httpx.TransportError as error:
            detail = (
                f"worker {owner} of {self.router.name}, which served episode {key}, is gone "
                f"({type(error).__name__}); its sessions died with it"
            )
            await _send(
                send,
                WORKER_LOST_STATUS,
                [(b"content-type", b"application/json")],
                _json(error_body("worker_lost", detail)),
            )
            return
        relayed = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in reply.headers.multi_items()
            if name not in HOP_HEADERS
        ]
        await _send(send, reply.status_code, relayed, reply.content)


async def _nothing(capture_key: str) -> None:
    return None


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value).encode()


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body read already, then the client's own messages (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
