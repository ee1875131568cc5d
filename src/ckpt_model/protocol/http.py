"""The HTTP plumbing every client of the checker shares: no proxy from the environment, idle connections dropped
before a server drops them, one TLS context built once, and one connection pool per calling thread.

The controller's client (`ckpt_model.protocol.client`), the harness's gate and `/run`s, a real Gym's pre-flight and
the real-model mode build their `httpx.Client` here (`new_http_client`). Building one costs about 42 ms, so each is
built once and reused.

Every call that drives the deployment rather than judging it (a control route, a fault, a clock, a capability of
the deployment) runs inside `control_call(doing)`: whatever fails in it becomes a `ControlCallFailed` harness error
naming the call, the status, the reply's detail and what the checker was doing, never a raw traceback that ends a
search; `checked_json` reads such a call's reply.
"""

from __future__ import annotations

import contextlib
import functools
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from ckpt_model.errors import ControlCallFailed

# Idle pooled connections are dropped after this long, well before a uvicorn server closes them (its default
# keep-alive is 5 s, the same as httpx's default expiry): a request sent on a connection the server is closing
# fails with "Server disconnected" or a reset, a transport error that is no fault of the deployment.
KEEPALIVE_EXPIRY_S = 2.0
# A failed control call's reply detail is shown this long at most.
DETAIL_SHOWN_CHARS = 300
# What a deployment's capability may raise when it fails (the seam's own failures: a signal to a process gone, a
# program that failed, a reply it could not read), besides the HTTP errors of its routes.
CAPABILITY_FAILURES: tuple[type[Exception], ...] = (
    OSError,
    RuntimeError,
    subprocess.SubprocessError,
    ValueError,
    KeyError,
)


def new_http_client(timeout: float | httpx.Timeout, *, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """The checker's HTTP client: no proxy from the environment (a proxy must not sit between the controller and
    the servers, and reading it costs time), idle connections dropped before a server drops them, and one
    connection pool per thread (`PerThreadTransport`), since the checker calls from many threads at once."""
    if transport is None:
        transport = PerThreadTransport(limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))
    return httpx.Client(transport=transport, timeout=timeout, trust_env=False)


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """One TLS context for every transport the checker builds. httpx builds a fresh one per transport unless it
    is given one, loading the CA bundle each time (about 10 ms of CPU): with a transport per calling thread that
    was a seventh of the checker's CPU in a planted-fault scenario. A context is safe to share between threads."""
    return httpx.create_ssl_context()


class PerThreadTransport(httpx.BaseTransport):
    """httpx's transport, one per calling thread, so no connection pool is ever shared between threads.

    httpcore's sync pool can close a connection it has just handed to another thread's waiting request (it still
    looks idle: encode/httpcore#1110); that request then reads a closed socket, `ReadError: [Errno 9] Bad file
    descriptor`, seen here a few times in a hundred examples beside two CPU hogs. A pool that one thread alone
    uses has nobody to race with."""

    def __init__(self, **options: Any) -> None:
        self._options = {"verify": shared_tls_context(), **options}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._transports: list[httpx.HTTPTransport] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._own().handle_request(request)

    def _own(self) -> httpx.HTTPTransport:
        transport: httpx.HTTPTransport | None = getattr(self._local, "transport", None)
        if transport is None:
            transport = httpx.HTTPTransport(**self._options)
            with self._lock:
                self._transports.append(transport)
            self._local.transport = transport
        return transport

    def close(self) -> None:
        with self._lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.close()


@contextlib.contextmanager
def control_call(doing: str, *, capability: str | None = None) -> Iterator[None]:
    """Run a call that drives the deployment; a failure of it becomes a `ControlCallFailed` naming the call.

    An HTTP error names its request (method and URL) and, with a reply, its status and detail. `capability`: the
    block calls this capability of the deployment (`skew_clock('agent', +8)`), whose other failures
    (`CAPABILITY_FAILURES`) are classified too, named by it; without it they pass (in the checker's own code they
    are bugs)."""
    try:
        yield
    except httpx.HTTPStatusError as error:
        raise ControlCallFailed(
            doing=doing,
            call=_request_line(error.request, capability),
            status=error.response.status_code,
            detail=reply_detail(error.response),
        ) from error
    except httpx.HTTPError as error:
        raise ControlCallFailed(
            doing=doing, call=_request_line(_request_of(error), capability), detail=_shorten(_described(error))
        ) from error
    except CAPABILITY_FAILURES as error:
        if capability is None:
            raise
        raise ControlCallFailed(doing=doing, call=capability, detail=_shorten(_described(error))) from error


def checked_json(response: httpx.Response) -> Any:
    """The JSON reply of a control call; an error status raises `httpx.HTTPStatusError` and a reply that is not
    JSON `httpx.DecodingError`, both naming the request (`control_call` turns them into `ControlCallFailed`)."""
    response.raise_for_status()
    try:
        return response.json()
    except ValueError:
        raise httpx.DecodingError(
            f"HTTP {response.status_code}, a reply that is not JSON: {_shorten(response.text)!r}",
            request=response.request,
        ) from None


def reply_detail(response: httpx.Response) -> str:
    """What a refusal says, shortened: the `{"error": {"code", "detail"}}` of Gym's control routes, FastAPI's
    `detail`, or the text of the reply."""
    try:
        text = response.text
    except httpx.ResponseNotRead:
        return "(reply not read)"
    try:
        body = json.loads(text)
    except ValueError:
        return _shorten(text)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "detail" in error:
        code = error.get("code")
        return _shorten(f"{code}: {error['detail']}" if code else str(error["detail"]))
    if isinstance(body, dict) and "detail" in body:
        return _shorten(str(body["detail"]))
    return _shorten(text)


def _request_of(error: httpx.HTTPError) -> httpx.Request | None:
    try:
        return error.request
    except RuntimeError:  # an error raised without its request
        return None


def _request_line(request: httpx.Request | None, capability: str | None) -> str:
    """`POST http://host:port/_ctl/clock` (through `capability`, where the deployment made the call)."""
    if request is None:
        return capability or "an HTTP call"
    line = f"{request.method} {request.url}"
    return f"{line} (in {capability})" if capability else line


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_SHOWN_CHARS else text[: DETAIL_SHOWN_CHARS - 3] + "..."
