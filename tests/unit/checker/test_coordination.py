"""The controller client against a scripted deployment behind `httpx.MockTransport`.

Every test reads what went over the wire (order, bodies, headers, timeouts), not the client's internals.
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest

from ckpt_model.errors import CoordinationError, ParticipantFailure, ProtocolError
from ckpt_model.protocol.client import ControlClient, Participant, Participants, PrepareResult
from ckpt_model.protocol.http import PerThreadTransport, new_http_client, shared_tls_context
from ckpt_model.protocol.wire import EpisodeId

TOKEN = "test-token"
NOW_TS = 1_000.0
DEADLINE_TS = 1_010.0

# name -> kind, deliberately listed out of order: the client must sort by (PREPARE_ORDER index, name).
KINDS = {
    "weather": "resources",
    "agent0": "agent",
    "policy": "model",
    "env1": "environment",
    "env0": "environment",
}
PREPARE_STAGE = {"environment": 0, "model": 1, "agent": 2, "resources": 3}
RETIRE_STAGE = {"environment": 0, "agent": 1, "model": 2, "resources": 2}
EMPTY_REPORT = {"ready": True, "blockers": [], "blocker_count": 0, "counts": {}, "restarts": []}

Handler = Callable[[httpx.Request], httpx.Response]


@attrs.frozen
class Call:
    server: str
    method: str
    operation: str
    body: Any
    authorization: str | None
    timeout: dict[str, float]


class FakeClock:
    def __init__(self, now_ts: float) -> None:
        self.now_ts = now_ts

    def __call__(self) -> float:
        return self.now_ts


class FakeDeployment:
    """Answers every control route like a healthy participant unless a test overrides (server, operation)."""

    def __init__(self, kinds: dict[str, str]) -> None:
        self.kinds = kinds
        self.calls: list[Call] = []
        self.overrides: dict[tuple[str, str], Handler] = {}
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        server = request.url.host.removesuffix(".test")
        operation = request.url.path.rsplit("/", 1)[-1]
        body = json.loads(request.content) if request.content else None
        call = Call(
            server=server,
            method=request.method,
            operation=operation,
            body=body,
            authorization=request.headers.get("authorization"),
            timeout=request.extensions["timeout"],
        )
        with self._lock:
            self.calls.append(call)
        override = self.overrides.get((server, operation))
        if override is not None:
            return override(request)
        return httpx.Response(200, json=self.reply(server, operation, body))

    def reply(self, server: str, operation: str, body: Any) -> dict[str, Any]:
        if operation == "status":
            return {
                "kind": self.kinds[server],
                "instance": server,
                "phase": "idle",
                "checkpoint_id": None,
                "lease_expires_at": None,
                "retired_rollouts": 0,
                "report": EMPTY_REPORT,
            }
        keys = [EpisodeId(**episode).capture_key for episode in (body or {}).get("episode_ids") or []]
        return {
            "prepare": {"phase": "prepared", "report": EMPTY_REPORT},
            "renew": {"lease_expires_at": 1_600.0},
            "commit": {
                "phase": "committed",
                "manifest": {"checkpoint_id": "c1"},
                "episode_ids": sorted(keys),
            },
            "restore": {"phase": "restored", "source_checkpoint_id": "c1", "restored": sorted(keys)},
            "resume": {"phase": "idle", "idempotent": False},
            "retire": {"retired": keys},
            "forget": {"forgotten": (body or {}).get("rollout_ids")},
        }[operation]

    def servers(self, operation: str) -> list[str]:
        return [call.server for call in self.calls if call.operation == operation]

    def sequence(self) -> list[tuple[str, str]]:
        return [(call.operation, call.server) for call in self.calls]


def reply_with(status: int, body: Any) -> Handler:
    return lambda _request: httpx.Response(status, json=body)


def gym_error(status: int, code: str, detail: str) -> Handler:
    return reply_with(status, {"error": {"code": code, "detail": detail}})


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def stages(servers: list[str], stage_of_kind: dict[str, int]) -> list[int]:
    return [stage_of_kind[KINDS[server]] for server in servers]


def participants_of(kinds: dict[str, str]) -> Participants:
    return Participants(Participant(name=name, kind=kind, url=f"http://{name}.test") for name, kind in kinds.items())


@pytest.fixture
def deployment() -> FakeDeployment:
    return FakeDeployment(dict(KINDS))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_TS)


@pytest.fixture
def client(deployment: FakeDeployment, clock: FakeClock) -> Iterator[ControlClient]:
    with ControlClient(
        TOKEN, participants_of(KINDS), transport=httpx.MockTransport(deployment), clock=clock
    ) as control:
        yield control


R0 = EpisodeId(rollout_id="r0")
R1_A2 = EpisodeId(rollout_id="r1", attempt=2)


# --- participants ------------------------------------------------------------------------------------------


def test_participants__sorted_by_prepare_order_then_name() -> None:
    participants = participants_of(KINDS)

    assert participants.names() == ("env0", "env1", "policy", "agent0", "weather")
    assert [p.name for p in participants.of_kind("environment")] == ["env0", "env1"]
    assert participants.of_kind("agent") == (Participant(name="agent0", kind="agent", url="http://agent0.test"),)


def test_participants__refuse_unknown_kind_and_duplicate_names() -> None:
    with pytest.raises(ValueError, match="'kind' must be one of"):
        Participant(name="judge", kind="judge", url="http://judge.test")
    with pytest.raises(ValueError, match="unique"):
        Participants([Participant("a", "model", "http://a"), Participant("a", "agent", "http://b")])


# --- prepare -----------------------------------------------------------------------------------------------


def test_prepare__contacts_stages_in_prepare_order(client: ControlClient, deployment: FakeDeployment) -> None:
    result = client.prepare("c1", DEADLINE_TS)

    assert result.prepared
    called = deployment.servers("prepare")
    assert sorted(called) == sorted(KINDS)
    assert stages(called, PREPARE_STAGE) == sorted(stages(called, PREPARE_STAGE))
    assert list(result.replies) == sorted(KINDS)
    assert result.blockers() == {}


def test_prepare__stops_at_first_unprepared_stage(client: ControlClient, deployment: FakeDeployment) -> None:
    blocked = {
        "phase": "preparing",
        "report": {**EMPTY_REPORT, "ready": False, "blockers": ["r3-a1"], "blocker_count": 1},
    }
    deployment.overrides["policy", "prepare"] = reply_with(200, blocked)

    result = client.prepare("c1", DEADLINE_TS)

    assert not result.prepared
    assert sorted(deployment.servers("prepare")) == ["env0", "env1", "policy"]
    assert result.blockers() == {"policy": ["r3-a1"]}
    assert list(result.replies) == ["env0", "env1", "policy"]


def test_prepare__stage_failure_raises_and_stops(client: ControlClient, deployment: FakeDeployment) -> None:
    deployment.overrides["env1", "prepare"] = gym_error(409, "checkpoint_conflict", "c0 is active")

    with pytest.raises(CoordinationError) as caught:
        client.prepare("c1", DEADLINE_TS)

    assert str(caught.value) == (
        "checkpoint prepare failed on 1 participant(s): env1: HTTP 409 checkpoint_conflict c0 is active"
    )
    assert set(caught.value.replies) == {"env0"}
    assert sorted(deployment.servers("prepare")) == ["env0", "env1"]


def test_prepare_result__restarts_and_continued() -> None:
    report = {**EMPTY_REPORT, "restarts": ["r1-a2", "r5"]}
    result = PrepareResult(
        prepared=True,
        replies={
            "env0": {"phase": "prepared", "report": report},
            "policy": {"phase": "prepared", "report": report},
        },
    )

    assert result.restarts() == {R1_A2, EpisodeId(rollout_id="r5")}
    assert result.continued([R1_A2, R0, EpisodeId(rollout_id="r1", attempt=1)]) == [
        R0,
        EpisodeId(rollout_id="r1", attempt=1),
    ]


# --- commit ------------------------------------------------------------------------------------------------


def test_commit__one_fan_out_with_exact_body(client: ControlClient, deployment: FakeDeployment) -> None:
    replies = client.commit("c1", "/ckpt/c1", [R0, R1_A2], DEADLINE_TS)

    assert sorted(deployment.servers("commit")) == sorted(KINDS)
    assert list(replies) == sorted(KINDS)
    assert replies["policy"]["episode_ids"] == ["r0", "r1-a2"]
    expected_body = {
        "checkpoint_id": "c1",
        "deadline_ts": DEADLINE_TS,
        "checkpoint_dir": "/ckpt/c1",
        "episode_ids": [{"rollout_id": "r0", "attempt": 0}, {"rollout_id": "r1", "attempt": 2}],
    }
    assert all(call.body == expected_body for call in deployment.calls)


def test_commit__aggregates_failures_with_status_code_and_detail(
    client: ControlClient, deployment: FakeDeployment
) -> None:
    deployment.overrides["policy", "commit"] = gym_error(409, "restart_in_scope", "r1-a2 is a restart")
    deployment.overrides["weather", "commit"] = reply_with(
        422, {"detail": [{"type": "missing", "loc": ["body", "checkpoint_dir"], "msg": "Field required"}]}
    )
    deployment.overrides["env1", "commit"] = refused

    with pytest.raises(CoordinationError) as caught:
        client.commit("c1", "/ckpt/c1", [R0, R1_A2], DEADLINE_TS)

    error = caught.value
    assert error.operation == "commit"
    assert error.failures["policy"] == ParticipantFailure("policy", 409, "restart_in_scope", "r1-a2 is a restart")
    assert error.failures["env1"].http_status is None
    assert str(error) == (
        "checkpoint commit failed on 3 participant(s): "
        "env1: transport error ConnectError: connection refused; "
        "policy: HTTP 409 restart_in_scope r1-a2 is a restart; "
        "weather: HTTP 422 body.checkpoint_dir: Field required"
    )
    assert set(error.replies) == {"env0", "agent0"}
    assert sorted(deployment.servers("commit")) == sorted(KINDS)


# --- resume ------------------------------------------------------------------------------------------------


def test_resume__reverse_order_continues_after_failures(client: ControlClient, deployment: FakeDeployment) -> None:
    deployment.overrides["weather", "resume"] = gym_error(409, "stale_checkpoint", "c1 was resumed")
    deployment.overrides["policy", "resume"] = refused

    with pytest.raises(CoordinationError) as caught:
        client.resume("c1", DEADLINE_TS)

    called = deployment.servers("resume")
    assert sorted(called) == sorted(KINDS)
    assert stages(called, PREPARE_STAGE) == sorted(stages(called, PREPARE_STAGE), reverse=True)
    assert called[0] == "weather"
    assert set(caught.value.failures) == {"weather", "policy"}
    assert list(caught.value.replies) == ["agent0", "env0", "env1"]
    assert "weather: HTTP 409 stale_checkpoint c1 was resumed" in str(caught.value)


def test_resume__returns_every_reply_sorted(client: ControlClient, deployment: FakeDeployment) -> None:
    replies = client.resume("c1", DEADLINE_TS)

    assert list(replies) == sorted(KINDS)
    assert all(call.body == {"checkpoint_id": "c1", "deadline_ts": DEADLINE_TS} for call in deployment.calls)


# --- restore -----------------------------------------------------------------------------------------------


def test_restore__failure_retires_next_attempts_then_resumes_then_reraises(
    client: ControlClient, deployment: FakeDeployment
) -> None:
    deployment.overrides["policy", "restore"] = gym_error(422, "invalid_checkpoint_state", "manifest missing")

    with pytest.raises(CoordinationError) as caught:
        client.restore("c2", "/ckpt/c1", [R0, R1_A2], DEADLINE_TS)

    assert caught.value.operation == "restore"
    assert set(caught.value.failures) == {"policy"}
    assert not getattr(caught.value, "__notes__", [])
    operations = [operation for operation, _ in deployment.sequence()]
    assert operations == ["restore"] * 5 + ["retire"] * 5 + ["resume"] * 5
    retired = deployment.servers("retire")
    assert stages(retired, RETIRE_STAGE) == sorted(stages(retired, RETIRE_STAGE))
    cleanup_deadline_ts = NOW_TS + 30
    retire_body = next(call.body for call in deployment.calls if call.operation == "retire")
    assert retire_body == {
        "checkpoint_id": "c2",
        "deadline_ts": cleanup_deadline_ts,
        "episode_ids": [{"rollout_id": "r0", "attempt": 1}, {"rollout_id": "r1", "attempt": 3}],
    }
    resumed = deployment.servers("resume")
    assert stages(resumed, PREPARE_STAGE) == sorted(stages(resumed, PREPARE_STAGE), reverse=True)
    resume_body = next(call.body for call in deployment.calls if call.operation == "resume")
    assert resume_body == {"checkpoint_id": "c2", "deadline_ts": cleanup_deadline_ts}


def test_restore__cleanup_failures_become_notes_and_resume_still_runs(
    client: ControlClient, deployment: FakeDeployment, clock: FakeClock
) -> None:
    clock.now_ts = 900.0  # the restore's own deadline is later than now + 30: it is kept for the cleanup
    deployment.overrides["weather", "restore"] = gym_error(422, "invalid_checkpoint_state", "bad record")
    deployment.overrides["agent0", "retire"] = gym_error(409, "invalid_phase", "resume first")
    deployment.overrides["env0", "resume"] = refused

    with pytest.raises(CoordinationError) as caught:
        client.restore("c2", "/ckpt/c1", [R0], DEADLINE_TS)

    assert caught.value.operation == "restore"
    notes = caught.value.__notes__
    assert len(notes) == 2
    assert notes[0].startswith("cleanup retire after the failed restore also failed: checkpoint retire failed")
    assert "agent0: HTTP 409 invalid_phase resume first" in notes[0]
    assert notes[1].startswith("cleanup resume after the failed restore also failed: checkpoint resume failed")
    assert sorted(deployment.servers("retire")) == ["agent0", "env0", "env1"]
    assert sorted(deployment.servers("resume")) == sorted(KINDS)
    assert all(call.body["deadline_ts"] == DEADLINE_TS for call in deployment.calls)


def test_restore__success_returns_replies_without_cleanup(client: ControlClient, deployment: FakeDeployment) -> None:
    replies = client.restore("c2", "/ckpt/c1", [], DEADLINE_TS)

    assert list(replies) == sorted(KINDS)
    assert {operation for operation, _ in deployment.sequence()} == {"restore"}
    assert deployment.calls[0].body == {
        "checkpoint_id": "c2",
        "deadline_ts": DEADLINE_TS,
        "checkpoint_dir": "/ckpt/c1",
        "episode_ids": [],
    }


# --- retire and forget -------------------------------------------------------------------------------------


def test_retire__stages_in_retire_order(client: ControlClient, deployment: FakeDeployment) -> None:
    replies = client.retire("c0", [R1_A2], DEADLINE_TS)

    called = deployment.servers("retire")
    assert sorted(called) == sorted(KINDS)
    assert stages(called, RETIRE_STAGE) == sorted(stages(called, RETIRE_STAGE))
    assert list(replies) == sorted(KINDS)
    assert replies["policy"] == {"retired": ["r1-a2"]}


def test_retire__failing_stage_stops_later_stages(client: ControlClient, deployment: FakeDeployment) -> None:
    deployment.overrides["agent0", "retire"] = gym_error(409, "invalid_phase", "resume first")

    with pytest.raises(CoordinationError) as caught:
        client.retire("c0", [R0], DEADLINE_TS)

    assert caught.value.operation == "retire"
    assert deployment.servers("retire")[2:] == ["agent0"]
    assert sorted(deployment.servers("retire")) == ["agent0", "env0", "env1"]


def test_retire_and_forget__empty_lists_send_nothing(client: ControlClient, deployment: FakeDeployment) -> None:
    assert client.retire("c0", [], DEADLINE_TS) == {}
    assert client.forget("c0", [], DEADLINE_TS) == {}
    assert deployment.calls == []


def test_forget__deduplicates_sorts_and_uses_retire_order(client: ControlClient, deployment: FakeDeployment) -> None:
    client.forget("c0", ["r2", "r0", "r2", "r10"], DEADLINE_TS)

    called = deployment.servers("forget")
    assert stages(called, RETIRE_STAGE) == sorted(stages(called, RETIRE_STAGE))
    assert sorted(called) == sorted(KINDS)
    assert all(
        call.body == {"checkpoint_id": "c0", "deadline_ts": DEADLINE_TS, "rollout_ids": ["r0", "r10", "r2"]}
        for call in deployment.calls
    )


# --- renew and status --------------------------------------------------------------------------------------


def test_renew__fans_out_to_everyone(client: ControlClient, deployment: FakeDeployment) -> None:
    replies = client.renew("c1", DEADLINE_TS)

    assert sorted(deployment.servers("renew")) == sorted(KINDS)
    assert replies["weather"] == {"lease_expires_at": 1_600.0}


def test_status__get_with_bearer(client: ControlClient, deployment: FakeDeployment) -> None:
    reply = client.status(client.participants.of_kind("model")[0])

    assert reply["kind"] == "model"
    assert deployment.calls == [Call("policy", "GET", "status", None, f"Bearer {TOKEN}", deployment.calls[0].timeout)]


def test_status_all__keyed_by_sorted_name(client: ControlClient, deployment: FakeDeployment) -> None:
    deployment.overrides["env1", "status"] = gym_error(503, "checkpoint_coordinator_unavailable", "no coordinator")

    with pytest.raises(CoordinationError) as caught:
        client.status_all()

    assert set(caught.value.failures) == {"env1"}
    deployment.overrides.clear()
    assert list(client.status_all()) == sorted(KINDS)


# --- wire details ------------------------------------------------------------------------------------------


def test_every_call_carries_the_bearer(client: ControlClient, deployment: FakeDeployment) -> None:
    client.prepare("c1", DEADLINE_TS)
    client.commit("c1", "/ckpt/c1", [R0], DEADLINE_TS)
    client.resume("c1", DEADLINE_TS)
    client.status_all()

    assert len(deployment.calls) == 4 * len(KINDS)
    assert {call.authorization for call in deployment.calls} == {f"Bearer {TOKEN}"}
    assert {call.method for call in deployment.calls if call.operation != "status"} == {"POST"}


def test_timeout_is_time_to_deadline_plus_margin(
    client: ControlClient, deployment: FakeDeployment, clock: FakeClock
) -> None:
    client.renew("c1", DEADLINE_TS)
    clock.now_ts = DEADLINE_TS + 100  # a deadline that has passed still gets the margin, never a negative timeout
    client.renew("c1", DEADLINE_TS)

    timeouts = [call.timeout["read"] for call in deployment.calls]
    assert timeouts == [15.0] * len(KINDS) + [5.0] * len(KINDS)
    assert all(set(call.timeout.values()) == {call.timeout["read"]} for call in deployment.calls)


def test_urls_use_the_checkpoint_route_prefix(clock: FakeClock) -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(str(request.url))
        return httpx.Response(200, json={"lease_expires_at": 1.0})

    members = Participants([Participant("policy", "model", "http://127.0.0.1:20001/")])
    with ControlClient(TOKEN, members, transport=httpx.MockTransport(handler), clock=clock) as control:
        control.renew("c1", DEADLINE_TS)

    assert paths == ["http://127.0.0.1:20001/ng-control/v1/checkpoint/renew"]


def test_malformed_reply_is_a_protocol_error_listing_every_problem(
    client: ControlClient, deployment: FakeDeployment
) -> None:
    deployment.overrides["env0", "prepare"] = reply_with(200, {"phase": "ready", "report": {"ready": True}})

    with pytest.raises(ProtocolError) as caught:
        client.prepare("c1", DEADLINE_TS)

    problems = caught.value.problems
    assert problems[0] == "env0: 'phase' must be one of idle, preparing, prepared, committed, restored (got 'ready')"
    assert {"env0: 'report.blockers' field required", "env0: 'report.restarts' field required"} <= set(problems)


def test_non_json_error_body_keeps_its_text(client: ControlClient, deployment: FakeDeployment) -> None:
    deployment.overrides["policy", "renew"] = lambda _request: httpx.Response(502, text="Bad Gateway")

    with pytest.raises(CoordinationError, match=r"policy: HTTP 502 Bad Gateway$"):
        client.renew("c1", DEADLINE_TS)


# --- discovery ---------------------------------------------------------------------------------------------


def servers_of(names: list[str]) -> dict[str, str]:
    return {name: f"http://{name}.test" for name in names}


def test_discover__skips_404_and_sorts(deployment: FakeDeployment, clock: FakeClock) -> None:
    deployment.overrides["relay", "status"] = reply_with(404, {"detail": "Not Found"})
    with ControlClient(TOKEN, transport=httpx.MockTransport(deployment), clock=clock) as control:
        found = control.discover_from_servers(servers_of([*KINDS, "relay"]))

    assert found.names() == ("env0", "env1", "policy", "agent0", "weather")
    assert control.participants is found
    assert sorted(deployment.servers("status")) == sorted([*KINDS, "relay"])


def test_discover__without_a_model_fails(clock: FakeClock) -> None:
    deployment = FakeDeployment({"env0": "environment", "agent0": "agent"})
    with (
        ControlClient(TOKEN, transport=httpx.MockTransport(deployment), clock=clock) as control,
        pytest.raises(CoordinationError) as caught,
    ):
        control.discover_from_servers(servers_of(["env0", "agent0"]))

    assert str(caught.value) == (
        "checkpoint discover failed on 1 participant(s): deployment: no policy model takes part in checkpoints"
    )


def test_discover__unknown_kind_and_errors_fail(deployment: FakeDeployment, clock: FakeClock) -> None:
    deployment.kinds["judge"] = "judge"
    deployment.overrides["env1", "status"] = gym_error(401, "unauthorized", "bad bearer")
    with (
        ControlClient(TOKEN, transport=httpx.MockTransport(deployment), clock=clock) as control,
        pytest.raises(CoordinationError) as caught,
    ):
        control.discover_from_servers(servers_of([*KINDS, "judge"]))

    assert caught.value.operation == "discover"
    assert str(caught.value.failures["env1"].describe()) == "HTTP 401 unauthorized bad bearer"
    assert caught.value.failures["judge"].detail == "unknown participant kind 'judge'"


def test_discover__retries_connection_errors_three_times(deployment: FakeDeployment, clock: FakeClock) -> None:
    flaky_left = [2]

    def flaky(request: httpx.Request) -> httpx.Response:
        if flaky_left[0]:
            flaky_left[0] -= 1
            raise httpx.ConnectError("reset", request=request)
        return httpx.Response(200, json=deployment.reply("env1", "status", None))

    deployment.overrides["env1", "status"] = flaky
    deployment.overrides["weather", "status"] = refused
    with (
        ControlClient(TOKEN, transport=httpx.MockTransport(deployment), clock=clock) as control,
        pytest.raises(CoordinationError) as caught,
    ):
        control.discover_from_servers(servers_of(list(KINDS)))

    assert list(caught.value.failures) == ["weather"]
    assert deployment.servers("status").count("env1") == 3
    assert deployment.servers("status").count("weather") == 3


def test_from_head__reads_json_encoded_yaml_config(deployment: FakeDeployment, clock: FakeClock) -> None:
    config_yaml = "\n".join(
        [
            "head_server: {host: 127.0.0.1, port: 11000}",
            "checkpoint: {enabled: true, control_auth_token: test-token}",
            "policy: {responses_api_models: {vllm_model: {host: policy.test, port: 80, api_key: dummy}}}",
            "env0: {environment_servers: {single_agent_turn: {host: env0.test, port: 80}}}",
            "relay: {environment_servers: {legacy_agent: {host: relay.test, port: 80}}}",
            "agent0: {responses_api_agents: {simple_agent: {host: agent0.test, port: 80}}}",
            "weather: {resources_servers: {example_single_tool_call: {host: '0.0.0.0', port: 80}}}",
        ]
    )
    kinds = {"policy": "model", "env0": "environment", "agent0": "agent", "head": "resources"}
    deployment = FakeDeployment(kinds)
    deployment.overrides["relay", "status"] = reply_with(404, {"detail": "Not Found"})
    # FastAPI renders the head server's `str` return value as a JSON string.
    deployment.overrides["head", "global_config_dict_yaml"] = reply_with(200, config_yaml)

    with ControlClient.from_head(
        "http://head.test", TOKEN, transport=httpx.MockTransport(deployment), clock=clock
    ) as control:
        assert control.participants.names() == ("env0", "policy", "agent0", "weather")
        assert control.participants.of_kind("resources")[0].url == "http://head.test:80"

    assert deployment.calls[0].operation == "global_config_dict_yaml"
    assert deployment.calls[0].authorization is None
    assert sorted(deployment.servers("status")) == ["agent0", "env0", "head", "policy", "relay"]


def test_from_head__entry_without_host_fails(clock: FakeClock) -> None:
    deployment = FakeDeployment({})
    deployment.overrides["head", "global_config_dict_yaml"] = lambda _request: httpx.Response(
        200, text="policy:\n  responses_api_models:\n    vllm_model:\n      model: fake\n"
    )
    with pytest.raises(CoordinationError, match=r"policy: 'policy.responses_api_models.<implementation>' has no"):
        ControlClient.from_head("http://head.test", TOKEN, transport=httpx.MockTransport(deployment), clock=clock)


# --- the client's own resources and errors -----------------------------------------------------------------


def test_injected_http_client_is_reused_and_left_open(deployment: FakeDeployment, clock: FakeClock) -> None:
    with httpx.Client(transport=httpx.MockTransport(deployment)) as http:
        control = ControlClient(TOKEN, participants_of(KINDS), http=http, clock=clock)
        control.prepare("c1", DEADLINE_TS)
        control.resume("c1", DEADLINE_TS)
        control.close()

        assert not http.is_closed
        assert len(deployment.calls) == 2 * len(KINDS)

    with pytest.raises(ValueError, match="not both"):
        ControlClient(TOKEN, http=http, transport=httpx.MockTransport(deployment))


def test_coordination_error_survives_pickling() -> None:
    error = CoordinationError("commit", {"policy": ParticipantFailure("policy", 409, "invalid_phase", "x")})
    error.add_note("replay with: ...")

    copy = pickle.loads(pickle.dumps(error))

    assert str(copy) == str(error) == "checkpoint commit failed on 1 participant(s): policy: HTTP 409 invalid_phase x"
    assert copy.failures == error.failures
    assert copy.__notes__ == ["replay with: ..."]


def test_the_checkers_client_gives_each_thread_a_pool_of_its_own_and_closes_them_all() -> None:
    """No connection pool is shared between threads (encode/httpcore#1110: a shared pool can close a connection it
    just handed to another thread); each thread keeps reusing its own."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Ok(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    client = new_http_client(5.0)
    transport = client._transport
    assert isinstance(transport, PerThreadTransport)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    used: dict[str, Any] = {}

    def call(name: str) -> None:
        for _ in range(3):
            assert client.get(url).text == "ok"
        used[name] = transport._own()

    try:
        threads = [threading.Thread(target=call, args=(f"t{n}",)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        call("main")
        assert len({id(each) for each in used.values()}) == 3
        assert len(transport._transports) == 3
        # ...and one TLS context among them, built once per process (httpx would load the CA bundle per transport).
        assert {id(each._pool._ssl_context) for each in used.values()} == {id(shared_tls_context())}
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    assert transport._transports == []
    with pytest.raises(RuntimeError):
        client.get(url)
