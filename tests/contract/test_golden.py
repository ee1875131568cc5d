"""Golden bodies from the reference, which the checker and the look-alike stack must both accept or both refuse.

The files under `golden/` are literal JSON written by hand from `shared/reference/gym-checkpoint-protocol.md`
(`golden/README.md` names each file's section). Each side has its own description of the protocol (the checker's
`ckpt_model.protocol.wire`, the stack's `fakes.gym.protocol.wire`; STYLE rule 2), so this is where a misreading on
either side shows:

- request bodies: both sides' models parse every valid body and dump it back exactly (modulo the defaults the
  reference states), and refuse every invalid one; the checker's `request_body` and `ControlClient` build exactly
  the golden bodies, and the stack's routes answer every invalid body with FastAPI's 422;
- episode IDs and capture keys: validation, `capture_key`, `from_capture_key` and `next_attempt` on both sides;
- errors: both error tables and envelopes, the stack's error classes and HTTP rendering, the checker's reading;
- replies: the checker's `reply_problems` accepts every golden reply and names a problem in every invalid one,
  and the stack's own replies have the golden shapes;
- native `/run` replies: both sides' models accept every valid body and dump it back exactly, and refuse every
  invalid one; the checker's `native_run_reply_problems` names the field; the stack's environment server answers
  Gym's own failures (a timeout, an unhandled error) with exactly the golden bodies;
- storage: both readers read the golden checkpoint directory, refuse broken manifests, and the stack's writer
  writes the golden bytes.

Pure and fast: the stack's apps run in-process (`httpx.ASGITransport`), the checker's client over
`httpx.MockTransport`; no processes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import json
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pydantic
import pytest

import fakes.gym.control.store as stack_store
import fakes.gym.protocol.errors as stack_errors
import fakes.gym.protocol.wire as stack_wire
from ckpt_model.errors import ParticipantFailure
from ckpt_model.protocol import storage as checker_storage
from ckpt_model.protocol import wire as checker_wire
from ckpt_model.protocol.client import ControlClient, Participant, Participants, request_body
from ckpt_model.protocol.replies import native_run_reply_problems, reply_problems
from fakes.gym.config import ServerConfig
from fakes.gym.policy.gate import episode_of
from fakes.gym.serve import build_app
from fakes.gym.servers.environment import episode_reply
from fakes.gym.servers.steps import Episode

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text())


REQUESTS_VALID = _golden("requests-valid.json")["cases"]
REQUESTS_INVALID = _golden("requests-invalid.json")["cases"]
EPISODE_IDS = _golden("episode-ids.json")
ERRORS = _golden("errors.json")
REPLIES_VALID = _golden("replies-valid.json")["cases"]
REPLIES_INVALID = _golden("replies-invalid.json")["cases"]
CONTROL_REPLIES_VALID = [case for case in REPLIES_VALID if case["operation"] != "run"]
CONTROL_REPLIES_INVALID = [case for case in REPLIES_INVALID if case["operation"] != "run"]
RUN_REPLIES_VALID = [case for case in REPLIES_VALID if case["operation"] == "run"]
RUN_REPLIES_INVALID = [case for case in REPLIES_INVALID if case["operation"] == "run"]
CONSTANTS = _golden("constants.json")
RUN_REQUEST = _golden("run-request.json")
MANIFESTS_INVALID = _golden("manifests-invalid.json")["cases"]
CHECKPOINT_DIR = GOLDEN / "checkpoint"
CHECKPOINT_ID = "ckpt-20250301T120000-1a2b3c4d"
TOKEN = CONSTANTS["authorization"]["token"]

SIDES = pytest.mark.parametrize("wire", [checker_wire, stack_wire], ids=["checker", "stack"])

# Where the checker disagreed with the reference; each entry names a fixed difference (kept empty once fixed, so
# a new one is added here with its reason, as a strict xfail, until `src/` is fixed).
CHECKER_DIFFERENCES: dict[str, str] = {}


def _checker_difference(name: str) -> list[pytest.MarkDecorator]:
    reason = CHECKER_DIFFERENCES.get(name)
    return [] if reason is None else [pytest.mark.xfail(strict=True, reason=reason)]


def _dumped(case: dict[str, Any]) -> Any:
    return case.get("dumped", case["body"])


# --- request bodies ------------------------------------------------------------------------------------------


@SIDES
@pytest.mark.parametrize("case", REQUESTS_VALID, ids=lambda case: case["name"])
def test_valid_request_parses_and_dumps_exactly(wire: ModuleType, case: dict[str, Any]) -> None:
    model = getattr(wire, case["model"])
    assert model.model_validate(case["body"]).model_dump(mode="json") == _dumped(case)
    assert model.model_validate_json(json.dumps(case["body"])).model_dump(mode="json") == _dumped(case)


@SIDES
@pytest.mark.parametrize("case", REQUESTS_INVALID, ids=lambda case: case["name"])
def test_invalid_request_is_refused(wire: ModuleType, case: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        getattr(wire, case["model"]).model_validate(case["body"])


BUILT_BY_CONTROLLER = [case for case in REQUESTS_VALID if "controller_never_sends" not in case]


def _controller_args(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "checkpoint_dir": body.get("checkpoint_dir", ""),
        "episode_ids": [checker_wire.EpisodeId.model_validate(e) for e in body.get("episode_ids") or []],
        "rollout_ids": body.get("rollout_ids", ()),
    }


@pytest.mark.parametrize("case", BUILT_BY_CONTROLLER, ids=lambda case: case["name"])
def test_checker_request_body_builds_the_golden_body(case: dict[str, Any]) -> None:
    body = case["body"]
    built = request_body(case["operation"], body["checkpoint_id"], body["deadline_ts"], **_controller_args(body))
    assert built == _dumped(case)


def _golden_reply(name: str) -> dict[str, Any]:
    return next(case["reply"] for case in REPLIES_VALID if case["name"] == name)


ENVIRONMENT_REPLIES = {
    "status": _golden_reply("status-environment-idle"),
    "prepare": _golden_reply("prepare-ready"),
    "renew": _golden_reply("renew"),
    "commit": _golden_reply("commit-environment"),
    "restore": _golden_reply("restore"),
    "resume": _golden_reply("resume"),
    "retire": _golden_reply("retire"),
    "forget": _golden_reply("forget"),
}


def _mock_client(respond: Callable[[str], httpx.Response], sent: list[httpx.Request]) -> ControlClient:
    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return respond(request.url.path.rsplit("/", 1)[-1])

    members = Participants([Participant(name="environment", kind="environment", url="http://environment")])
    return ControlClient(TOKEN, members, transport=httpx.MockTransport(handler), clock=lambda: 0.0)


def _call_client(client: ControlClient, operation: str, body: dict[str, Any]) -> Any:
    args = _controller_args(body)
    checkpoint_id, deadline_ts = body["checkpoint_id"], body["deadline_ts"]
    if operation in ("prepare", "renew", "resume"):
        return getattr(client, operation)(checkpoint_id, deadline_ts)
    if operation in ("commit", "restore"):
        method = getattr(client, operation)
        return method(checkpoint_id, args["checkpoint_dir"], args["episode_ids"], deadline_ts)
    if operation == "retire":
        return client.retire(checkpoint_id, args["episode_ids"], deadline_ts)
    return client.forget(checkpoint_id, args["rollout_ids"], deadline_ts)


@pytest.mark.parametrize("case", BUILT_BY_CONTROLLER, ids=lambda case: case["name"])
def test_checker_client_sends_golden_bodies_and_accepts_golden_replies(case: dict[str, Any]) -> None:
    sent: list[httpx.Request] = []
    operation = case["operation"]
    with _mock_client(lambda op: httpx.Response(200, json=ENVIRONMENT_REPLIES[op]), sent) as client:
        outcome = _call_client(client, operation, case["body"])
    assert len(sent) == 1
    request = sent[0]
    assert f"{request.method} {request.url.path}" == CONSTANTS["routes"][operation]
    assert request.headers["authorization"] == CONSTANTS["authorization"]["header"]
    assert json.loads(request.content) == _dumped(case)
    replies = outcome.replies if operation == "prepare" else outcome
    assert replies == {"environment": ENVIRONMENT_REPLIES[operation]}


# --- episode IDs and capture keys ----------------------------------------------------------------------------


@SIDES
@pytest.mark.parametrize("case", EPISODE_IDS["valid"], ids=lambda case: case["capture_key"])
def test_valid_episode_id(wire: ModuleType, case: dict[str, Any]) -> None:
    episode = wire.EpisodeId.model_validate(case["body"])
    assert episode.model_dump(mode="json") == _dumped(case)
    assert episode.wire() == _dumped(case)
    assert episode.capture_key == case["capture_key"]
    assert wire.EpisodeId.from_capture_key(case["capture_key"]) == episode


@SIDES
@pytest.mark.parametrize("case", EPISODE_IDS["invalid"], ids=lambda case: json.dumps(case["body"]))
def test_invalid_episode_id_is_refused(wire: ModuleType, case: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        wire.EpisodeId.model_validate(case["body"])


@SIDES
@pytest.mark.parametrize("case", EPISODE_IDS["capture_keys"], ids=lambda case: case["capture_key"])
def test_capture_key_round_trips(wire: ModuleType, case: dict[str, Any]) -> None:
    episode = wire.EpisodeId.from_capture_key(case["capture_key"])
    assert episode.model_dump(mode="json") == case["episode_id"]
    assert wire.EpisodeId.model_validate(case["episode_id"]).capture_key == case["capture_key"]
    assert wire.capture_key(case["episode_id"]["rollout_id"], case["episode_id"]["attempt"]) == case["capture_key"]


@SIDES
@pytest.mark.parametrize("case", EPISODE_IDS["next_attempt"], ids=lambda case: case["next_capture_key"])
def test_next_attempt(wire: ModuleType, case: dict[str, Any]) -> None:
    following = wire.EpisodeId.model_validate(case["episode_id"]).next_attempt()
    assert following.model_dump(mode="json") == case["next"]
    assert following.capture_key == case["next_capture_key"]


INVALID_KEYS = EPISODE_IDS["invalid_capture_keys"]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=repr(case["capture_key"]), marks=_checker_difference(case["capture_key"]))
        for case in INVALID_KEYS
    ],
)
def test_checker_refuses_invalid_capture_key(case: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        checker_wire.EpisodeId.from_capture_key(case["capture_key"])


@pytest.mark.parametrize("case", INVALID_KEYS, ids=lambda case: repr(case["capture_key"]))
def test_stack_refuses_invalid_capture_key(case: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        stack_wire.EpisodeId.from_capture_key(case["capture_key"])
    # What the policy model server answers a call tagged with it (2.3, 7.1): 400 invalid_rollout_id.
    with pytest.raises(stack_errors.InvalidRolloutIdError) as refused:
        episode_of(case["capture_key"])
    assert (refused.value.status_code, refused.value.code) == (400, "invalid_rollout_id")


# --- error envelope ------------------------------------------------------------------------------------------

GOLDEN_ERRORS = ERRORS["errors"]
GOLDEN_CODES = {entry["body"]["error"]["code"]: entry["status"] for entry in GOLDEN_ERRORS}


@SIDES
def test_error_table_matches_the_reference(wire: ModuleType) -> None:
    known = {code: status for code, status in wire.ERROR_STATUS.items() if code != "retire_incomplete"}
    assert known == GOLDEN_CODES
    # The reference does not know RetireIncompleteError's code or status; both sides chose the same.
    assert wire.ERROR_STATUS.get("retire_incomplete") == 409


@SIDES
@pytest.mark.parametrize("entry", GOLDEN_ERRORS, ids=lambda entry: entry["class"])
def test_error_body(wire: ModuleType, entry: dict[str, Any]) -> None:
    error = entry["body"]["error"]
    assert wire.error_body(error["code"], error["detail"]) == entry["body"]


@pytest.mark.parametrize("entry", GOLDEN_ERRORS, ids=lambda entry: entry["class"])
def test_stack_error_class_renders_the_envelope(entry: dict[str, Any]) -> None:
    error_class = getattr(stack_errors, entry["class"])
    error = error_class(entry["body"]["error"]["detail"])
    assert (error.status_code, error.to_wire()) == (entry["status"], entry["body"])


def test_stack_internal_error_is_500_checkpoint_error() -> None:
    internal = ERRORS["internal"]
    error = stack_errors.InternalControlError(internal["body"]["error"]["detail"])
    assert (error.status_code, error.to_wire()) == (internal["status"], internal["body"])


@pytest.mark.parametrize(
    "entry", [*GOLDEN_ERRORS, ERRORS["internal"]], ids=lambda entry: entry.get("class", "internal")
)
def test_checker_reads_the_error_envelope(entry: dict[str, Any]) -> None:
    sent: list[httpx.Request] = []
    with _mock_client(lambda _op: httpx.Response(entry["status"], json=entry["body"]), sent) as client:
        outcome = client.post_each("prepare", request_body("prepare", CHECKPOINT_ID, 1767225600.5), 1767225600.5)
    error = entry["body"]["error"]
    expected = ParticipantFailure("environment", entry["status"], error["code"], error["detail"])
    assert outcome == {"environment": expected}


# --- replies -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CONTROL_REPLIES_VALID, ids=lambda case: case["name"])
def test_checker_accepts_golden_reply(case: dict[str, Any]) -> None:
    assert reply_problems(case["operation"], case["reply"]) == []


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, id=case["name"], marks=_checker_difference(case["name"])) for case in CONTROL_REPLIES_INVALID],
)
def test_checker_names_a_problem_in_invalid_reply(case: dict[str, Any]) -> None:
    assert reply_problems(case["operation"], case["reply"]) != []


# --- native /run replies (5.2; nemo-gym 0.7.0's episode contracts) ---------------------------------------------

RUN_MODELS = {"checker": checker_wire.NativeRunReply, "stack": stack_wire.EpisodeResponse}
SHAPE_REFUSED = [case for case in RUN_REPLIES_INVALID if "judged_by" not in case]


@pytest.mark.parametrize("case", RUN_REPLIES_VALID, ids=lambda case: case["name"])
def test_checker_accepts_golden_run_reply(case: dict[str, Any]) -> None:
    assert native_run_reply_problems(case["reply"]) == []
    parsed = checker_wire.NativeRunReply.model_validate(case["reply"])
    assert parsed.model_dump(mode="json", exclude_unset=True) == case["reply"]
    # The field table's model of the body reads it too (`ckpt_model.protocol.fields`).
    checker_wire.RunReply.model_validate(case["reply"])


@pytest.mark.parametrize("case", RUN_REPLIES_VALID, ids=lambda case: case["name"])
def test_stack_accepts_golden_run_reply_and_writes_it_back(case: dict[str, Any]) -> None:
    assert stack_wire.EpisodeResponse.model_validate(case["reply"]).wire() == case["reply"]


@pytest.mark.parametrize("case", RUN_REPLIES_INVALID, ids=lambda case: case["name"])
def test_checker_names_the_field_of_an_invalid_run_reply(case: dict[str, Any]) -> None:
    problems = native_run_reply_problems(case["reply"])
    assert problems != []
    assert any(case["field"] in problem for problem in problems), problems


@pytest.mark.parametrize("side", RUN_MODELS)
@pytest.mark.parametrize("case", SHAPE_REFUSED, ids=lambda case: case["name"])
def test_both_sides_refuse_an_invalid_run_reply(side: str, case: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        RUN_MODELS[side].model_validate(case["reply"])


GYM_OWN = {case["name"]: case for case in RUN_REPLIES_VALID if "gym_own" in case}


def _raised(gym_own: dict[str, str]) -> BaseException:
    error_type: type[BaseException] = getattr(builtins, gym_own["type"])
    return error_type(gym_own["message"])


def test_stack_describes_gyms_own_failures_as_the_golden_bodies() -> None:
    made = {
        "admission_timed_out": stack_wire.ADMISSION_TIMED_OUT,
        "episode_timed_out": stack_wire.EPISODE_TIMED_OUT,
    }
    for name, case in GYM_OWN.items():
        gym_own = case["gym_own"]
        failure = made[gym_own] if isinstance(gym_own, str) else stack_wire.unhandled_error(_raised(gym_own))
        assert failure.wire() == case["reply"]["failure"], name


async def _ended_episode(request: Any, outcome: BaseException | None) -> Episode:
    """An episode whose task ended as `outcome` says: cancelled (its budget ran out) or raised."""

    async def episode_body() -> None:
        if outcome is not None:
            raise outcome
        await asyncio.Event().wait()

    episode = Episode(episode_id=request.episode_id, task_digest=stack_wire.task_digest(request.task.model_dump()))
    episode.task = asyncio.get_running_loop().create_task(episode_body())
    if outcome is None:
        episode.task.cancel(msg="Episode timed out")
    await asyncio.wait({episode.task})
    return episode


@pytest.mark.parametrize("name", ["gym-episode-timed-out", "gym-unhandled-error", "gym-unhandled-error-cut"])
def test_stack_environment_answers_gyms_own_failures_with_the_golden_bodies(name: str) -> None:
    case = GYM_OWN[name]
    gym_own = case["gym_own"]
    request = stack_wire.EpisodeRequest.model_validate(
        {**RUN_REQUEST["body"], "episode_id": case["reply"]["episode_id"]}
    )
    outcome = None if gym_own == "episode_timed_out" else _raised(gym_own)
    episode = asyncio.run(_ended_episode(request, outcome))
    response = episode_reply(request, episode)
    assert response.status_code == 200
    assert json.loads(bytes(response.body)) == case["reply"]


# --- the stack over HTTP, in-process -------------------------------------------------------------------------

ROUTE_OF_MODEL = {
    "CheckpointRequest": "prepare",
    "CommitRequest": "commit",
    "RestoreRequest": "restore",
    "RetireRequest": "retire",
    "ForgetRequest": "forget",
}


@contextlib.asynccontextmanager
async def _stack_server(role: str, name: str, capture_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    """One of the stack's real server apps with its lifespan; its peers are never called here."""
    config = ServerConfig(
        name=name,
        role=role,  # type: ignore[arg-type]
        port=0,
        token=TOKEN,
        backend_url="http://backend.invalid/v1",
        peers=dict.fromkeys(("environment", "agent", "resources", "policy_model"), "http://peer.invalid"),
        capture_dir=str(capture_dir),
    )
    app = build_app(config)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://s") as c:
        yield c


