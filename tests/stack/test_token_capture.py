"""Token capture and generation cuts against the look-alike stack, over HTTP only (real processes, real SIGKILL).

Gym's scenarios 3, 6, 7 and the ledger part of 14 with their facts, and the ledger routes' refusal while a
checkpoint is open. Each test also runs with a planted fault whose effect shows in the same sequence (next to the
fault-free run), as `test_faults.py` does for the other faults.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_model.errors import CoordinationError
from ckpt_model.protocol.client import PrepareResult
from ckpt_model.protocol.gym_tasks import COUNTER_SCRIPT, counter_run_body, native_run_body
from ckpt_model.protocol.storage import participant_dir, read_records
from ckpt_model.protocol.wire import EpisodeId
from fakes import clock
from fakes.backend import FINAL_TEXT, tokens_from_text
from tests.stack.conftest import Deployment, deadline, move_clock, wait_until

pytestmark = pytest.mark.processes

Deploy = Callable[..., Deployment]
LEDGER_ROUTES = "/training-token-capture/control/rollouts"


def with_and_without(fault: str) -> Any:
    return pytest.mark.parametrize("faults", [(), (fault,)], ids=["fault-free", "fault"])


def ledger_route(deployment: Deployment, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    """A ledger control route of the policy model, with the capture bearer (GET without a body)."""
    url = deployment.url("policy_model") + LEDGER_ROUTES + path
    headers = {"Authorization": f"Bearer {deployment.stack.capture_token}"}
    if body is None:
        return deployment.http.get(url, headers=headers)
    return deployment.http.post(url, json=body, headers=headers)


def manifest(deployment: Deployment, capture_key: str) -> httpx.Response:
    return ledger_route(deployment, f"/{capture_key}/manifest")


def chain(deployment: Deployment, capture_key: str) -> list[str]:
    """The model_call_ids of a live ledger, in order; its manifest lists no failures."""
    response = manifest(deployment, capture_key)
    assert response.status_code == 200, response.text
    assert response.json()["failures"] == []
    return [row["model_call_id"] for row in response.json()["records"]]


def assert_retired(response: httpx.Response) -> None:
    assert response.status_code == 410, response.text
    assert "is retired" in response.json()["error"]["detail"]


def admissions(deployment: Deployment) -> list[dict[str, Any]]:
    return [call["admission"] for call in deployment.calls()]


def backend_view(deployment: Deployment, path: str) -> Any:
    response = deployment.http.get(deployment.stack.backend_url + path)
    response.raise_for_status()
    return response.json()


def model_records(directory: str) -> list[Any]:
    return read_records(participant_dir(Path(directory), "model", "policy_model"), "model", "policy_model")


def checkpoint(deployment: Deployment, checkpoint_id: str, scope: list[EpisodeId]) -> tuple[str, dict[str, Any]]:
    """Prepare (asserting it is ready everywhere) and commit `scope`; the directory and the commit replies."""
    prepared = deployment.control.prepare(checkpoint_id, deadline())
    assert prepared.prepared, prepared.blockers()
    directory = str(deployment.stack.checkpoint_root / checkpoint_id)
    return directory, deployment.control.commit(checkpoint_id, directory, scope, deadline())


def crash_and_restore(deployment: Deployment, restore_id: str, directory: str, scope: list[EpisodeId]) -> None:
    deployment.crash_and_restart()
    deployment.control.restore(restore_id, directory, scope, deadline())
    deployment.control.resume(restore_id, deadline())


def assert_rewarded(reply: httpx.Response, reward: Callable[[Any], float]) -> None:
    assert reply.status_code == 200, reply.text
    assert reward(reply.json()) == 1.0, reply.text


def counter_reward(reply: Any) -> float:
    return float(reply["reward"])


def native_reward(reply: Any) -> float:
    return float(reply["result"]["reward"])


def start_counter(deployment: Deployment, rollout_id: str) -> list[EpisodeId]:
    """Gym's counter row held at its second model call (call 0 delivered); returns the checkpoint scope."""
    deployment.backend("/_ctl/script", {"tool_calls": list(COUNTER_SCRIPT)})
    deployment.start_held(counter_run_body(rollout_id, 0), calls_delivered=1)
    return [EpisodeId(rollout_id=rollout_id)]


# -- Gym's scenario 6: the lineage continues across a crash ------------------------------------------------------


