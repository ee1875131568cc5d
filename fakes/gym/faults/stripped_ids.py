"""The planted fault `agent_strips_checkpoint_ids`: an agent that strips the whitespace around a control body's
`checkpoint_id` before the body is validated (as pydantic's `str_strip_whitespace` would, set on a model for
convenience).

Gym validates the ID as sent (reference 2.2), so `c1\\n` or ` c1` is a 422 that changes nothing; this agent takes
it as `c1`, and a prepare, a resume or any other call then acts on, or refuses as, a checkpoint the controller never
named. It is an ASGI middleware ahead of the routes, so the routes and their body models stay Gym's.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fakes.gym.protocol.wire import CHECKPOINT_ROUTE_PREFIX

STRIPS_CHECKPOINT_IDS = "agent_strips_checkpoint_ids"


class StripsCheckpointIds:
    """Rewrites each control POST's body with its `checkpoint_id` stripped of surrounding whitespace."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not scope["path"].startswith(CHECKPOINT_ROUTE_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        body = _stripped(await _whole_body(receive))
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(name, value) for name, value in scope["headers"] if name != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.app({**scope, "headers": headers}, replay, send)


async def _whole_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _stripped(body: bytes) -> bytes:
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return body
    if not (isinstance(parsed, dict) and isinstance(parsed.get("checkpoint_id"), str)):
        return body
    return json.dumps({**parsed, "checkpoint_id": parsed["checkpoint_id"].strip()}).encode()
