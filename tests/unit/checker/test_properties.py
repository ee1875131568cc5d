"""The property checks on plain, hand-built values: each passes on a good value and raises its own violation type
on every way a value can be bad, naming the rollout or participant it is about."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
import pytest

from ckpt_model.errors import CoordinationError, ParticipantFailure
from ckpt_model.model.contract import VERIFY, Model
from ckpt_model.model.expectation import Expectation, expect
from ckpt_model.properties.clocks import (
    P18Violation,
    P20Violation,
    P21Violation,
    p18_lapsed_first,
    p18_refused_on_its_clock,
    p18_stale_commit_refused,
    p20_budget_kept,
    p21_lapsed_on_waking,
    p21_refused_on_waking,
    p21_still_idle,
)
from ckpt_model.properties.continuation import (
    P2Violation,
    P3Violation,
    P4Violation,
    p2_held_responses,
    p2_no_reply_while_prepared,
    p2_silent_while_checkpointed,
    p3_every_reply_complete,
    p3_reply_complete,
    p3_run_reply_shape,
    p3_still_running,
    p4_calls,
    p4_calls_complete,
)
from ckpt_model.properties.durability import (
    P9Violation,
    P16Violation,
    p9_unchanged,
    p9_verifies,
    p16_no_manifest,
    p16_retry_commits,
    p16_still_prepared,
    p16_write_refused,
)
from ckpt_model.properties.fencing import (
    P10Violation,
    p10_admission_agrees,
    p10_admission_refused,
    p10_each_refused,
    p10_each_replied,
    p10_failed_close_refused,
    p10_lease_lapsed,
    p10_phase,
    p10_prepared_everywhere,
    p10_refusal_came,
    p10_refused_runs_made_no_calls,
    p10_reopened_after_failed_close,
    p10_resume_accepted,
    p10_status_agrees,
    status_mismatches,
)
from ckpt_model.properties.network import (
    P17Violation,
    P19Violation,
    p17_only_reply_lost,
    p17_resume_replayed,
    p17_retry_answered,
    p17_took_effect,
    p19_answered_from_record,
    p19_first_resume,
    p19_only_unreached,
    p19_retry_completes,
    p19_untouched,
)
from ckpt_model.properties.registry import REGISTRY
from ckpt_model.properties.scope import (
    P1Violation,
    p1_exports_exact,
    p1_finished_or_exported,
    p1_replied_or_exported,
    p1_restart_in_scope_refused,
    p1_restarts_reported,
)
from ckpt_model.properties.state import (
    P6Violation,
    P7Violation,
    P8Violation,
    P13Violation,
    p6_exported_state,
    p6_restored,
    p7_callee_refused,
    p7_refused,
    p8_died_in_restore,
    p8_refused_by,
    p13_clean_end,
)
from ckpt_model.properties.verification import P11Violation, p11_blocked, p11_prepared_once_verified, p11_preparing
from ckpt_model.protocol.history import Event, EventType, History
from ckpt_model.protocol.storage import CheckpointUnreadable, Fingerprint

# -- P4 and P11: backend calls (kept from the first version of this file) ----------------------------------------


def test_calls_not_yet_made_are_pending_not_a_violation() -> None:
    assert p4_calls({"r0": (2, 4), "r1": (2,)}, {"r0": (2,), "r1": (2,)}) == ["r0"]


def test_a_policy_call_made_again_is_p4() -> None:
    with pytest.raises(P4Violation, match=r"backend calls \[2, 2\]"):
        p4_calls({"r0-a1": (4,)}, {"r0-a1": (2, 2)})


def test_a_verification_run_again_is_p11() -> None:
    with pytest.raises(P11Violation, match="verify"):
        p4_calls({"r0-a1": ()}, {"r0-a1": (VERIFY,)})


def test_a_verification_skipped_for_a_policy_call_is_p11() -> None:
    with pytest.raises(P11Violation):
        p4_calls({"r0-a1": (VERIFY,)}, {"r0-a1": (4,)})


def test_p4_calls_exactly_as_expected_leave_nothing_missing() -> None:
    calls = {"r0": (2, 4, VERIFY), "r1": (2,)}
    assert p4_calls(calls, dict(calls)) == []


def test_p4_keys_with_no_call_yet_are_returned_missing_in_order() -> None:
    assert p4_calls({"r1": (2,), "r0": (2, 4)}, {}) == ["r0", "r1"]


def test_p4_a_wrong_policy_call_names_the_attempt() -> None:
    with pytest.raises(P4Violation, match=r"rollout r0-a1") as caught:
        p4_calls({"r0-a1": (4,)}, {"r0-a1": (2,)})
    assert type(caught.value) is P4Violation
    assert caught.value.rollout == "r0-a1"


def test_p4_an_extra_call_after_the_script_is_p4() -> None:
    with pytest.raises(P4Violation, match=r"rollout r0\)") as caught:
        p4_calls({"r0": (2, 4)}, {"r0": (2, 4, 4)})
    assert type(caught.value) is P4Violation


def test_p4_calls_of_an_attempt_the_model_never_started_are_p4() -> None:
    with pytest.raises(P4Violation, match=r"rollout r9") as caught:
        p4_calls({"r0": (2,)}, {"r0": (2,), "r9": (2,)})
    assert type(caught.value) is P4Violation


def test_p11_a_judge_call_made_after_the_script_is_p11() -> None:
    with pytest.raises(P11Violation, match=r"rollout r0-a1") as caught:
        p4_calls({"r0-a1": (4,)}, {"r0-a1": (4, VERIFY)})
    assert type(caught.value) is P11Violation


def test_p11_a_policy_call_in_place_of_the_judge_call_is_p11() -> None:
    with pytest.raises(P11Violation, match=r"rollout r0"):
        p4_calls({"r0": (2, 4, VERIFY)}, {"r0": (2, 4, 4)})


# -- P1 -----------------------------------------------------------------------------------------------------------


def test_p1_exports_exact_passes_when_reply_and_disk_name_the_expected_keys() -> None:
    p1_exports_exact("c1", "env", ["r1", "r0"], ["r0", "r1"], ("r1", "r0"))
    p1_exports_exact("c1", "policy", [], [], [])


def test_p1_exports_exact_a_key_missing_from_the_reply_is_lost() -> None:
    with pytest.raises(P1Violation, match=r"\(rollout r1\)") as caught:
        p1_exports_exact("c1", "env", ["r0", "r1"], ["r0"], ["r0", "r1"])
    assert type(caught.value) is P1Violation
    assert "env writes exactly ['r0', 'r1'] in c1" in str(caught.value)
    assert "commit reply names ['r0']; lost ['r1']" in str(caught.value)


def test_p1_exports_exact_an_extra_key_on_disk_is_not_continued() -> None:
    with pytest.raises(P1Violation, match=r"\(rollout r2\)") as caught:
        p1_exports_exact("c1", "agent", ["r0"], ["r0"], ["r0", "r2"])
    assert "records on disk names ['r0', 'r2']; not continued ['r2']" in str(caught.value)
    assert "agent writes exactly" in str(caught.value)


def test_p1_exports_exact_a_key_written_twice_is_a_violation_without_a_rollout() -> None:
    with pytest.raises(P1Violation, match=r"names \['r0', 'r0'\]") as caught:
        p1_exports_exact("c1", "env", ["r0"], ["r0", "r0"], ["r0"])
    assert caught.value.rollout is None


def test_p1_replied_or_exported_passes_when_every_continued_attempt_is_exported() -> None:
    p1_replied_or_exported("c1", ["r0", "r1-a1"], ["r2"], ["r1-a1", "r0"], "environment")


def test_p1_replied_or_exported_a_continued_attempt_not_exported_is_lost() -> None:
    with pytest.raises(P1Violation, match=r"\(rollout r1\)") as caught:
        p1_replied_or_exported("c1", ["r0", "r1"], [], ["r0"], "environment")
    assert type(caught.value) is P1Violation
    assert "environment exported ['r0']: ['r1'] neither replied nor exported" in str(caught.value)


def test_p1_replied_or_exported_an_attempt_that_replied_and_is_exported_is_both() -> None:
    with pytest.raises(P1Violation, match=r"\(rollout r2\)") as caught:
        p1_replied_or_exported("c1", ["r0"], ["r2"], ["r0", "r2"], "agent")
    assert "agent exported ['r2'], which already replied" in str(caught.value)
    assert "replied before c1" in str(caught.value)


# -- P2 -----------------------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def timed(*steps: tuple[float, str, str, EventType | Literal["note"]]) -> History:
    """A history of (time, process, f, type) steps; a `run` completion pairs with that process's last invoke."""
    clock = FakeClock()
    history = History(clock=clock)
    open_runs: dict[str, Event] = {}
    for time_s, process, f, type_ in steps:
        clock.now_s = time_s
        if type_ == "note":
            history.note(process, f)
        elif type_ == "invoke":
            open_runs[process] = history.invoke(process, f)
        else:
            history.complete(open_runs.pop(process), type_, {"result": {"reward": 1.0}})
    return history


