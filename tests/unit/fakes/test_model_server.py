"""The policy model server against a real fake backend, both as real processes.

Each test gets a fresh model server (restore refusal and retired marks are per process) and the module's one
backend, reset between tests. Waits poll a condition with a timeout; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX, EpisodeId
from fakes.gym.config import CONFIG_ENV, ServerConfig
from fakes.gym.policy.gate import PolicyGate
from fakes.gym.policy.model import PolicyParticipant
from fakes.gym.protocol.errors import CheckpointStateError, ControlError
from fakes.processes.ports import free_port

pytestmark = pytest.mark.processes

TOKEN = "test-control-token"
START_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.01
LOG_TAIL_LINES = 30
MESSAGES = [{"role": "developer", "content": "You answer."}, {"role": "user", "content": "Weather in SF?"}]


class Server:
    """A server in its own process group; `stop()` kills the group and reaps the process."""

    def __init__(self, name: str, args: list[str], url: str, health_path: str, log_path: Path, **env: str):
        self.url = url
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **env},
            )
        try:
            self._wait_healthy(name, health_path)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, name: str, health_path: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(base_url=self.url) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {self.process.returncode}:\n{self.log_tail()}")
                try:
                    if client.get(health_path).status_code < 500:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(POLL_INTERVAL_S)  # polling a start-up condition, not synchronising
        raise RuntimeError(f"{name} not healthy within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return "\n".join(lines) + f"\n(full log: {self.log_path})"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=START_TIMEOUT_S)


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("backend") / "backend.log"
    server = Server(
        "backend",
        ["-m", "fakes.backend", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        "/v1/models",
        log_path,
    )
    try:
        yield server.url
    finally:
        server.stop()


def start_model_server(backend_url: str, log_dir: Path, faults: tuple[str, ...] = (), **options: Any) -> Server:
    """A model server; `options` are more `ServerConfig` fields (token capture, generation cuts)."""
    port = free_port()
    config = ServerConfig(
        name="policy_model",
        role="policy_model",
        port=port,
        token=TOKEN,
        backend_url=backend_url,
        faults=faults,
        **options,
    )
    env = {CONFIG_ENV: config.to_json()}
    return Server(
        "policy_model", ["-m", "fakes.gym.serve"], config.url, "/health", log_dir / f"model-{port}.log", **env
    )


@pytest.fixture
def model_url(backend_url: str, tmp_path: Path) -> Iterator[str]:
    server = start_model_server(backend_url, tmp_path)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def http(backend_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(WAIT_TIMEOUT_S, read=None)) as client:
        (await client.post(f"{backend_url}/_ctl/reset")).raise_for_status()
        yield client
        # A test that failed half-way must not leave the next one a gated backend.
        await client.post(f"{backend_url}/_ctl/reset")


async def wait_until(predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    """Poll `predicate` until it holds; time out naming the condition instead of hanging."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s} s")
        await asyncio.sleep(POLL_INTERVAL_S)


async def backend_calls(http: httpx.AsyncClient, backend_url: str) -> list[dict[str, Any]]:
    return (await http.get(f"{backend_url}/_ctl/calls")).json()


async def wait_backend_waiting(http: httpx.AsyncClient, backend_url: str, count: int) -> None:
    async def reached() -> bool:
        return sum(call["waiting"] for call in await backend_calls(http, backend_url)) == count

    await wait_until(reached, f"{count} call(s) waiting at the backend")


