"""A call that drives the deployment and fails is a harness error naming the call, its status and what the checker was
doing, never a raw exception that ends a search (`ckpt_model.protocol.http.control_call`).

Each path is tried against a fake transport (`httpx.MockTransport`) that answers 409, 500, a reply that is not JSON,
or refuses the connection: the backend's gate (the checker's own HTTP), and a deployment's clock and fault
capabilities whose routes fail inside the deployment (as the look-alike's `_look_alike_route` raises). The verdict
is then "could not judge" (exit 2), where the same raw httpx error was "unexpected"."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ckpt_model.deployments.clocks import Clocks
from ckpt_model.deployments.faults import Faults
from ckpt_model.deployments.gate import BackendGate
from ckpt_model.errors import ControlCallFailed
from ckpt_model.protocol.http import DETAIL_SHOWN_CHARS, checked_json, control_call
from ckpt_model.results.verdicts import Exit, failure_report, kind_of

BACKEND = "http://127.0.0.1:4000"
SERVER = "http://127.0.0.1:4001"
Handler = Callable[[httpx.Request], httpx.Response]


def refusing(status: int, body: Any = None, *, text: str | None = None) -> Handler:
    def answer(request: httpx.Request) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)

    return answer


def unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def gate_answering(handler: Handler) -> BackendGate:
    return BackendGate(BACKEND, httpx.Client(transport=httpx.MockTransport(handler)))


CONFLICT = {"error": {"code": "not_waiting", "detail": "call 3 is not waiting"}}


# --- the checker's own HTTP: the backend's gate --------------------------------------------------------------------


def test_a_refused_release_names_the_route_the_status_and_the_detail() -> None:
    gate = gate_answering(refusing(409, CONFLICT))

    with pytest.raises(ControlCallFailed) as failed:
        gate.release([3])

    error = failed.value
    assert (error.call, error.status) == (f"POST {BACKEND}/_ctl/step", 409)
    assert error.detail == "not_waiting: call 3 is not waiting"
    assert error.doing == "releasing the backend's calls [3]"
    assert f"POST {BACKEND}/_ctl/step answered HTTP 409 Conflict: not_waiting: call 3 is not waiting" in str(error)


def test_a_backend_error_names_its_status_and_a_shortened_body() -> None:
    gate = gate_answering(refusing(500, text="Internal Server Error " + "x" * 1000))

    with pytest.raises(ControlCallFailed) as failed:
        gate.staged()

    assert (failed.value.call, failed.value.status) == (f"GET {BACKEND}/_ctl/staged", 500)
    assert failed.value.detail.startswith("Internal Server Error xxx")
    assert len(failed.value.detail) == DETAIL_SHOWN_CHARS


def test_a_reply_that_is_not_json_names_the_route() -> None:
    gate = gate_answering(refusing(200, text="<html>a proxy's page</html>"))

    with pytest.raises(ControlCallFailed) as failed:
        gate.cuts()

    assert failed.value.call == f"GET {BACKEND}/_ctl/cuts"
    assert failed.value.status is None
    assert "not JSON" in failed.value.detail
    assert "a proxy's page" in failed.value.detail


def test_a_refused_connection_names_the_route_and_no_status() -> None:
    gate = gate_answering(unreachable)

    with pytest.raises(ControlCallFailed) as failed:
        gate.reset()

    assert (failed.value.call, failed.value.status) == (f"POST {BACKEND}/_ctl/reset", None)
    assert failed.value.detail == "ConnectError: [Errno 111] Connection refused"
    assert "failed: ConnectError" in str(failed.value)


def test_a_gate_that_answers_passes_its_reply_through() -> None:
    gate = gate_answering(refusing(200, {"released": [3], "waiting": 0}))

    assert gate.release([3]) == {"released": [3], "waiting": 0}


# --- a deployment's capabilities, whose routes fail inside the deployment ---------------------------------------------


class RoutedDeployment:
    """A deployment whose clock and fault capabilities call routes of its own, as the look-alike does, and raise the
    HTTP error of a refused one (`raise_for_status`)."""

    topology = "native"
    verify_mode = "wait"
    faults: tuple[str, ...] = ()
    lease_grace_s = 5.0
    skews_clocks = True

    def __init__(self, handler: Handler) -> None:
        self.http = httpx.Client(transport=httpx.MockTransport(handler))

    def _route(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.http.post(f"{SERVER}{path}", json=body or {})
        response.raise_for_status()
        return dict(response.json())

    def skew_clock(self, name: str, offset_s: float) -> float:
        return float(self._route("/_ctl/clock", {"offset_s": offset_s})["time"])

    def fail_hook(self, name: str, hook: str) -> None:
        self._route("/_ctl/hooks", {"hook": hook})

    def failed_hooks(self, name: str) -> int:
        return int(self._route("/_ctl/hooks")["failed"])

    def pause_server(self, name: str) -> None:
        raise ProcessLookupError(3, "No such process")

    def continue_server(self, name: str) -> None:
        pass


def clocks_of(deployment: RoutedDeployment) -> Clocks:
    return Clocks(deployment, lambda: "native", lambda: ["agent"])  # type: ignore[arg-type]


def test_a_refused_clock_move_names_the_route_the_capability_and_what_it_moved() -> None:
    refusal = {"error": {"code": "checkpoint_error", "detail": "agent runs without libfaketime"}}
    clocks = clocks_of(RoutedDeployment(refusing(409, refusal)))

    with pytest.raises(ControlCallFailed) as failed:
        clocks.skew_clock("agent", 8.0)

    error = failed.value
    assert error.call == f"POST {SERVER}/_ctl/clock (in skew_clock('agent', +8))"
    assert (error.status, error.detail) == (409, "checkpoint_error: agent runs without libfaketime")
    assert error.doing == "moving agent's clock +8 s from the true time (0 s passed, skewed +8 s)"


@pytest.mark.parametrize(
    ("handler", "call", "status"),
    [
        (refusing(500, {"detail": "boom"}), f"POST {SERVER}/_ctl/hooks (in fail_hook('agent', 'export'))", 500),
        (unreachable, f"POST {SERVER}/_ctl/hooks (in fail_hook('agent', 'export'))", None),
        # The deployment's own JSON decoding names no URL: the capability names the call.
        (refusing(200, text="not json"), "fail_hook('agent', 'export')", None),
    ],
    ids=["500", "refused", "not-json"],
)
def test_a_failing_fault_route_names_its_call(handler: Handler, call: str, status: int | None) -> None:
    deployment = RoutedDeployment(handler)
    faults = Faults(deployment, clocks_of(deployment), lambda: "native")  # type: ignore[arg-type]

    with pytest.raises(ControlCallFailed) as failed:
        faults.fail_hook("agent", "export")

    assert (failed.value.call, failed.value.status) == (call, status)
    assert failed.value.doing == "arming agent's export hook to fail"


def test_a_capability_that_fails_without_http_is_named_by_the_capability() -> None:
    deployment = RoutedDeployment(refusing(200, {}))
    faults = Faults(deployment, clocks_of(deployment), lambda: "native")  # type: ignore[arg-type]

    with pytest.raises(ControlCallFailed) as failed:
        faults.pause_server("agent")

    assert failed.value.call == "pause_server('agent')"
    assert failed.value.detail == "ProcessLookupError: [Errno 3] No such process"


def test_a_reply_missing_its_field_is_a_failed_control_call() -> None:
    deployment = RoutedDeployment(refusing(200, {"armed": []}))
    faults = Faults(deployment, clocks_of(deployment), lambda: "native")  # type: ignore[arg-type]

    with pytest.raises(ControlCallFailed) as failed:
        faults.failed_hooks("agent")

    assert failed.value.call == "failed_hooks('agent')"
    assert failed.value.detail == "KeyError: 'failed'"


def test_in_the_checkers_own_code_an_error_that_is_not_http_passes() -> None:
    """Without a capability, a ValueError in the block is the checker's own bug: it stays unexpected."""
    with pytest.raises(ValueError, match="a bug"), control_call("doing something"):
        raise ValueError("a bug")


