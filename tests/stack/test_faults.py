"""Each planted fault's effect at the HTTP level, next to the fault-free stack doing the same thing.

Every test runs one sequence twice, once per deployment (`fault-free`, `fault`), and asserts the replies and
status fields that differ. The stateful search finds these faults on its own (`tests/stateful/test_finds_faults.py`);
these tests pin down what each one does, so a change to a fake that silently disarms a fault shows here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.errors import ParticipantFailure
from ckpt_model.protocol.client import PrepareResult, request_body
from ckpt_model.protocol.gym_tasks import native_run_body
from ckpt_model.protocol.storage import participant_dir, read_records
from ckpt_model.protocol.wire import EpisodeId
from fakes.gym.servers.resources import SESSION_COOKIE, session_id_for
from tests.stack.conftest import Deployment, InBackground, deadline, wait_until

pytestmark = pytest.mark.processes

Deploy = Callable[..., Deployment]


def with_and_without(fault: str) -> Any:
    """Parametrize a test over the fault-free stack and the stack with `fault` planted."""
    return pytest.mark.parametrize("faults", [(), (fault,)], ids=["fault-free", "fault"])


def records(directory: str, kind: str, instance: str) -> list[Any]:
    return read_records(participant_dir(Path(directory), kind, instance), kind, instance)


def counts(deployment: Deployment, name: str) -> dict[str, int]:
    return deployment.status(name)["report"]["counts"]


def prepare(deployment: Deployment, checkpoint_id: str) -> None:
    prepared = deployment.control.prepare(checkpoint_id, deadline())
    assert prepared.prepared, prepared.blockers()


def commit(deployment: Deployment, checkpoint_id: str, scope: list[EpisodeId]) -> tuple[str, dict[str, Any]]:
    directory = str(deployment.stack.checkpoint_root / checkpoint_id)
    return directory, deployment.control.commit(checkpoint_id, directory, scope, deadline())


def assert_rewarded(reply: Any) -> None:
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["reward"] == 1.0, reply.text


@with_and_without("agent_export_drops_unstarted")
def test_agent_export_drops_unstarted__a_session_at_its_first_model_call_is_lost(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("native", faults=faults)
    original = deployment.start_held(native_run_body("first-1", 0), calls_delivered=0)
    scope = [EpisodeId(rollout_id="first-1")]
    prepare(deployment, "c1")
    directory, committed = commit(deployment, "c1", scope)

    # The environment exports the episode either way, waiting at `invoke_agent`.
    assert committed["environment"]["episode_ids"] == ["first-1"]
    (environment_record,) = records(directory, "environment", "environment")
    assert environment_record["boundary"]["next"] == "invoke_agent"
    agent_records = records(directory, "agent", "agent")
    if faults:
        assert committed["agent"]["episode_ids"] == []
        assert agent_records == []
    else:
        assert committed["agent"]["episode_ids"] == ["first-1"]
        (agent_record,) = agent_records
        assert agent_record["boundary"]["model_calls"] == 0

    deployment.crash_and_restart()
    restored = deployment.control.restore("r1", directory, scope, deadline())
    deployment.control.resume("r1", deadline())
    reply = deployment.run(native_run_body("first-1", 1))
    original.wait()
    if faults:
        # The continued episode asks the agent for a session the restore never brought back.
        assert restored["agent"]["restored"] == []
        assert reply.status_code == 200, reply.text
        assert "is not open" in reply.json()["failure"]["failure_reason"]
    else:
        assert restored["agent"]["restored"] == ["first-1-a1"]
        assert_rewarded(reply)


@pytest.mark.parametrize("topology", ["native", "slow"])
@with_and_without("resources_retire_keeps_sessions")
def test_resources_retire_keeps_sessions__a_retired_session_stays_tracked(
    deploy: Deploy, faults: tuple[str, ...], topology: str
) -> None:
    deployment = deploy(topology, faults=faults)
    run = deployment.start_held(native_run_body("gone-1", 0), calls_delivered=1)
    assert counts(deployment, "resources")["sessions"] == 1

    deployment.control.retire("retire", [EpisodeId(rollout_id="gone-1")], deadline())
    assert run.result().json()["error"]["code"] == "stale_attempt"
    resources = deployment.status("resources")
    assert resources["retired_sessions"] == 1
    assert resources["retired_rollouts"] == 1
    assert resources["report"]["counts"]["sessions"] == (1 if faults else 0)
    # The retire marked the attempt either way: its session's requests are refused.
    late = deployment.http.post(
        deployment.url("resources") + "/ng-rollout/gone-1/get_weather",
        json={"city": "SF"},
        headers={"cookie": f"{SESSION_COOKIE}={session_id_for('gone-1')}"},
    )
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "stale_attempt"

    deployment.backend("/_ctl/release")
    deployment.control.forget("forget", ["gone-1"], deadline())
    resources = deployment.status("resources")
    assert resources["retired_sessions"] == 0
    assert resources["report"]["counts"]["sessions"] == (1 if faults else 0)


@pytest.mark.parametrize("phase", ["prepared", "committed", "restored"])
@with_and_without("environment_admits_while_closed")
def test_environment_admits_while_closed__a_new_run_starts_during_a_checkpoint(
    deploy: Deploy, faults: tuple[str, ...], phase: str
) -> None:
    deployment = deploy("native", faults=faults)
    prepare(deployment, "c1")
    checkpoint_id = "c1"
    if phase != "prepared":
        directory, _ = commit(deployment, "c1", [])
    if phase == "restored":
        deployment.control.resume("c1", deadline())
        deployment.control.restore("r1", directory, [], deadline())
        checkpoint_id = "r1"
    assert deployment.status("environment")["phase"] == phase

    run = deployment.run_in_background(native_run_body("late-1", 0))
    if faults:
        wait_until(lambda: counts(deployment, "environment")["episodes"] == 1, "the admitted episode to start")
        assert not run.done, "the admitted /run replied while the checkpoint was open"
        assert deployment.status("environment")["phase"] == phase
    else:
        refused = run.result()
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "admission_closed"
        assert counts(deployment, "environment")["episodes"] == 0
    if phase == "prepared":
        # A commit exports every live episode, so the one admitted by mistake lands in the records unasked.
        _, committed = commit(deployment, "c1", [])
        assert committed["environment"]["episode_ids"] == (["late-1"] if faults else [])

    deployment.control.resume(checkpoint_id, deadline())
    assert_rewarded(run.result() if faults else deployment.run(native_run_body("late-1", 0)))


@with_and_without("agent_stays_closed_after_commit")
def test_agent_stays_closed_after_commit__seeds_wait_after_a_committed_checkpoint(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("native", faults=faults)
    prepare(deployment, "c0")
    deployment.control.resume("c0", deadline())
    assert deployment.status("agent")["accepting"] is True, "an uncommitted checkpoint re-opens either way"

    prepare(deployment, "c1")
    commit(deployment, "c1", [])
    deployment.control.resume("c1", deadline())
    agent = deployment.status("agent")
    assert agent["phase"] == "idle"
    assert agent["accepting"] is not bool(faults)

    run = deployment.run_in_background(native_run_body("late-1", 0))
    if not faults:
        assert_rewarded(run.result())
        return
    # The resources seed went through; the agent seed waits, so no model call is ever made.
    wait_until(lambda: counts(deployment, "resources")["sessions"] == 1, "the resources seed of late-1")
    assert counts(deployment, "agent")["sessions"] == 0
    assert deployment.calls() == []
    assert not run.done
    # A checkpoint that is prepared and resumed without a commit re-opens the agent, and the seed goes on.
    prepare(deployment, "c2")
    deployment.control.resume("c2", deadline())
    assert deployment.status("agent")["accepting"] is True
    assert_rewarded(run.result())
    assert len(deployment.calls()) == 2


@with_and_without("environment_drops_finished_during_prepare")
def test_environment_drops_finished_during_prepare__an_episode_verified_during_prepare_is_not_exported(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("slow", "wait", faults=faults)
    run, prepared = deployment.finish_verification_during_prepare("done-1", "c1")
    assert prepared.prepared, prepared.blockers()
    assert counts(deployment, "environment")["episodes"] == 1, "the episode is live, parked at `return`"

    directory, committed = commit(deployment, "c1", [EpisodeId(rollout_id="done-1")])
    environment_records = records(directory, "environment", "environment")
    if faults:
        assert committed["environment"]["episode_ids"] == []
        assert environment_records == []
    else:
        assert committed["environment"]["episode_ids"] == ["done-1"]
        assert [record["boundary"]["next"] for record in environment_records] == ["return"]
    assert not run.done, "the episode replied while the checkpoint was committed"

    # Without a crash nothing is lost: the episode replies after resume either way.
    deployment.control.resume("c1", deadline())
    assert_rewarded(run.result())


# -- topology `mixed`: `restart` on restart_environment is a restart, `continued` on the environment is not --------

CONTINUED = EpisodeId(rollout_id="continued")
RESTART = EpisodeId(rollout_id="restart")


def restarts_of(prepared: PrepareResult) -> dict[str, list[str]]:
    """Who reported which restarts in a prepare round (participants with none left out)."""
    reports = {name: reply["report"] for name, reply in prepared.replies.items()}
    return {name: report["restarts"] for name, report in reports.items() if report["restarts"]}


@with_and_without("environment_exports_restarts")
def test_environment_exports_restarts__a_restart_is_written_to_the_checkpoint(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("mixed", faults=faults)
    deployment.start_mixed()
    prepare(deployment, "c1")
    directory, committed = commit(deployment, "c1", [CONTINUED])

    exported = records(directory, "environment", "restart_environment")
    if faults:
        assert committed["restart_environment"]["episode_ids"] == ["restart"]
        assert [record["episode_id"] for record in exported] == [RESTART.wire()]
    else:
        assert committed["restart_environment"]["episode_ids"] == []
        assert exported == []


@with_and_without("restarts_block_prepare")
def test_restarts_block_prepare__a_checkpoint_waits_for_a_restart(deploy: Deploy, faults: tuple[str, ...]) -> None:
    deployment = deploy("mixed", faults=faults)
    deployment.start_mixed()
    if not faults:
        prepare(deployment, "c1")
        return
    waiting = InBackground(lambda: deployment.control.prepare("c1", deadline()))

    def waits_for_the_restart() -> bool:
        status = deployment.status("restart_environment")
        return status["phase"] == "preparing" and status["report"]["blockers"] == ["restart"]

    # The restart never stops blocking: only the resume ends the prepare.
    wait_until(waits_for_the_restart, "restart_environment's prepare to wait for the restart")
    deployment.control.resume("c1", deadline())
    assert not waiting.result().prepared


@with_and_without("resources_restart_unreported")
def test_resources_restart_unreported__the_environment_exports_the_episode(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("mixed", faults=faults)
    deployment.start_mixed()
    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()
    _, committed = commit(deployment, "c1", prepared.continued([CONTINUED, RESTART]))

    if faults:
        # Only the resources server knows: the environment never heard, so it writes the episode as continuable.
        assert restarts_of(prepared) == {"restart_resources": ["restart"]}
        assert committed["restart_environment"]["episode_ids"] == ["restart"]
    else:
        assert restarts_of(prepared) == {"restart_environment": ["restart"], "restart_resources": ["restart"]}
        assert committed["restart_environment"]["episode_ids"] == []
    assert prepared.restarts() == {RESTART}


@with_and_without("restart_in_scope_accepted")
def test_restart_in_scope_accepted__a_scope_naming_a_restart_is_committed(
    deploy: Deploy, faults: tuple[str, ...]
) -> None:
    deployment = deploy("mixed", faults=faults)
    deployment.start_mixed()
    prepare(deployment, "c1")
    directory = str(deployment.stack.checkpoint_root / "c1")
    body = request_body("commit", "c1", deadline(), checkpoint_dir=directory, episode_ids=[CONTINUED, RESTART])
    reporting = ("restart_environment", "restart_resources")
    answers = deployment.control.post_each("commit", body, deadline(), names=set(reporting))

    phases = {name: deployment.status(name)["phase"] for name in reporting}
    if faults:
        assert all(not isinstance(answer, ParticipantFailure) for answer in answers.values()), answers
        assert phases == dict.fromkeys(reporting, "committed")
    else:
        assert {name: (answer.http_status, answer.code) for name, answer in answers.items()} == dict.fromkeys(
            reporting, (409, "restart_in_scope")
        )
        assert phases == dict.fromkeys(reporting, "prepared")