def _post_raw(client: httpx.AsyncClient, operation: str, body: Any, **headers: str) -> Any:
    # Standard `json.dumps` writes NaN and Infinity as Python does, which is what FastAPI then parses.
    content = json.dumps(body)
    route = f"{stack_wire.CHECKPOINT_ROUTE_PREFIX}/{operation}"
    return client.post(route, content=content, headers={"content-type": "application/json", **headers})


def test_stack_answers_every_invalid_body_with_fastapis_422(tmp_path: Path) -> None:
    """2.2: body-validation failures are FastAPI's 422 `detail` list, before the bearer is checked (2.1)."""

    async def scenario() -> list[tuple[str, int, Any]]:
        answers = []
        async with _stack_server("environment", "environment", tmp_path) as client:
            for case in REQUESTS_INVALID:
                response = await _post_raw(client, ROUTE_OF_MODEL[case["model"]], case["body"])
                answers.append((case["name"], response.status_code, response.json()))
        return answers

    for name, status, body in asyncio.run(scenario()):
        assert status == ERRORS["validation"]["status"], (name, body)
        assert isinstance(body.get(ERRORS["validation"]["body_has"]), list), (name, body)
        assert ERRORS["validation"]["body_lacks"] not in body, (name, body)


def _keys(reply: dict[str, Any]) -> set[str]:
    return set(reply)