def test_p2_replies_outside_every_prepared_interval_pass() -> None:
    history = timed(
        (0.0, "r0", "run", "invoke"),
        (1.0, "r0", "run", "ok"),
        (2.0, "controller", "prepared", "note"),
        (3.0, "r1", "run", "invoke"),
        (3.5, "r1", "run", "fail"),  # a refused /run is not a reply
        (4.0, "controller", "resume", "invoke"),
        (5.0, "r2", "run", "invoke"),
        (6.0, "r2", "run", "ok"),
    )
    p2_no_reply_while_prepared(history)


def test_p2_no_prepared_interval_passes_whatever_replied() -> None:
    p2_no_reply_while_prepared(timed((0.0, "r0", "run", "invoke"), (1.0, "r0", "run", "ok")))


def test_p2_a_reply_at_an_interval_end_is_outside_it() -> None:
    history = timed(
        (0.0, "r0", "run", "invoke"),
        (1.0, "controller", "prepared", "note"),
        (1.0, "r0", "run", "ok"),
        (2.0, "r1", "run", "invoke"),
        (3.0, "controller", "crash", "invoke"),
        (3.0, "r1", "run", "ok"),
    )
    p2_no_reply_while_prepared(history)


def test_p2_a_reply_while_prepared_names_the_attempt_and_its_event() -> None:
    history = timed(
        (0.0, "r0-a1", "run", "invoke"),
        (1.0, "controller", "prepared", "note"),
        (1.5, "r0-a1", "run", "ok"),
        (2.0, "controller", "resume", "invoke"),
    )
    with pytest.raises(P2Violation, match=r"\(rollout r0-a1\)") as caught:
        p2_no_reply_while_prepared(history)
    assert type(caught.value) is P2Violation
    assert caught.value.history_indices == (2,)
    assert "replied at 1.500s" in str(caught.value)


def test_p2_a_reply_in_a_later_or_still_open_interval_is_caught() -> None:
    later = timed(
        (0.0, "controller", "prepared", "note"),
        (1.0, "controller", "crash", "invoke"),
        (2.0, "r1", "run", "invoke"),
        (3.0, "controller", "prepared", "note"),
        (4.0, "controller", "resume", "invoke"),
        (5.0, "controller", "prepared", "note"),
        (9.0, "r1", "run", "ok"),
    )
    with pytest.raises(P2Violation, match=r"\(rollout r1\)"):
        p2_no_reply_while_prepared(later)


def test_p2_held_responses_as_expected_pass() -> None:
    p2_held_responses("c1", 2, 2)


@pytest.mark.parametrize("observed", [1, 3, None])
def test_p2_held_responses_that_differ_are_p2(observed: Any) -> None:
    with pytest.raises(P2Violation, match=rf"while c1 is open[\s\S]*it holds {observed}") as caught:
        p2_held_responses("c1", 2, observed)
    assert type(caught.value) is P2Violation


# -- P3 -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [{"result": {"reward": 1.0}}, {"reward": 1.0}, {"reward": 1}])
def test_p3_a_200_with_the_full_reward_passes(body: Any) -> None:
    p3_reply_complete("r0-a1", 200, body, 1.0)


@pytest.mark.parametrize(
    ("status_code", "body"),
    [
        (200, {"result": {"reward": 0.0}}),
        (200, {"reward": 0.5}),
        (500, {"result": {"reward": 1.0}}),
        (None, None),
        (200, {"result": None}),
        (200, ["reward", 1.0]),
    ],
)
def test_p3_a_wrong_status_or_reward_names_the_attempt(status_code: int | None, body: Any) -> None:
    with pytest.raises(P3Violation, match=r"\(rollout r0-a1\)") as caught:
        p3_reply_complete("r0-a1", status_code, body, 1.0)
    assert type(caught.value) is P3Violation
    assert f"HTTP {status_code}" in str(caught.value)


def test_p3_a_long_body_is_shortened() -> None:
    with pytest.raises(P3Violation) as caught:
        p3_reply_complete("r0", 500, "x" * 1000, 1.0)
    assert "x" * 300 + "..." in str(caught.value)
    assert "x" * 301 not in str(caught.value)


def native_reply(**outcome: Any) -> dict[str, Any]:
    """A native `/run` reply of attempt r0-a1 with `outcome` (`result=...`, `failure=...`)."""
    task_id = {"taskset": "example_single_tool_call:e2e", "task_id": "weather-sf"}
    return {"episode_id": {"rollout_id": "r0", "attempt": 1}, "task_id": task_id, **outcome}


@pytest.mark.parametrize(
    "body",
    [
        native_reply(result={"reward": 1.0}),
        native_reply(failure={"failure_reason": "the agent raised", "terminal": False}),
        native_reply(failure={"failure_reason": "x" * 2000, "terminal": True, "failure_kind": "k", "stage": "seed"}),
        native_reply(failure={"failure_reason": "Episode timed out", "terminal": False}),
        native_reply(
            failure={"failure_reason": "Episode admission timed out", "terminal": False, "stage": "admission"}
        ),
        native_reply(failure={"failure_reason": "Unhandled environment server error: OSError: gone", "terminal": True}),
        {**native_reply(result={"reward": 1.0}), "served_by": "environment-0"},
    ],
    ids=["result", "failure", "every-field", "timed-out", "admission", "unhandled", "extra-at-top"],
)
def test_p3_run_reply_shape_passes_on_the_release_shapes(body: Any) -> None:
    p3_run_reply_shape("r0-a1", 200, body)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (native_reply(), "exactly one of 'result' and 'failure' must be set (got neither)"),
        (
            native_reply(result={"reward": 1.0}, failure={"failure_reason": "x", "terminal": False}),
            "exactly one of 'result' and 'failure' must be set (got both)",
        ),
        (native_reply(failure={"failure_reason": "x" * 2001, "terminal": False}), "'failure.failure_reason'"),
        (native_reply(failure={"failure_reason": "x", "terminal": "no"}), "'failure.terminal'"),
        (native_reply(failure={"failure_reason": "x", "terminal": False, "stage": "verify"}), "'failure.stage'"),
        (native_reply(failure={"failure_reason": "x", "terminal": False, "stage": None}), "'stage' must be left out"),
        (native_reply(failure={"failure_reason": "x", "terminal": False, "why": "y"}), "'failure.why'"),
        ({"result": {"reward": 1.0}}, "'episode_id': Field required; 'task_id': Field required"),
        (native_reply(failure={"failure_reason": "Episode timed out", "terminal": True}), "'failure.terminal'"),
        (
            native_reply(failure={"failure_reason": "Episode timed out", "terminal": False, "stage": "agent"}),
            "'failure.stage': a failure 'Episode timed out' has no stage",
        ),
        (
            native_reply(failure={"failure_reason": "Episode admission timed out", "terminal": False}),
            "'failure.stage': a failure 'Episode admission timed out' has stage 'admission'",
        ),
        (
            native_reply(failure={"failure_reason": "Unhandled environment server error: E: m", "terminal": False}),
            "'failure.terminal'",
        ),
        ("Internal Server Error", "reply must be a JSON object"),
    ],
    ids=[
        "neither",
        "both",
        "long-reason",
        "terminal-text",
        "bad-stage",
        "null-stage",
        "extra-in-failure",
        "no-identity",
        "timed-out-terminal",
        "timed-out-stage",
        "admission-no-stage",
        "unhandled-not-terminal",
        "text",
    ],
)
def test_p3_run_reply_shape_names_the_field_that_misses_it(body: Any, named: str) -> None:
    with pytest.raises(P3Violation, match=r"\(rollout r0-a1\)") as caught:
        p3_run_reply_shape("r0-a1", 200, body)
    assert type(caught.value) is P3Violation
    assert named in str(caught.value)
    assert "nemo-gym 0.7.0's shape" in str(caught.value)


@pytest.mark.parametrize("status_code", [409, 500, None])
def test_p3_run_reply_shape_leaves_refusals_to_their_checks(status_code: int | None) -> None:
    p3_run_reply_shape("r0-a1", status_code, {"error": {"code": "stale_attempt", "detail": "retired"}})


# -- P7 and P10 admission: refusals of a /run ---------------------------------------------------------------------


def refusal(code: str) -> dict[str, Any]:
    return {"error": {"code": code, "detail": "refused"}}


def test_p7_a_409_stale_attempt_passes() -> None:
    p7_refused("r0", 409, refusal("stale_attempt"))


@pytest.mark.parametrize(
    ("status_code", "body"),
    [
        (200, {"result": {"reward": 1.0}}),
        (409, refusal("admission_closed")),
        (400, refusal("stale_attempt")),
        (409, {"detail": "no envelope"}),
        (None, None),
    ],
)
def test_p7_anything_else_names_the_attempt(status_code: int | None, body: Any) -> None:
    with pytest.raises(P7Violation, match=r"\(rollout r0-a2\)") as caught:
        p7_refused("r0-a2", status_code, body)
    assert type(caught.value) is P7Violation


