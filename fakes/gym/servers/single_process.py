"""A participant server as one process: its role's routes and participant, with the control plane beside them.

Each role (`environment`, `agent`, `resources`) builds its routes and participant once, over a `ServerPlane`
(`build_parts`); here the plane is the server's own `ControlPlane`, and in a worker of several it is the worker's
view of its coordinator (`fakes.gym.servers.participant_workers`).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from fakes.gym.config import ServerConfig
from fakes.gym.control.participant import LatePlane, Participant, ServerPlane
from fakes.gym.control.plane import ControlPlane
from fakes.gym.protocol.http import add_health

BuildParts = Callable[[ServerConfig, ServerPlane], tuple[FastAPI, Participant]]


def single_process_app(config: ServerConfig, build_parts: BuildParts) -> FastAPI:
    """The role's app with health and the control routes, its plane the control plane over its participant."""
    plane = LatePlane()
    app, participant = build_parts(config, plane)
    control_plane = ControlPlane.from_config(participant, config)
    plane.target = control_plane
    add_health(app)
    app.include_router(control_plane.router())
    return app
