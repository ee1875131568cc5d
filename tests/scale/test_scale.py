"""Scale mode (Gym's scenario 13): the pure checks on hand-built values, a small run in every test session, and
the opt-in run at the size `CKPT_MODEL_SCALE` names."""

from __future__ import annotations

import os

import pytest

from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import QuiescenceTimeout
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.modes.scale import (
    SCALE_ENV,
    RunOutcome,
    ScaleError,
    ScalePlan,
    check_continuations,
    check_cover,
    check_replies,
    check_silent,
    cpu_spent_s,
    expected_calls,
    in_flight_bound,
    in_flight_max,
    relaying_server_fds,
    run_scale,
    wait_for,
    workers_for,
)
from ckpt_model.properties.continuation import P2Violation, P3Violation, P4Violation
from ckpt_model.properties.scope import P1Violation

SMALL_ROLLOUTS = 50
STAGES = ("dispatch", "prepare", "commit", "crash", "restore", "resume", "replacement")


def ok(reward: float = 1.0) -> RunOutcome:
    """A native `/run` reply of nemo-gym 0.7.0's shape with `reward`."""
    identity = {"episode_id": {"rollout_id": "r", "attempt": 1}, "task_id": {"taskset": "t:t", "task_id": "t"}}
    return RunOutcome(status_code=200, body={**identity, "result": {"reward": reward}})


# --- pure ----------------------------------------------------------------------------------------------------


def test_the_plan_puts_every_rollout_in_one_place_and_caps_what_is_in_flight() -> None:
    plan = ScalePlan.split(10, in_flight_max=100, finished_share=0.125)
    assert plan.finished == ("scale-0", "scale-1")
    assert plan.at_second == ("scale-2", "scale-3", "scale-4", "scale-5")
    assert plan.at_first == ("scale-6", "scale-7", "scale-8", "scale-9")
    capped = ScalePlan.split(16_000, in_flight_max=9_000)
    assert (len(capped.finished), len(capped.in_flight)) == (7_000, 9_000)
    assert len(set(capped.rollouts)) == 16_000
    assert in_flight_max(20_000) == 20_000 - 1024
    everything = ScalePlan.split(16_000, in_flight_max=18_976)
    assert (len(everything.finished), len(everything.at_second), len(everything.at_first)) == (0, 8_000, 8_000)
    with pytest.raises(ValueError, match="'rollouts' must be at least 3"):
        ScalePlan.split(2, in_flight_max=100)


def test_servers_get_the_fewest_workers_that_keep_each_under_the_descriptor_limit() -> None:
    # One process each while two descriptors a rollout fit: the bound this mode had before workers.
    assert workers_for(9_488, 20_000) == (1, 1)
    assert in_flight_bound(20_000, 1, 1) == 9_488
    # 16,000 in flight: every worker could hold twice its share of relayed requests and still fit.
    server, policy = workers_for(16_000, 20_000)
    assert (server, policy) == (7, 4)
    assert 2 * relaying_server_fds(16_000, server) <= 20_000 - 1024
    assert 2 * relaying_server_fds(16_000, server - 1) > 20_000 - 1024
    assert 2 * (2 * 16_000 / policy) <= 20_000 - 1024 < 2 * (2 * 16_000 / (policy - 1))
    assert in_flight_bound(20_000, server, policy) == in_flight_max(20_000)
    # A worker relays (workers - 1) / workers of what it accepts to a sibling: two more descriptors each.
    assert relaying_server_fds(1_000, 1) == 2_000
    assert relaying_server_fds(1_000, 2) == 500 * 3
    with pytest.raises(ValueError, match="more than 16 server workers"):
        workers_for(1_000_000, 20_000)


def test_a_replacement_makes_the_calls_not_yet_delivered() -> None:
    plan = ScalePlan(finished=("f",), at_first=("a",), at_second=("b",))
    assert expected_calls(plan) == {"f": (2, 4), "a": (2,), "a-a1": (2, 4), "b": (2, 4), "b-a1": (4,)}


def test_finished_and_exported_must_be_disjoint_and_cover_every_rollout() -> None:
    assert check_cover(["a", "b", "c"], ["a"], ["b", "c"]).startswith("ok: 1 finished + 2 exported = 3")
    with pytest.raises(P1Violation, match=r"1 replied and were exported: \['b'\]"):
        check_cover(["a", "b", "c"], ["a", "b"], ["b", "c"])
    with pytest.raises(P1Violation, match=r"1 neither replied nor were exported: \['c'\]") as lost:
        check_cover(["a", "b", "c"], ["a"], ["b"])
    assert lost.value.rollout == "c"
    with pytest.raises(P1Violation, match="never dispatched"):
        check_cover(["a"], ["a"], ["z"])


def test_many_lost_rollouts_are_counted_and_only_the_first_ten_named() -> None:
    rollouts = [f"r{index:02d}" for index in range(30)]
    with pytest.raises(P1Violation, match=r"30 neither replied nor were exported: \[.*'r09'\] and 20 more"):
        check_cover(rollouts, [], [])


def test_a_run_in_flight_that_ends_during_the_checkpoint_is_p2() -> None:
    assert check_silent(None, 8).startswith("ok: none of the 8")
    with pytest.raises(P2Violation, match="1 /runs that should wait"):
        check_silent("1 /runs that should wait at the backend ended, r3: ...", 8)