async def status(http: httpx.AsyncClient, model_url: str) -> dict[str, Any]:
    reply = await http.get(f"{model_url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=bearer())
    reply.raise_for_status()
    return reply.json()


async def wait_counts(http: httpx.AsyncClient, model_url: str, **expected: int) -> None:
    async def reached() -> bool:
        counts = (await status(http, model_url))["report"]["counts"]
        return all(counts[name] == value for name, value in expected.items())

    await wait_until(reached, f"model server counts {expected}")


def bearer() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


async def control(http: httpx.AsyncClient, model_url: str, op: str, checkpoint_id: str, **body: Any) -> httpx.Response:
    payload = {"checkpoint_id": checkpoint_id, "deadline_ts": time.time() + 60.0, **body}
    return await http.post(f"{model_url}{CHECKPOINT_ROUTE_PREFIX}/{op}", json=payload, headers=bearer())


def generate(http: httpx.AsyncClient, model_url: str, capture_key: str | None) -> Awaitable[httpx.Response]:
    prefix = "" if capture_key is None else f"/ng-rollout/{capture_key}"
    return http.post(f"{model_url}{prefix}/v1/chat/completions", json={"model": "fake-model", "messages": MESSAGES})


def error_code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


@pytest.mark.anyio
async def test_calls_are_forwarded_with_their_capture_key(
    http: httpx.AsyncClient, backend_url: str, model_url: str
) -> None:
    tagged = await generate(http, model_url, "r0-a1")
    untagged = await generate(http, model_url, None)

    assert tagged.status_code == 200
    assert tagged.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert untagged.status_code == 200
    calls = await backend_calls(http, backend_url)
    assert [(call["capture_key"], call["n_messages"]) for call in calls] == [("r0-a1", 2), (None, 2)]
    counts = (await status(http, model_url))["report"]["counts"]
    assert counts == {"inflight": 0, "held": 0, "cut": 0, "cut_failed": 0, "cut_skipped": 0}


@pytest.mark.anyio
async def test_invalid_capture_keys_are_refused_before_the_backend(
    http: httpx.AsyncClient, backend_url: str, model_url: str
) -> None:
    # One server for every key: each start costs about a second here.
    for capture_key in ("-r0", "r0%20x", "", "r0-a1-a2"):
        response = await generate(http, model_url, capture_key)

        assert response.status_code == 400, capture_key
        assert error_code(response) == "invalid_rollout_id"
    assert await backend_calls(http, backend_url) == []


@pytest.mark.anyio
async def test_a_reply_arriving_while_prepared_is_held_until_resume(
    http: httpx.AsyncClient, backend_url: str, model_url: str
) -> None:
    await http.post(f"{backend_url}/_ctl/gate")
    first = asyncio.ensure_future(generate(http, model_url, "r0"))
    await wait_backend_waiting(http, backend_url, 1)

    prepared = await control(http, model_url, "prepare", "c1")
    assert prepared.json()["phase"] == "prepared"  # an undelivered call never blocks
    second = asyncio.ensure_future(generate(http, model_url, "r1"))
    await http.post(f"{backend_url}/_ctl/step", json={"calls": 1})
    await wait_counts(http, model_url, inflight=1, held=1)

    assert not first.done()
    assert not second.done()
    assert len(await backend_calls(http, backend_url)) == 1  # the second call is not admitted while closed
    assert (await control(http, model_url, "resume", "c1")).json() == {"phase": "idle", "idempotent": False}
    assert (await first).status_code == 200
    await wait_backend_waiting(http, backend_url, 1)
    await http.post(f"{backend_url}/_ctl/step", json={"calls": 1})
    assert (await second).status_code == 200
    await wait_counts(http, model_url, inflight=0, held=0)


@pytest.mark.anyio
async def test_the_delivers_held_fault_delivers_while_prepared(
    http: httpx.AsyncClient, backend_url: str, tmp_path: Path
) -> None:
    server = start_model_server(backend_url, tmp_path, faults=("model_delivers_held",))
    try:
        await http.post(f"{backend_url}/_ctl/gate")
        call = asyncio.ensure_future(generate(http, server.url, "r0"))
        await wait_backend_waiting(http, backend_url, 1)
        assert (await control(http, server.url, "prepare", "c1")).json()["phase"] == "prepared"

        await http.post(f"{backend_url}/_ctl/step", json={"calls": 1})

        assert (await call).status_code == 200
        assert (await status(http, server.url))["phase"] == "prepared"
    finally:
        server.stop()


@pytest.mark.anyio
async def test_a_retired_attempt_gets_stale_attempt_and_a_later_one_runs(
    http: httpx.AsyncClient, backend_url: str, model_url: str
) -> None:
    retired = await control(http, model_url, "retire", "c0", episode_ids=[{"rollout_id": "r0", "attempt": 1}])
    assert retired.json() == {"retired": ["r0-a1"]}

    for key in ("r0", "r0-a1"):
        response = await generate(http, model_url, key)
        assert response.status_code == 409
        assert error_code(response) == "stale_attempt"
    assert (await generate(http, model_url, "r0-a2")).status_code == 200
    assert (await status(http, model_url))["retired_rollouts"] == 1
    assert [call["capture_key"] for call in await backend_calls(http, backend_url)] == ["r0-a2"]


@pytest.mark.anyio
async def test_retire_cancels_an_admitted_call_waiting_at_the_backend(
    http: httpx.AsyncClient, backend_url: str, model_url: str
) -> None:
    await http.post(f"{backend_url}/_ctl/gate")
    doomed = asyncio.ensure_future(generate(http, model_url, "r0"))
    survivor = asyncio.ensure_future(generate(http, model_url, "r1"))
    await wait_backend_waiting(http, backend_url, 2)

    retired = await control(http, model_url, "retire", "c0", episode_ids=[{"rollout_id": "r0", "attempt": 0}])

    assert retired.status_code == 200
    assert (await status(http, model_url))["report"]["counts"]["inflight"] == 1
    response = await doomed
    assert response.status_code == 409
    assert error_code(response) == "stale_attempt"

    async def backend_saw_cancel() -> bool:
        calls = {call["capture_key"]: call for call in await backend_calls(http, backend_url)}
        return calls["r0"]["cancelled"] and calls["r1"]["waiting"]

    await wait_until(backend_saw_cancel, "backend marks r0's call cancelled")
    await http.post(f"{backend_url}/_ctl/release")
    assert (await survivor).status_code == 200


@pytest.mark.anyio
async def test_restore_is_refused_once_the_server_served_and_accepted_by_a_fresh_one(
    http: httpx.AsyncClient, backend_url: str, model_url: str, tmp_path: Path
) -> None:
    checkpoint_dir = str(tmp_path / "c1")
    scope = [{"rollout_id": "r0", "attempt": 0}]
    assert (await generate(http, model_url, "r0")).status_code == 200
    assert (await control(http, model_url, "prepare", "c1")).json()["phase"] == "prepared"
    committed = (
        await control(http, model_url, "commit", "c1", checkpoint_dir=checkpoint_dir, episode_ids=scope)
    ).json()
    assert (committed["episode_ids"], committed["staging_keys"], committed["staging_keys_by_episode"]) == ([], [], {})
    await control(http, model_url, "resume", "c1")

    refused = await control(http, model_url, "restore", "c2", checkpoint_dir=checkpoint_dir, episode_ids=scope)

    assert refused.status_code == 409
    assert error_code(refused) == "checkpoint_error"
    assert "freshly started" in refused.json()["error"]["detail"]
    fresh = start_model_server(backend_url, tmp_path)
    try:
        restored = await control(http, fresh.url, "restore", "c2", checkpoint_dir=checkpoint_dir, episode_ids=scope)
        assert restored.json() == {"phase": "restored", "source_checkpoint_id": "c1", "restored": ["r0-a1"]}
    finally:
        fresh.stop()


@pytest.mark.anyio
async def test_a_commit_without_scope_is_refused(http: httpx.AsyncClient, model_url: str, tmp_path: Path) -> None:
    await control(http, model_url, "prepare", "c1")

    refused = await control(http, model_url, "commit", "c1", checkpoint_dir=str(tmp_path / "c1"))

    assert refused.status_code == 409
    assert "needs the episode_ids" in refused.json()["error"]["detail"]


# -- the participant's record rules, in-process ---------------------------------------------------------------


def participant() -> PolicyParticipant:
    return PolicyParticipant(PolicyGate(holds_responses=True, is_retired=lambda _: False, notify=lambda: None))


@pytest.mark.parametrize(
    "record",
    [
        {"rows": [], "generation_cuts": []},
        {"episode_id": {"rollout_id": "r0"}, "rows": {}, "generation_cuts": []},
        {"episode_id": {"rollout_id": "r0"}, "rows": []},
    ],
)
def test_validate_record_requires_episode_rows_and_cuts(record: dict[str, Any]) -> None:
    with pytest.raises(CheckpointStateError):
        participant().validate_record(record)


@pytest.mark.anyio
async def test_install_refuses_rows_without_a_ledger_and_remembers_targets() -> None:
    policy = participant()
    episode = {"rollout_id": "r0", "attempt": 0}
    with_rows = {"episode_id": episode, "rows": [{"model_call_id": "m0"}], "generation_cuts": []}
    with pytest.raises(ControlError, match="capture ledger"):
        await policy.install([with_rows], [])

    installed = await policy.install([], [EpisodeId(rollout_id="r0"), EpisodeId(rollout_id="r1", attempt=2)])

    assert installed == ["r0-a1", "r1-a3"]
    assert policy.gate.restored_targets == {"r0-a1", "r1-a3"}


# -- token capture and generation cuts, as real processes ---------------------------------------------------------

CAPTURE_TOKEN = "test-capture-token"
LEDGER_ROUTES = "/training-token-capture/control/rollouts"


@pytest.fixture
def capture_url(backend_url: str, tmp_path: Path) -> Iterator[str]:
    """A model server with token capture and generation cuts, its ledgers under `tmp_path / "capture"`."""
    capture = {"capture_dir": str(tmp_path / "capture"), "capture_token": CAPTURE_TOKEN}
    server = start_model_server(backend_url, tmp_path, token_capture=True, generation_cuts=True, **capture)
    try:
        yield server.url
    finally:
        server.stop()


def capture_bearer() -> dict[str, str]:
    return {"authorization": f"Bearer {CAPTURE_TOKEN}"}


@pytest.mark.anyio
async def test_a_captured_call_carries_its_lineage_and_stages_its_row_before_delivery(
    http: httpx.AsyncClient, backend_url: str, capture_url: str
) -> None:
    replies = [await generate(http, capture_url, key) for key in ("r0", "r0", None, "r1")]

    assert [reply.status_code for reply in replies] == [200] * 4
    assert [call["admission"] for call in await backend_calls(http, backend_url)] == [
        {"model_call_id": "r0.0", "parent_call_id": None, "rollout_id": "r0"},
        {"model_call_id": "r0.1", "parent_call_id": "r0.0", "rollout_id": "r0"},
        None,
        {"model_call_id": "r1.0", "parent_call_id": None, "rollout_id": "r1"},
    ]
    manifest = await http.get(f"{capture_url}{LEDGER_ROUTES}/r0/manifest", headers=capture_bearer())
    assert manifest.json() == {
        "rollout_id": "r0",
        "records": [
            {"model_call_id": "r0.0", "parent_call_id": None, "staging_key": "r0/r0.0"},
            {"model_call_id": "r0.1", "parent_call_id": "r0.0", "staging_key": "r0/r0.1"},
        ],
        "failures": [],
    }


@pytest.mark.anyio
async def test_the_ledger_routes_answer_only_their_own_bearer_and_capture_keys(
    http: httpx.AsyncClient, capture_url: str
) -> None:
    manifest = f"{capture_url}{LEDGER_ROUTES}/r0/manifest"
    for headers in ({}, bearer()):
        refused = await http.get(manifest, headers=headers)
        assert (refused.status_code, error_code(refused)) == (401, "unauthorized")
    unknown = await http.get(manifest, headers=capture_bearer())
    assert unknown.json() == {"rollout_id": "r0", "records": [], "failures": []}
    invalid = await http.get(f"{capture_url}{LEDGER_ROUTES}/r0-a1-a2/manifest", headers=capture_bearer())
    assert (invalid.status_code, error_code(invalid)) == (400, "invalid_rollout_id")
    for op in ("retire", "delete"):
        url = f"{capture_url}{LEDGER_ROUTES}/{op}"
        assert (await http.post(url, json={"rollout_ids": []}, headers=capture_bearer())).status_code == 422
        bad_key = await http.post(url, json={"rollout_ids": ["r0", "-x"]}, headers=capture_bearer())
        assert (bad_key.status_code, error_code(bad_key)) == (400, "invalid_rollout_id")

    retire = f"{capture_url}{LEDGER_ROUTES}/retire"
    retired = await http.post(retire, json={"rollout_ids": ["r0"]}, headers=capture_bearer())

    assert retired.json() == {"retired": ["r0"]}
    gone = await http.get(manifest, headers=capture_bearer())
    assert (gone.status_code, error_code(gone)) == (410, "rollout_retired")
    assert gone.json()["error"]["detail"].startswith("rollout ledger 'r0' is retired")
    # A retired attempt's ledger takes no more calls.
    late = await generate(http, capture_url, "r0")
    assert (late.status_code, error_code(late)) == (410, "rollout_retired")


@pytest.mark.anyio
async def test_a_prepare_cuts_generating_calls_and_skips_constrained_ones(
    http: httpx.AsyncClient, backend_url: str, capture_url: str
) -> None:
    await http.post(f"{backend_url}/_ctl/gate")
    free = asyncio.ensure_future(generate(http, capture_url, "r0"))
    constrained = asyncio.ensure_future(
        http.post(
            f"{capture_url}/ng-rollout/r1/v1/chat/completions",
            json={"model": "fake-model", "messages": MESSAGES, "tool_choice": "required"},
        )
    )
    await wait_backend_waiting(http, backend_url, 2)

    prepared = (await control(http, capture_url, "prepare", "c1")).json()

    assert prepared["phase"] == "prepared"
    assert prepared["report"]["counts"] == {"inflight": 2, "held": 0, "cut": 1, "cut_failed": 0, "cut_skipped": 1}
    assert (await http.get(f"{backend_url}/_ctl/cuts")).json() == [["r0.0"]]
    await control(http, capture_url, "resume", "c1")
    await wait_counts(http, capture_url, cut=0, cut_failed=0, cut_skipped=0)
    await http.post(f"{backend_url}/_ctl/release")
    assert [(await free).status_code, (await constrained).status_code] == [200, 200]


@pytest.mark.anyio
@pytest.mark.parametrize("faults", [(), ("ledger_removal_while_open",)], ids=["fault-free", "fault"])
async def test_ledger_removal_waits_for_an_open_checkpoint(
    http: httpx.AsyncClient, backend_url: str, tmp_path: Path, faults: tuple[str, ...]
) -> None:
    capture = {"capture_dir": str(tmp_path / "capture"), "capture_token": CAPTURE_TOKEN}
    server = start_model_server(backend_url, tmp_path, faults, token_capture=True, **capture)
    try:
        assert (await generate(http, server.url, "r0")).status_code == 200
        await control(http, server.url, "prepare", "c1")

        routes = f"{server.url}{LEDGER_ROUTES}"
        answers = [
            await http.post(f"{routes}/{op}", json={"rollout_ids": ["r0"]}, headers=capture_bearer())
            for op in ("retire", "delete")
        ]

        if faults:
            assert [answer.json() for answer in answers] == [{"retired": ["r0"]}, {"deleted": ["r0"]}]
            return
        for answer in answers:
            assert (answer.status_code, error_code(answer)) == (409, "invalid_phase")
            assert "retry ledger retire and delete after it resumes" in answer.json()["error"]["detail"]
        manifest = await http.get(f"{routes}/r0/manifest", headers=capture_bearer())
        assert [row["model_call_id"] for row in manifest.json()["records"]] == ["r0.0"]
        await control(http, server.url, "resume", "c1")
        retired = await http.post(f"{routes}/retire", json={"rollout_ids": ["r0"]}, headers=capture_bearer())
        assert retired.json() == {"retired": ["r0"]}
    finally:
        server.stop()
