"""Several uvicorn worker processes behind one port, and the one coordinator that owns the checkpoint contract.

Reference 1.4 and Appendix B. What here is generic (any participant kind); `fakes.gym.model_workers` builds the
policy model server on it.

Process model. The server process, however it was started (`python -m fakes.gym.serve`, or forked by the fork
server with its listening socket bound, or a promoted standby that received it), becomes the coordinator: it binds
a Unix socket in a private runtime directory (`fakes.gym.runtime`) and forks its workers, each of which starts its
event loop and lifespan and waits; then it hands every worker the listening socket (SCM_RIGHTS over a socket pair,
as the fork server hands one to a standby), closes its own copy and serves no HTTP. A standby of the fork server
does all of this but the hand-off before it is promoted, so a restart waits for no fork and no lifespan. The
workers all accept on the one listening socket, as uvicorn's own `--workers` does. One shared socket rather than
SO_REUSEPORT, because: the fork server hands a server exactly one pre-bound socket, so sharing it needs nothing new
from the fork server; a crash closes that one socket with the group, so a crashed server refuses connections as a
single process does; and no other process of the user can join the port, as any could with SO_REUSEPORT. The kernel
spreads connections over the workers waiting in accept (measured here: 16 concurrent connections split 9-13 to
3-7 between two workers).

Workers stay in the coordinator's process group, so a crash (SIGKILL of the group) takes them all. A worker asks to
be killed with its coordinator (PR_SET_PDEATHSIG) and stops when its channel closes; the coordinator exits when no
worker is left. A SIGKILLed coordinator cannot reap its workers: they are re-parented to the nearest child subreaper,
which the fork server is (`fakes.zygote`), or else to init, which on these machines reaps orphans only every 1-1.5 s.

Channel. Frames are a 4-byte big-endian length then compact JSON (at most 1 GiB). Requests `{id, kind, body}`;
replies `{reply_to, ok: true, body}` or `{reply_to, ok: false, error: {status, code, detail}}`; a request with
`id: null` is a notification and gets no reply. Both directions share one connection. Every request runs as its
own task, started in arrival order, so what a message changes synchronously changes in the order it was sent.

    worker -> coordinator   register {pid, routing_id} (the first frame) -> the coordinator's state
                            report {generation, seq, report} (notification), control {operation, body}, health {}
    coordinator -> worker   close {generation, checkpoint_id} -> {generation, seq, report}; open; mark {episode_ids};
                            forget {rollout_ids}; and the kind's own (policy: retire, check_forget, snapshot,
                            install, delete_restored)

Close generations (reference 13.1 item 29): every close numbers a new generation and each worker answers it with a
report for it; until every live worker has, the merged report names `<label>-workers-unreported:<n>`. A worker lost
while admission is closed blocks (`<label>-worker-lost`) until admission opens again. A worker that registers while
closed closes at once and reports for the current generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

import attrs
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fakes.fd_passing import receive_fds
from fakes.gym.config import ServerConfig
from fakes.gym.control_plane import RetiredAttempts, check_bearer, control_router, forwarded_body
from fakes.gym.errors import ControlError, CoordinatorUnavailableError
from fakes.gym.runtime import make_runtime_dir, remove_runtime_dir
from fakes.gym.wire import EpisodeId, bearer

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">I")
FRAME_BYTES_MAX = 1 << 30
# Appendix B: light messages get 30 s; a forwarded control call gets its own deadline plus 10 s.
LIGHT_TIMEOUT_S = 30.0
CONTROL_EXTRA_S = 10.0
INTERNAL_ERROR_STATUS = 500
WORKER_HEADER = b"x-ckpt-worker"
# A worker whose coordinator is gone exits with this (EX_SOFTWARE); one that could not register, with 3 (uvicorn's
# STARTUP_FAILURE).
COORDINATOR_LOST_EXIT = 70
STARTUP_FAILURE_EXIT = 3
UNIX_BACKLOG = 64
# Coordinator <-> worker hand-off of the listening socket, as between the fork server and a standby.
HANDOFF_READY = b"r"  # worker -> coordinator: loop and lifespan up, waiting for the socket
HANDOFF_GO = b"g"  # coordinator -> worker, with the listening socket's descriptor
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15
PROCESS_NAME_BYTES_MAX = 15

Handler = Callable[[Any], Awaitable[Any]]


# --- frames -------------------------------------------------------------------------------------------------------


class FrameError(ValueError):
    """A frame that is too long, truncated, or not a JSON object."""


class ChannelClosed(ConnectionError):
    """The other end of a channel is gone (or the channel was closed here)."""


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """A message as one frame: its compact JSON, prefixed by the JSON's length (4 bytes, big-endian)."""
    payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(payload) > FRAME_BYTES_MAX:
        raise FrameError(f"a frame must be at most {FRAME_BYTES_MAX} bytes (got {len(payload)})")
    return FRAME_HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None if the peer closed between frames."""
    try:
        header = await reader.readexactly(FRAME_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"the stream ended inside a frame header ({len(exc.partial)} of 4 bytes)") from None
    (length,) = FRAME_HEADER.unpack(header)
    if length > FRAME_BYTES_MAX:
        raise FrameError(f"a frame must be at most {FRAME_BYTES_MAX} bytes (its header says {length})")
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"the stream ended inside a frame ({len(exc.partial)} of {length} bytes)") from None
    try:
        message = json.loads(payload)
    except ValueError as exc:
        raise FrameError(f"a frame must hold JSON ({exc})") from None
    if not isinstance(message, dict):
        raise FrameError(f"a frame must hold a JSON object (got {type(message).__name__})")
    return message


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
        "detail": f"{what} failed unexpectedly in pid {os.getpid()}: {exc!r}; this is a server bug, see its log",
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
        self.writer.write(encode_frame(message))

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


# --- the coordinator's side ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Worker:
    """A registered, live worker as its coordinator sees it; `report` answers close generation `generation`.

    `routing_id` names it (random, chosen by the worker when it registers); `pid` is for people reading logs."""

    routing_id: str
    pid: int
    channel: Channel
    report: Any = None
    generation: int = -1
    seq: int = -1


class WorkerPool:
    """The coordinator's view of its workers: who registered and lives, what each reported for which close
    generation, admission as the coordinator last set it, and whether a worker ever left."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.workers: dict[str, Worker] = {}
        self.open = True
        self.generation = 0
        self.left = False
        self.lost_while_closed = False
        self.all_joined = asyncio.Event()
        self.empty = asyncio.Event()
        # Set by whoever assembles the coordinator (`serve_with_workers`' `assemble`): what to wake when the
        # workers' state changes, the kind's state a joining worker gets, the control plane's forwarded entry, and
        # the kind's own worker -> coordinator requests (policy, with token capture: claim_cut, return_cut).
        self.on_change: Callable[[], None] = lambda: None
        self.state: Callable[[], dict[str, Any]] = dict
        self.run_control: Callable[[str, Any], Awaitable[Any]] | None = None
        self.handlers: dict[str, Handler] = {}

    # -- registration and loss ------------------------------------------------------------------------------

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A worker connected: take its `register`, answer with the current state, then serve its requests."""
        try:
            async with asyncio.timeout(LIGHT_TIMEOUT_S):
                message = await read_frame(reader)
            if message is None or message.get("kind") != "register" or not isinstance(message.get("body"), dict):
                raise FrameError(f"a worker's first frame must be a register request (got {message!r})")
            pid = int(message["body"]["pid"])
            routing_id = str(message["body"]["routing_id"])
            if routing_id in self.workers:
                raise ValueError(f"routing ID {routing_id!r} is registered already")
        except (FrameError, TimeoutError, OSError, KeyError, ValueError) as exc:
            log.warning("a connection to the coordinator did not register: %s", exc)
            writer.close()
            return
        channel = Channel(reader, writer, name=f"worker {pid}", handlers=self.handlers)
        worker = Worker(routing_id, pid, channel, generation=self.generation if self.open else -1)
        channel.handlers.update(
            report=lambda body: self._report(worker, body),
            control=self._control,
            health=self._health,
        )
        channel.on_close(lambda: self._lost(worker))
        # No await between adding the worker and sending the reply: every broadcast from now on reaches it, after it.
        self.workers[routing_id] = worker
        channel.send({"reply_to": message.get("id"), "ok": True, "body": self.register_reply()})
        log.info("worker %d registered (%d of %d)", pid, len(self.workers), self.expected)
        if len(self.workers) >= self.expected:
            self.all_joined.set()
        self.on_change()
        await channel.serve()

    def register_reply(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "generation": self.generation,
            "workers": len(self.workers),
            "expected_workers": self.expected,
            **self.state(),
        }

    def _lost(self, worker: Worker) -> None:
        if self.workers.get(worker.routing_id) is not worker:
            return
        del self.workers[worker.routing_id]
        self.left = True
        if not self.open:
            self.lost_while_closed = True
        log.warning("worker %d left (%d of %d remain)", worker.pid, len(self.workers), self.expected)
        if not self.workers:
            self.empty.set()
        self.on_change()

    # -- what workers ask -----------------------------------------------------------------------------------

    async def _report(self, worker: Worker, body: Any) -> None:
        self.take_report(worker, body)

    def take_report(self, worker: Worker, body: Mapping[str, Any]) -> None:
        """Keep a worker's newest report: a close's reply is taken when the close resumes, which can be after a
        later report (say, a reply held since) was read, so `seq` decides, not arrival."""
        if int(body["seq"]) <= worker.seq:
            return
        worker.report = body["report"]
        worker.generation = int(body["generation"])
        worker.seq = int(body["seq"])
        self.on_change()

    async def _control(self, body: Any) -> Any:
        assert self.run_control is not None, "the coordinator sets run_control before it accepts workers"
        return await self.run_control(body["operation"], body.get("body"))

    async def _health(self, body: Any) -> dict[str, Any]:
        return {"serving": self.serving, "workers": len(self.workers), "expected_workers": self.expected}

    @property
    def serving(self) -> bool:
        """Every expected worker registered and is alive (the server's /health answers 200 only then)."""
        return len(self.workers) >= self.expected

    # -- what the coordinator's participant does through it -------------------------------------------------

    def unreported(self) -> int:
        """Live workers that have not reported for the current close generation (none while open)."""
        if self.open:
            return 0
        return sum(1 for worker in self.workers.values() if worker.generation < self.generation)

    def reports(self) -> list[Any]:
        return [worker.report for worker in self.workers.values() if worker.report is not None]

    async def broadcast(
        self, kind: str, body: Any, timeout_s: float | None = LIGHT_TIMEOUT_S
    ) -> list[tuple[Worker, Any]]:
        """Send a request to every live worker at once; each reply or exception, by worker."""
        workers = list(self.workers.values())
        results = await asyncio.gather(
            *(worker.channel.request(kind, body, timeout_s) for worker in workers), return_exceptions=True
        )
        return list(zip(workers, results, strict=True))

    async def fan_out(self, kind: str, body: Any, timeout_s: float | None = LIGHT_TIMEOUT_S) -> list[Any]:
        """`broadcast`, raising the first refusal or failure; a worker that left meanwhile is skipped (what it
        held died with it)."""
        replies = []
        for worker, result in await self.broadcast(kind, body, timeout_s):
            if isinstance(result, ChannelClosed):
                continue
            if isinstance(result, TimeoutError):
                raise CoordinatorUnavailableError(
                    f"worker {worker.pid} did not answer {kind} within {timeout_s} s; see the server log"
                )
            if isinstance(result, BaseException):
                raise result
            replies.append(result)
        return replies

    async def close(self, extra: Mapping[str, Any]) -> None:
        """A new close generation: every worker stops admitting and answers with its report for it."""
        self.open = False
        self.generation += 1
        self.on_change()
        generation = self.generation
        for worker, result in await self.broadcast("close", {"generation": generation, **extra}):
            if isinstance(result, ChannelClosed | TimeoutError):
                # Lost (the close callback saw it) or slow: either way it blocks readiness until it reports.
                log.warning("worker %d did not answer close generation %d: %r", worker.pid, generation, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                self.take_report(worker, result)

    async def reopen(self) -> None:
        """Admission opens everywhere; a loss while closed stops blocking."""
        self.open = True
        self.lost_while_closed = False
        self.on_change()
        for worker, result in await self.broadcast("open", {}):
            if isinstance(result, BaseException) and not isinstance(result, ChannelClosed):
                log.warning("worker %d did not re-open admission: %r", worker.pid, result)


# --- the worker's side --------------------------------------------------------------------------------------------


class WorkerLink:
    """A worker's end of its coordinator's channel: registration, the retired marks, admission as the coordinator
    sets it, reports, and the control routes forwarded to the coordinator.

    The kind's worker sets `close_admission`, `open_admission`, `report` (its report as JSON, blockers uncapped),
    `on_register` (kind state from the register reply) and adds its own `handlers`."""

    def __init__(self, config: ServerConfig, *, socket_env: str) -> None:
        self.config = config
        self.socket_env = socket_env
        self.retired = RetiredAttempts()
        self.generation = 0
        self.channel: Channel | None = None
        self.handlers: dict[str, Handler] = {
            "close": self._close,
            "open": self._open,
            "mark": self._mark,
            "forget": self._forget,
        }
        # Called with the close's body (`checkpoint_id`, and a prepare's `deadline_ts`; empty on joining).
        self.close_admission: Callable[[dict[str, Any]], Awaitable[None]] = _nothing_with
        self.open_admission: Callable[[], Awaitable[None]] = _nothing
        self.report: Callable[[], Any] = lambda: None
        self.on_register: Callable[[dict[str, Any]], Awaitable[None]] = _nothing_with
        self._bearer = bearer(config.token).encode()
        self._starting = False
        self._registered = asyncio.Event()
        self._report_scheduled = False
        self._seq = 0
        self._serving: asyncio.Future[None] | None = None
        self.routing_id = ""

    # -- registration ---------------------------------------------------------------------------------------

    async def start(self, on_lost: Callable[[], None]) -> None:
        """Connect, register, apply the coordinator's state, then serve its requests; `on_lost` runs if the channel
        closes."""
        self._starting = True
        path = os.environ.get(self.socket_env)
        if not path:
            raise RuntimeError(f"{self.socket_env} is not set: a worker is started by its coordinator")
        reader, writer = await asyncio.open_unix_connection(path)
        self.routing_id = secrets.token_hex(16)
        body = {"pid": os.getpid(), "routing_id": self.routing_id}
        writer.write(encode_frame({"id": 0, "kind": "register", "body": body}))
        async with asyncio.timeout(LIGHT_TIMEOUT_S):
            reply = await read_frame(reader)
        if reply is None or not reply.get("ok"):
            writer.close()
            raise RuntimeError(f"the coordinator at {path} refused to register this worker: {reply!r}")
        state: dict[str, Any] = reply["body"]
        handlers = {kind: self._reporting(handler) for kind, handler in self.handlers.items()}
        self.channel = Channel(reader, writer, name="coordinator", handlers=handlers)
        self.channel.on_close(on_lost)
        self.retired.mark(
            EpisodeId(rollout_id=rollout_id, attempt=attempt) for rollout_id, attempt in state["retired"].items()
        )
        self.generation = state["generation"]
        await self.on_register(state)
        if state["open"]:
            await self.open_admission()
        else:
            await self.close_admission({})  # joining while closed: close at once, and report for this generation
        self._registered.set()
        self._send_report()
        self._serving = asyncio.ensure_future(self.channel.serve())  # kept: the loop holds tasks only weakly

    async def _ready_channel(self) -> Channel:
        """The channel, once registered; a worker not started by a coordinator (a warm-up) has none."""
        if self._starting and not self._registered.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LIGHT_TIMEOUT_S):
                    await self._registered.wait()
        channel = self.channel
        if channel is None or channel.closed:
            raise CoordinatorUnavailableError(
                f"worker {os.getpid()} of {self.config.name} is not connected to its coordinator; "
                "retry on a running server, or restart it"
            )
        return channel

    # -- requests from the coordinator ----------------------------------------------------------------------

    async def _close(self, body: Any) -> dict[str, Any]:
        self.generation = int(body["generation"])
        await self.close_admission(body)
        return self._report_body()

    async def _open(self, body: Any) -> None:
        await self.open_admission()

    async def _mark(self, body: Any) -> None:
        self.retired.mark(EpisodeId.model_validate(episode) for episode in body["episode_ids"])

    async def _forget(self, body: Any) -> None:
        self.retired.forget(body["rollout_ids"])

    # -- reports --------------------------------------------------------------------------------------------

    def report_soon(self) -> None:
        """Send the report once this turn of the loop is over: a burst of changes is one message."""
        if self._report_scheduled or self.channel is None:
            return
        self._report_scheduled = True
        asyncio.get_running_loop().call_soon(self._flush_report)

    def _flush_report(self) -> None:
        """Send the report if a change is still unreported."""
        if self._report_scheduled:
            self._send_report()

    def _send_report(self) -> None:
        self._report_scheduled = False
        if self.channel is not None and not self.channel.closed:
            self.channel.notify("report", self._report_body())

    def _reporting(self, handler: Handler) -> Handler:
        """`handler`, sending an unreported change before its reply: the coordinator reads and applies the report
        before the request's reply resumes it, so when a fanned-out request (a retire, say) returns, the server's
        status already shows what each worker did."""

        async def handle(body: Any) -> Any:
            result = await handler(body)
            self._flush_report()
            return result

        return handle

    def _report_body(self) -> dict[str, Any]:
        """`{generation, seq, report}`: numbered, so the coordinator keeps the newest whatever order it reads them."""
        self._seq += 1
        return {"generation": self.generation, "seq": self._seq, "report": self.report()}

    # -- routes ---------------------------------------------------------------------------------------------

    async def handle_control(self, op: str, authorization: str | None, argument: Any) -> Any:
        """A control route: the bearer is checked here, then the coordinator's control plane answers."""
        check_bearer(authorization, self._bearer)
        channel = await self._ready_channel()
        body = {"operation": op, "body": forwarded_body(argument)}
        try:
            return await channel.request("control", body, control_timeout_s(argument))
        except (ChannelClosed, TimeoutError) as exc:
            raise CoordinatorUnavailableError(
                f"the coordinator of {self.config.name} did not answer {op} ({exc!r}); see the server log"
            ) from exc

    async def health(self) -> tuple[int, dict[str, Any]]:
        """200 once every expected worker of the server has registered; 503 before (the stack waits for it)."""
        try:
            channel = await self._ready_channel()
            state = await channel.request("health", {})
        except (ControlError, ChannelClosed, TimeoutError) as exc:
            return 503, {"status": "starting", "detail": str(exc)}
        return (200 if state["serving"] else 503), {"status": "ok" if state["serving"] else "starting", **state}


async def _nothing() -> None:
    return None


async def _nothing_with(state: dict[str, Any]) -> None:
    return None


def control_timeout_s(argument: Any) -> float:
    """How long a worker waits for a forwarded control call: the call's own deadline plus 10 s, else 30 s."""
    deadline_ts = getattr(argument, "deadline_ts", None)
    if deadline_ts is None:
        return LIGHT_TIMEOUT_S
    return max(deadline_ts - time.time(), 0.0) + CONTROL_EXTRA_S


class WorkerHeaderMiddleware:
    """Every reply says which worker process answered (`x-ckpt-worker: <pid>`), so tests can tell them apart."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_pid(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                # Read per reply: the app is built before the fork, in the fork server or the coordinator.
                headers.append((WORKER_HEADER, str(os.getpid()).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_pid)


def add_worker_routes(app: FastAPI, link: WorkerLink) -> None:
    """What every worker app serves besides its data plane: /health, the forwarded control routes, the pid header."""
    app.add_middleware(WorkerHeaderMiddleware)
    app.state.worker_link = link

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = await link.health()
        return JSONResponse(body, status_code=status)

    app.include_router(control_router(link.handle_control))


# --- processes ----------------------------------------------------------------------------------------------------


class WorkerServer(uvicorn.Server):
    """A worker's uvicorn server. It starts its loop and lifespan, says READY on `handoff` and waits there for the
    listening socket its coordinator hands every worker (SCM_RIGHTS), so a promoted standby's workers are built
    before the restart that needs them; then it serves the socket, registers with its coordinator, and stops when
    the coordinator is gone."""

    stood_down = False

    def __init__(self, config: uvicorn.Config, link: WorkerLink, handoff: socket.socket) -> None:
        super().__init__(config)
        self.link = link
        self.handoff = handoff

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            _flush_and_exit(STARTUP_FAILURE_EXIT)
        with contextlib.suppress(OSError):
            self.handoff.sendall(HANDOFF_READY)
        fds = await receive_fds(self.handoff, len(HANDOFF_GO))
        sock = socket.socket(fileno=fds[0]) if fds else None
        self.handoff.close()
        if sock is None:  # stood down: the coordinator is gone, or stands down itself
            self.stood_down = True
            self.should_exit = True
            return
        self.lifespan.startup = _started  # type: ignore[method-assign]  # it ran above; the base startup calls it
        await super().startup(sockets=[sock])
        if not self.started:
            return
        try:
            await self.link.start(on_lost=_coordinator_lost)
        except Exception:
            traceback.print_exc()
            print(f"worker {os.getpid()} could not register with its coordinator", file=sys.stderr, flush=True)
            _flush_and_exit(STARTUP_FAILURE_EXIT)


async def _started() -> None:
    return None


def _coordinator_lost() -> None:
    """Reference 13.1 item 29: a worker that lost its coordinator stops (at once: held replies never finish)."""
    print(f"worker {os.getpid()} lost its coordinator; stopping", file=sys.stderr)
    _flush_and_exit(COORDINATOR_LOST_EXIT)


def _flush_and_exit(code: int) -> NoReturn:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _prctl(option: int, value: int | bytes) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value)


@attrs.frozen
class Forked:
    """A worker forked by this coordinator, and the coordinator's end of its hand-off channel."""

    pid: int
    handoff: socket.socket


def fork_worker(index: int, name: str, app_config: uvicorn.Config, inherited: Sequence[socket.socket]) -> Forked:
    """Fork worker `index`: it builds its server from `app_config` (whose app's `state.worker_link` it registers)
    and waits for the listening socket on its hand-off channel. The child closes `inherited`."""
    coordinator_pid = os.getpid()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        ours.close()
        for sock in inherited:
            sock.close()
        _run_worker(index, name, app_config, theirs, coordinator_pid)
    theirs.close()
    return Forked(pid, ours)


def _run_worker(
    index: int, name: str, app_config: uvicorn.Config, handoff: socket.socket, coordinator_pid: int
) -> NoReturn:
    """In a forked worker: serve until killed or until the coordinator is gone; never returns."""
    exit_code = 1
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != coordinator_pid:
            _flush_and_exit(COORDINATOR_LOST_EXIT)  # the coordinator died before the request took effect
        _prctl(PR_SET_NAME, f"gym-w{index}-{name}".encode()[:PROCESS_NAME_BYTES_MAX])
        server = WorkerServer(app_config, app_config.app.state.worker_link, handoff)
        server.run()
        exit_code = 0 if server.started or server.stood_down else STARTUP_FAILURE_EXIT
    except SystemExit as exit_:
        exit_code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_and_exit(exit_code)


def _wait_built(workers: Sequence[Forked]) -> bool:
    """Wait until every worker has its loop and lifespan up (it says READY); False if one died first."""
    built = True
    for worker in workers:
        try:
            built = worker.handoff.recv(len(HANDOFF_READY)) == HANDOFF_READY and built
        except OSError:
            built = False
    return built


def serve_with_workers(
    config: ServerConfig,
    *,
    assemble: Callable[[ServerConfig, WorkerPool], Any],
    socket_env: str,
    listening: socket.socket | Callable[[], socket.socket | None],
    app_config: uvicorn.Config,
    on_serving: Callable[[], None] | None = None,
) -> int:
    """Run a multi-worker server in this process until every worker is gone or SIGTERM/SIGINT; the exit code.

    The workers are forked and built first, then handed the listening socket: `listening` itself, or what
    `listening()` returns (a standby's blocks until the fork server promotes it, and returns None if it stands
    down instead). `app_config` is uvicorn's config with the worker app;
    `assemble(config, pool)` builds the coordinator's control plane on the pool; `on_serving` runs once every
    worker has registered (a promoted standby says SERVING then)."""
    directory = make_runtime_dir(os.getpid())
    path = directory / f"{config.name}-{secrets.token_hex(4)}.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    workers: list[Forked] = []
    try:
        unix.bind(str(path))
        path.chmod(0o600)
        unix.listen(UNIX_BACKLOG)
        os.environ[socket_env] = str(path)
        held = [unix, *([listening] if isinstance(listening, socket.socket) else [])]
        workers = [fork_worker(index, config.name, app_config, held) for index in range(config.workers)]
        if not _wait_built(workers):
            print(f"a worker of {config.name} died while it started; see above", file=sys.stderr, flush=True)
            return STARTUP_FAILURE_EXIT
        if isinstance(listening, socket.socket):
            sock: socket.socket | None = listening
        else:
            sock = listening()
        if sock is None:
            return 0  # a standby that stood down
        with sock:  # the workers get it; a coordinator serves no HTTP
            for worker in workers:
                with contextlib.suppress(OSError):  # one that died is noticed by the coordinator's reaping
                    socket.send_fds(worker.handoff, [HANDOFF_GO], [sock.fileno()])
        for worker in workers:
            worker.handoff.close()
        return asyncio.run(_coordinate(config, unix, [worker.pid for worker in workers], assemble, on_serving))
    finally:
        unix.close()
        for worker in workers:
            worker.handoff.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)
        remove_runtime_dir(os.getpid())


