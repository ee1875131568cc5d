"""The coordinator's view of its workers (`WorkerPool`): registration, loss, reports, fan-out, close generations.

Runs in the coordinator process (`fakes.gym.workers.coordinator_process` starts it); each worker's end of the channel is
`fakes.gym.workers.link`. What is here is generic (any participant kind); `fakes.gym.policy.model_workers` builds the
policy model's participant on it.

Close generations (reference 13.1 item 29): every close numbers a new generation and each worker answers it with a
report for it; until every live worker has, the merged report names `<label>-workers-unreported:<n>`. A worker lost
while admission is closed blocks (`<label>-worker-lost`) until admission opens again. A worker that registers while
closed closes at once and reports for the current generation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from fakes.gym.control.participant import PrepareReport
from fakes.gym.protocol.errors import CoordinatorUnavailableError
from fakes.gym.workers.channel import LIGHT_TIMEOUT_S, Channel, ChannelClosed, FrameError, Handler, read_frame
from fakes.gym.workers.reports import merge_reports

log = logging.getLogger(__name__)


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
        self.run_control: Callable[[str, Any, str | None], Awaitable[Any]] | None = None
        self.handlers: dict[str, Handler] = {}
        # This server's clock offset (`fakes.clock`) as `POST /_ctl/clock` on the coordinator last set it: it is
        # the whole server's time, so every worker keeps it too, one that registers later included.
        self.clock_offset_s: float | None = None

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
            "clock_offset_s": self.clock_offset_s,
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
        return await self.run_control(body["operation"], body.get("body"), body.get("traceparent"))

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

    def merged_report(self, own: PrepareReport, *, label: str, lost: bool | None = None) -> PrepareReport:
        """The server's report: the coordinator's own with every live worker's (`merge_reports`); `lost` says
        whether a lost worker blocks (by default, one lost while admission is closed)."""
        return merge_reports(
            own,
            self.reports(),
            label=label,
            workers=len(self.workers),
            unreported=self.unreported(),
            lost=self.lost_while_closed if lost is None else lost,
        )

    async def broadcast(
        self, kind: str, body: Any, timeout_s: float | None = LIGHT_TIMEOUT_S
    ) -> list[tuple[Worker, Any]]:
        """Send a request to every live worker at once; each reply or exception, by worker."""
        workers = list(self.workers.values())
        results = await asyncio.gather(
            *(worker.channel.request(kind, body, timeout_s) for worker in workers), return_exceptions=True
        )
        return list(zip(workers, results, strict=True))

    async def move_clock(self, offset_s: float) -> None:
        """Move every worker's clock with the coordinator's (`POST /_ctl/clock`)."""
        self.clock_offset_s = offset_s
        await self.fan_out("clock", {"offset_s": offset_s})

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

    async def retire(self, body: Mapping[str, Any]) -> None:
        """Retire `body["episode_ids"]` on every worker: every worker marks them (refusing the attempts) before any
        stops anything, then each stops and frees its covered work (bounded by the retire's deadline)."""
        await self.fan_out("mark", body)
        await self.fan_out("retire", body, timeout_s=None)

    async def reopen(self) -> None:
        """Admission opens everywhere; a loss while closed stops blocking."""
        self.open = True
        self.lost_while_closed = False
        self.on_change()
        for worker, result in await self.broadcast("open", {}):
            if isinstance(result, BaseException) and not isinstance(result, ChannelClosed):
                log.warning("worker %d did not re-open admission: %r", worker.pid, result)
