"""The warm-up requests (`fakes.gym.serve.touch_stateless_routes`) leave FastAPI nothing to build on a child's
first request of any route: a server lives for one example, so each route's first request is most of them."""

from __future__ import annotations

import tempfile
from typing import Any

import fastapi.routing
import httpx
import pytest

from fakes.gym.config import ROLES, ServerConfig
from fakes.gym.serve import build_app, touch_stateless_routes

PEER = "http://127.0.0.1:9"  # never reached: the requests below stop at routing
# Paths a served example sends: control, rollout, model and test-control routes, and one no route serves.
PATHS = ["/ng-control/v1/checkpoint/prepare", "/run", "/v1/chat/completions", "/_ctl/clock", "/seed_session", "/no"]
LAZY_ROUTER = getattr(fastapi.routing, "_IncludedRouter", None)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _app(role: str) -> Any:
    peers = {"resources": PEER, "agent": PEER, "environment": PEER, "policy_model": PEER}
    config = ServerConfig(
        name=role, role=role, port=1, token="t", backend_url=PEER, capture_dir=tempfile.mkdtemp(), peers=peers
    )
    return build_app(config)


async def _options(app: Any) -> None:
    """OPTIONS on each path: matched against every route, none of whose endpoints runs."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        for path in PATHS:
            await client.request("OPTIONS", path)


@pytest.mark.anyio
@pytest.mark.skipif(LAZY_ROUTER is None, reason="this FastAPI copies included routes at once: nothing is lazy")
@pytest.mark.parametrize("role", ["environment", "agent", "resources", "policy_model"])
async def test_after_the_warm_up_no_request_builds_route_state(role: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert role in ROLES
    built: list[Any] = []
    build = LAZY_ROUTER._build_effective_context  # type: ignore[union-attr]
    monkeypatch.setattr(
        LAZY_ROUTER, "_build_effective_context", lambda self, route: built.append(route) or build(self, route)
    )
    app = _app(role)

    await touch_stateless_routes(app)
    warmed = len(built)
    await _options(app)

    assert warmed > 0
    assert built[warmed:] == []
