"""The fake inference backend and token store: one FastAPI app standing in for a vLLM worker.

It outlives every Gym crash, so the calls it saw and the hold or gate it was told to keep are the checker's
view of "the model". A call that must wait waits on asyncio events that only a control route sets, which is
how the checker decides every interleaving (SPEC section 4): nothing here sleeps. Facts: reference section 11.

Routes: `GET /v1/models`, `POST /v1/chat/completions`, the cut endpoint `POST /ng-control/v1/generation-cut`,
and the test controls under `/_ctl/` (`hold`, `release`, `gate`, `step`, `script`, `calls`, `cuts`, plus our
`reset`, `staged` and `cut_stall`).

Token capture: a call carrying `ng_capture` is staged in the token store (the training framework's durable store,
which survives every Gym crash) when it returns, and its reply names the row (`ng_commit_coords`). While it waits it
is active, with the first tokens of its output "generated so far": a cut stages that prefix, and a call continuing
the cut generates only the rest.

Ungated (`--ungated`): the same OpenAI API as a real model server (vLLM) serves it, and nothing else: no `/_ctl/`
route and no cut endpoint, so nothing can hold a call. Every call answers after `--latency-ms` (a model's
generation time, so rollouts are genuinely in flight when a checkpoint comes), and a request naming a model other
than the served one (`--served-model-name`) is refused with 404, as vLLM refuses it. What the real-model mode
(`ckpt_model.modes.real_model`) runs against in CI.

Run: `python -m fakes.backend --port N [--host 127.0.0.1] [--ungated [--latency-ms MS] [--served-model-name ID]]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable
from typing import Any

import attrs
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fakes.gym.protocol.generation_cut import GenerationCutContinuation, GenerationCutInventory, canonical_digest
from fakes.gym.protocol.http import SERVER_KEEP_ALIVE_S, ClientGone, unless_client_gone
from fakes.gym.protocol.wire import BEARER_PREFIX, GENERATION_CUT_ROUTE, error_body
from fakes.gym.server_logs import uvicorn_logging

MODEL_NAME = "fake-model"
CAPTURE_KEY_HEADER = "x-ng-capture-key"
# A judge verifier (the slow topology's blockable verify) marks its calls, so the checker tells them from policy
# calls; both wait at the same gate.
CALL_KIND_HEADER = "x-ng-call-kind"
CALL_KINDS = ("policy", "judge")
# The policy worker (its index) that served a call, sent by a worker of a multi-worker model server
# (`fakes.gym.workers.placement`); recorded as the call's `worker` (None: a single process, or a judge).
POLICY_WORKER_HEADER = "x-ckpt-policy-worker"
FINAL_TEXT = "It is cold in SF."
TOKENS_MAX = 64
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
# nginx's "client closed request": nobody reads it, but the record of the call says what happened.
CLIENT_GONE_STATUS = 499
JSON = "application/json"
# How much of an active call's output counts as generated so far (reference 11).
PREFIX_TOKENS = 5
EFFECTIVE_OUTPUT_LIMIT = 1024
CUT_KEY_PREFIX = "__generation_cut__"
SNAPSHOT_ID = "fake-transfer-queue"


def tokens_from_text(text: str) -> list[int]:
    """Deterministic token IDs of a text (char code mod 250, plus 1; at most 64): lineage compares them."""
    return [ord(char) % 250 + 1 for char in text[:TOKENS_MAX]]


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


DEFAULT_SCRIPT: tuple[ScriptedToolCall, ...] = (ScriptedToolCall(name="get_weather", arguments={"city": "SF"}),)


class CaptureAdmission(BaseModel):
    """`ng_capture`: the captured call's identity and lineage; fields the fake does not read pass unread."""

    model_config = ConfigDict(extra="allow")

    model_call_id: str = Field(min_length=1)
    rollout_id: str = Field(min_length=1)
    parent_call_id: str | None = None
    generation_cut: GenerationCutContinuation | None = None


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat request the fake reads; everything else passes unread."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]]
    model: str = MODEL_NAME
    ng_capture: CaptureAdmission | None = None


class HoldRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after_calls: int = Field(ge=0)


class StepRequest(BaseModel):
    """Release gated calls: `calls` (the n longest-waiting) or our `indices` (exactly those calls)."""

    model_config = ConfigDict(extra="forbid")

    calls: int | None = Field(default=None, ge=0)
    indices: list[int] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StepRequest:
        if (self.calls is None) == (self.indices is None):
            raise ValueError("give exactly one of 'calls' (a count) or 'indices' (call indices)")
        if self.indices is not None and len(set(self.indices)) != len(self.indices):
            raise ValueError(f"'indices' must not repeat a call (got {self.indices})")
        return self


class ScriptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_calls: list[ScriptedToolCall]


class CutStallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stall: bool


@attrs.define(eq=False)
class Call:
    """One chat call as the backend saw it; `hold` and `gate` are set only for calls that wait for them."""

    index: int
    n_messages: int
    capture: CaptureAdmission | None
    # `capture` as the request sent it, for the call record.
    admission: dict[str, Any] | None
    capture_key: str | None
    t: float
    step: int
    script: tuple[ScriptedToolCall, ...]
    kind: str = "policy"
    worker: int | None = None
    hold: asyncio.Event | None = None
    gate: asyncio.Event | None = None
    returned: bool = False
    cancelled: bool = False
    # A call continuing a cut: the prefix it reuses, and where that prefix is staged.
    prefix: list[int] | None = None
    prefix_staging_key: str | None = None

    @property
    def active(self) -> bool:
        """A captured call still generating: a cut can freeze its prefix."""
        return self.capture is not None and not self.returned and not self.cancelled

    @property
    def output_tokens(self) -> list[int]:
        """The whole output's tokens: a function of the reply, so the same call always yields the same tokens."""
        message, _ = reply_message(self)
        text = message["content"] if message["content"] is not None else json.dumps(message["tool_calls"][0])
        return tokens_from_text(text)

    @property
    def waiting(self) -> bool:
        if self.returned or self.cancelled:
            return False
        return any(event is not None and not event.is_set() for event in (self.hold, self.gate))

    @property
    def at_gate(self) -> bool:
        return self.gate is not None and not self.gate.is_set() and not self.cancelled

    def release(self) -> None:
        for event in (self.hold, self.gate):
            if event is not None:
                event.set()

    async def wait_released(self) -> None:
        # Hold first, then the gate: a call both held and gated needs a release and a step.
        for event in (self.hold, self.gate):
            if event is not None:
                await event.wait()

    def wire(self) -> dict[str, Any]:
        cut = self.capture.generation_cut if self.capture is not None else None
        return {
            "index": self.index,
            "n_messages": self.n_messages,
            "admission": self.admission,
            "capture_key": self.capture_key,
            "kind": self.kind,
            "worker": self.worker,
            "t": self.t,
            "returned": self.returned,
            "waiting": self.waiting,
            "cancelled": self.cancelled,
            "continued_from": cut.source_model_call_id if cut is not None else None,
            "reused_prefix_tokens": cut.prefix_token_count if cut is not None else None,
        }


class StepRefused(Exception):
    """`/_ctl/step` named calls that are not waiting; nothing was released."""


class CutRefused(Exception):
    """A continued call whose cut is not in the token store as its continuation describes it."""


