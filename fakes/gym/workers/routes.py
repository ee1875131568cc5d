"""A worker app's own routes beside its data plane: they answer through the worker's link to its coordinator
(`fakes.gym.workers.link`), and every reply names the worker process that sent it."""

from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fakes.gym.control.routes import BULKY_OPERATIONS, control_router
from fakes.gym.control.store import collector_paused
from fakes.gym.protocol.wire import CHECKPOINT_ROUTE_PREFIX
from fakes.gym.workers.link import WorkerLink

WORKER_HEADER = b"x-ckpt-worker"
BULKY_PATHS = frozenset(f"{CHECKPOINT_ROUTE_PREFIX}/{op}" for op in BULKY_OPERATIONS)


class WorkerHeaderMiddleware:
    """Every reply says which worker process answered (`x-ckpt-worker: <pid>`), so tests can tell them apart; a
    reply relayed from the worker a call was placed on keeps that worker's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_pid(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name == WORKER_HEADER for name, _ in headers):
                    # Read per reply: the app is built before the fork, in the fork server or the coordinator.
                    headers.append((WORKER_HEADER, str(os.getpid()).encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_pid)


class BulkyControlMiddleware:
    """A commit, restore or retire (`BULKY_OPERATIONS`) is served with the cycle collector paused, from reading its
    body to sending its reply (`store.collector_paused`): its request and reply name every episode in scope, and
    thousands of episode objects validated with the collector on can start a collection of the worker's whole heap,
    which at scale holds thousands of requests in flight (hundreds of ms of CPU)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in BULKY_PATHS:
            with collector_paused():
                await self.app(scope, receive, send)
            return
        await self.app(scope, receive, send)


def add_worker_routes(app: FastAPI, link: WorkerLink) -> None:
    """What every worker app serves besides its data plane: /health, the forwarded control routes, the pid header."""
    app.add_middleware(BulkyControlMiddleware)
    app.add_middleware(WorkerHeaderMiddleware)
    app.state.worker_link = link

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = await link.health()
        return JSONResponse(body, status_code=status)

    app.include_router(control_router(link.handle_control))