@pytest.mark.parametrize("error", ["stale_attempt", None])
def test_p7_an_error_that_is_not_an_object_is_p7(error: Any) -> None:
    with pytest.raises(P7Violation):
        p7_refused("r0", 409, {"error": error})


def test_p10_admission_a_409_admission_closed_passes() -> None:
    p10_admission_refused("r3", 409, refusal("admission_closed"))


def test_p10_a_run_refused_while_open_that_reached_the_backend_was_admitted() -> None:
    """Before P4: the call is the consequence, the admission the bug."""
    with pytest.raises(P10Violation, match=r"\(rollout r3\)[\s\S]*admitted: backend calls \[2\]"):
        p10_refused_runs_made_no_calls(["r3"], {"r0": (2, 4), "r3": (2,)})


def test_p10_runs_refused_while_open_that_called_nothing_pass() -> None:
    p10_refused_runs_made_no_calls(["r3", "r4"], {"r0": (2, 4), "r3": ()})


@pytest.mark.parametrize(
    ("status_code", "body"),
    [(200, {"result": {"reward": 1.0}}), (409, refusal("stale_attempt")), (503, refusal("admission_closed"))],
)
def test_p10_admission_anything_else_names_the_rollout(status_code: int, body: Any) -> None:
    with pytest.raises(P10Violation, match=r"\(rollout r3\)") as caught:
        p10_admission_refused("r3", status_code, body)
    assert type(caught.value) is P10Violation
    assert f"HTTP {status_code}" in str(caught.value)


def test_p10_admission_an_error_that_is_not_an_object_is_p10() -> None:
    with pytest.raises(P10Violation):
        p10_admission_refused("r3", 409, {"error": "admission_closed"})


# -- P9 -----------------------------------------------------------------------------------------------------------


def fingerprint(records_sha256: str = "b" * 64, episode_ids: tuple[str, ...] = ("r0",)) -> Fingerprint:
    return Fingerprint(
        manifest_sha256="a" * 64,
        records_file="records.jsonl",
        records_sha256=records_sha256,
        record_count=len(episode_ids),
        episode_ids=episode_ids,
    )


def test_p9_verifies_passes_when_every_directory_reads() -> None:
    p9_verifies("c1", {"env": fingerprint(), "agent": fingerprint()})
    p9_verifies("c1", {})


def test_p9_verifies_an_unreadable_directory_names_it() -> None:
    read = {"agent": fingerprint(), "env": CheckpointUnreadable("records digest mismatch")}
    with pytest.raises(P9Violation, match=r"c1/env verifies[\s\S]*records digest mismatch") as caught:
        p9_verifies("c1", read)
    assert type(caught.value) is P9Violation


def test_p9_unchanged_passes_on_an_equal_fingerprint() -> None:
    p9_unchanged("c1", {"env": fingerprint()}, {"env": fingerprint(), "extra": object()})


def test_p9_unchanged_an_unreadable_directory_is_p9() -> None:
    with pytest.raises(P9Violation, match=r"c1/env verifies[\s\S]*manifest missing") as caught:
        p9_unchanged("c1", {"env": fingerprint()}, {"env": CheckpointUnreadable("manifest missing")})
    assert type(caught.value) is P9Violation


def test_p9_unchanged_a_directory_that_changed_but_still_verifies_is_p9() -> None:
    changed = fingerprint(records_sha256="c" * 64, episode_ids=("r0", "r1"))
    with pytest.raises(P9Violation, match=r"c1/agent unchanged since its commit") as caught:
        p9_unchanged("c1", {"agent": fingerprint()}, {"agent": changed})
    assert "c" * 64 in str(caught.value)


def test_p9_unchanged_a_directory_gone_from_the_read_is_p9() -> None:
    with pytest.raises(P9Violation, match=r"c1/env unchanged[\s\S]*observed: None"):
        p9_unchanged("c1", {"env": fingerprint()}, {})


# -- P10: control calls -------------------------------------------------------------------------------------------


def failure(name: str, code: str | None, http_status: int | None = 409) -> ParticipantFailure:
    return ParticipantFailure(participant=name, http_status=http_status, code=code, detail="refused")


def test_p10_each_refused_passes_when_every_participant_refused_with_the_code() -> None:
    outcomes = {name: failure(name, "stale_checkpoint") for name in ("env", "agent", "policy")}
    p10_each_refused("commit(c1)", "stale_checkpoint", outcomes)


def test_p10_each_refused_one_participant_that_accepted_is_named() -> None:
    outcomes = {"env": failure("env", "stale_checkpoint"), "agent": {"phase": "committed"}}
    with pytest.raises(P10Violation, match=r"agent: accepted: \{'phase': 'committed'\}") as caught:
        p10_each_refused("commit(c1)", "stale_checkpoint", outcomes)
    assert type(caught.value) is P10Violation
    assert "env" not in str(caught.value.observed)


def test_p10_each_refused_one_refused_with_another_code_is_named() -> None:
    outcomes = {"env": failure("env", "stale_checkpoint"), "policy": failure("policy", "invalid_phase")}
    with pytest.raises(P10Violation, match=r"policy: HTTP 409 invalid_phase refused"):
        p10_each_refused("resume(c1)", "stale_checkpoint", outcomes)


def test_p10_each_refused_lists_every_wrong_participant_in_order() -> None:
    outcomes = {"z": failure("z", None, None), "a": {"ok": True}}
    with pytest.raises(P10Violation) as caught:
        p10_each_refused("prepare(c1)", "stale_checkpoint", outcomes)
    assert caught.value.observed == "a: accepted: {'ok': True}; z: refused"


def test_p10_resume_accepted__a_refusal_the_protocol_never_gives_a_resume_is_p10() -> None:
    """An idle participant that never saw the ID must answer a resume as idempotent and remember it."""
    error = CoordinationError(
        "resume", {"agent": failure("agent", "invalid_phase"), "env": failure("env", "deadline_exceeded")}
    )
    with pytest.raises(P10Violation, match=r"resume c3 accepted by every participant") as caught:
        p10_resume_accepted("c3", error)
    assert caught.value.observed == "agent: HTTP 409 invalid_phase refused"


def test_p10_resume_accepted__stale_checkpoint_is_never_a_resume_answer() -> None:
    with pytest.raises(P10Violation, match=r"policy: HTTP 409 stale_checkpoint"):
        p10_resume_accepted("c1", CoordinationError("resume", {"policy": failure("policy", "stale_checkpoint")}))


def test_p10_resume_accepted__no_reply_a_passed_deadline_or_a_server_error_is_left_to_the_caller() -> None:
    """Slowness and lost replies are never this verdict: the caller decides what they mean."""
    error = CoordinationError(
        "resume",
        {
            "agent": failure("agent", None, None),
            "env": failure("env", "deadline_exceeded"),
            "policy": failure("policy", "checkpoint_error", 500),
        },
    )
    p10_resume_accepted("c1", error)


def test_p10_each_replied_passes_when_every_reply_is_the_expected_one() -> None:
    replies = {"env": {"phase": "idle", "idempotent": True}, "agent": {"phase": "idle", "idempotent": True}}
    p10_each_replied("retry(resume c1)", replies, dict(replies))


def test_p10_each_replied_a_different_reply_names_the_participant() -> None:
    expected = {"agent": {"phase": "committed"}, "env": {"phase": "committed"}}
    outcomes = {"agent": {"phase": "committed"}, "env": {"phase": "prepared"}}
    with pytest.raises(P10Violation, match=r"answered by env with[\s\S]*env answered \{'phase': 'prepared'\}") as c:
        p10_each_replied("retry(commit c1)", expected, outcomes)
    assert type(c.value) is P10Violation
    assert "differ too" not in str(c.value)


def test_p10_each_replied_a_refusal_is_described_and_the_others_listed() -> None:
    expected = {"agent": {"phase": "idle"}, "env": {"phase": "idle"}, "policy": {"phase": "idle"}}
    outcomes = {"agent": failure("agent", "invalid_phase"), "env": {"phase": "idle"}, "policy": None}
    with pytest.raises(P10Violation, match=r"agent answered HTTP 409 invalid_phase refused \(and \['policy'\]"):
        p10_each_replied("retry(resume c1)", expected, outcomes)


def test_p10_each_replied_a_participant_the_model_expects_nothing_of_differs() -> None:
    with pytest.raises(P10Violation, match=r"answered by extra with None"):
        p10_each_replied("retry(resume c1)", {}, {"extra": {"phase": "idle"}})


def test_p10_phase_passes_on_the_expected_phase_and_id() -> None:
    p10_phase("env", ("prepared", "c1"), {"phase": "prepared", "checkpoint_id": "c1", "kind": "environment"})
    p10_phase("env", ("idle", None), {"phase": "idle", "checkpoint_id": None})


