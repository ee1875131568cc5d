"""The HTTP plumbing every client of the checker shares: no proxy from the environment, idle connections dropped
before a server drops them, one TLS context built once, and one connection pool per calling thread.

The controller's client (`ckpt_model.protocol.client`), the harness's gate and `/run`s, a real Gym's pre-flight and
the real-model mode build their `httpx.Client` here (`new_http_client`). Building one costs about 42 ms, so each is
built once and reused.
"""

from __future__ import annotations

import functools
import ssl
import threading
from typing import Any

import httpx

# Idle pooled connections are dropped after this long, well before a uvicorn server closes them (its default
# keep-alive is 5 s, the same as httpx's default expiry): a request sent on a connection the server is closing
# fails with "Server disconnected" or a reset, a transport error that is no fault of the deployment.
KEEPALIVE_EXPIRY_S = 2.0


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
