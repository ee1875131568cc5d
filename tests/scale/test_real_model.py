"""Real-model mode (the seed's real-model test): the pure checks on hand-built values, a run in every test session
against the fake backend serving the OpenAI API without its gate (a separate process), and the opt-in run against
the server `CKPT_MODEL_MODEL_URL` names (vLLM)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_model.modes.real_model import (
    MODEL_NAME_ENV,
    MODEL_URL_ENV,
    NOT_CHECKED,
    RealModelError,
    check_restored,
    check_silent,
    check_well_formed,
    first_model_id,
    model_base_url,
    model_name_from_env,
    replied,
    rollout_ids,
    run_real_model,
)
from ckpt_model.modes.scale import RunOutcome
from ckpt_model.properties.continuation import P2Violation, P3Violation
from ckpt_model.properties.identifiers import P15Violation
from tests.ungated_backend import SERVED_MODEL
from tests.ungated_backend import ungated_backend as running_ungated_backend

STAGES = ("dispatch", "prepare", "commit", "crash", "restore", "replacement")


IDENTITY = {"episode_id": {"rollout_id": "r", "attempt": 1}, "task_id": {"taskset": "t:t", "task_id": "t"}}


def ok(reward: object = 0.0) -> RunOutcome:
    """A native `/run` reply of nemo-gym 0.7.0's shape with `reward`."""
    return RunOutcome(status_code=200, body={**IDENTITY, "result": {"reward": reward}})


# --- pure ----------------------------------------------------------------------------------------------------


def test_the_model_url_is_a_base_url_with_or_without_v1() -> None:
    assert model_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert model_base_url(" http://gpu:8000/v1/ ") == "http://gpu:8000"
    with pytest.raises(ValueError, match="'CKPT_MODEL_MODEL_URL' must be an http:// or https:// URL"):
        model_base_url("127.0.0.1:8000")


def test_the_served_model_is_the_first_id_listed() -> None:
    assert first_model_id({"data": [{"id": "Qwen/Qwen3-0.6B"}, {"id": "other"}]}) == "Qwen/Qwen3-0.6B"
    assert first_model_id({"data": []}) is None
    assert first_model_id({"data": [{"object": "model"}]}) is None
    assert first_model_id(["not", "an", "object"]) is None


def test_a_run_cut_off_by_the_crash_did_not_reply() -> None:
    outcomes = {"a": ok(), "b": RunOutcome(None, None, error="ReadError"), "c": None, "d": RunOutcome(500, "x")}
    assert replied(outcomes) == {"a", "d"}
    assert rollout_ids(12)[:2] == ("real-00", "real-01")
    with pytest.raises(ValueError, match="'rollouts' must be at least 2"):
        rollout_ids(1)


def test_an_exported_rollout_that_replies_after_prepare_is_p2() -> None:
    assert check_silent(["b", "c"], []) == "ok: none of the 2 exported rollouts replied between prepare and the crash"
    # A late reply of a rollout the environment did not export is finished (its reply may predate the prepare).
    assert "1 replies of rollouts not exported arrived after prepare returned" in check_silent(["b"], ["a"])
    with pytest.raises(P2Violation, match=r"1 exported rollouts replied after prepare returned: \['c'\]") as caught:
        check_silent(["b", "c"], ["a", "c"])
    assert caught.value.rollout == "c"


def test_a_reply_must_be_200_with_a_numeric_reward_and_no_failure() -> None:
    assert check_well_formed({"a": ok(0.0), "b": ok(1)}, "replacement").startswith("ok: 2 replacement /runs")
    failed = RunOutcome(200, {**IDENTITY, "failure": {"failure_reason": "boom", "terminal": False}})
    bad = {
        "a failure": failed,
        "no reward": RunOutcome(200, {**IDENTITY, "result": {}}),
        "a bool reward": ok(True),
        "a text reward": ok("1.0"),
        "an infinite reward": ok(float("inf")),
        "a 500": RunOutcome(500, {"error": "boom"}),
        "a cut-off run": RunOutcome(None, None, error="ReadError"),
    }
    for what, outcome in bad.items():
        with pytest.raises(P3Violation, match="HTTP 200 with a numeric reward and no failure"):
            check_well_formed({"x": outcome}, what)
    with pytest.raises(P3Violation, match="1 never replied"):
        check_well_formed({"a": ok(), "b": None}, "replacement")
    both = {**IDENTITY, "result": {"reward": 0.0}, "failure": {"failure_reason": "boom", "terminal": False}}
    with pytest.raises(P3Violation, match="exactly one of 'result' and 'failure' must be set"):
        check_well_formed({"x": RunOutcome(200, both)}, "replacement")


# --- processes -------------------------------------------------------------------------------------------------


@pytest.fixture
def ungated_backend(tmp_path: Path) -> Iterator[str]:
    with running_ungated_backend(tmp_path / "backend.log") as url:
        yield url


@pytest.mark.processes
def test_the_restore_names_its_source_and_the_owner_installs_every_next_attempt() -> None:
    replies = {
        "environment": {"source_checkpoint_id": "real-c1", "restored": ["real-0-a1", "real-1-a1"]},
        "agent": {"source_checkpoint_id": "real-c1", "restored": []},
    }
    assert check_restored(replies, ["environment"], ["real-0", "real-1"]).startswith("ok: 2 participants")
    with pytest.raises(P15Violation, match="its restore reply names"):
        check_restored(replies, ["environment"], ["real-0", "real-1", "real-2"])
    with pytest.raises(P15Violation, match="source_checkpoint_id"):
        check_restored(replies | {"agent": {"source_checkpoint_id": "real-r1"}}, ["environment"], ["real-0", "real-1"])


def test_16_rollouts_against_the_ungated_backend_are_finished_or_continued(ungated_backend: str) -> None:
    # Which rollouts finish before the checkpoint is a race the run observes; the contract holds either way.
    result = run_real_model(ungated_backend + "/v1", rollouts=16)
    assert (result.model, result.rollouts, result.finished + result.exported) == (SERVED_MODEL, 16, 16)
    assert result.finished >= 1
    assert tuple(result.stage_s) == STAGES
    assert all(verdict.startswith("ok: ") for verdict in result.verdicts.values()), result.verdicts
    assert result.not_checked == NOT_CHECKED
    table = result.table()
    assert "continued from the boundary (P4): not checked" in table
    assert "replacements complete (P3): ok" in table


@pytest.mark.processes
def test_a_model_the_server_does_not_serve_is_a_harness_error_before_any_gym_server_starts(
    ungated_backend: str,
) -> None:
    with pytest.raises(RealModelError, match=r"HTTP 404.*does not exist"):
        run_real_model(ungated_backend, model_name="no-such-model")


@pytest.mark.processes
@pytest.mark.skipif(
    not os.environ.get(MODEL_URL_ENV),
    reason=f"real-model mode is opt-in: start an OpenAI-compatible server (`vllm serve Qwen/Qwen3-0.6B "
    f"--enable-auto-tool-choice --tool-call-parser hermes`) and run {MODEL_URL_ENV}=http://127.0.0.1:8000 "
    f"pytest -s tests/scale -k real_model ({MODEL_NAME_ENV} picks the model; docs/real-model.md)",
)
def test_real_model_rollouts_are_either_finished_or_continued_after_a_crash() -> None:
    result = run_real_model(os.environ[MODEL_URL_ENV], model_name=model_name_from_env(), progress=print)
    print(result.table())
    assert result.finished + result.exported == result.rollouts
    assert all(verdict.startswith("ok: ") for verdict in result.verdicts.values()), result.verdicts
