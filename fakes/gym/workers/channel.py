"""The channel between a multi-worker server's coordinator and each of its workers: what both sides speak.

Reference Appendix B. Each worker holds one connection to its coordinator's Unix socket; the coordinator's end is
served by `fakes.gym.workers.coordinator`, a worker's by `fakes.gym.workers.link`.

Frames are a 4-byte big-endian length then compact JSON (at most 1 GiB). A frame may also carry raw bytes beside
its JSON (`Framed`: records already encoded as lines of a records file, say, which JSON would escape and decode):
its header's top bit is then set, and after the JSON come the bytes' length (4 bytes, big-endian) and the bytes;
the message's body arrives as a `Framed` again. Requests `{id, kind, body}`; replies
`{reply_to, ok: true, body}` or `{reply_to, ok: false, error: {status, code, detail}}`; a request with `id: null` is
a notification and gets no reply. Both directions share one connection. Every request runs as its own task,
started in arrival order, so what a message changes synchronously changes in the order it was sent.

    worker -> coordinator   register {pid, routing_id} (the first frame) -> the coordinator's state
                            report {generation, seq, report} (notification), control {operation, body}, health {}
    coordinator -> worker   close {generation, checkpoint_id} -> {generation, seq, report}; open; mark {episode_ids};
                            forget {rollout_ids}; and the kind's own (policy: retire, check_forget, snapshot,
                            install, delete_restored)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from fakes.gym.faults import blame
from fakes.gym.protocol.errors import ControlError

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">I")
FRAME_BYTES_MAX = 1 << 30
# A header with this bit set: raw bytes follow the JSON (their own length first).
FRAME_DATA_FLAG = 1 << 31
# Appendix B: light messages get 30 s (a forwarded control call gets longer: `fakes.gym.workers.link`).
LIGHT_TIMEOUT_S = 30.0
INTERNAL_ERROR_STATUS = 500

Handler = Callable[[Any], Awaitable[Any]]


# --- frames -------------------------------------------------------------------------------------------------------


class FrameError(ValueError):
    """A frame that is too long, truncated, or not a JSON object."""


class ChannelClosed(ConnectionError):
    """The other end of a channel is gone (or the channel was closed here)."""


@attrs.frozen
class Framed:
    """A message body whose `data` travels as raw bytes beside its JSON `body`, neither encoded nor decoded on the
    way. A handler may return one, `Channel.request` may send one, and the other side gets one back."""

    body: Any
    data: bytes | bytearray


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """A message as one frame: its compact JSON, prefixed by the JSON's length (4 bytes, big-endian); a `Framed`
    body's bytes follow the JSON, prefixed by their length, and the header's top bit says they do."""
    return b"".join(frame_parts(message))


def frame_parts(message: Mapping[str, Any]) -> tuple[bytes, bytes | bytearray]:
    """A message's frame in two parts: everything up to a `Framed` body's bytes, and those bytes (empty without
    them), so a channel writes megabytes of records as they are rather than copied into one frame first."""
    body = message.get("body")
    data = None
    if isinstance(body, Framed):
        message, data = {**message, "body": body.body}, body.data
    payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    for part in (payload, data or b""):
        if len(part) > FRAME_BYTES_MAX:
            raise FrameError(f"a frame must be at most {FRAME_BYTES_MAX} bytes (got {len(part)})")
    if data is None:
        return FRAME_HEADER.pack(len(payload)) + payload, b""
    return FRAME_HEADER.pack(len(payload) | FRAME_DATA_FLAG) + payload + FRAME_HEADER.pack(len(data)), data


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None if the peer closed between frames."""
    try:
        header = await reader.readexactly(FRAME_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"the stream ended inside a frame header ({len(exc.partial)} of 4 bytes)") from None
    (length,) = FRAME_HEADER.unpack(header)
    has_data = bool(length & FRAME_DATA_FLAG)
    payload = await _read_part(reader, length & ~FRAME_DATA_FLAG)
    try:
        message = json.loads(payload)
    except ValueError as exc:
        raise FrameError(f"a frame must hold JSON ({exc})") from None
    if not isinstance(message, dict):
        raise FrameError(f"a frame must hold a JSON object (got {type(message).__name__})")
    if has_data:
        try:
            (data_length,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
        except asyncio.IncompleteReadError as exc:
            raise FrameError(f"the stream ended inside a frame's data length ({len(exc.partial)} of 4 bytes)") from None
        message["body"] = Framed(message.get("body"), await _read_data(reader, data_length))
    return message


async def _read_data(reader: asyncio.StreamReader, length: int) -> bytearray:
    """A frame's data, `length` bytes, read into a buffer of that size as it arrives: `readexactly` would grow
    the stream's buffer to the whole length and then copy it (megabytes of records, each copy new memory)."""
    if length > FRAME_BYTES_MAX:
        raise FrameError(f"a frame must be at most {FRAME_BYTES_MAX} bytes (its header says {length})")
    data = bytearray(length)
    view = memoryview(data)
    received = 0
    while received < length:
        chunk = await reader.read(length - received)
        if not chunk:
            raise FrameError(f"the stream ended inside a frame ({received} of {length} bytes)")
        view[received : received + len(chunk)] = chunk
        received += len(chunk)
    return data


async def _read_part(reader: asyncio.StreamReader, length: int) -> bytes:
    """A frame's JSON, `length` bytes (its data comes through `_read_data`)."""
    if length > FRAME_BYTES_MAX:
        raise FrameError(f"a frame must be at most {FRAME_BYTES_MAX} bytes (its header says {length})")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"the stream ended inside a frame ({len(exc.partial)} of {length} bytes)") from None