@pytest.mark.parametrize(
    "status",
    [{"phase": "idle", "checkpoint_id": "c1"}, {"phase": "prepared", "checkpoint_id": "c2"}, {}],
)
def test_p10_phase_a_wrong_phase_or_id_names_the_participant(status: dict[str, Any]) -> None:
    with pytest.raises(P10Violation, match=r"agent in phase \('prepared', 'c1'\)[\s\S]*observed: agent in") as c:
        p10_phase("agent", ("prepared", "c1"), status)
    assert type(c.value) is P10Violation


# -- status_mismatches --------------------------------------------------------------------------------------------


def expectation(**changes: Any) -> Expectation:
    base = Expectation(
        calls={},
        waiting=frozenset(),
        phase="idle",
        checkpoint_id=None,
        held=0,
        inflight=0,
        episodes=0,
        sessions=0,
        restored_pending=(),
        retired_rollouts=0,
    )
    return attrs.evolve(base, **changes)


def status(kind: str, counts: dict[str, int], **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "phase": "idle", "report": {"counts": counts}, "retired_rollouts": 0, **fields}


def test_status_environment_agrees() -> None:
    expected = expectation(episodes=2, restored_pending=("r0-a1", "r1-a1"))
    observed = status("environment", {"episodes": 2}, restored_pending=["r0-a1", "r1-a1"])
    assert status_mismatches(expected, observed) == []


def test_status_environment_episodes_and_restored_pending_differ() -> None:
    expected = expectation(episodes=2, restored_pending=("r0-a1",))
    observed = status("environment", {"episodes": 1}, restored_pending=[])
    assert status_mismatches(expected, observed) == [
        "counts episodes=1 (expected 2)",
        "restored_pending=[] (expected ['r0-a1'])",
    ]


def test_status_environment_without_restored_pending_reads_as_none_pending() -> None:
    assert status_mismatches(expectation(), status("environment", {"episodes": 0})) == []
    assert status_mismatches(expectation(restored_pending=("r0-a1",)), status("environment", {"episodes": 0})) == [
        "restored_pending=None (expected ['r0-a1'])"
    ]


def test_status_agent_sessions_and_accepting() -> None:
    expected = expectation(sessions=1, accepting=False, restored_pending=("r0-a1",))
    assert status_mismatches(expected, status("agent", {"sessions": 1}, accepting=False)) == []
    assert status_mismatches(expected, status("agent", {"sessions": 0}, accepting=True)) == [
        "counts sessions=0 (expected 1)",
        "accepting=True (expected False)",
    ]


def test_status_accepting_is_compared_only_when_present() -> None:
    assert status_mismatches(expectation(sessions=1, accepting=False), status("agent", {"sessions": 1})) == []
    assert status_mismatches(expectation(accepting=False), status("resources", {"sessions": 0})) == []
    assert status_mismatches(expectation(accepting=False), status("model", {"inflight": 0, "held": 0})) == []
    assert status_mismatches(expectation(), status("model", {"inflight": 0, "held": 0}, accepting=False)) == [
        "accepting=False (expected True)"
    ]


def test_status_resources_sessions() -> None:
    expected = expectation(sessions=5, resources_sessions=2)
    assert status_mismatches(expected, status("resources", {"sessions": 2})) == []
    assert status_mismatches(expected, status("resources", {"sessions": 5})) == ["counts sessions=5 (expected 2)"]


def test_status_model_inflight_and_held() -> None:
    expected = expectation(inflight=2, held=1)
    assert status_mismatches(expected, status("model", {"inflight": 2, "held": 1})) == []
    assert status_mismatches(expected, status("model", {"inflight": 1})) == [
        "counts inflight=1 (expected 2)",
        "counts held=None (expected 1)",
    ]


def test_status_retired_rollouts_are_compared_for_every_kind() -> None:
    expected = expectation(retired_rollouts=1)
    for kind, counts in (("environment", {"episodes": 0}), ("agent", {"sessions": 0}), ("resources", {"sessions": 0})):
        assert status_mismatches(expected, status(kind, counts, retired_rollouts=1)) == []
        assert status_mismatches(expected, status(kind, counts)) == ["retired_rollouts=0 (expected 1)"]


def test_status_of_other_kinds_ignores_their_counts_and_restored_pending() -> None:
    expected = expectation(episodes=3, restored_pending=("r0-a1",))
    observed = status("agent", {"sessions": 0, "episodes": 9}, restored_pending=[])
    assert status_mismatches(expected, observed) == []


def test_status_from_the_model_agrees_with_a_matching_report() -> None:
    model, _ = Model(topology="native").dispatch()
    model, _ = model.prepare()
    expected = expect(model)
    assert status_mismatches(expected, status("agent", {"sessions": 1}, accepting=False)) == []
    assert status_mismatches(expected, status("resources", {"sessions": 1})) == []
    assert status_mismatches(expected, status("model", {"inflight": 1, "held": 0})) == []


# -- P13 ----------------------------------------------------------------------------------------------------------


def clean(kind: str = "environment", **changes: Any) -> dict[str, Any]:
    base = {
        "kind": kind,
        "phase": "idle",
        "retired_rollouts": 0,
        "restored_pending": [],
        "retired_sessions": [],
        "accepting": True,
        "report": {"counts": {"episodes": 0, "sessions": 0, "cut_skipped": 4}},
    }
    return base | changes


def test_p13_idle_and_clean_participants_pass() -> None:
    p13_clean_end({"env": clean(), "agent": clean("agent"), "policy": {"phase": "idle"}})
    p13_clean_end({})


@pytest.mark.parametrize(
    "leftover",
    [
        {"phase": "prepared"},
        {"phase": "committed"},
        {"report": {"counts": {"episodes": 1}}},
        {"report": {"counts": {"sessions": 0, "inflight": 2}}},
        {"retired_rollouts": 1},
        {"restored_pending": ["r0-a1"]},
        {"retired_sessions": ["s-r0"]},
        {"accepting": False},
    ],
    ids=["prepared", "committed", "episodes", "inflight", "retired", "restored_pending", "retired_sessions", "closed"],
)
def test_p13_each_kind_of_leftover_names_the_participant(leftover: dict[str, Any]) -> None:
    statuses = {"agent": clean("agent"), "env": clean(**leftover)}
    with pytest.raises(P13Violation, match=r"env idle and accepting with nothing left") as caught:
        p13_clean_end(statuses)
    assert type(caught.value) is P13Violation
    observed = caught.value.observed
    assert isinstance(observed, dict)
    assert set(observed) == {"phase", "retired_rollouts", "restored_pending", "accepting", "counts", "retired_sessions"}


def test_the_docs_property_table_says_what_the_registry_says() -> None:
    """Each row of docs/how-it-works.md's property table names a registered property and says 'yes' exactly when
    the checker checks it, so the docs cannot claim a check the code does not make."""
    docs = (Path(__file__).parents[3] / "docs" / "how-it-works.md").read_text()
    table = docs[docs.index("## The properties") :].split("\n\n")[1]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    documented = {cell.split()[0]: checked.strip() == "yes" for cell, checked in rows}
    assert documented == {pid: info.checked for pid, info in REGISTRY.items()}


def test_p10_prepared_everywhere_passes_when_prepared_and_names_what_blocks() -> None:
    p10_prepared_everywhere("c1", True, {}, [])
    with pytest.raises(P10Violation, match=r"(?s)c1 prepared everywhere.*blockers \{'agent': \['r0'\]\}"):
        p10_prepared_everywhere("c1", False, {"agent": ["r0"]}, [])


def test_p10_prepared_everywhere_reports_a_prepare_still_waiting_with_the_status_blockers() -> None:
    with pytest.raises(
        P10Violation, match=r"still preparing after 10.0 s; the statuses report blockers \{'environment'"
    ):
        p10_prepared_everywhere("c1", False, {"environment": ["r1"]}, [], waited_s=10.0)


def test_p10_prepared_everywhere_blames_verification_when_one_runs() -> None:
    with pytest.raises(P11Violation, match=r"\['r0'\] verify in mode replay"):
        p10_prepared_everywhere("c1", False, {"environment": ["r0"]}, ["r0"])


def test_p11_blocked_needs_exactly_the_verifying_keys_as_the_owners_blockers() -> None:
    p11_blocked("c2", "environment", ["r0"], False, {"environment": ["r0"]})
    for prepared, blockers in [(True, {}), (False, {"environment": ["r0", "r1"]}), (False, {"agent": ["r0"]})]:
        with pytest.raises(P11Violation) as caught:
            p11_blocked("c2", "environment", ["r0"], prepared, blockers)
        assert caught.value.rollout == "r0"


def test_p11_prepared_once_verified_fails_a_prepare_still_blocked() -> None:
    p11_prepared_once_verified("c3", ["r0"], True, {})
    with pytest.raises(P11Violation, match=r"prepared once the verifications of \['r0'\] finished"):
        p11_prepared_once_verified("c3", ["r0"], False, {"environment": ["r0"]})