def _envelope(response: httpx.Response) -> tuple[int, str | None]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "detail"}, body
    assert isinstance(body["error"]["detail"], str), body
    return response.status_code, body["error"]["code"]


def _code(code: str) -> tuple[int, str]:
    return GOLDEN_CODES[code], code


def test_stack_environment_server_speaks_the_golden_shapes(tmp_path: Path) -> None:
    """Every control route of the stack's environment server, with replies and refusals checked against the
    golden shapes and by the checker's own reply check."""
    auth = {"Authorization": stack_wire.bearer(TOKEN)}
    directory = str(tmp_path / "checkpoint")
    replies: dict[str, dict[str, Any]] = {}
    refusals: dict[str, tuple[int, str | None]] = {}

    async def scenario() -> None:
        async with _stack_server("environment", "environment", tmp_path / "capture") as client:
            deadline = time.time() + 60

            def body(checkpoint_id: str, **fields: Any) -> dict[str, Any]:
                return {"checkpoint_id": checkpoint_id, "deadline_ts": deadline, **fields}

            async def call(label: str, operation: str, request: dict[str, Any]) -> None:
                response = await _post_raw(client, operation, request, **auth)
                if response.status_code == 200:
                    replies[label] = response.json()
                else:
                    refusals[label] = _envelope(response)

            status_route = f"{stack_wire.CHECKPOINT_ROUTE_PREFIX}/status"
            refusals["status-without-bearer"] = _envelope(await client.get(status_route))
            replies["status"] = (await client.get(status_route, headers=auth)).json()
            await call("prepare", "prepare", body("c1"))
            await call("renew", "renew", body("c1"))
            await call("commit", "commit", body("c1", checkpoint_dir=directory, episode_ids=[]))
            await call("resume", "resume", body("c1"))
            await call("resume-again", "resume", body("c1"))
            await call("prepare-resumed", "prepare", body("c1"))
            await call("commit-while-idle", "commit", body("c2", checkpoint_dir=directory, episode_ids=[]))
            await call("prepare-past-deadline", "prepare", {"checkpoint_id": "c3", "deadline_ts": time.time() - 1})
            await call("restore", "restore", body("c4", checkpoint_dir=directory, episode_ids=[]))
            await call("prepare-other-id", "prepare", body("c5"))
            retire_scope = [{"rollout_id": "counter-1", "attempt": 1}]
            await call("retire", "retire", body("c4", episode_ids=retire_scope))
            await call("forget", "forget", body("c4", rollout_ids=["counter-1"]))
            await call("resume-restore", "resume", body("c4"))

    asyncio.run(scenario())

    assert refusals == {
        "status-without-bearer": _code("unauthorized"),
        "prepare-resumed": _code("stale_checkpoint"),
        "commit-while-idle": _code("invalid_phase"),
        "prepare-past-deadline": _code("deadline_exceeded"),
        "prepare-other-id": _code("checkpoint_conflict"),
    }
    operation_of = {"resume-again": "resume", "resume-restore": "resume"}
    for label, reply in replies.items():
        operation = operation_of.get(label, label)
        assert reply_problems(operation, reply) == [], (label, reply)
        assert _keys(reply) == _keys(ENVIRONMENT_REPLIES[operation]), (label, reply)
    assert _keys(replies["status"]["report"]) == _keys(ENVIRONMENT_REPLIES["status"]["report"])
    assert replies["prepare"]["phase"] == "prepared"
    assert replies["commit"]["phase"] == "committed"
    manifest = replies["commit"]["manifest"]
    assert list(manifest) == CONSTANTS["manifest_fields"]
    assert manifest["schema_version"] == CONSTANTS["manifest_schema_version"]
    assert (manifest["kind"], manifest["instance"], manifest["checkpoint_id"]) == ("environment", "environment", "c1")
    assert (replies["resume"]["idempotent"], replies["resume-again"]["idempotent"]) == (False, True)
    assert replies["restore"] == {"phase": "restored", "source_checkpoint_id": "c1", "restored": []}
    assert replies["retire"] == {"retired": ["counter-1-a1"]}
    assert replies["forget"] == {"forgotten": ["counter-1"]}
    # The checker's own reader reads what the stack committed.
    assert (
        checker_storage.read_records(
            checker_storage.participant_dir(Path(directory), "environment", "environment"),
            "environment",
            "environment",
            checkpoint_id="c1",
        )
        == []
    )


