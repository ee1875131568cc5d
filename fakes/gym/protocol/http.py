"""Plumbing every look-alike server shares: the rollout path prefix, one reused HTTP client, health."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import http.cookiejar
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import h11
import httpx
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from fakes.gym.protocol.wire import ROLLOUT_PATH_PREFIX

# Idle keep-alive connections: a client must always drop one before the server does. uvicorn's default (5 s)
# equals httpx's default `keepalive_expiry`, so a request sent on a connection idle for about 5 s can race the
# server's close and fail with "Server disconnected" or a reset: a transport error, not a fault of the system.
SERVER_KEEP_ALIVE_S = 600
CLIENT_KEEPALIVE_EXPIRY_S = 5.0
# Idle connections kept per peer; a burst above it is served by new connections, closed when they fall idle.
CLIENT_KEEPALIVE_MAX = 256
READ_CHUNK_BYTES = 65536
PEER_TIMEOUT_S = 10.0
# A connect to a live loopback peer waits only while the peer's loop is busy, which on loaded cores with thousands
# of requests in flight can be many seconds (a full collection of a big heap); a dead peer refuses at once.
PEER_CONNECT_TIMEOUT_S = 60.0
T = TypeVar("T")


class RolloutPrefixMiddleware:
    """Strip a `/ng-rollout/<capture_key>` path prefix and keep the key in `scope["state"]["capture_key"]`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(ROLLOUT_PATH_PREFIX):
            key, _, rest = scope["path"][len(ROLLOUT_PATH_PREFIX) :].partition("/")
            scope = dict(scope)
            scope["path"] = "/" + rest
            scope["raw_path"] = scope["path"].encode()
            scope.setdefault("state", {})
            scope["state"] = {**scope["state"], "capture_key": key}
        await self.app(scope, receive, send)


def rollout_key(scope_state: Any) -> str | None:
    """The capture key a request came with, or None for untagged work."""
    return getattr(scope_state, "capture_key", None)


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """Loading the CA bundle costs ~45 ms; build it once per process (the fork server's children inherit it)."""
    return httpx.create_ssl_context()


class _PeerConnection:
    """One HTTP/1.1 connection to a peer: asyncio streams, framed by h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, expiry_s: float) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.expiry_s = expiry_s
        self.idle_since = 0.0

    def reusable(self) -> bool:
        """Idle, not closed by the peer, and not idle so long that the peer may be closing it."""
        return (
            self.h11.our_state is h11.IDLE
            and not self.reader.at_eof()
            and not self.writer.is_closing()
            and time.monotonic() - self.idle_since < self.expiry_s
        )

    async def exchange(self, request: httpx.Request, body: bytes) -> httpx.Response:
        """Send the request and read the whole response; the connection is reusable after it if both sides may."""
        target = request.url.raw_path
        events = (
            h11.Request(method=request.method, target=target, headers=request.headers.raw),
            h11.Data(data=body),
            h11.EndOfMessage(),
        )
        self.writer.write(b"".join(self.h11.send(event) or b"" for event in events))
        await self.writer.drain()
        response: h11.Response | None = None
        chunks: list[bytes] = []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = await self.reader.read(READ_CHUNK_BYTES)
                if not data and response is None:
                    raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
                self.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        assert response is not None
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        self.idle_since = time.monotonic()
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers.raw_items(),
            content=b"".join(chunks),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": bytes(response.reason)},
        )

    def close(self) -> None:
        self.writer.close()


class PeerConnections(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive connections to peers on plain asyncio streams, reused LIFO per origin: O(1) a request.

    httpx's own pool re-scans every connection it holds whenever a request starts or ends (with a socket poll
    each), and its anyio layers (cancel scopes, a task group per connect) cost more than the request itself; a
    scale run holds one request per waiting rollout on every hop, thousands at once. Connections are unlimited in
    number; at most `keepalive_max` idle ones are kept per origin. Bodies are read whole: no caller streams.
    Failures raise httpx's exceptions, as httpx's own transport does."""

    def __init__(self, *, keepalive_max: int, keepalive_expiry_s: float, uds: str | None = None) -> None:
        self._keepalive_max = keepalive_max
        self._keepalive_expiry_s = keepalive_expiry_s
        # A Unix socket every request goes to, whatever its URL's host (a worker's sibling's private socket).
        self._uds = uds
        self._idle: dict[tuple[str, str, int], collections.deque[_PeerConnection]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        connection = await self._checkout(request, origin, timeouts.get("connect"))
        try:
            async with asyncio.timeout(timeouts.get("read")):
                response = await connection.exchange(request, body)
        except BaseException as exc:
            # Cut off mid-exchange (an error, a timeout, or a retire cancelling the caller): never reused.
            connection.close()
            mapped = _transport_error(exc, request)
            if mapped is exc:
                raise
            raise mapped from exc
        self._checkin(origin, connection)
        return response

    async def _checkout(
        self, request: httpx.Request, origin: tuple[str, str, int], connect_timeout_s: float | None
    ) -> _PeerConnection:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        scheme, host, port = origin
        try:
            async with asyncio.timeout(connect_timeout_s):
                if self._uds is not None:
                    reader, writer = await asyncio.open_unix_connection(self._uds)
                else:
                    reader, writer = await asyncio.open_connection(
                        host, port, ssl=ssl_context() if scheme == "https" else None
                    )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}", request=request) from exc
        return _PeerConnection(reader, writer, self._keepalive_expiry_s)

    def _checkin(self, origin: tuple[str, str, int], connection: _PeerConnection) -> None:
        if connection.h11.our_state is not h11.IDLE:
            connection.close()  # the peer or we asked to close after this exchange
            return
        idle = self._idle.setdefault(origin, collections.deque())
        idle.append(connection)
        if len(idle) > self._keepalive_max:
            idle.popleft().close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for connection in [connection for connections in idle.values() for connection in connections]:
            connection.close()
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()