def test_status_marks_of_a_participant_restarted_alone_are_its_own() -> None:
    expected = expectation(retired_rollouts=2, retired_by_kind=(("environment", 0),))
    assert status_mismatches(expected, status("environment", {"episodes": 0}, retired_rollouts=0)) == []
    assert status_mismatches(expected, status("agent", {"sessions": 0}, retired_rollouts=2)) == []
    assert status_mismatches(expected, status("environment", {"episodes": 0}, retired_rollouts=2)) == [
        "retired_rollouts=2 (expected 0)"
    ]
    assert status_mismatches(expected, status("agent", {"sessions": 0}, retired_rollouts=0)) == [
        "retired_rollouts=0 (expected 2)"
    ]


def restore_refusal(name: str, code: str = "invalid_checkpoint_state") -> ParticipantFailure:
    return ParticipantFailure(participant=name, http_status=422, code=code, detail="records digest mismatch")


def test_p8_holds_when_the_damaged_participant_alone_refuses_and_the_cleanup_succeeds() -> None:
    p8_refused_by("c1-restore2", ["agent"], "damaged", {"agent": restore_refusal("agent")}, [])


def test_p8_holds_when_every_participant_missing_its_share_refuses() -> None:
    failures = {"agent": restore_refusal("agent"), "resources": restore_refusal("resources")}
    p8_refused_by("c1-restore2", ["agent", "resources"], "no share", failures, [])


def test_p8_fails_when_one_of_several_refusers_installs() -> None:
    with pytest.raises(P8Violation, match="resources installed it"):
        p8_refused_by("c1-restore2", ["agent", "resources"], "no share", {"agent": restore_refusal("agent")}, [])


@pytest.mark.parametrize(
    ("failures", "cleanup", "shown"),
    [
        ({}, [], "agent installed it"),
        ({"agent": restore_refusal("agent", "checkpoint_error")}, [], "checkpoint_error"),
        ({"agent": restore_refusal("agent"), "environment": restore_refusal("environment")}, [], "refused as well by"),
        ({"agent": restore_refusal("agent")}, ["cleanup retire also failed"], "cleanup failed"),
    ],
    ids=["victim-installed", "victim-wrong-code", "another-refused", "cleanup-failed"],
)
def test_p8_fails_when_the_refusal_or_the_cleanup_is_not_the_victims_alone(
    failures: dict[str, ParticipantFailure], cleanup: list[str], shown: str
) -> None:
    with pytest.raises(P8Violation, match=shown):
        p8_refused_by("c1-restore2", ["agent"], "damaged", failures, cleanup)


def counter_record(rollout: str, attempt: int, count: object) -> dict[str, object]:
    state = {"count": count}
    return {"episode_id": {"rollout_id": rollout, "attempt": attempt}, "session_id": f"s-{rollout}", "state": state}


def test_p6_exported_state_passes_when_every_record_holds_the_computed_state() -> None:
    expected = {"r0": {"count": 4}, "r1-a1": {"count": 6}}
    p6_exported_state("c1", "resources", expected, [counter_record("r1", 1, 6), counter_record("r0", 0, 4)])
    p6_exported_state("c1", "resources", {}, [])


def test_p6_exported_state_a_count_written_wrong_is_a_violation() -> None:
    with pytest.raises(P6Violation, match=r"\(rollout r0\)") as caught:
        p6_exported_state("c1", "resources", {"r0": {"count": 4}}, [counter_record("r0", 0, 3)])
    assert type(caught.value) is P6Violation
    assert "resources writes the states {'r0': {'count': 4}} in c1" in str(caught.value)
    assert "records on disk hold {'r0': {'count': 3}}" in str(caught.value)


def test_p6_exported_state_a_session_not_written_is_a_violation() -> None:
    with pytest.raises(P6Violation, match=r"hold \{\}"):
        p6_exported_state("c1", "resources", {"r0": {"count": 4}}, [])


def test_p6_restored_passes_when_the_reply_and_the_status_show_the_next_attempts_of_the_records() -> None:
    p6_restored("c1-restore2", "resources", ["r1-a1", "r0-a1"], ["r0-a1", "r1-a1"], 2)
    p6_restored("c1-restore2", "resources", [], [], 0)


def test_p6_restored_a_skipped_install_is_a_violation() -> None:
    """Gym's negative control: a restore that never installs the resources sessions."""
    with pytest.raises(P6Violation, match=r"\(rollout r0-a1\)") as caught:
        p6_restored("c1-restore2", "resources", ["r0-a1"], [], 0)
    assert "resources restores the exported sessions of ['r0-a1'] in c1-restore2" in str(caught.value)
    assert "its restore reply names [] as restored; its status counts 0 session(s)" in str(caught.value)


def test_p6_restored_a_reply_that_claims_sessions_the_status_does_not_count_is_a_violation() -> None:
    with pytest.raises(P6Violation, match=r"names \['r0-a1'\] as restored; its status counts 0"):
        p6_restored("c1-restore2", "resources", ["r0-a1"], ["r0-a1"], 0)


def test_p6_restored_a_reply_without_a_list_is_a_violation() -> None:
    with pytest.raises(P6Violation, match="names None"):
        p6_restored("c1-restore2", "resources", [], None, 0)


def test_status_the_restart_servers_count_restarts_the_others_the_rest() -> None:
    expected = expectation(episodes=1, resources_sessions=1, restart_episodes=2, restart_sessions=2)
    agree = [
        status("environment", {"episodes": 1}, instance="environment", restored_pending=[]),
        status("environment", {"episodes": 2}, instance="restart_environment", restored_pending=[]),
        status("resources", {"sessions": 1}, instance="resources"),
        status("resources", {"sessions": 2}, instance="restart_resources"),
    ]
    assert [status_mismatches(expected, observed) for observed in agree] == [[], [], [], []]
    swapped = status("environment", {"episodes": 1}, instance="restart_environment", restored_pending=[])
    assert status_mismatches(expected, swapped) == ["counts episodes=1 (expected 2)"]
    restored = attrs.evolve(expected, restored_pending=("r0-a1",))
    assert status_mismatches(restored, agree[1]) == [], "the restart environment restores nothing"
    assert status_mismatches(restored, agree[0]) == ["restored_pending=[] (expected ['r0-a1'])"]


# -- P1: restarts ----------------------------------------------------------------------------------------------


def prepared(restarts: list[str]) -> dict[str, Any]:
    return {"phase": "prepared", "report": {"ready": True, "blockers": [], "counts": {}, "restarts": restarts}}


def test_p1_restarts_reported_by_the_restart_servers_and_nobody_else_pass() -> None:
    replies = {
        "environment": prepared([]),
        "restart_environment": prepared(["r1"]),
        "restart_resources": prepared(["r1"]),
        "agent": prepared([]),
    }
    p1_restarts_reported("c1", ["r1"], replies)


def test_p1_a_restart_server_that_misses_a_restart_names_it() -> None:
    replies = {"restart_environment": prepared(["r1"]), "restart_resources": prepared([])}
    with pytest.raises(P1Violation, match=r"restart_resources reports exactly \['r1'\]") as caught:
        p1_restarts_reported("c1", ["r1"], replies)
    assert caught.value.rollout == "r1"


def test_p1_a_continued_attempt_reported_as_a_restart_is_p1() -> None:
    with pytest.raises(P1Violation, match=r"environment reports nothing outside \[\]") as caught:
        p1_restarts_reported("c1", [], {"environment": prepared(["r0"])})
    assert (caught.value.rollout, caught.value.observed) == ("r0", "its prepare reply reports ['r0']")


def test_p1_restart_in_scope_refused_everywhere_passes() -> None:
    outcomes = {name: failure(name, "restart_in_scope") for name in ("restart_environment", "restart_resources")}
    p1_restart_in_scope_refused("c1", outcomes)


@pytest.mark.parametrize(
    "outcome", [{"phase": "committed"}, failure("restart_resources", "invalid_phase")], ids=["accepted", "other"]
)
def test_p1_restart_in_scope_accepted_or_refused_otherwise_names_the_participant(outcome: Any) -> None:
    outcomes = {"restart_environment": failure("restart_environment", "restart_in_scope"), "restart_resources": outcome}
    with pytest.raises(P1Violation, match=r"observed: restart_resources: ") as caught:
        p1_restart_in_scope_refused("c1", outcomes)
    assert "restart_environment" not in str(caught.value.observed)


def test_p1_exports_exact_optional_keys_may_be_written_or_not() -> None:
    p1_exports_exact("c1", "agent", ["r0"], ["r0", "r1"], ["r0"], optional={"r1"})
    with pytest.raises(P1Violation, match=r"lost \['r0'\]"):
        p1_exports_exact("c1", "agent", ["r0"], ["r1"], ["r1"], optional={"r1"})
    with pytest.raises(P1Violation, match=r"not continued \['r2'\]"):
        p1_exports_exact("c1", "agent", ["r0"], ["r0", "r2"], ["r0"], optional={"r1"})