def test_stack_model_server_status_and_commit_have_the_golden_shapes(tmp_path: Path) -> None:
    auth = {"Authorization": stack_wire.bearer(TOKEN)}
    deadline = time.time() + 60
    body = {"checkpoint_id": "c1", "deadline_ts": deadline}

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _stack_server("policy_model", "policy_model", tmp_path / "capture") as client:
            status = (await client.get(f"{stack_wire.CHECKPOINT_ROUTE_PREFIX}/status", headers=auth)).json()
            assert (await _post_raw(client, "prepare", body, **auth)).status_code == 200
            commit_body = {**body, "checkpoint_dir": str(tmp_path / "checkpoint"), "episode_ids": []}
            commit = (await _post_raw(client, "commit", commit_body, **auth)).json()
            assert (await _post_raw(client, "resume", body, **auth)).status_code == 200
        return status, commit

    status, commit = asyncio.run(scenario())
    assert reply_problems("status", status) == []
    assert _keys(status) == _keys(_golden_reply("status-model-restored"))
    assert status["kind"] == "model"
    assert reply_problems("commit", commit) == []
    assert _keys(commit) == _keys(_golden_reply("commit-model-with-staging-keys"))


def test_stack_serves_every_golden_route() -> None:
    config = ServerConfig(name="environment", role="environment", port=0, token=TOKEN)
    paths = build_app(config).openapi()["paths"]
    served = {f"{method.upper()} {path}" for path, operations in paths.items() for method in operations}
    assert set(CONSTANTS["routes"].values()) <= served