@pytest.mark.parametrize(
    "faults",
    [(), ("lineage_forgets_restored_parent",), ("ledger_source_not_retired",)],
    ids=["fault-free", "lineage_forgets_restored_parent", "ledger_source_not_retired"],
)
def test_token_lineage_continues_across_a_crash(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("counter", faults=faults, token_capture=True)
    scope = start_counter(deployment, "counter-1")
    directory, committed = checkpoint(deployment, "c1", scope)

    # Call 1 is still generating: only call 0's row is exported, and its staging key kept.
    assert committed["policy_model"]["staging_keys"] == ["counter-1/counter-1.0"]
    (record,) = model_records(directory)
    assert record["rows"] == [
        {"model_call_id": "counter-1.0", "parent_call_id": None, "staging_key": "counter-1/counter-1.0"}
    ]
    crash_and_restore(deployment, "r1", directory, scope)
    assert_rewarded(deployment.run(counter_run_body("counter-1", 1)), counter_reward)

    calls = admissions(deployment)
    assert [admission["model_call_id"] for admission in calls] == [
        "counter-1.0",
        "counter-1.1",
        "counter-1-a1.0",
        "counter-1-a1.1",
    ]
    assert calls[2]["rollout_id"] == "counter-1-a1"
    lineage = chain(deployment, "counter-1-a1")
    assert lineage == ["counter-1.0", "counter-1-a1.0", "counter-1-a1.1"]
    assert calls[1]["model_call_id"] not in lineage
    restored_row = manifest(deployment, "counter-1-a1").json()["records"][0]
    assert restored_row["capture_key"] == "counter-1", "a restored row names the attempt that staged it"
    if "lineage_forgets_restored_parent" in faults:
        assert calls[2]["parent_call_id"] is None
    else:
        assert calls[2]["parent_call_id"] == calls[0]["model_call_id"]
    if "ledger_source_not_retired" in faults:
        assert chain(deployment, "counter-1") == ["counter-1.0"]
    else:
        assert_retired(manifest(deployment, "counter-1"))


# -- Gym's scenario 3: a checkpoint restores again after its replacement made calls --------------------------------


@pytest.mark.parametrize(
    "faults",
    [(), ("ledger_refuses_dead_rows",), ("ledger_appends_on_restore",)],
    ids=["fault-free", "ledger_refuses_dead_rows", "ledger_appends_on_restore"],
)
def test_a_checkpoint_restores_again_after_its_replacement_made_calls(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("counter", faults=faults, token_capture=True)
    scope = start_counter(deployment, "again-1")
    directory, _ = checkpoint(deployment, "c1", scope)
    crash_and_restore(deployment, "r1", directory, scope)
    assert_rewarded(deployment.run(counter_run_body("again-1", 1)), counter_reward)
    dead_calls = len(deployment.calls())
    dead = [admission["model_call_id"] for admission in admissions(deployment)[2:dead_calls]]
    assert dead == ["again-1-a1.0", "again-1-a1.1"]

    deployment.crash_and_restart()
    if "ledger_refuses_dead_rows" in faults:
        with pytest.raises(CoordinationError) as refused:
            deployment.control.restore("r2", directory, scope, deadline())
        failure = refused.value.failures["policy_model"]
        assert (failure.http_status, failure.code) == (409, "checkpoint_error")
        assert "already holds rows from another execution" in failure.detail
        return
    deployment.control.restore("r2", directory, scope, deadline())
    deployment.control.resume("r2", deadline())
    assert_rewarded(deployment.run(counter_run_body("again-1", 1)), counter_reward)

    first_after = admissions(deployment)[dead_calls]
    assert first_after["model_call_id"] == "again-1-a1.2", "IDs of the dead run are never reused"
    assert first_after["parent_call_id"] == "again-1.0"
    lineage = chain(deployment, "again-1-a1")
    assert lineage[0] == "again-1.0"
    if "ledger_appends_on_restore" in faults:
        assert lineage == ["again-1.0", *dead, "again-1.0", "again-1-a1.2", "again-1-a1.3"]
    else:
        assert lineage == ["again-1.0", "again-1-a1.2", "again-1-a1.3"]
        assert not set(dead) & set(lineage)


@with_and_without("ledger_exports_undelivered")
def test_ledger_exports_undelivered__a_held_reply_enters_the_lineage(deploy: Deploy, faults: tuple[str, ...]) -> None:
    """Call 1 returns while the checkpoint is prepared: its row is staged, but its reply is held, undelivered."""
    deployment = deploy("counter", faults=faults, token_capture=True)
    scope = start_counter(deployment, "held-1")
    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()
    deployment.backend("/_ctl/release")
    wait_until(lambda: deployment.status("policy_model")["report"]["counts"]["held"] == 1, "the reply held")
    assert chain(deployment, "held-1") == ["held-1.0", "held-1.1"]
    directory = str(deployment.stack.checkpoint_root / "c1")
    deployment.control.commit("c1", directory, scope, deadline())

    (record,) = model_records(directory)
    exported = [row["model_call_id"] for row in record["rows"]]
    crash_and_restore(deployment, "r1", directory, scope)
    assert_rewarded(deployment.run(counter_run_body("held-1", 1)), counter_reward)
    parent = admissions(deployment)[2]["parent_call_id"]
    if faults:
        assert (exported, parent) == (["held-1.0", "held-1.1"], "held-1.1")
    else:
        assert (exported, parent) == (["held-1.0"], "held-1.0")


# -- Gym's scenario 7: an in-flight generation is cut and its prefix continued -------------------------------------


@with_and_without("cut_not_attached")
def test_an_in_flight_generation_is_cut_and_its_prefix_continued(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("native", faults=faults, token_capture=True, generation_cuts=True)
    deployment.start_held(native_run_body("cut-1", 0), calls_delivered=1)
    scope = [EpisodeId(rollout_id="cut-1")]
    directory, committed = checkpoint(deployment, "c1", scope)

    cut_key = "__generation_cut__/cut-1/cut-1.1"
    assert backend_view(deployment, "/_ctl/cuts") == [["cut-1.1"]]
    assert deployment.status("policy_model")["report"]["counts"]["cut"] == 1
    assert committed["policy_model"]["staging_keys"] == sorted([cut_key, "cut-1/cut-1.0"])
    ((cut,),) = [record["generation_cuts"] for record in model_records(directory)]
    assert cut["model_call_id"] == "cut-1.1"
    assert cut["continuation"]["source_capture_key"] == "cut-1"
    assert (cut["continuation"]["staging_keys"], cut["continuation"]["prefix_token_count"]) == ([cut_key], 5)
    crash_and_restore(deployment, "r1", directory, scope)
    assert deployment.status("policy_model")["restored_generation_cuts"] == ["cut-1-a1"]
    assert_rewarded(deployment.run(native_run_body("cut-1", 1)), native_reward)

    continued = [call for call in deployment.calls() if call["capture_key"] == "cut-1-a1"]
    staged = backend_view(deployment, "/_ctl/staged")
    full_output = tokens_from_text(FINAL_TEXT)
    assert staged[cut_key]["tokens"] == full_output[:5]
    (row,) = [entry for key, entry in staged.items() if key.startswith("cut-1-a1/")]
    assert row["tokens"] == full_output, "the continued call's tokens hold its prefix once"
    if faults:
        # The re-issued call regenerates from scratch, and the restored cut is never used up.
        assert [(call["continued_from"], call["reused_prefix_tokens"]) for call in continued] == [(None, None)]
        assert row["prefix_staging_key"] is None
        assert deployment.status("policy_model")["restored_generation_cuts"] == ["cut-1-a1"]
    else:
        assert [(call["continued_from"], call["reused_prefix_tokens"]) for call in continued] == [("cut-1.1", 5)]
        assert (row["continued_from"], row["prefix_staging_key"]) == ("cut-1.1", cut_key)
        assert deployment.status("policy_model")["restored_generation_cuts"] == []


@with_and_without("cuts_pile_up")
def test_cuts_pile_up__a_call_cut_twice_makes_its_checkpoint_unrestorable(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("native", faults=faults, token_capture=True, generation_cuts=True)
    deployment.start_held(native_run_body("pile-1", 0), calls_delivered=1)
    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()
    deployment.control.resume("c1", deadline())
    scope = [EpisodeId(rollout_id="pile-1")]
    directory, _ = checkpoint(deployment, "c2", scope)

    assert backend_view(deployment, "/_ctl/cuts") == [["pile-1.1"], ["pile-1.1"]]
    (record,) = model_records(directory)
    assert len(record["generation_cuts"]) == (2 if faults else 1)
    deployment.crash_and_restart()
    if faults:
        with pytest.raises(CoordinationError) as refused:
            deployment.control.restore("r2", directory, scope, deadline())
        failure = refused.value.failures["policy_model"]
        assert (failure.http_status, failure.code) == (409, "checkpoint_error")
        assert "more than one generation cut" in failure.detail
        return
    deployment.control.restore("r2", directory, scope, deadline())
    deployment.control.resume("r2", deadline())
    assert_rewarded(deployment.run(native_run_body("pile-1", 1)), native_reward)


@with_and_without("cut_without_timeout")
def test_cut_without_timeout__a_hung_cut_eats_the_prepare(deploy: Deploy, faults: tuple[str, ...]) -> None:
    """A cut that never answers costs the cut (the call regenerates), never the prepare: it may take only half
    of the remaining prepare time. Without a timeout it holds the prepare past its deadline."""
    deployment = deploy("native", faults=faults, token_capture=True, generation_cuts=True)
    deployment.backend("/_ctl/cut_stall", {"stall": True})
    deployment.start_held(native_run_body("hung-1", 0), calls_delivered=1)
    budget_s = 6.0
    started = time.monotonic()
    if faults:
        # The controller gives up at the deadline plus its margin; the model never answered.
        outcome = prepare_or_failure(deployment, "c1", time.time() + budget_s)
        assert time.monotonic() - started >= budget_s
        assert isinstance(outcome, CoordinationError), outcome
    else:
        prepared = prepared_past_a_hung_cut(deployment, "c1", budget_s)
        assert prepared.prepared, prepared.blockers()
        counts = prepared.replies["policy_model"]["report"]["counts"]
        assert (counts["cut"], counts["cut_failed"]) == (0, 1)
    assert backend_view(deployment, "/_ctl/cuts") == []


# The fault-free prepare's deadline where the policy model's clock can be moved: far ahead, so that no loaded machine
# makes a stage after the model's late (a real 6 s, of which the cut may take 3, was not enough at load 9-15).
HUNG_CUT_DEADLINE_S = 60.0


def prepared_past_a_hung_cut(deployment: Deployment, checkpoint_id: str, budget_s: float) -> PrepareResult:
    """A prepare whose cut hangs at the backend. With libfaketime its deadline is far ahead and, once the cut hangs,
    the policy model's clock moves past the half of it the cut may take (then back): it must give the cut up and
    prepare (when it gives up, to the millisecond, is shown on a clock a unit test moves). Without, a real
    `budget_s`."""
    if clock.library() is None:
        return deployment.control.prepare(checkpoint_id, time.time() + budget_s)
    deadline_ts = time.time() + HUNG_CUT_DEADLINE_S
    with ThreadPoolExecutor(1) as pool:
        prepare = pool.submit(deployment.control.prepare, checkpoint_id, deadline_ts)
        wait_until(
            lambda: prepare.done() or backend_view(deployment, "/_ctl/cut_stall")["hanging"] > 0,
            "the prepare answered, or its cut hangs at the backend",
        )
        if prepare.done():
            return prepare.result()
        move_clock(deployment, "policy_model", (deadline_ts - time.time()) / 2 + 1.0)
        try:
            return prepare.result()
        finally:
            move_clock(deployment, "policy_model", 0.0)


def prepare_or_failure(
    deployment: Deployment, checkpoint_id: str, deadline_ts: float
) -> PrepareResult | CoordinationError:
    try:
        return deployment.control.prepare(checkpoint_id, deadline_ts)
    except CoordinationError as failure:
        return failure


# -- retire (Gym's scenario 14, its ledger part) and the ledger routes -------------------------------------------


@with_and_without("ledger_retire_skipped")
def test_a_retired_episode_leaves_its_ledger_retired(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("native", faults=faults, token_capture=True)
    run = deployment.start_held(native_run_body("gone-1", 0), calls_delivered=1)

    deployment.control.retire("retire", [EpisodeId(rollout_id="gone-1")], deadline())
    assert run.result().json()["error"]["code"] == "stale_attempt"
    deployment.backend("/_ctl/release")
    deployment.control.forget("forget", ["gone-1"], deadline())

    if faults:
        assert chain(deployment, "gone-1") == ["gone-1.0"]
    else:
        assert_retired(manifest(deployment, "gone-1"))


@with_and_without("ledger_removal_while_open")
def test_ledger_retire_and_delete_wait_for_an_open_checkpoint(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("counter", faults=faults, token_capture=True)
    deployment.backend("/_ctl/script", {"tool_calls": list(COUNTER_SCRIPT)})
    assert_rewarded(deployment.run(counter_run_body("done-1", 0)), counter_reward)
    assert chain(deployment, "done-1") == ["done-1.0", "done-1.1", "done-1.2"]
    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()

    retired = ledger_route(deployment, "/retire", {"rollout_ids": ["done-1"]})
    if faults:
        assert retired.json() == {"retired": ["done-1"]}
        assert_retired(manifest(deployment, "done-1"))
        return
    deleted = ledger_route(deployment, "/delete", {"rollout_ids": ["done-1"]})
    for refused in (retired, deleted):
        assert refused.status_code == 409, refused.text
        assert "retry ledger retire and delete after it resumes" in refused.json()["error"]["detail"]
    assert len(chain(deployment, "done-1")) == 3

    deployment.control.resume("c1", deadline())
    assert ledger_route(deployment, "/retire", {"rollout_ids": ["done-1"]}).json() == {"retired": ["done-1"]}
    assert_retired(manifest(deployment, "done-1"))
    assert ledger_route(deployment, "/delete", {"rollout_ids": ["done-1"]}).json() == {"deleted": ["done-1"]}
    assert chain(deployment, "done-1") == []
