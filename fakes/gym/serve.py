"""Entry point of one look-alike server process: `python -m fakes.gym.serve` with `CKPT_FAKES_SERVER` set."""

from __future__ import annotations

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
    else:
        from fakes.gym.model import build_app as build
    return build(config)


def main() -> None:
    config = ServerConfig.from_env()
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
