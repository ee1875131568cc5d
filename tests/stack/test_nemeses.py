"""Nemeses that kill nothing, on real server processes: a frozen server (SIGSTOP, SIGCONT) and a lost reply."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import CoordinationError
from ckpt_model.protocol.gym_tasks import native_run_body
from ckpt_model.protocol.wire import EpisodeId
from fakes import clock
from fakes.gym.protocol.wire import bearer
from fakes.processes.process_groups import process_state
from tests.stack.conftest import Deployment, deadline, wait_until

pytestmark = pytest.mark.processes

Deploy = Callable[..., Deployment]


def look_alike_route(deployment: Deployment, name: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """GET (or POST `body` to) one of the look-alike's own `/_ctl` routes of server `name`; its JSON reply."""
    url, headers = f"{deployment.url(name)}/_ctl/{path}", {"Authorization": bearer(deployment.stack.token)}
    response = httpx.get(url, headers=headers) if body is None else httpx.post(url, json=body, headers=headers)
    response.raise_for_status()
    return response.json()


def lose_reply(deployment: Deployment, name: str, operation: str) -> None:
    look_alike_route(deployment, name, "lost-replies", {"operation": operation})


def lost_count(deployment: Deployment, name: str) -> int:
    return int(look_alike_route(deployment, name, "lost-replies")["lost"])


def commit(deployment: Deployment, checkpoint_id: str) -> dict[str, Any]:
    directory = str(deployment.stack.checkpoint_root / checkpoint_id)
    return deployment.control.commit(checkpoint_id, directory, [], deadline())