# --- errors across the channel ------------------------------------------------------------------------------------


class RemoteControlError(ControlError):
    """A refusal from the other end of a channel, keeping its HTTP status and code (Gym's `_RemoteControlError`)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status
        self.code = code


def error_reply(exc: BaseException, what: str) -> dict[str, Any]:
    """The `error` of a failed reply: a `ControlError` keeps its status and code; anything else is a 500."""
    if isinstance(exc, ControlError):
        return {"status": exc.status_code, "code": exc.code, "detail": exc.detail}
    return {
        "status": INTERNAL_ERROR_STATUS,
        "code": "checkpoint_error",
        "detail": f"{what} failed unexpectedly in pid {os.getpid()}: {exc!r}; {blame(exc)}",
    }


def remote_error(error: Mapping[str, Any]) -> RemoteControlError:
    return RemoteControlError(int(error["status"]), str(error["code"]), str(error["detail"]))


# --- the channel --------------------------------------------------------------------------------------------------


class Channel:
    """One end of a coordinator-worker connection: requests out, replies in, and the other side's requests run
    through `handlers` (kind -> coroutine function of the body)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        name: str,
        handlers: Mapping[str, Handler] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.name = name
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.closed = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_close: list[Callable[[], None]] = []

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    def send(self, message: Mapping[str, Any]) -> None:
        if self.closed:
            raise ChannelClosed(f"the channel to {self.name} is closed")
        head, data = frame_parts(message)
        self.writer.write(head)
        if data:
            self.writer.write(data)

    def notify(self, kind: str, body: Any) -> None:
        """A request that gets no reply."""
        self.send({"id": None, "kind": kind, "body": body})

    async def request(self, kind: str, body: Any, timeout_s: float | None = LIGHT_TIMEOUT_S) -> Any:
        """Send a request and return the reply's body; a refusal raises `RemoteControlError`, a channel that closes
        first `ChannelClosed`, no reply within `timeout_s` `TimeoutError`."""
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self.send({"id": request_id, "kind": kind, "body": body})
            async with asyncio.timeout(timeout_s):
                reply = await future
        finally:
            self._pending.pop(request_id, None)
        if reply.get("ok"):
            return reply.get("body")
        raise remote_error(reply["error"])

    async def serve(self) -> None:
        """Read frames until the peer closes: replies complete requests, requests run their handlers."""
        try:
            while True:
                message = await read_frame(self.reader)
                if message is None:
                    break
                self._dispatch(message)
        except (FrameError, OSError) as exc:
            log.warning("the channel to %s broke: %s", self.name, exc)
        finally:
            self.close()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "reply_to" in message:
            future = self._pending.get(message["reply_to"])
            if future is not None and not future.done():
                future.set_result(message)
            return  # a reply nobody waits for any more (its request timed out or was cancelled)
        task = asyncio.ensure_future(self._handle(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: dict[str, Any]) -> None:
        request_id, kind = message.get("id"), message.get("kind")
        try:
            handler = self.handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise ValueError(f"'kind' must be one of {sorted(self.handlers)} (got {kind!r})")
            reply: dict[str, Any] = {"reply_to": request_id, "ok": True, "body": await handler(message.get("body"))}
        except Exception as exc:
            if not isinstance(exc, ControlError):
                log.exception("%s request from %s failed", kind, self.name)
            reply = {"reply_to": request_id, "ok": False, "error": error_reply(exc, f"{kind} request")}
        if request_id is not None and not self.closed:
            with contextlib.suppress(ChannelClosed, OSError):
                self.send(reply)

    def close(self) -> None:
        """Close the connection, fail every request still waiting, and run the close callbacks (once)."""
        if self.closed:
            return
        self.closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelClosed(f"the channel to {self.name} closed before it replied"))
        self.writer.close()
        for callback in self._on_close:
            callback()