@attrs.define
class Backend:
    """Everything the backend remembers; only the control routes change what calls wait for."""

    calls: list[Call] = attrs.field(factory=list)
    cuts: list[list[str]] = attrs.field(factory=list)
    # The token store: staging key -> staged entry (captured calls' rows and cut prefixes).
    staged: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    hold_after_calls: int | None = None
    gated: bool = False
    cut_stall: bool = False
    # Cut requests hanging now (`cut_stall`): each ends when its sender gives up.
    hanging_cuts: int = 0
    script: tuple[ScriptedToolCall, ...] = DEFAULT_SCRIPT

    def arrive(
        self, request: ChatRequest, capture_key: str | None, kind: str = "policy", worker: int | None = None
    ) -> Call:
        """Record a call on arrival, before it waits, so a held call is already counted (reference 11).

        A continued call whose cut is not staged as described is refused (`CutRefused`) and not recorded."""
        index = len(self.calls)
        call = Call(
            index=index,
            n_messages=len(request.messages),
            capture=request.ng_capture,
            admission=request.ng_capture.model_dump(mode="json", exclude_unset=True) if request.ng_capture else None,
            capture_key=capture_key,
            t=time.time(),
            step=sum(1 for message in request.messages if message.get("role") == "tool"),
            # The script is read on arrival: what a call answers does not depend on when it is released.
            script=self.script,
            kind=kind,
            worker=worker,
        )
        cut = request.ng_capture.generation_cut if request.ng_capture is not None else None
        if cut is not None:
            call.prefix = self.staged_prefix(cut)
            call.prefix_staging_key = cut.staging_keys[0]
        if self.hold_after_calls is not None and index >= self.hold_after_calls:
            call.hold = asyncio.Event()
        if self.gated:
            call.gate = asyncio.Event()
        self.calls.append(call)
        return call

    def waiting_calls(self) -> list[Call]:
        return [call for call in self.calls if call.waiting]

    def release_all(self) -> int:
        """Clear hold and gate and release every waiter; returns how many were waiting."""
        waiters = self.waiting_calls()
        self.hold_after_calls = None
        self.gated = False
        for call in self.calls:
            call.release()
        return len(waiters)

    def step_count(self, calls_max: int) -> list[int]:
        chosen = [call for call in self.calls if call.at_gate][:calls_max]
        for call in chosen:
            assert call.gate is not None
            call.gate.set()
        return [call.index for call in chosen]

    def step_indices(self, indices: list[int]) -> list[int]:
        waiting = {call.index: call for call in self.waiting_calls()}
        missing = [index for index in indices if index not in waiting]
        if missing:
            raise StepRefused(
                f"'indices' must name waiting calls (got {missing} not waiting; waiting: {sorted(waiting)});"
                " read GET /_ctl/calls for the calls that wait"
            )
        for index in indices:
            waiting[index].release()
        return list(indices)

    def reset(self) -> int:
        """Release every waiter, then forget everything, so one backend serves many test examples."""
        released = self.release_all()
        self.calls = []
        self.cuts = []
        self.staged = {}
        self.cut_stall = False
        self.script = DEFAULT_SCRIPT
        return released

    def staged_prefix(self, cut: GenerationCutContinuation) -> list[int]:
        """The tokens a continuation reuses, checked against the token store."""
        missing = [key for key in cut.staging_keys if key not in self.staged]
        if missing:
            raise CutRefused(
                f"generation cut of {cut.source_model_call_id!r}: staging keys {missing} are not in the token store;"
                " continue only a cut this backend acknowledged"
            )
        prefix = [token for key in cut.staging_keys for token in self.staged[key]["tokens"]]
        if (len(prefix), canonical_digest(prefix)) != (cut.prefix_token_count, cut.prefix_digest):
            raise CutRefused(
                f"generation cut of {cut.source_model_call_id!r}: the staged prefix has {len(prefix)} tokens and "
                f"digest {canonical_digest(prefix)}, not {cut.prefix_token_count} and {cut.prefix_digest}"
            )
        return prefix

    def capture_fields(self, call: Call) -> dict[str, Any]:
        """Stage a captured call's row in the token store; its reply names the row (`ng_commit_coords`)."""
        if call.capture is None:
            return {}
        capture = call.capture
        key = f"{capture.rollout_id}/{capture.model_call_id}"
        tokens = call.output_tokens
        if call.prefix is not None:
            # Only the rest is generated: the prefix is reused once, never generated again.
            tokens = call.prefix + tokens[len(call.prefix) :]
        self.staged[key] = {
            "rollout_id": capture.rollout_id,
            "model_call_id": capture.model_call_id,
            "parent_call_id": capture.parent_call_id,
            "tokens": tokens,
            "continued_from": capture.generation_cut.source_model_call_id if capture.generation_cut else None,
            "prefix_staging_key": call.prefix_staging_key,
        }
        return {"ng_commit_coords": {"staging_key": key}}

    def cut(self, inventory: GenerationCutInventory, echo: dict[str, Any]) -> dict[str, Any]:
        """One cut round: stage the prefix of every inventoried call still active; the rest fail."""
        active = {call.capture.model_call_id: call for call in self.calls if call.capture and call.active}
        acks, durable = [], []
        for prefix in inventory.active_prefixes:
            identity = prefix.model_dump()
            call = active.get(prefix.model_call_id)
            if call is None:
                acks.append({**identity, "disposition": "durable_failure"})
                continue
            tokens = call.output_tokens[:PREFIX_TOKENS]
            key = f"{CUT_KEY_PREFIX}/{prefix.rollout_id}/{prefix.model_call_id}"
            self.staged[key] = {
                "rollout_id": prefix.rollout_id,
                "model_call_id": prefix.model_call_id,
                "checkpoint_id": inventory.checkpoint_id,
                "tokens": tokens,
            }
            acks.append(
                {
                    **identity,
                    "disposition": "durable_prefix",
                    "cut_kind": "active_prefix",
                    "frozen_buffer_id": f"buf-{prefix.model_call_id}",
                    "staging_keys": [key],
                    "prefix_token_count": len(tokens),
                    "prefix_digest": canonical_digest(tokens),
                    "effective_output_limit": EFFECTIVE_OUTPUT_LIMIT,
                    "terminal_finish_reason": None,
                    "terminal_stop_reason": None,
                }
            )
            durable.append(prefix.model_call_id)
        self.cuts.append(durable)
        return {
            "checkpoint_id": inventory.checkpoint_id,
            "cut_id": f"cut-{len(self.cuts)}",
            "inventory_digest": inventory.inventory_digest,
            "inventory": echo,
            "backend_snapshot_id": SNAPSHOT_ID,
            "prefixes": acks,
        }