# --- constants -----------------------------------------------------------------------------------------------


@SIDES
def test_routes_orders_and_limits(wire: ModuleType) -> None:
    assert CONSTANTS["checkpoint_route_prefix"] == wire.CHECKPOINT_ROUTE_PREFIX
    assert CONSTANTS["generation_cut_route"] == wire.GENERATION_CUT_ROUTE
    assert list(wire.PHASES) == CONSTANTS["phases"]
    assert list(wire.PREPARE_ORDER) == CONSTANTS["prepare_order"]
    assert list(reversed(wire.PREPARE_ORDER)) == CONSTANTS["resume_order"]
    assert [list(stage) for stage in wire.RETIRE_ORDER] == CONSTANTS["retire_order"]
    assert CONSTANTS["blockers_shown_max"] == wire.BLOCKERS_SHOWN_MAX
    assert CONSTANTS["manifest_schema_version"] == wire.MANIFEST_SCHEMA_VERSION


def test_stack_names_kinds_resume_order_and_bearer() -> None:
    assert list(stack_wire.PARTICIPANT_KINDS) == CONSTANTS["participant_kinds"]
    assert list(stack_wire.RESUME_ORDER) == CONSTANTS["resume_order"]
    assert CONSTANTS["checkpoint_id_max_chars"] == stack_wire.CHECKPOINT_ID_MAX_CHARS
    assert list(stack_wire.MANIFEST_FIELDS) == CONSTANTS["manifest_fields"]
    assert stack_wire.bearer(TOKEN) == CONSTANTS["authorization"]["header"]


