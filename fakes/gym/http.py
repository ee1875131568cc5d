"""Plumbing every look-alike server shares: the rollout path prefix, one reused HTTP client, health."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.cookiejar
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from fakes.gym.wire import ROLLOUT_PATH_PREFIX

# Idle keep-alive connections: a client must always drop one before the server does. uvicorn's default (5 s)
# equals httpx's default `keepalive_expiry`, so a request sent on a connection idle for about 5 s can race the
# server's close and fail with "Server disconnected" or a reset: a transport error, not a fault of the system.
SERVER_KEEP_ALIVE_S = 600
CLIENT_KEEPALIVE_EXPIRY_S = 5.0
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


def new_client() -> httpx.AsyncClient:
    """One client per server process: building one costs ~42 ms, so it is made once and reused.

    Its cookie jar accepts nothing: one client serves every episode, and a session cookie one episode received
    must never ride along on another episode's request. Cookies are sent explicitly, per request."""
    no_cookies = http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=None),
        limits=httpx.Limits(max_connections=1000, keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S),
        cookies=no_cookies,
        trust_env=False,
        verify=ssl_context(),
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