def reply_message(call: Call) -> tuple[dict[str, Any], str]:
    """The scripted turn policy: the step-th scripted tool call while the script lasts, then the answer."""
    if call.step < len(call.script):
        scripted = call.script[call.step]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{call.step}",
                    "type": "function",
                    "function": {"name": scripted.name, "arguments": json.dumps(scripted.arguments)},
                }
            ],
        }
        finish_reason = "tool_calls"
    else:
        message = {"role": "assistant", "content": FINAL_TEXT}
        finish_reason = "stop"
    return message, finish_reason


def chat_completion(call: Call, model: str) -> dict[str, Any]:
    message, finish_reason = reply_message(call)
    return {
        "id": f"chatcmpl-{call.index}",
        "object": "chat.completion",
        "created": int(call.t),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": dict(USAGE),
    }


async def released_or_gone(call: Call, request: Request) -> bool:
    """Wait until the call is released (True) or its client goes away first (False, marked `cancelled`)."""
    return await _unless_gone(call, request, call.wait_released())


async def _unless_gone(call: Call, request: Request, wait: Awaitable[Any]) -> bool:
    """Await `wait` unless the call's client goes first: True once it is done, False (marked `cancelled`) if not."""
    try:
        await unless_client_gone(request, wait)
    except ClientGone:
        call.cancelled = True
        return False
    except asyncio.CancelledError:
        call.cancelled = True
        raise
    return True