RECORDS_FILE_CHECKS = [
    pytest.param(lambda name: checker_wire.RECORDS_FILE_RE.fullmatch(name) is not None, id="checker-wire"),
    pytest.param(
        lambda name: re.fullmatch(checker_storage.RECORDS_FILE_PATTERN, name) is not None, id="checker-storage"
    ),
    pytest.param(lambda name: stack_wire.RECORDS_FILE_RE.fullmatch(name) is not None, id="stack"),
]


@pytest.mark.parametrize("accepts", RECORDS_FILE_CHECKS)
def test_records_file_names(accepts: Callable[[str], bool]) -> None:
    names = CONSTANTS["records_file_names"]
    assert [name for name in names["valid"] if not accepts(name)] == []
    assert [name for name in names["invalid"] if accepts(name)] == []


# --- /run and task digest ------------------------------------------------------------------------------------


@SIDES
def test_native_run_request_and_task_digest(wire: ModuleType) -> None:
    request = wire.EpisodeRequest.model_validate(RUN_REQUEST["body"])
    assert request.model_dump(mode="json") == RUN_REQUEST["body"]
    assert wire.task_digest(RUN_REQUEST["body"]["task"]) == RUN_REQUEST["task_digest"]
    assert wire.task_digest(request.task.model_dump()) == RUN_REQUEST["task_digest"]


