"""Entry point of one look-alike server process: `python -m fakes.gym.serve` with `CKPT_FAKES_SERVER` set.

A server configured with several workers (`ServerConfig.workers`, policy model only) becomes their coordinator
(`fakes.gym.workers`): `build_app` then builds the app each worker serves.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from fakes.gym.config import ServerConfig
from fakes.gym.http import SERVER_KEEP_ALIVE_S


def build_app(config: ServerConfig) -> FastAPI:
    """The app for the server's role; imports stay local so each process loads only what it serves."""
    if config.role == "environment":
        from fakes.gym.environment import build_app as build
    elif config.role == "legacy_relay":
        from fakes.gym.environment import build_relay_app as build
    elif config.role == "agent":
        from fakes.gym.agent import build_app as build
    elif config.role == "resources":
        from fakes.gym.resources import build_app as build
    elif config.workers > 1:
        from fakes.gym.model_workers import build_worker_app as build
    else:
        from fakes.gym.model import build_app as build
    return build(config)


def serve_workers(
    config: ServerConfig,
    listening: socket.socket | Callable[[], socket.socket | None] | None = None,
    app_config: Any = None,
    on_serving: Callable[[], None] | None = None,
) -> int:
    """Run a server with several workers in this process, as their coordinator; the exit code. `listening` is its
    listening socket, or what gives it once the workers are built (bound here if None); `app_config` uvicorn's
    config with the worker app (built if None); `on_serving` runs once every worker has registered."""
    from fakes.gym.model_workers import serve

    return serve(config, listening, app_config, on_serving)


def main() -> None:
    config = ServerConfig.from_env()
    if config.workers > 1:
        raise SystemExit(serve_workers(config))
    uvicorn.run(
        build_app(config),
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )


if __name__ == "__main__":
    main()