def build_app(*, ungated: bool = False, latency_s: float = 0.0, served_model: str = MODEL_NAME) -> FastAPI:
    """A fresh backend: its own calls, hold, gate and script. Ungated: only the model routes (see the module)."""
    if not (latency_s >= 0 and math.isfinite(latency_s)):
        raise ValueError(f"'latency_s' must be a finite number of seconds >= 0 (got {latency_s!r})")
    app = FastAPI(title="ckpt-model fake backend" + (" (ungated)" if ungated else ""))
    backend = Backend()
    app.state.backend = backend
    _add_model_routes(app, backend, latency_s, served_model if ungated else None)
    if not ungated:
        _add_control_routes(app, backend)
    return app


def _add_model_routes(app: FastAPI, backend: Backend, latency_s: float, served_model: str | None) -> None:
    """`/v1/models` and `/v1/chat/completions`; with `served_model`, a call naming another model is a 404."""
    model_id = served_model or MODEL_NAME

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> dict[str, Any] | Response:
        kind = request.headers.get(CALL_KIND_HEADER, "policy")
        if kind not in CALL_KINDS:
            detail = f"header {CALL_KIND_HEADER} must be one of {list(CALL_KINDS)} (got {kind!r})"
            return JSONResponse(error_body("invalid_request", detail), status_code=422)
        if served_model is not None and body.model != served_model:
            return JSONResponse(model_not_found(body.model), status_code=404)
        worker = request.headers.get(POLICY_WORKER_HEADER)
        try:
            call = backend.arrive(
                body, request.headers.get(CAPTURE_KEY_HEADER), kind, int(worker) if worker is not None else None
            )
        except CutRefused as refusal:
            return JSONResponse(error_body("invalid_generation_cut", str(refusal)), status_code=409)
        if call.waiting and not await released_or_gone(call, request):
            return Response(status_code=CLIENT_GONE_STATUS)
        if latency_s and not await generated_or_gone(call, request, latency_s):
            return Response(status_code=CLIENT_GONE_STATUS)
        reply = chat_completion(call, body.model) | backend.capture_fields(call)
        call.returned = True
        return reply


