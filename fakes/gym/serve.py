"""Entry point of one look-alike server process: `python -m fakes.gym.serve` with `CKPT_FAKES_SERVER` set.

A server configured with several workers (`ServerConfig.workers`) becomes their coordinator
(`fakes.gym.workers.coordinator_process`): `build_app` then builds the app each worker serves.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from fakes.gym.config import ServerConfig
from fakes.gym.protocol.http import SERVER_KEEP_ALIVE_S
from fakes.gym.server_logs import uvicorn_logging

LISTEN_BACKLOG = 2048  # uvicorn's default


def build_app(config: ServerConfig) -> FastAPI:
    """The app for the server's role; imports stay local so each process loads only what it serves."""
    if config.workers > 1 and config.role != "policy_model":
        from fakes.gym.servers.participant_workers import build_worker_app as build
    elif config.role == "environment":
        from fakes.gym.servers.environment import build_app as build
    elif config.role == "legacy_relay":
        from fakes.gym.servers.environment import build_relay_app as build
    elif config.role == "agent":
        from fakes.gym.servers.agent import build_app as build
    elif config.role == "resources":
        from fakes.gym.servers.resources import build_app as build
    elif config.workers > 1:
        from fakes.gym.policy.model_workers import build_worker_app as build
    else:
        from fakes.gym.policy.model import build_app as build
    return build(config)


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket for a server to inherit.

    The protocol must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
    listening socket says TCP, and without it every request after a connection's first stalls ~44 ms (Nagle
    plus delayed ACK; SPEC section 11). SO_REUSEADDR lets a port be bound again while old connections linger.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


# A path no server serves: a request for it walks every router to its end (404), changing nothing.
UNSERVED_PATH = "/_warm-up/unserved"


async def touch_stateless_routes(app: Any) -> None:
    """Send `app` the requests that read or change no server state: health, status without the token (refused
    with 401 before the control plane looks at anything), and a path no route serves. They walk the app's routers,
    the last one every router, so FastAPI builds its lazy per-route state (each included router's effective
    routes) and Starlette its middleware stack here, not on a child's first request of each route: a server lives
    for one example, so each route's first request is most of them."""
    import httpx

    from fakes.gym.protocol.wire import CHECKPOINT_ROUTE_PREFIX

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://warm-up") as client:
        await client.get("/health")
        await client.get(CHECKPOINT_ROUTE_PREFIX + "/status")
        await client.get(UNSERVED_PATH)


def build_config(config_json: str) -> Any:
    """uvicorn's loaded config for a server, its app built now and warmed by stateless requests."""
    app = build_app(ServerConfig.from_json(config_json))
    asyncio.run(touch_stateless_routes(app))
    config = uvicorn.Config(app, lifespan="on", timeout_keep_alive=SERVER_KEEP_ALIVE_S, **uvicorn_logging())
    config.load()
    return config


def serve_workers(
    config: ServerConfig,
    listening: socket.socket | Callable[[], socket.socket | None] | None = None,
    app_config: Any = None,
    on_serving: Callable[[], None] | None = None,
) -> int:
    """Run a server with several workers in this process, as their coordinator; the exit code. `listening` is its
    listening socket, or what gives it once the workers are built (bound here if None); `app_config` uvicorn's
    config with the worker app (built if None); `on_serving` runs once every worker has registered."""
    from fakes.gym.workers.coordinator_process import serve_with_workers

    if config.role == "policy_model":
        from fakes.gym.policy.model_workers import POLICY_SOCKET_ENV as socket_env
        from fakes.gym.policy.model_workers import coordinator_control_plane
    else:
        from fakes.gym.servers.participant_workers import COORDINATOR_SOCKET_ENV as socket_env
        from fakes.gym.servers.participant_workers import coordinator_control_plane

    if app_config is None:
        app_config = build_config(config.to_json())
    if listening is None:
        # Bound only once the workers are built, as a promoted standby's socket arrives.
        listening = lambda: listening_socket(config.host, config.port)  # noqa: E731
    return serve_with_workers(
        config,
        assemble=coordinator_control_plane,
        socket_env=socket_env,
        listening=listening,
        app_config=app_config,
        on_serving=on_serving,
    )


def main() -> None:
    config = ServerConfig.from_env()
    if config.workers > 1:
        raise SystemExit(serve_workers(config))
    uvicorn.run(
        build_app(config),
        host=config.host,
        port=config.port,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        **uvicorn_logging(),
    )


if __name__ == "__main__":
    main()