def test_checked_json_raises_for_an_error_status() -> None:
    response = httpx.Response(404, json={"detail": "Not Found"}, request=httpx.Request("GET", f"{SERVER}/x"))

    with pytest.raises(ControlCallFailed) as failed, control_call("reading x"):
        checked_json(response)

    assert (failed.value.call, failed.value.status, failed.value.detail) == (f"GET {SERVER}/x", 404, "Not Found")


# --- what the run reports ----------------------------------------------------------------------------------------


def test_a_failed_control_call_is_could_not_judge_where_the_raw_error_was_unexpected() -> None:
    gate = gate_answering(refusing(409, CONFLICT))
    with pytest.raises(ControlCallFailed) as failed:
        gate.release([3])
    raw = failed.value.__cause__
    assert isinstance(raw, httpx.HTTPStatusError)

    assert kind_of(failed.value) == "harness"
    code, text = failure_report(failed.value)
    assert code == Exit.UNJUDGED == 2
    assert "=== could not judge: the harness could not do its job" in text
    assert f"POST {BACKEND}/_ctl/step answered HTTP 409 Conflict" in text
    assert text.endswith("COULD NOT JUDGE: harness")
    # The negative control: the raw error, as it escaped before, is a checker bug.
    assert kind_of(raw) == "unexpected"
    assert failure_report(raw)[1].endswith("COULD NOT JUDGE: unexpected")


def test_the_rule_is_named_once_and_survives_pickling() -> None:
    error = ControlCallFailed(doing="moving agent's clock", call=f"POST {SERVER}/_ctl/clock", status=409, detail="no")

    error.during("skewed_clock(victim=1, behind=False), step 17")
    error.during("an outer rule, step 17")

    assert error.rule == "skewed_clock(victim=1, behind=False), step 17"
    assert str(error).splitlines()[-1] == "  rule:  skewed_clock(victim=1, behind=False), step 17"
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy)) == (ControlCallFailed, str(error))
