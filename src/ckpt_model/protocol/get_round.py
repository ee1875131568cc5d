"""One GET to several HTTP servers at once, over connections kept alive between rounds.

The settle reads every participant's status once or twice a step. Through httpx on the control client's thread
pool a round of four cost 3.1 ms on an idle stack (2 cores): each request pays httpx's and the pool's own work,
and the threads hand the GIL to each other. Here every request is written before any reply is read, on one
connection per server of the standard library's `http.client`, so the servers answer in parallel and the checker
does little per request: 1.8 ms for the same round.

Only plain `http://` URLs take this path (`GetRound.serves`); a deployment behind TLS or a proxy keeps httpx. An idle
connection is dropped after `KEEPALIVE_EXPIRY_S`, before a server may close it; a reused one the server closed
anyway (a restarted server, or one that dropped it first) fails its request, which is then sent once more on a fresh
connection, as httpx does: a GET changes nothing on the server.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import httpx

# As the control client's pool (`ckpt_model.protocol.http.KEEPALIVE_EXPIRY_S`): well before a uvicorn server's 5 s
# keep-alive.
KEEPALIVE_EXPIRY_S = 2.0
# What a failed request on a connection shows: the peer closed or reset it, or it timed out.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)

Address = tuple[str, int]


class GetRound:
    """Kept-alive connections to each server asked so far, and `get_all` over them. Thread-safe: a round taken
    while another thread's is under way returns None, and that caller asks its own way."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._connections: dict[Address, tuple[http.client.HTTPConnection, float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def serves(url: str) -> bool:
        """Whether `url` is plain HTTP with a host, which this round can ask."""
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname)

    def get_all(
        self, urls: Sequence[str], headers: Mapping[str, str]
    ) -> list[httpx.Response | OSError | http.client.HTTPException] | None:
        """GET each of `urls` (every one `serves`), all sent before any reply is read: each one's response, or the
        transport error it met on a fresh connection. None if another thread's round is under way."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            sent = [self._send(url, headers) for url in urls]
            return [self._read(url, headers, connection) for url, connection in zip(urls, sent, strict=True)]
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, {}
        for connection, _ in connections.values():
            connection.close()

    def _send(
        self, url: str, headers: Mapping[str, str]
    ) -> tuple[http.client.HTTPConnection, bool] | OSError | http.client.HTTPException:
        """The connection the request went out on and whether it was reused, or the error a fresh one met."""
        kept = self._connections.pop(_address(url), None)
        if kept is not None and time.monotonic() - kept[1] < KEEPALIVE_EXPIRY_S:
            try:
                kept[0].request("GET", _target(url), headers=dict(headers))
                return kept[0], True
            except TRANSPORT_ERRORS:
                pass
        if kept is not None:
            kept[0].close()
        return self._send_fresh(url, headers)

    def _read(
        self,
        url: str,
        headers: Mapping[str, str],
        sent: tuple[http.client.HTTPConnection, bool] | OSError | http.client.HTTPException,
    ) -> httpx.Response | OSError | http.client.HTTPException:
        if isinstance(sent, TRANSPORT_ERRORS):
            return sent
        connection, reused = sent
        try:
            reply = connection.getresponse()
            body = reply.read()
        except TRANSPORT_ERRORS as error:
            connection.close()
            if not reused:
                return error
            # The server closed the kept connection (it restarted, or dropped it first): once more, afresh.
            return self._read(url, headers, self._send_fresh(url, headers))
        if reply.will_close:
            connection.close()
        else:
            replaced = self._connections.pop(_address(url), None)  # two URLs of one server in a round
            if replaced is not None:
                replaced[0].close()
            self._connections[_address(url)] = (connection, time.monotonic())
        return httpx.Response(reply.status, headers=reply.getheaders(), content=body, request=httpx.Request("GET", url))

    def _send_fresh(
        self, url: str, headers: Mapping[str, str]
    ) -> tuple[http.client.HTTPConnection, bool] | OSError | http.client.HTTPException:
        """A new connection the request went out on, or the error it met."""
        connection = http.client.HTTPConnection(*_address(url), timeout=self.timeout_s)
        try:
            connection.request("GET", _target(url), headers=dict(headers))
        except TRANSPORT_ERRORS as error:
            connection.close()
            return error
        return connection, False


def _address(url: str) -> Address:
    parts = urlsplit(url)
    assert parts.hostname is not None, f"{url} names no host"
    return parts.hostname, parts.port or 80


def _target(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