# -- P8: a participant dying in its restore --------------------------------------------------------------------------


def test_p8_died_in_restore_the_victim_silent_and_the_others_restored_pass() -> None:
    outcomes = {"agent": failure("agent", None, None), "environment": {"phase": "restored", "restored": []}}
    p8_died_in_restore("c1-restore2", "agent", outcomes)


@pytest.mark.parametrize(
    ("victim_outcome", "shown"),
    [({"phase": "restored"}, "answered"), (failure("agent", "invalid_checkpoint_state"), "HTTP 409")],
)
def test_p8_died_in_restore_a_victim_that_answered_is_p8(victim_outcome: Any, shown: str) -> None:
    outcomes = {"agent": victim_outcome, "environment": {"phase": "restored"}}
    with pytest.raises(P8Violation, match=f"observed: agent {shown}"):
        p8_died_in_restore("c1-restore2", "agent", outcomes)


def test_p8_died_in_restore_another_participant_that_did_not_restore_is_named() -> None:
    outcomes = {"agent": failure("agent", None, None), "environment": failure("environment", "checkpoint_error")}
    with pytest.raises(P8Violation, match=r"not restored: \{'environment': 'HTTP 409 checkpoint_error"):
        p8_died_in_restore("c1-restore2", "agent", outcomes)


# -- verdicts of the settle (quiescence) and of scale mode ----------------------------------------------------------


def test_p3_still_running_passes_while_the_run_has_neither_replied_nor_failed() -> None:
    p3_still_running("r0", 1, 2, None, None, None, None)
    p3_still_running("r0", 1, 2, "c1", None, None, None)


@pytest.mark.parametrize(
    ("open_checkpoint", "status_code", "error", "violation", "shown"),
    [
        (None, None, "ReadError", P3Violation, "it failed: ReadError"),
        ("c1", None, "ReadError", P3Violation, "it failed: ReadError"),
        ("c1", 200, None, P2Violation, "no reply while c1 is open"),
        (None, 200, None, P4Violation, "it ended with HTTP 200"),
        (None, 500, None, P3Violation, "it ended with HTTP 500"),
    ],
    ids=["failed", "failed-while-open", "replied-while-open", "replied-200", "replied-500"],
)
def test_p3_still_running_an_ended_run_breaks_the_property_of_how_it_ended(
    open_checkpoint: str | None, status_code: int | None, error: str | None, violation: type[Exception], shown: str
) -> None:
    with pytest.raises(violation, match=shown) as caught:
        p3_still_running("r0", 1, 2, open_checkpoint, status_code, {"result": {}}, error)
    assert type(caught.value) is violation
    assert caught.value.rollout == "r0"


def test_p10_status_agrees_passes_without_mismatches() -> None:
    p10_status_agrees(None, "phase idle", [])


def test_p10_status_agrees_a_mismatch_is_the_steps_property_or_p10() -> None:
    with pytest.raises(P10Violation, match="status of agent counts sessions=1"):
        p10_status_agrees(None, "phase idle", ["status of agent counts sessions=1 (expected 0)"])
    with pytest.raises(P7Violation, match="retired_rollouts=0"):
        p10_status_agrees(P7Violation, "phase idle", ["status of agent retired_rollouts=0 (expected 1)"])


def test_p10_admission_agrees_passes_when_no_mismatch_is_about_admission() -> None:
    p10_admission_agrees("phase idle", ["status of agent counts sessions=1 (expected 0)"], ["x"], 10.0)


def test_p10_admission_agrees_a_contradicting_admission_is_p10_with_what_is_pending() -> None:
    mismatches = ["status of agent accepting=False (expected True)", "status of agent counts sessions=1 (expected 0)"]
    with pytest.raises(P10Violation) as caught:
        p10_admission_agrees("phase idle", mismatches, ["r0 reply"], 10.0)
    assert caught.value.observed == (
        "status of agent accepting=False (expected True) (still pending after 10 s: ['r0 reply'])"
    )


def test_p10_refusal_came_passes_unless_only_refusals_are_pending_beside_a_mismatch() -> None:
    mismatch = ["status of environment counts episodes=1 (expected 0)"]
    p10_refusal_came(None, "phase idle", ["r0 refusal after retire"], [])
    p10_refusal_came(None, "phase idle", [], mismatch)
    p10_refusal_came(None, "phase idle", ["r0 refusal after retire", "r1 reply"], mismatch)


def test_p10_refusal_came_a_refusal_taken_in_is_the_steps_property_or_p10() -> None:
    mismatch = ["status of environment counts episodes=1 (expected 0)"]
    with pytest.raises(P7Violation) as caught:
        p10_refusal_came(P7Violation, "phase idle", ["r0 refusal after retire"], mismatch)
    assert caught.value.observed == "r0 refusal after retire; status of environment counts episodes=1 (expected 0)"
    with pytest.raises(P10Violation):
        p10_refusal_came(None, "phase idle", ["r0 refusal while a checkpoint is open"], mismatch)


def test_p10_lease_lapsed_passes_when_every_participant_is_idle() -> None:
    p10_lease_lapsed("c1", {"agent": ("idle", None), "environment": ("idle", None)}, 0.5)


def test_p10_lease_lapsed_a_participant_still_prepared_is_p10() -> None:
    phases = {"agent": ("idle", None), "environment": ("prepared", "c1")}
    with pytest.raises(P10Violation, match=r"once the lease of c1 lapsed") as caught:
        p10_lease_lapsed("c1", phases, 10.25)
    assert caught.value.observed == f"phases {phases} 10.2 s after it lapsed"


def test_p11_preparing_passes_on_exactly_the_blockers() -> None:
    p11_preparing("c1", "environment", ["r0", "r1"], ["preparing", "c1", ["r0", "r1"]], returned=False)


@pytest.mark.parametrize(
    ("seen", "returned", "shown"),
    [
        (["preparing", "c1", ["r0"]], False, r"\('preparing', 'c1', \['r0'\]\)$"),
        (["prepared", "c1", []], True, r"\('prepared', 'c1', \[\]\); the prepare returned$"),
    ],
    ids=["other-blockers", "returned"],
)
def test_p11_preparing_other_blockers_or_a_returned_prepare_is_p11(seen: list[Any], returned: bool, shown: str) -> None:
    with pytest.raises(P11Violation, match=shown) as caught:
        p11_preparing("c1", "environment", ["r0", "r1"], seen, returned)
    assert caught.value.rollout == "r0"


def test_p1_finished_or_exported_passes_when_disjoint_and_covering() -> None:
    p1_finished_or_exported(["a", "b", "c"], ["a"], ["b", "c"])


@pytest.mark.parametrize(
    ("finished", "exported", "rollout", "shown"),
    [
        (["a", "b"], ["b", "c"], "b", r"1 replied and were exported: \['b'\]"),
        (["a"], ["b"], "c", r"1 neither replied nor were exported: \['c'\]"),
        (["a"], ["b", "c", "z"], "z", r"1 exported that were never dispatched: \['z'\]"),
    ],
    ids=["both", "lost", "never-dispatched"],
)
def test_p1_finished_or_exported_overlap_loss_or_stranger_is_p1(
    finished: list[str], exported: list[str], rollout: str, shown: str
) -> None:
    with pytest.raises(P1Violation, match=shown) as caught:
        p1_finished_or_exported(["a", "b", "c"], finished, exported)
    assert caught.value.rollout == rollout


def test_p1_finished_or_exported_names_ten_keys_then_counts_the_rest() -> None:
    rollouts = [f"r{index:02d}" for index in range(12)]
    with pytest.raises(P1Violation, match=r"12 neither replied .*'r09'\] and 2 more$"):
        p1_finished_or_exported(rollouts, [], [])


def test_p2_silent_while_checkpointed_passes_when_none_replied() -> None:
    p2_silent_while_checkpointed(None)


def test_p2_silent_while_checkpointed_a_run_that_ended_is_p2() -> None:
    with pytest.raises(P2Violation, match="observed: 1 /runs that should wait at the backend ended"):
        p2_silent_while_checkpointed("1 /runs that should wait at the backend ended, r3: ...")


def test_p3_every_reply_complete_passes_on_every_reward() -> None:
    replies = {"a": (200, native_reply(result={"reward": 1.0})), "b": (200, native_reply(result={"reward": 1}))}
    p3_every_reply_complete("replacement", 1.0, replies)


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (None, r"1 never replied: \['b'\]"),
        ((500, {"error": "boom"}), r"1 did not \(\['b'\]\); b: HTTP 500"),
        ((200, native_reply(result={"reward": 0.0})), r"1 did not \(\['b'\]\); b: HTTP 200"),
        ((None, None), r"1 did not \(\['b'\]\); b: HTTP None"),
        ((200, {"result": {"reward": 1.0}}), r"1 did not \(\['b'\]\); b: 'episode_id': Field required"),
    ],
    ids=["never", "500", "reward", "cut-off", "shape"],
)
def test_p3_every_reply_complete_a_missing_or_wrong_reply_is_p3(
    reply: tuple[int | None, Any] | None, shown: str
) -> None:
    replies = {"a": (200, native_reply(result={"reward": 1.0})), "b": reply}
    with pytest.raises(P3Violation, match=shown) as caught:
        p3_every_reply_complete("replacement", 1.0, replies)
    assert caught.value.rollout == "b"


