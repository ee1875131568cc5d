"""The normaliser of completed outcomes and P14 on hand-built values: a resumed run's reply and chain normalise to
the uninterrupted run's exactly when only identifiers differ, and any other difference is P14, shown as a diff."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ckpt_model.model.outcome import (
    ATTEMPT,
    KEY,
    ROLLOUT,
    SESSION,
    TASK,
    TIMESTAMP,
    Identity,
    Outcome,
    ledger_chain,
    normalised,
)
from ckpt_model.properties.continuation import P14Violation, p14_resumed_equals_uninterrupted
from ckpt_model.protocol.ledger import LedgerRow

TWIN = Identity("twin", 0, "twin")
RESUMED = Identity("r0", 1, "r0-a1")


def legacy_reply(key: str, outputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    call = {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": '{"city": "SF"}'}
    result = {"type": "function_call_output", "call_id": "call_0", "output": "cold"}
    return {
        "reward": 1.0,
        "response": {"id": f"resp-{key}-1", "output": [call, result] if outputs is None else outputs},
    }


def native_reply(rollout: str, attempt: int) -> dict[str, Any]:
    return {"episode_id": {"rollout_id": rollout, "attempt": attempt}, "result": {"reward": 1.0}}


def test_the_same_reply_under_other_ids_normalises_to_the_same_value() -> None:
    assert normalised(legacy_reply("twin"), TWIN) == normalised(legacy_reply("r0-a1"), RESUMED)
    assert normalised(native_reply("twin", 0), TWIN) == normalised(native_reply("r0", 1), RESUMED)
    assert normalised(native_reply("r0", 1), RESUMED) == {
        "episode_id": {"rollout_id": ROLLOUT, "attempt": ATTEMPT},
        "result": {"reward": 1.0},
    }
    assert normalised(legacy_reply("r0-a1"), RESUMED)["response"]["id"] == f"resp-{KEY}-1"


def test_only_the_runs_own_names_are_replaced() -> None:
    # Another rollout's key, a longer name containing the run's, and a wrong attempt number all stay.
    value = {"note": "r0-a2 r10 r0-a1", "attempt": 2, "rollout_id": "r1"}
    assert normalised(value, RESUMED) == {"note": f"{ROLLOUT}-a2 r10 {KEY}", "attempt": 2, "rollout_id": "r1"}


def test_the_runs_own_task_name_is_replaced_in_its_field_only() -> None:
    """A reply echoes the task its `/run` named: the run's own name reads as the twin's (the weather task's), and
    any other name, or the name outside a `task_id` field, stays as sent."""
    drawn = Identity("r0", 0, "r0", task=("ünï-env:天気", "task 1"))
    named = {"taskset": "ünï-env:天気", "task_id": "task 1"}
    weather = {"taskset": "example_single_tool_call:e2e", "task_id": "weather-sf"}
    assert normalised({"task_id": named}, drawn) == normalised({"task_id": weather}, TWIN) == {"task_id": TASK}
    assert normalised({"task_id": weather}, drawn) == {"task_id": weather}
    assert normalised({"echo": named}, drawn) == {"echo": named}


def test_session_ids_and_timestamps_are_replaced_by_field() -> None:
    value = {"agent_session_id": "ab12", "started_at": 1796176790.1, "created": "2026-12-02", "count": 4}
    assert normalised(value, RESUMED) == {
        "agent_session_id": SESSION,
        "started_at": TIMESTAMP,
        "created": TIMESTAMP,
        "count": 4,
    }


def test_a_boolean_is_not_an_attempt_number() -> None:
    assert normalised({"attempt": True}, Identity("r0", 1, "r0-a1")) == {"attempt": True}


def test_ledger_chain_keeps_order_links_and_tokens_not_ids() -> None:
    staged = {"r0/r0.0": {"tokens": [1, 2]}, "r0-a1/r0-a1.0": {"tokens": [3]}}
    resumed = [LedgerRow("r0.0", None, "r0/r0.0", "r0"), LedgerRow("r0-a1.0", "r0.0", "r0-a1/r0-a1.0")]
    twin = [LedgerRow("twin.0", None, "twin/twin.0"), LedgerRow("twin.1", "twin.0", "twin/twin.1")]
    twin_staged = {"twin/twin.0": {"tokens": [1, 2]}, "twin/twin.1": {"tokens": [3]}}
    assert ledger_chain(resumed, staged) == ledger_chain(twin, twin_staged)
    assert ledger_chain(resumed, staged) == [{"parent": None, "tokens": [1, 2]}, {"parent": 0, "tokens": [3]}]
    stray = [LedgerRow("x.0", "elsewhere", None)]
    assert ledger_chain(stray, {}) == [{"parent": "outside", "tokens": None}]


def test_p14_passes_when_only_ids_differ() -> None:
    twin = Outcome(normalised(legacy_reply("twin"), TWIN), [{"parent": None, "tokens": [1]}])
    resumed = Outcome(normalised(legacy_reply("r0-a1"), RESUMED), [{"parent": None, "tokens": [1]}])
    p14_resumed_equals_uninterrupted("r0-a1", twin, resumed)


def test_p14_shows_both_outcomes_and_a_diff_of_a_dropped_tool_output() -> None:
    twin = Outcome(normalised(legacy_reply("twin"), TWIN))
    call_only = [legacy_reply("r0-a1")["response"]["output"][0]]
    resumed = Outcome(normalised(legacy_reply("r0-a1", call_only), RESUMED))
    with pytest.raises(P14Violation) as caught:
        p14_resumed_equals_uninterrupted("r0-a1", twin, resumed)
    violation = caught.value
    assert violation.rollout == "r0-a1"
    assert "function_call_output" in str(violation.expected)
    assert "function_call_output" not in str(violation.observed).split("diff")[0]
    assert re.search(r'\n +- +"type": "function_call_output"', str(violation.observed))


def test_p14_catches_a_ledger_chain_that_differs_in_tokens() -> None:
    body = normalised(native_reply("twin", 0), TWIN)
    with pytest.raises(P14Violation, match=r"ledger chain"):
        p14_resumed_equals_uninterrupted(
            "r0-a1", Outcome(body, [{"parent": None, "tokens": [1]}]), Outcome(body, [{"parent": None, "tokens": [2]}])
        )