def test_every_run_must_reply_200_with_the_uninterrupted_reward() -> None:
    assert check_replies({"a": ok(), "b": ok()}, 1.0, "replacement").startswith("ok: 2 replacement")
    with pytest.raises(P3Violation, match="1 never replied"):
        check_replies({"a": ok(), "b": None}, 1.0, "replacement")
    with pytest.raises(P3Violation, match=r"1 did not \(\['b'\]\); b: HTTP 500"):
        check_replies({"a": ok(), "b": RunOutcome(500, {"error": "boom"})}, 1.0, "replacement")
    with pytest.raises(P3Violation, match="HTTP 200"):
        check_replies({"a": ok(reward=0.0)}, 1.0, "replacement")
    with pytest.raises(P3Violation, match="HTTP None"):
        check_replies({"a": RunOutcome(None, None, error="ReadError")}, 1.0, "replacement")


def test_a_continuation_that_redoes_a_delivered_call_or_misses_one_is_p4() -> None:
    expected = {"b": (2, 4), "b-a1": (4,)}
    assert check_continuations(expected, {"b": (2, 4), "b-a1": (4,), "other": (2,)}).startswith("ok: 2 capture")
    with pytest.raises(P4Violation, match=r"backend calls \[2, 4\]"):
        check_continuations(expected, {"b": (2, 4), "b-a1": (2, 4)})
    with pytest.raises(P4Violation, match="1 keys are missing calls"):
        check_continuations(expected, {"b": (2, 4)})


def test_stage_cpu_counts_what_survivors_and_newcomers_spent() -> None:
    # pid 2 was killed during the stage (its time is lost), pid 3 started in it (all its time counts).
    assert cpu_spent_s({1: 1.0, 2: 5.0}, {1: 1.5, 3: 0.25}) == 0.75
    assert cpu_spent_s(None, {1: 1.0}) is None


def test_a_wait_ends_when_its_progress_reaches_the_target_or_says_why_it_never_can() -> None:
    """The waits poll with the checker's one back-off poll; what ends one is the progress, not a deadline."""
    counts = iter(range(10))
    wait_for(lambda: next(counts), 5, "five arrived")
    assert next(counts) == 6  # polled until the count reached 5, not once more

    with pytest.raises(ScaleError, match="every /run replied: never, r3 ended"):
        wait_for(lambda: 0, 1, "every /run replied", hopeless=lambda: "r3 ended")


def test_a_wait_tells_its_watcher_every_count_it_reads() -> None:
    """What the scale run's progress line says of the stage under way ("... 3 of 5")."""
    counts = iter(range(10))
    seen: list[int] = []

    wait_for(lambda: next(counts), 3, "three arrived", watch=seen.append)

    assert seen == [0, 1, 2, 3]


def test_a_wait_whose_progress_stands_still_for_its_stall_time_is_a_quiescence_timeout() -> None:
    with pytest.raises(QuiescenceTimeout, match="2 of 3, unchanged for 0 s"):
        wait_for(lambda: 2, 3, "three arrived", stall_s=0.0)


# --- processes -------------------------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_small_scale_run_checkpoints_crashes_restores_and_continues_every_rollout() -> None:
    said: list[str] = []
    result = run_scale(SMALL_ROLLOUTS, finished_share=0.125, progress=said.append, progress_every_s=0.01)
    assert tuple(result.stage_s) == STAGES
    # Each stage is announced and timed; between, a progress line names the stage under way.
    assert said[0].startswith("starting the look-alike stack: 1 worker(s) per environment, agent and resources")
    assert "dispatch ..." in said
    assert any(line.startswith("progress: ") and " for " in line for line in said), said
    assert result.finished >= 1
    assert (result.rollouts, result.finished + result.exported) == (SMALL_ROLLOUTS, SMALL_ROLLOUTS)
    assert result.exported == result.at_first + result.at_second
    assert result.records["environment"] == result.records["agent"] == result.exported
    assert all(verdict.startswith("ok: ") for verdict in result.verdicts.values()), result.verdicts
    assert "restore" in result.table()


@pytest.mark.processes
def test_a_small_scale_run_on_several_workers_of_every_server() -> None:
    """What 16,000 in flight needs, at a size the default run affords: every server split into workers, each
    relaying requests to the sibling owning their episode."""
    harness = Harness.embedded(DeploymentSpec("native", server_workers=3, policy_workers=2))
    try:
        result = run_scale(2 * SMALL_ROLLOUTS, harness=harness)
    finally:
        harness.close()
    assert (result.server_workers, result.policy_workers) == (3, 2)
    assert (result.finished, result.exported) == (0, 2 * SMALL_ROLLOUTS)  # by default every rollout in flight
    assert result.records["environment"] == result.records["agent"] == result.exported
    verdicts = dict(result.verdicts)
    assert verdicts.pop("finished complete (P3)").startswith("none planned: every rollout was in flight")
    assert all(verdict.startswith("ok: ") for verdict in verdicts.values()), result.verdicts
    assert "3 per environment, agent and resources server, 2 of the policy model" in result.table()


@pytest.mark.processes
@pytest.mark.skipif(
    not os.environ.get(SCALE_ENV),
    reason=f"scale mode is opt-in: {SCALE_ENV}=16000 pytest -s tests/scale (or python benchmarks/scale.py "
    "--rollouts 16000) runs Gym's scenario 13 with that many rollouts; minutes on 2 cores",
)
def test_thousands_of_rollouts_checkpoint_crash_restore_and_continue() -> None:
    rollouts = int(os.environ[SCALE_ENV])
    result = run_scale(rollouts, progress=print)
    print(result.table())
    assert result.rollouts == rollouts
    assert all(verdict.startswith(("ok: ", "none planned: ")) for verdict in result.verdicts.values()), result.verdicts