@SIDES
def test_native_run_request_refuses_extra_fields(wire: ModuleType) -> None:
    with pytest.raises(pydantic.ValidationError):
        wire.EpisodeRequest.model_validate({**RUN_REQUEST["body"], "stop": True})


# --- storage -------------------------------------------------------------------------------------------------

PARTICIPANT_DIRS = [("environment", "environment", 2), ("environment", "restart_environment", 0)]


def _golden_records(kind: str, instance: str) -> tuple[dict[str, Any], list[Any]]:
    directory = CHECKPOINT_DIR / "gym" / kind / instance
    manifest = json.loads((directory / "manifest.json").read_text())
    lines = (directory / manifest["records_file"]).read_text().splitlines()
    return manifest, [json.loads(line) for line in lines]


@pytest.mark.parametrize(("kind", "instance", "count"), PARTICIPANT_DIRS)
def test_both_readers_read_the_golden_checkpoint(kind: str, instance: str, count: int) -> None:
    manifest, records = _golden_records(kind, instance)
    assert len(records) == manifest["record_count"] == count
    directory = checker_storage.participant_dir(CHECKPOINT_DIR, kind, instance)
    assert checker_storage.read_records(directory, kind, instance, checkpoint_id=CHECKPOINT_ID) == records
    assert stack_store.read_participant_state(CHECKPOINT_DIR, kind, instance) == (manifest, records)