def test_p4_calls_complete_passes_on_exactly_the_expected_calls_of_the_planned_keys() -> None:
    p4_calls_complete({"b": (2, 4), "b-a1": (4,)}, {"b": (2, 4), "b-a1": (4,), "other": (2,)})


def test_p4_calls_complete_missing_calls_are_p4() -> None:
    with pytest.raises(P4Violation, match=r"1 keys are missing calls once every run replied, b-a1: \[\]") as caught:
        p4_calls_complete({"b": (2, 4), "b-a1": (4,)}, {"b": (2, 4)})
    assert caught.value.rollout == "b-a1"


# -- P16: failed and stalled writes -------------------------------------------------------------------------------


def test_p16_write_refused_passes_for_gyms_code_from_the_victim_alone() -> None:
    failures = {"environment": failure("environment", "invalid_checkpoint_state", 422)}
    p16_write_refused("c1", "environment", "ENOSPC at records.write", "ENOSPC", failures)
    stalled = {"agent": failure("agent", "deadline_exceeded", 409)}
    p16_write_refused("c1", "agent", "stall at manifest.write", "stall", stalled)


@pytest.mark.parametrize(
    ("fault", "failures", "observed"),
    [
        ("EIO at manifest.link", {}, "environment committed it"),
        ("ENOSPC at records.write", {"environment": failure("environment", "checkpoint_error", 500)}, "HTTP 500"),
        ("stall at records.fsync", {"environment": failure("environment", "invalid_checkpoint_state", 422)}, "422"),
        (
            "EIO at records.fsync",
            {
                "environment": failure("environment", "invalid_checkpoint_state", 422),
                "agent": failure("agent", "invalid_checkpoint_state", 422),
            },
            "refused as well by",
        ),
    ],
)
def test_p16_write_refused_fails_otherwise(fault: str, failures: dict[str, ParticipantFailure], observed: str) -> None:
    with pytest.raises(P16Violation, match=observed):
        p16_write_refused("c1", "environment", fault, fault.split(" ", 1)[0], failures)


def test_p16_no_manifest() -> None:
    p16_no_manifest("c1", "environment", "after its write failed", published=False)
    with pytest.raises(P16Violation, match=r"manifest\.json is there"):
        p16_no_manifest("c1", "environment", "after its write failed", published=True)


def test_p16_still_prepared() -> None:
    p16_still_prepared("c1", "environment", {"phase": "prepared", "checkpoint_id": "c1"})
    for status in ({"phase": "idle", "checkpoint_id": None}, {"phase": "prepared", "checkpoint_id": "c2"}):
        with pytest.raises(P16Violation, match="ready for a retry"):
            p16_still_prepared("c1", "environment", status)


def test_p16_retry_commits_reports_the_refusal() -> None:
    refused = CoordinationError("commit", {"environment": failure("environment", "invalid_checkpoint_state", 422)})
    with pytest.raises(P16Violation, match=r"retried commit of c1 after EIO at records\.write"):
        p16_retry_commits("c1", "EIO at records.write", refused)


def test_p7_callee_refused() -> None:
    stale = {"error": {"code": "stale_attempt", "detail": "retired"}}
    p7_callee_refused("r0", "resources /get_weather", 409, stale)
    with pytest.raises(P7Violation, match="resources /get_weather straight from a late caller"):
        p7_callee_refused("r0", "resources /get_weather", 200, {"weather": "cold"})
    with pytest.raises(P7Violation, match="stale_attempt"):
        p7_callee_refused("r0", "resources /increment_counter", 409, {"error": {"code": "checkpoint_error"}})


def test_p16_a_paused_commit_is_refused_with_deadline_exceeded() -> None:
    woke = {"agent": failure("agent", "deadline_exceeded", 409)}
    p16_write_refused("c1", "agent", "pause across its deadline", "pause", woke)
    with pytest.raises(P16Violation, match="agent committed it"):
        p16_write_refused("c1", "agent", "pause across its deadline", "pause", {})


def test_p16_a_failed_export_hook_is_an_internal_error() -> None:
    failed = {"resources": failure("resources", "checkpoint_error", 500)}
    p16_write_refused("c1", "resources", "failing export hook", "export", failed)
    wrong = {"resources": failure("resources", "invalid_checkpoint_state", 422)}
    with pytest.raises(P16Violation, match="HTTP 422"):
        p16_write_refused("c1", "resources", "failing export hook", "export", wrong)


def test_p10_failed_close_refused() -> None:
    refused = CoordinationError("prepare", {"agent": failure("agent", "checkpoint_error", 500)})
    p10_failed_close_refused("c1", "agent", refused)
    with pytest.raises(P10Violation, match="every participant prepared"):
        p10_failed_close_refused("c1", "agent", None)
    with pytest.raises(P10Violation, match="agent: HTTP 409"):
        p10_failed_close_refused(
            "c1", "agent", CoordinationError("prepare", {"agent": failure("agent", "invalid_phase")})
        )
    both = {"agent": failure("agent", "checkpoint_error", 500), "environment": failure("environment", "x", 500)}
    with pytest.raises(P10Violation, match="environment: HTTP 500"):
        p10_failed_close_refused("c1", "agent", CoordinationError("prepare", both))


def test_p10_reopened_after_failed_close() -> None:
    p10_reopened_after_failed_close("c1", "agent", {"phase": "idle", "checkpoint_id": None, "accepting": True})
    p10_reopened_after_failed_close("c1", "environment", {"phase": "idle", "checkpoint_id": None})
    for status in (
        {"phase": "idle", "checkpoint_id": None, "accepting": False},
        {"phase": "preparing", "checkpoint_id": "c1", "accepting": False},
    ):
        with pytest.raises(P10Violation, match="admission open again"):
            p10_reopened_after_failed_close("c1", "agent", status)


def test_p8_refused_by_a_failed_install_hook_with_its_own_code() -> None:
    failures = {"agent": failure("agent", "checkpoint_error", 500)}
    p8_refused_by("c1-restore2", ["agent"], "install hook", failures, [], code="checkpoint_error")
    with pytest.raises(P8Violation, match="with checkpoint_error"):
        p8_refused_by("c1-restore2", ["agent"], "install hook", {}, [], code="checkpoint_error")


# -- P17: lost replies ---------------------------------------------------------------------------------------------


def lost(name: str) -> ParticipantFailure:
    return ParticipantFailure(name, None, None, "RemoteProtocolError: peer closed connection")


def test_p17_only_reply_lost_passes_when_the_victim_alone_gave_no_reply() -> None:
    p17_only_reply_lost("commit", "c1", "agent", CoordinationError("commit", {"agent": lost("agent")}))


@pytest.mark.parametrize(
    ("failures", "observed"),
    [
        ({"agent": failure("agent", "invalid_phase", 409)}, "agent: HTTP 409 invalid_phase"),
        ({"agent": lost("agent"), "environment": failure("environment", "checkpoint_error", 500)}, "environment"),
        ({"environment": lost("environment")}, "environment: RemoteProtocolError"),
    ],
)
def test_p17_only_reply_lost_fails_on_any_refusal_or_other_silence(
    failures: dict[str, ParticipantFailure], observed: str
) -> None:
    with pytest.raises(P17Violation, match=observed):
        p17_only_reply_lost("commit", "c1", "agent", CoordinationError("commit", failures))


def test_p17_took_effect() -> None:
    p17_took_effect("prepare", "c1", "agent", {"phase": "prepared", "checkpoint_id": "c1"})
    p17_took_effect("commit", "c1", "agent", {"phase": "committed", "checkpoint_id": "c1"}, True)
    p17_took_effect("resume", "c1", "agent", {"phase": "idle", "checkpoint_id": None})
    with pytest.raises(P17Violation, match="phase 'prepared'"):
        p17_took_effect("commit", "c1", "agent", {"phase": "prepared", "checkpoint_id": "c1"}, True)
    with pytest.raises(P17Violation, match="no manifest"):
        p17_took_effect("commit", "c1", "agent", {"phase": "committed", "checkpoint_id": "c1"}, False)
    with pytest.raises(P17Violation, match="no checkpoint active"):
        p17_took_effect("resume", "c1", "agent", {"phase": "idle", "checkpoint_id": "c1"})


