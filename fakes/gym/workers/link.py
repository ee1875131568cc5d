"""A worker's end of the channel to its coordinator (`WorkerLink`), and how long a forwarded control call waits.

Runs in each worker process (`fakes.gym.workers.worker_process`); the coordinator's end is
`fakes.gym.workers.coordinator`. What is here is generic (any participant kind); `fakes.gym.policy.model_workers` builds
the policy model's worker on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fakes import clock
from fakes.gym.config import ServerConfig
from fakes.gym.control.retired import RetiredAttempts
from fakes.gym.control.routes import check_bearer, forwarded_body
from fakes.gym.protocol.errors import ControlError, CoordinatorUnavailableError
from fakes.gym.protocol.wire import EpisodeId, bearer
from fakes.gym.workers.channel import LIGHT_TIMEOUT_S, Channel, ChannelClosed, Handler, encode_frame, read_frame

# Appendix B: a forwarded control call gets its own deadline plus 10 s (light messages get `LIGHT_TIMEOUT_S`).
CONTROL_EXTRA_S = 10.0


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
            "clock": self._clock,
        }
        # Called with the close's body (`checkpoint_id`, and a prepare's `deadline_ts`; empty on joining).
        self.close_admission: Callable[[dict[str, Any]], Awaitable[None]] = _nothing_with
        self.open_admission: Callable[[], Awaitable[None]] = _nothing
        self.report: Callable[[], Any] = lambda: None
        self.on_register: Callable[[dict[str, Any]], Awaitable[None]] = _nothing_with
        # Called with the offset once this worker's clock moved (`_clock`): what it times on the wall clock.
        self.clock_followers: list[Callable[[float], Awaitable[None]]] = []
        self._bearer = bearer(config.token).encode()
        self._starting = False
        self._registered = asyncio.Event()
        self._report_scheduled = False
        self._seq = 0
        self._serving: asyncio.Future[None] | None = None
        self.routing_id = ""
        # This worker's index among its coordinator's (0 .. workers - 1), set in the worker after the fork.
        self.index: int | None = None

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
        if state.get("clock_offset_s") is not None:
            clock.set_offset(float(state["clock_offset_s"]))
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

    async def _clock(self, body: Any) -> None:
        """The coordinator's clock moved (`POST /_ctl/clock`): this process is the same server, so its clock
        moves too, and what it times on the wall clock follows (`clock_followers`)."""
        offset_s = float(body["offset_s"])
        clock.set_offset(offset_s)
        for follow in self.clock_followers:
            await follow(offset_s)

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

    async def handle_control(
        self, op: str, authorization: str | None, argument: Any, traceparent: str | None = None
    ) -> Any:
        """A control route: the bearer is checked here, then the coordinator's control plane answers (in the trace
        the caller's `traceparent` names: the coordinator makes the operation's span)."""
        check_bearer(authorization, self._bearer)
        channel = await self._ready_channel()
        body = {"operation": op, "body": forwarded_body(argument), "traceparent": traceparent}
        # A bulky operation's request and reply (`BULKY_OPERATIONS`) go through with the collector paused: the
        # worker's routes pause it for the whole request (`fakes.gym.workers.routes`).
        try:
            return await channel.request("control", body, control_timeout_s(op, argument))
        except (ChannelClosed, TimeoutError) as exc:
            raise CoordinatorUnavailableError(
                f"the coordinator of {self.config.name} did not answer {op} ({exc!r}); see the server log"
            ) from exc

    async def ask_coordinator(self, kind: str, authorization: str | None, body: Any) -> Any:
        """A harness route's request to the coordinator (the kind's own, e.g. the policy's `place`), bearer first."""
        check_bearer(authorization, self._bearer)
        return await self.ask(kind, body)

    async def ask(self, kind: str, body: Any) -> Any:
        """A request of the worker's own to its coordinator (a restored record's claim, say)."""
        channel = await self._ready_channel()
        try:
            return await channel.request(kind, body)
        except (ChannelClosed, TimeoutError) as exc:
            raise CoordinatorUnavailableError(
                f"the coordinator of {self.config.name} did not answer {kind} ({exc!r}); see the server log"
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


def control_timeout_s(op: str, argument: Any) -> float | None:
    """How long a worker waits for a forwarded control call: the call's own deadline plus 10 s, else 30 s.

    A clock move waits for as long as it takes: the coordinator moves this worker's clock too before it answers
    (`WorkerPool.move_clock`), and where time passes for the monotonic clock as well (`fakes.clock`) a jump past
    the timer would fire it, a timeout of the worker's own making. A coordinator that dies closes the channel."""
    if op == "skew clock":
        return None
    deadline_ts = getattr(argument, "deadline_ts", None)
    if deadline_ts is None:
        return LIGHT_TIMEOUT_S
    return max(deadline_ts - time.time(), 0.0) + CONTROL_EXTRA_S
