"""A recording relay in front of each server, so the checker sees the calls of a controller it does not own.

Rollout collection is a program of the system's that calls the servers itself (docs/collection.md). To check the
servers' replies to those calls as the trainer machine checks its own, the checker hands the program the relay's
URLs instead of the servers': each relay port forwards every request to its server unchanged, and journals each
control call and `/run` in a `History` (invoke when the request went on, then `ok` with the HTTP status and body,
or `info` when the server or the program dropped the connection first). Before a reply goes back, `observe` may
read what the reply stands for (a commit's directory, before the program can prune it) into the completion.

What the program sees is what the servers did: a server that drops the connection or never listens drops the
program's connection too (no HTTP status made up here), and a program that drops its connection (SIGKILL) drops
the server's, which cancels the work it asked for as the server's own disconnect handling decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from ckpt_model.protocol.history import Event, History
from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX

HEAD_END = b"\r\n\r\n"
HEAD_LIMIT = 64 * 1024
START_TIMEOUT_S = 10.0
SHUTDOWN_GRACE_S = 1.0

# What to add to a completion, from (server name, operation, request body, status, reply body).
Observer = Callable[[str, str, Any, int, Any], Mapping[str, Any]]


@attrs.frozen
class Message:
    """One HTTP/1.1 message as relayed: its head (start line and headers) and its body."""

    start_line: str
    headers: tuple[tuple[str, str], ...]
    head: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    @property
    def closes(self) -> bool:
        return (self.header("connection") or "").lower() == "close"

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return self.body.decode(errors="replace")[:500]


def operation_of(method: str, target: str) -> str | None:
    """The journaled name of a request: a checkpoint control call (`prepare`, `commit`, ...) or `run`; None for
    anything else (status polls, health checks), which is relayed without a record."""
    path = urlsplit(target).path
    if method != "POST":
        return None
    if path == "/run":
        return "run"
    prefix = CHECKPOINT_ROUTE_PREFIX + "/"
    if path.startswith(prefix) and "/" not in path[len(prefix) :]:
        return path[len(prefix) :]
    return None


async def read_message(reader: asyncio.StreamReader, *, request: bool) -> Message | None:
    """The next message on `reader`, or None at a clean end of stream before one began. A body is read by its
    Content-Length or as chunks; a reply with neither runs to the end of the stream."""
    try:
        head = await reader.readuntil(HEAD_END)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError("the stream ended inside a message head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise ConnectionError("a message head over the limit") from exc
    lines = head[: -len(HEAD_END)].decode("latin-1").split("\r\n")
    headers = tuple((key.strip(), value.strip()) for key, _, value in (line.partition(":") for line in lines[1:]))
    message = Message(lines[0], headers, head, b"")
    if (message.header("transfer-encoding") or "").lower() == "chunked":
        body = await _read_chunked(reader)
    elif (length := message.header("content-length")) is not None:
        body = await reader.readexactly(int(length))
    elif request or _without_body(lines[0]):
        body = b""
    else:
        body = await reader.read()
    return attrs.evolve(message, body=body)


def _without_body(status_line: str) -> bool:
    parts = status_line.split()
    return len(parts) > 1 and (parts[1].startswith("1") or parts[1] in ("204", "304"))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The raw chunked body, relayed as it came (sizes, data and trailers)."""
    raw = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        raw += size_line
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                raw += line
            raw += b"\r\n"
            return bytes(raw)
        raw += await reader.readexactly(size + 2)