def _transport_error(exc: BaseException, request: httpx.Request) -> BaseException:
    """The httpx exception for a failed exchange; cancellation and httpx's own errors pass unchanged."""
    if isinstance(exc, httpx.HTTPError | asyncio.CancelledError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout("the peer did not answer in time", request=request)
    if isinstance(exc, h11.RemoteProtocolError):
        return httpx.RemoteProtocolError(str(exc), request=request)
    if isinstance(exc, h11.LocalProtocolError):
        return httpx.LocalProtocolError(str(exc), request=request)
    if isinstance(exc, OSError):
        return httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request)
    return exc


def no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps nothing: for a client whose requests belong to many episodes (or sessions)."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def new_client(uds: str | None = None) -> httpx.AsyncClient:
    """One client per server process: building one costs ~42 ms, so it is made once and reused. With `uds`, every
    request goes to that Unix socket (a worker's client to a sibling's private socket).

    Its cookie jar accepts nothing: one client serves every episode, and a session cookie one episode received
    must never ride along on another episode's request. Cookies are sent explicitly, per request. Its connections
    are unlimited in number: thousands of requests can wait on one peer at once (`PeerConnections`)."""
    connections = PeerConnections(
        keepalive_max=CLIENT_KEEPALIVE_MAX, keepalive_expiry_s=CLIENT_KEEPALIVE_EXPIRY_S, uds=uds
    )
    return httpx.AsyncClient(
        transport=connections,
        timeout=httpx.Timeout(PEER_TIMEOUT_S, connect=PEER_CONNECT_TIMEOUT_S, read=None),
        cookies=no_cookies(),
        trust_env=False,
    )


def lifespan_with_client(
    on_start: Callable[[httpx.AsyncClient], None],
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with new_client() as client:
            on_start(client)
            yield

    return lifespan


def cookie_header(cookies: dict[str, str]) -> dict[str, str]:
    """Send a session's cookies explicitly: the shared client's jar keeps none (see `new_client`)."""
    return {"cookie": "; ".join(f"{name}={value}" for name, value in cookies.items())} if cookies else {}


def add_health(app: FastAPI) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}


class DownstreamError(Exception):
    """A peer server refused a request; keeps its status and error envelope for the caller's failure."""

    def __init__(self, url: str, status: int, body: Any) -> None:
        self.url = url
        self.status = status
        self.body = body
        super().__init__(f"{url} answered HTTP {status}: {body}")

    @property
    def code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return self.body["error"].get("code")
        return None


async def post_json(client: httpx.AsyncClient, url: str, body: Any, **kwargs: Any) -> httpx.Response:
    """POST and raise `DownstreamError` on any non-2xx reply."""
    response = await client.post(url, json=body, **kwargs)
    if response.status_code >= 300:
        try:
            payload: Any = response.json()
        except ValueError:
            payload = response.text
        raise DownstreamError(url, response.status_code, payload)
    return response


class ClientGone(Exception):
    """The client disconnected before the work it asked for finished; the work was cancelled."""


async def _disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_gone(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, or cancel it and raise `ClientGone` once the client disconnects first.

    A handler that waits on something slow (a gated backend call) must stop when its caller gives up (a retire
    cancels the caller), or whatever the caller's retire waits for would never end."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientGone(request.url.path)