@pytest.mark.parametrize(("kind", "instance", "count"), PARTICIPANT_DIRS)
def test_stack_writer_writes_the_golden_bytes(tmp_path: Path, kind: str, instance: str, count: int) -> None:
    manifest, records = _golden_records(kind, instance)
    written = stack_store.write_participant_state(tmp_path, kind, instance, CHECKPOINT_ID, records)
    assert written == manifest
    golden_dir = CHECKPOINT_DIR / "gym" / kind / instance
    written_dir = tmp_path / "gym" / kind / instance
    assert sorted(path.name for path in written_dir.iterdir()) == sorted(path.name for path in golden_dir.iterdir())
    for path in golden_dir.iterdir():
        assert (written_dir / path.name).read_bytes() == path.read_bytes(), path.name
    assert stack_wire.manifest_text(manifest) + "\n" == (golden_dir / "manifest.json").read_text()


@pytest.mark.parametrize("case", MANIFESTS_INVALID, ids=lambda case: case["name"])
def test_both_readers_refuse_a_broken_manifest(tmp_path: Path, case: dict[str, Any]) -> None:
    shutil.copytree(CHECKPOINT_DIR, tmp_path, dirs_exist_ok=True)
    directory = tmp_path / "gym" / "environment" / "environment"
    manifest = copy.deepcopy(json.loads((directory / "manifest.json").read_text()))
    manifest.update(case["changes"])
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=1) + "\n")
    with pytest.raises(checker_storage.CheckpointUnreadable):
        checker_storage.read_records(directory, "environment", "environment")
    with pytest.raises(stack_errors.CheckpointStateError):
        stack_store.read_participant_state(tmp_path, "environment", "environment")