async def _coordinate(
    config: ServerConfig,
    unix: socket.socket,
    pids: list[int],
    assemble: Callable[[ServerConfig, WorkerPool], Any],
    on_serving: Callable[[], None] | None,
) -> int:
    """The coordinator's loop: accept workers, serve their requests, exit when all are gone or on a stop signal."""
    loop = asyncio.get_running_loop()
    pool = WorkerPool(config.workers)
    control_plane = assemble(config, pool)
    stop = asyncio.Event()
    forked = set(pids)

    def reap() -> None:
        for pid in list(forked):
            with contextlib.suppress(ChildProcessError):
                reaped, status = os.waitpid(pid, os.WNOHANG)
                if reaped == 0:
                    continue
                log.warning("worker %d exited with %d", pid, os.waitstatus_to_exitcode(status))
            forked.discard(pid)
            pool.left = True
        if not forked:
            pool.empty.set()

    loop.add_signal_handler(signal.SIGCHLD, reap)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reap()  # a worker that died before the handler was installed
    server = await asyncio.start_unix_server(pool.accept, sock=unix)
    joined = asyncio.ensure_future(pool.all_joined.wait())
    ended = [asyncio.ensure_future(pool.empty.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait({joined, *ended}, return_when=asyncio.FIRST_COMPLETED)
        if joined.done() and on_serving is not None:
            on_serving()
        await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (joined, *ended):
            task.cancel()
        server.close()
        await control_plane.close()
    if stop.is_set():
        return 0
    print(f"every worker of {config.name} exited; the server stops", file=sys.stderr, flush=True)
    return 1