def model_not_found(model: str) -> dict[str, Any]:
    """vLLM's reply to a request naming a model it does not serve (HTTP 404)."""
    return {
        "object": "error",
        "message": f"The model `{model}` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


async def generated_or_gone(call: Call, request: Request, latency_s: float) -> bool:
    """A model's generation time: True after `latency_s`, False (marked `cancelled`) if the client went first."""
    return await _unless_gone(call, request, asyncio.sleep(latency_s))


def _add_control_routes(app: FastAPI, backend: Backend) -> None:
    """The test controls under `/_ctl/` and the cut endpoint: what a real model server does not have."""

    @app.post("/_ctl/hold")
    async def hold(body: HoldRequest) -> dict[str, Any]:
        backend.hold_after_calls = body.after_calls
        return {"after_calls": body.after_calls}

    @app.post("/_ctl/release")
    async def release() -> dict[str, Any]:
        # Any body (`{}` or none) is accepted and ignored, as in Gym's backend.
        return {"released": backend.release_all()}

    @app.post("/_ctl/gate")
    async def gate() -> dict[str, Any]:
        backend.gated = True
        return {"gated": True}

    @app.post("/_ctl/step", response_model=None)
    async def step(body: StepRequest) -> dict[str, Any] | JSONResponse:
        try:
            if body.indices is not None:
                released = backend.step_indices(body.indices)
            else:
                assert body.calls is not None
                released = backend.step_count(body.calls)
        except StepRefused as refusal:
            return JSONResponse(error_body("not_waiting", str(refusal)), status_code=409)
        return {
            "released": len(released),
            "released_indices": released,
            "waiting": len(backend.waiting_calls()),
        }

    @app.post("/_ctl/script")
    async def script(body: ScriptRequest) -> dict[str, Any]:
        backend.script = tuple(body.tool_calls)
        return {"tool_calls": [tool_call.model_dump() for tool_call in backend.script]}

    @app.get("/_ctl/calls")
    async def calls(since: int = 0) -> Response:
        # `since` (ours): only calls from that index on, so a poller of thousands of calls reads only new ones.
        # Encoded here rather than by FastAPI's jsonable_encoder, which costs ~10x more on 30,000 calls.
        return Response(json.dumps([call.wire() for call in backend.calls[max(since, 0) :]]), media_type=JSON)

    @app.get("/_ctl/cuts")
    async def cuts() -> list[list[str]]:
        return backend.cuts

    @app.get("/_ctl/staged")
    async def staged() -> dict[str, dict[str, Any]]:
        return backend.staged

    @app.post("/_ctl/cut_stall")
    async def cut_stall(body: CutStallRequest) -> dict[str, Any]:
        backend.cut_stall = body.stall
        return {"stall": body.stall}

    @app.get("/_ctl/cut_stall")
    async def cut_stall_state() -> dict[str, Any]:
        # `hanging`: how many cut requests hang now, so the checker knows when their senders' budgets run.
        return {"stall": backend.cut_stall, "hanging": backend.hanging_cuts}

    @app.post(GENERATION_CUT_ROUTE, response_model=None)
    async def generation_cut(
        body: GenerationCutInventory, request: Request, authorization: str | None = Header(default=None)
    ) -> dict[str, Any] | Response:
        if not (authorization or "").startswith(BEARER_PREFIX):
            detail = "the cut endpoint needs the header 'Authorization: Bearer <token>'"
            return JSONResponse(error_body("unauthorized", detail), status_code=401)
        if body.inventory_digest != body.expected_digest():
            detail = (
                f"'inventory_digest' must be the SHA-256 of the canonical JSON of checkpoint_id, server_name and "
                f"active_prefixes (got {body.inventory_digest!r}, expected {body.expected_digest()!r})"
            )
            return JSONResponse(error_body("invalid_inventory", detail), status_code=422)
        if backend.cut_stall:
            # A hung cut: it answers nothing, and ends only when its caller gives up.
            backend.hanging_cuts += 1
            try:
                with contextlib.suppress(ClientGone):
                    await unless_client_gone(request, asyncio.Event().wait())
            finally:
                backend.hanging_cuts -= 1
            return Response(status_code=CLIENT_GONE_STATUS)
        return backend.cut(body, await request.json())

    @app.post("/_ctl/reset")
    async def reset() -> dict[str, Any]:
        return {"released": backend.reset()}


def _stop_at_stdin_eof() -> None:
    """Block until stdin closes, then stop as on SIGTERM (uvicorn shuts down cleanly)."""
    sys.stdin.buffer.read()
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fakes.backend", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--exit-with-stdin", action="store_true", help="stop when stdin closes (the process that started us died)"
    )
    parser.add_argument(
        "--ungated", action="store_true", help="only the model routes, as a real model server serves them (no /_ctl)"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="ungated: each call answers after this many ms (default 0)"
    )
    parser.add_argument(
        "--served-model-name", default=MODEL_NAME, help=f"ungated: the one model served (default {MODEL_NAME})"
    )
    args = parser.parse_args(argv)
    if not (args.latency_ms >= 0 and math.isfinite(args.latency_ms)):
        parser.error(f"'--latency-ms' must be a finite number >= 0 (got {args.latency_ms})")
    if args.latency_ms and not args.ungated:
        parser.error("'--latency-ms' needs '--ungated': a gated backend's calls wait for the checker, not a clock")
    app = build_app(ungated=args.ungated, latency_s=args.latency_ms / 1000, served_model=args.served_model_name)
    if args.exit_with_stdin:
        threading.Thread(target=_stop_at_stdin_eof, name="stdin-watch", daemon=True).start()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        **uvicorn_logging(),
    )


if __name__ == "__main__":
    main()