class CallRelay:
    """One relay port per server (`urls`), journaling into `history`; started with `start`, stopped with `close`."""

    def __init__(self, upstreams: Mapping[str, str], history: History, observe: Observer | None = None) -> None:
        self.upstreams = {name: urlsplit(url) for name, url in upstreams.items()}
        self.history = history
        self.observe = observe
        self.urls: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="call-relay", daemon=True)
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.StreamWriter] = set()

    def start(self) -> dict[str, str]:
        """Listen on one loopback port per server (the kernel's choice, among ephemeral ports, which the servers'
        fixed ports lie below); the relay URL of each server by name."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.urls = future.result(timeout=START_TIMEOUT_S)
        return dict(self.urls)

    @property
    def open_connections(self) -> int:
        """Connections the relay holds open now, the program's and the servers' ends counted apart."""
        return len(self._connections)

    def close(self) -> None:
        """Stop listening and drop every relayed connection (both ends), then stop the loop's thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=START_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    async def _listen(self) -> dict[str, str]:
        urls: dict[str, str] = {}
        for name, upstream in sorted(self.upstreams.items()):
            # IPPROTO_TCP named, so asyncio sets TCP_NODELAY on accepted connections (docs: SPEC 11).
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            listener.bind(("127.0.0.1", 0))
            server = await asyncio.start_server(
                functools.partial(self._relay, name, upstream), sock=listener, limit=HEAD_LIMIT
            )
            self._servers.append(server)
            urls[name] = f"http://127.0.0.1:{listener.getsockname()[1]}"
        return urls

    async def _shutdown(self) -> None:
        """Stop listening, close every relayed connection, and let each relaying task end (it journals the call it
        relayed as `info`); one still running after `SHUTDOWN_GRACE_S` is cancelled, so the loop stops with no task
        left pending (an example that failed stops its run and the relay while calls are under way)."""
        for server in self._servers:
            server.close()
        for writer in list(self._connections):
            writer.close()
        relaying = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if relaying:
            _, pending = await asyncio.wait(relaying, timeout=SHUTDOWN_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _relay(
        self, name: str, upstream: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Relay one program connection's requests, in order, over one server connection of its own."""
        self._connections.add(writer)
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        invocation: Event | None = None  # the journaled call under way, until its completion is journaled
        try:
            while (request := await self._next_request(reader, server)) is not None:
                method, target = [*request.start_line.split(), "", ""][:2]
                operation = operation_of(method, target)
                invocation = (
                    self.history.invoke(name, operation, {"body": request.json()}) if operation is not None else None
                )
                if server is None:
                    try:
                        server = await asyncio.open_connection(upstream.hostname, upstream.port, limit=HEAD_LIMIT)
                    except OSError as exc:
                        self._lost(invocation, f"connection to the server failed: {exc}")
                        return
                    self._connections.add(server[1])
                reply = await self._exchange(server, request, reader)
                if reply is None:
                    self._lost(invocation, "the connection closed before the reply")
                    return
                status = int(reply.start_line.split()[1])
                if invocation is not None:
                    self._replied(invocation, name, operation or "", request, status, reply)
                    invocation = None
                writer.write(reply.head + reply.body)
                await writer.drain()
                if request.closes or reply.closes:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            self._lost(invocation, f"the exchange broke off: {type(exc).__name__}: {exc}")
        finally:
            for end in (writer, *(() if server is None else (server[1],))):
                self._connections.discard(end)
                end.close()

    async def _next_request(
        self, program: asyncio.StreamReader, server: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None
    ) -> Message | None:
        """The program's next request; None once it ends the connection, or once the server ends its idle one
        (then the program's pooled connection ends too, and its next request opens a new one, as it would have)."""
        if server is None:
            return await read_message(program, request=True)
        request = asyncio.ensure_future(read_message(program, request=True))
        server_end = asyncio.ensure_future(server[0].read(1))
        done, _ = await asyncio.wait({request, server_end}, return_when=asyncio.FIRST_COMPLETED)
        if request in done:
            server_end.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await server_end
            return request.result()
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            await request
        return None

    async def _exchange(
        self,
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        request: Message,
        program: asyncio.StreamReader,
    ) -> Message | None:
        """Send `request` on and wait for the reply; None if either end closed first. The program sends nothing
        more on this connection before its reply (HTTP/1.1 without pipelining), so anything it sends meanwhile is
        its end of stream: the server's connection is then closed too, as the program's would have been."""
        server_reader, server_writer = server
        server_writer.write(request.head + request.body)
        await server_writer.drain()
        reply = asyncio.ensure_future(read_message(server_reader, request=False))
        gone = asyncio.ensure_future(program.read(1))
        done, _ = await asyncio.wait({reply, gone}, return_when=asyncio.FIRST_COMPLETED)
        if reply not in done:
            reply.cancel()
            return None
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await gone
        try:
            return reply.result()
        except (ConnectionError, asyncio.IncompleteReadError):
            return None

    def _replied(
        self, invocation: Event, name: str, operation: str, request: Message, status: int, reply: Message
    ) -> None:
        value: dict[str, Any] = {"status": status, "body": reply.json()}
        if self.observe is not None:
            try:
                value |= dict(self.observe(name, operation, request.json(), status, value["body"]))
            except Exception as exc:  # journaled for the audit: never raised into the relay's loop
                value["observe_error"] = f"{type(exc).__name__}: {exc}"
        self.history.complete(invocation, "ok", value)

    def _lost(self, invocation: Event | None, why: str) -> None:
        if invocation is not None:
            self.history.complete(invocation, "info", why)