def test_p17_retry_answered_reports_the_refusal() -> None:
    refused = CoordinationError("commit", {"agent": failure("agent", "invalid_phase", 409)})
    with pytest.raises(P17Violation, match=r"retried commit of c1, whose first reply was lost"):
        p17_retry_answered("commit", "c1", refused)


def test_p17_resume_replayed() -> None:
    p17_resume_replayed("c1", "agent", {"phase": "idle", "idempotent": True})
    with pytest.raises(P17Violation, match="idempotent: true"):
        p17_resume_replayed("c1", "agent", {"phase": "idle", "idempotent": False})


# -- P18: skewed clocks --------------------------------------------------------------------------------------------


def test_p18_refused_on_its_clock() -> None:
    p18_refused_on_its_clock("a prepare", "resources", 8.0, failure("resources", "deadline_exceeded"))
    with pytest.raises(P18Violation, match=r"accepted: \{'phase': 'prepared'"):
        p18_refused_on_its_clock("a prepare", "resources", 8.0, {"phase": "prepared", "report": {}})
    with pytest.raises(P18Violation, match="invalid_phase"):
        p18_refused_on_its_clock("a prepare", "resources", 8.0, failure("resources", "invalid_phase"))


def test_p18_lapsed_first() -> None:
    stale = CoordinationError("commit", {"agent": failure("agent", "stale_checkpoint")})
    p18_lapsed_first("c1", "agent", stale)
    with pytest.raises(P18Violation, match="every participant committed it"):
        p18_lapsed_first("c1", "agent", None)
    also = CoordinationError(
        "commit", {"agent": failure("agent", "stale_checkpoint"), "resources": failure("resources", "stale_checkpoint")}
    )
    with pytest.raises(P18Violation, match="resources: HTTP 409 stale_checkpoint"):
        p18_lapsed_first("c1", "agent", also)
    with pytest.raises(P18Violation, match="agent: committed it"):
        p18_lapsed_first("c1", "agent", CoordinationError("commit", {"env": failure("env", "x")}))


def test_p18_stale_commit_refused() -> None:
    lapsed = ["agent", "environment"]
    refused = CoordinationError("commit", {name: failure(name, "stale_checkpoint") for name in lapsed})
    p18_stale_commit_refused("c1", lapsed, refused)
    with pytest.raises(P18Violation, match="agent: committed it; environment: committed it"):
        p18_stale_commit_refused("c1", lapsed, None)
    half = CoordinationError("commit", {"agent": failure("agent", "stale_checkpoint")})
    with pytest.raises(P18Violation, match="environment: committed it"):
        p18_stale_commit_refused("c1", lapsed, half)


def refused_on_connect(name: str) -> ParticipantFailure:
    return ParticipantFailure(name, None, None, "transport error ConnectError: [Errno 111] Connection refused")


def test_p19_only_unreached_passes_when_the_victim_alone_refused_the_connection() -> None:
    error = CoordinationError("prepare", {"agent": refused_on_connect("agent")}, {"environment": {"phase": "prepared"}})
    p19_only_unreached("prepare", "c1", "agent", error)


@pytest.mark.parametrize(
    ("failures", "observed"),
    [
        ({"agent": lost("agent")}, "agent: RemoteProtocolError"),
        ({"agent": failure("agent", "invalid_phase", 409)}, "agent: HTTP 409 invalid_phase"),
        ({"agent": refused_on_connect("agent"), "environment": failure("environment", "x", 500)}, "environment"),
        ({"environment": refused_on_connect("environment")}, "agent: answered"),
    ],
)
def test_p19_only_unreached_fails_on_anything_but_the_victims_refused_connection(
    failures: dict[str, ParticipantFailure], observed: str
) -> None:
    with pytest.raises(P19Violation, match=observed):
        p19_only_unreached("commit", "c1", "agent", CoordinationError("commit", failures))


def test_p19_untouched() -> None:
    prepared = {"phase": "prepared", "checkpoint_id": "c1", "lease_expires_at": 1.0}
    p19_untouched("commit", "c1", "agent", prepared, {**prepared, "lease_expires_at": 2.0})
    p19_untouched("prepare", "c1", "agent", {"phase": "idle"}, {"phase": "idle", "checkpoint_id": None})
    with pytest.raises(P19Violation, match="phase 'committed', checkpoint 'c1'"):
        p19_untouched("commit", "c1", "agent", prepared, {"phase": "committed", "checkpoint_id": "c1"})
    with pytest.raises(P19Violation, match="phase 'prepared', checkpoint 'c1'"):
        p19_untouched("prepare", "c1", "agent", {"phase": "idle"}, prepared)
    with pytest.raises(P19Violation, match=r"manifest.json is in its share"):
        p19_untouched("commit", "c1", "agent", prepared, prepared, published=True)


def test_p19_retry_completes_reports_the_refusal() -> None:
    refused = CoordinationError("prepare", {"agent": failure("agent", "checkpoint_conflict", 409)})
    with pytest.raises(P19Violation, match=r"retried prepare of c1, once every participant is reachable"):
        p19_retry_completes("prepare", "c1", refused)


def test_p19_answered_from_record() -> None:
    first = {"environment": {"phase": "prepared", "report": {"blockers": []}}}
    p19_answered_from_record("prepare", "c1", first, {**first, "agent": {"phase": "prepared"}})
    with pytest.raises(P19Violation, match="environment answers the retried prepare"):
        p19_answered_from_record("prepare", "c1", first, {"environment": {"phase": "idle"}})
    with pytest.raises(P19Violation, match="None"):
        p19_answered_from_record("prepare", "c1", first, {})


def test_p19_first_resume() -> None:
    p19_first_resume("c1", "agent", {"phase": "idle", "idempotent": False})
    with pytest.raises(P19Violation, match="idempotent: false"):
        p19_first_resume("c1", "agent", {"phase": "idle", "idempotent": True})


TIMED_OUT = {"episode_id": {"rollout_id": "r0", "attempt": 0}, "failure": {"failure_reason": "Episode timed out"}}


def test_p20_budget_kept_fails_on_a_timeout_after_time_passed_while_parked() -> None:
    with pytest.raises(P20Violation, match="it timed out: HTTP 200") as caught:
        p20_budget_kept("r0", 1200.0, 200, TIMED_OUT)
    assert caught.value.rollout == "r0"
    assert "as 1200 s passed" in str(caught.value)


@pytest.mark.parametrize(
    ("parked_for_s", "status_code", "body"),
    [
        (None, 200, TIMED_OUT),  # no time passed while it was parked: a timeout is P3's to judge
        (1200.0, None, None),  # no reply yet
        (1200.0, 200, {"result": {"reward": 1.0}}),
        (1200.0, 200, {"failure": {"failure_reason": "the agent raised"}}),
        (1200.0, 409, {"error": {"code": "stale_attempt"}}),
    ],
)
def test_p20_budget_kept_passes_on_anything_but_a_timeout_after_time_passed(
    parked_for_s: float | None, status_code: int | None, body: Any
) -> None:
    p20_budget_kept("r0", parked_for_s, status_code, body)


def test_p21_refused_on_waking() -> None:
    late = CoordinationError("prepare", {"agent": failure("agent", "deadline_exceeded")}, {"environment": {}})
    p21_refused_on_waking("c1", "agent", late)
    with pytest.raises(P21Violation, match="every participant prepared"):
        p21_refused_on_waking("c1", "agent", None)
    with pytest.raises(P21Violation, match="agent: HTTP 409 invalid_phase"):
        p21_refused_on_waking("c1", "agent", CoordinationError("prepare", {"agent": failure("agent", "invalid_phase")}))
    also = CoordinationError(
        "prepare", {"agent": failure("agent", "deadline_exceeded"), "resources": failure("resources", "x", 500)}
    )
    with pytest.raises(P21Violation, match="resources: HTTP 500 x"):
        p21_refused_on_waking("c1", "agent", also)


def test_p21_lapsed_on_waking() -> None:
    p21_lapsed_on_waking("c1", "agent", CoordinationError("commit", {"agent": failure("agent", "stale_checkpoint")}))
    with pytest.raises(P21Violation, match="every participant committed it"):
        p21_lapsed_on_waking("c1", "agent", None)
    forgot = CoordinationError("commit", {"agent": failure("agent", "invalid_phase")})
    with pytest.raises(P21Violation, match="agent: HTTP 409 invalid_phase"):
        p21_lapsed_on_waking("c1", "agent", forgot)


def test_p21_still_idle() -> None:
    p21_still_idle("c1", "agent", {"phase": "idle", "checkpoint_id": None, "accepting": True})
    p21_still_idle("c1", "environment", {"phase": "idle"})
    with pytest.raises(P21Violation, match="accepting False"):
        p21_still_idle("c1", "agent", {"phase": "idle", "checkpoint_id": None, "accepting": False})
    with pytest.raises(P21Violation, match="phase 'preparing', checkpoint 'c1'"):
        p21_still_idle("c1", "agent", {"phase": "preparing", "checkpoint_id": "c1"})
