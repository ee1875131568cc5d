"""Calls straight to a callee for a retired attempt: Gym's routes with the rollout prefix, journaled, and a
generation call a policy model wrongly admits released at the backend instead of left waiting."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from ckpt_model.model.contract import Attempt
from ckpt_model.protocol.client import Participant
from ckpt_model.protocol.history import History
from ckpt_model.trainer.callees import GENERATION_ROUTE, Callees

RETIRED = Attempt(rollout="r0", attempt=1, status="retired", script=(2, 4), run=1)
RESOURCES = Participant(name="resources", kind="resources", url="http://resources")
POLICY = Participant(name="policy_model", kind="model", url="http://policy")
STALE = {"error": {"code": "stale_attempt", "detail": "attempt r0-a1 is retired"}}


class Backend:
    """A gated backend's call log: a call waits until released."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.released = threading.Event()

    def calls(self) -> list[dict[str, Any]]:
        return list(self.log)

    def release(self, indices: list[int]) -> None:
        for index in indices:
            self.log[index]["waiting"] = False
        self.released.set()


class Harness:
    def __init__(self, handler: Any) -> None:
        self.backend = Backend()
        self.run_http = httpx.Client(transport=httpx.MockTransport(handler))


class Runs:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2)

    def submit(self, call: Any, *args: Any) -> Future[Any]:
        return self.pool.submit(call, *args)


def callees_for(handler: Any) -> tuple[Callees, Harness, History]:
    harness, history = Harness(handler), History()
    return Callees(harness, history, Runs(), timeout_s=5.0), harness, history  # type: ignore[arg-type]


def test_resources_calls_use_the_rollout_prefix_and_are_journaled_under_the_attempt() -> None:
    seen: list[tuple[str, bytes]] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.content))
        return httpx.Response(409, json=STALE)

    callees, _, history = callees_for(refuse)
    tool = {"name": "get_weather", "arguments": {"city": "SF"}}
    outcomes = callees.resources_calls(RETIRED, [RESOURCES], tool)

    assert [path for path, _ in seen] == ["/ng-rollout/r0-a1/get_weather", "/ng-rollout/r0-a1/verify"]
    assert seen[0][1] == b'{"city":"SF"}'
    assert {call: (o.status_code, o.body) for call, o in outcomes.items()} == {
        "resources /get_weather": (409, STALE),
        "resources /verify": (409, STALE),
    }
    assert [(e.process, e.f, e.type) for e in history.events] == [
        ("r0-a1", "callee", t) for t in ("invoke", "fail") * 2
    ]


def test_a_refused_generation_call_is_answered_without_a_release() -> None:
    callees, harness, _ = callees_for(lambda request: httpx.Response(409, json=STALE))
    (outcome,) = callees.generation_calls(RETIRED, [POLICY]).values()

    assert (outcome.status_code, outcome.body) == (409, STALE)
    assert not harness.backend.released.is_set()


def test_an_admitted_generation_call_is_released_at_the_backend_and_its_reply_shows_it_was_served() -> None:
    harness_box: list[Harness] = []

    def admit(request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/ng-rollout/r0-a1{GENERATION_ROUTE}"
        backend = harness_box[0].backend
        backend.log.append({"capture_key": "r0-a1", "n_messages": 1, "waiting": True, "index": len(backend.log)})
        assert backend.released.wait(5.0), "the checker never released the admitted call"
        return httpx.Response(200, json={"choices": []})

    callees, harness, _ = callees_for(admit)
    harness_box.append(harness)
    (outcome,) = callees.generation_calls(RETIRED, [POLICY]).values()

    assert outcome.status_code == 200
    assert harness.backend.log[0]["waiting"] is False


def test_without_a_gated_backend_no_generation_call_is_sent() -> None:
    def never(request: httpx.Request) -> httpx.Response:
        pytest.fail(f"sent {request.url}")

    callees, harness, _ = callees_for(never)
    harness.backend = None  # type: ignore[assignment]
    assert callees.generation_calls(RETIRED, [POLICY]) == {}