@pytest.mark.parametrize("faults", [(), ("replay_recorded_once_delivered",)], ids=["fault-free", "fault"])
def test_a_commit_whose_reply_is_lost_took_effect_and_its_retry_replays(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("native", faults=faults)
    assert deployment.control.prepare("c1", deadline()).prepared
    lose_reply(deployment, "agent", "commit")

    with pytest.raises(CoordinationError) as lost:
        commit(deployment, "c1")
    status = deployment.status("agent")

    assert sorted(lost.value.failures) == ["agent"]
    assert lost.value.failures["agent"].http_status is None  # no reply at all, not a refusal
    assert (status["phase"], status["checkpoint_id"]) == ("committed", "c1")
    assert lost_count(deployment, "agent") == 1
    if not faults:
        replies = commit(deployment, "c1")  # answered from the record, the lost reply among them
        assert replies["agent"]["manifest"]["checkpoint_id"] == "c1"
    else:
        with pytest.raises(CoordinationError) as refused:
            commit(deployment, "c1")
        assert (refused.value.failures["agent"].http_status, refused.value.failures["agent"].code) == (
            409,
            "invalid_phase",
        )


def test_a_lost_resume_reply_on_a_server_with_two_workers_is_lost_by_the_worker_that_holds_the_call(
    deploy: Deploy,
) -> None:
    deployment = deploy("native", policy_workers=2)
    assert deployment.control.prepare("c1", deadline()).prepared
    lose_reply(deployment, "policy_model", "resume")

    with pytest.raises(CoordinationError) as lost:
        deployment.control.resume("c1", deadline())
    again = deployment.control.resume("c1", deadline())

    assert sorted(lost.value.failures) == ["policy_model"]
    assert lost.value.failures["policy_model"].http_status is None
    assert deployment.status("policy_model")["phase"] == "idle"
    assert again["policy_model"] == {"phase": "idle", "idempotent": True}


def test_a_paused_server_answers_nothing_until_it_goes_on_then_refuses_a_commit_past_its_deadline(
    deploy: Deploy,
) -> None:
    deployment = deploy("native")
    assert deployment.control.prepare("c1", deadline()).prepared
    server = deployment.stack.gym["environment"]

    deployment.stack.pause_server("environment")
    try:
        assert process_state(server.pid) == "T"
        with pytest.raises(httpx.TimeoutException):
            httpx.get(f"{server.url}/health", timeout=0.3)
    finally:
        deployment.stack.continue_server("environment")
    late = httpx.post(
        f"{server.url}/ng-control/v1/checkpoint/commit",
        json={"checkpoint_id": "c1", "deadline_ts": 1.0, "checkpoint_dir": str(deployment.stack.checkpoint_root)},
        headers={"Authorization": bearer(deployment.stack.token)},
    )

    assert process_state(server.pid) != "T"
    assert (late.status_code, late.json()["error"]["code"]) == (409, "deadline_exceeded")
    assert deployment.status("environment")["phase"] == "prepared"


def fail_hook(deployment: Deployment, name: str, hook: str) -> None:
    look_alike_route(deployment, name, "hooks", {"hook": hook})


@pytest.mark.parametrize("faults", [(), ("failed_close_stays_closed",)], ids=["fault-free", "fault"])
def test_a_close_that_fails_after_closing_leaves_the_agent_idle_and_open_again(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("native", faults=faults)
    fail_hook(deployment, "agent", "close")

    with pytest.raises(CoordinationError) as failed:
        deployment.control.prepare("c1", deadline())
    status = deployment.status("agent")

    refused = failed.value.failures["agent"]
    assert (refused.http_status, refused.code) == (500, "checkpoint_error")
    assert (status["phase"], status["checkpoint_id"]) == ("idle", None)
    assert status["accepting"] is (not faults)


@pytest.mark.parametrize("faults", [(), ("failed_export_retried_empty",)], ids=["fault-free", "fault"])
def test_a_commit_whose_export_hook_raised_exports_afresh_when_retried(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("native", faults=faults)
    deployment.start_held(native_run_body("r0", 0), calls_delivered=0)
    assert deployment.control.prepare("c1", deadline()).prepared
    fail_hook(deployment, "environment", "export")
    directory = str(deployment.stack.checkpoint_root / "c1")
    scope = [EpisodeId(rollout_id="r0")]

    with pytest.raises(CoordinationError) as failed:
        deployment.control.commit("c1", directory, scope, deadline())
    status = deployment.status("environment")
    retried = deployment.control.commit("c1", directory, scope, deadline())

    refused = failed.value.failures["environment"]
    assert (refused.http_status, refused.code) == (500, "checkpoint_error")
    assert status["phase"] == "prepared"
    assert retried["environment"]["episode_ids"] == ([] if faults else ["r0"])


def skew(deployment: Deployment, name: str, offset_s: float) -> dict[str, Any]:
    return dict(look_alike_route(deployment, name, "clock", {"offset_s": offset_s}))


# A clock a server reads is compared with the true time read just before and just after the call that returned it
# (not with a tolerance of seconds: at load 9-15 the calls between took longer); libfaketime rounds an offset to the
# millisecond.
ROUNDING_S = 0.01


def read_within(read: float, before: float, after: float) -> bool:
    """Whether a clock `read` during a call falls between the times read just before and just after it."""
    return before - ROUNDING_S <= read <= after + ROUNDING_S


@pytest.mark.skipif(clock.library() is None, reason="Debian's faketime is not installed (.ci/run installs it)")
def test_a_skewed_server_judges_deadlines_and_its_lease_on_its_own_clock(deploy: Deploy) -> None:
    deployment = deploy("native")
    before = time.time()
    ahead = skew(deployment, "environment", 30.0)
    after = time.time()
    # A deadline 10 s ahead of the true time has passed 20 s ago on the environment's clock.
    with pytest.raises(CoordinationError) as refused:
        deployment.control.prepare("c1", time.time() + 10.0)
    lease_deadline_ts = time.time() + 60.0
    lease = deployment.control.prepare("c2", lease_deadline_ts)
    status = deployment.status("environment")
    before_back = time.time()
    back = skew(deployment, "environment", 0.0)
    after_back = time.time()

    assert ahead["offset_s"] == 30.0
    assert read_within(ahead["time"] - 30.0, before, after)
    assert read_within(back["time"], before_back, after_back)
    assert (refused.value.failures["environment"].http_status, refused.value.failures["environment"].code) == (
        409,
        "deadline_exceeded",
    )
    assert lease.prepared
    # The deadline plus the grace, as sent (compared with the deadline, not with the clock read after three more
    # calls: at load 9-15 those outlasted the 0.25 s grace).
    assert status["lease_expires_at"] == pytest.approx(lease_deadline_ts + deployment.stack.lease_grace_s, abs=0.01)


def test_a_server_without_libfaketime_refuses_a_skew(deploy: Deploy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.LIBRARY_ENV, "/nonexistent/libfaketime.so.1")
    deployment = deploy("native", fork_server=False)
    response = httpx.post(
        f"{deployment.url('agent')}/_ctl/clock",
        json={"offset_s": 5.0},
        headers={"Authorization": bearer(deployment.stack.token)},
    )

    assert response.status_code == 409
    assert "cannot be skewed" in response.json()["error"]["detail"]


@pytest.mark.skipif(clock.library() is None, reason="Debian's faketime is not installed (.ci/run installs it)")
def test_a_lease_the_wall_clock_jumped_past_lapses_at_once(deploy: Deploy) -> None:
    """The lease's timer runs on the true monotonic clock: the clock route times it again, so a jump of the wall
    clock past the lease lapses it now, not after the minutes of its old delay."""
    deployment = deploy("native")
    assert deployment.control.prepare("c1", time.time() + 60.0).prepared
    lease_expires_at = deployment.status("environment")["lease_expires_at"]
    skew(deployment, "environment", lease_expires_at - time.time() + 1.0)
    lapsed = wait_until(lambda: deployment.status("environment")["phase"] == "idle", "the environment lapsed")
    others = deployment.status("agent")

    assert lapsed
    assert others["phase"] == "prepared"  # its clock did not move


@pytest.mark.skipif(clock.library() is None, reason="Debian's faketime is not installed (.ci/run installs it)")
def test_the_harness_jumps_every_clock_and_a_frozen_server_s_as_it_goes_on() -> None:
    """`Clocks.jump_to`: the controller's clock and every server's pass the time together (a skew on top); a server
    frozen meanwhile wakes to it, and so lapses the lease the jump passed."""
    with Harness.embedded("native") as harness:
        harness.begin_example()
        assert harness.clocks.owns_time
        before_skew = time.time()
        skewed = harness.clocks.skew_clock("agent", 30.0)
        after_skew = time.time()
        assert harness.control is not None
        assert harness.control.prepare("c1", harness.clocks.now() + 60.0).prepared
        lapses_at = harness.statuses()["environment"]["lease_expires_at"]
        harness.faults.pause_server("environment")
        jumped = harness.clocks.jump_to(lapses_at)
        now = harness.clocks.now()
        reads = harness.clocks.skew_clock("agent", 30.0)
        after = harness.clocks.now()
        harness.faults.continue_server("environment")
        lapsed = wait_until(lambda: harness.statuses()["environment"]["phase"] == "idle", "the environment lapsed")

    assert jumped
    assert lapsed
    assert now > lapses_at
    # Each read compared with the clocks read around its own call: the steps between took seconds at load 9-15.
    assert read_within(skewed - 30.0, before_skew, after_skew)
    assert read_within(reads - 30.0, now, after)  # the skew on top of the time passed


@pytest.mark.skipif(clock.library() is None, reason="Debian's faketime is not installed (.ci/run installs it)")
def test_a_crash_after_time_passed_moves_the_fresh_participants_and_no_relay() -> None:
    """A fresh process starts on the true time: after a crash the harness moves each participant to the time that
    passed (its deadlines and lease agree with the controller's), and leaves a relay, which has no clock route."""
    with Harness.embedded("counter") as harness:
        harness.begin_example()
        assert harness.clocks.jump_to(harness.clocks.now() + 100.0)
        harness.crash()
        assert harness.control is not None
        reads = [
            (harness.clocks.now(), look_alike(harness, member.name), harness.clocks.now())
            for member in harness.control.participants
        ]

    assert len(reads) == 3  # the agent, the resources server, the policy model: not the relay
    assert all(read_within(read, before, after) for before, read, after in reads), reads


def look_alike(harness: Harness, name: str) -> float:
    """The time server `name`'s clock reads now (`GET /_ctl/clock`)."""
    url, headers = f"{harness.servers[name]}/_ctl/clock", {"Authorization": bearer(harness.deployment.token)}
    response = httpx.get(url, headers=headers)
    response.raise_for_status()
    return float(response.json()["time"])
