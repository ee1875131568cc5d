"""Topology `mixed` (Gym's scenarios 15 and 16): a second environment whose resources server is `restart_only`, so
its episodes are restarts that no checkpoint continues. Real processes, driven over HTTP only."""

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
CONTINUED = EpisodeId(rollout_id="continued")
RESTART = EpisodeId(rollout_id="restart")
# The participants that can only restart `restart`: its environment marks it, its resources server says so.
REPORTING = {"restart_environment": "environment", "restart_resources": "resources"}


def records(directory: str, kind: str, instance: str) -> list[Any]:
    return read_records(participant_dir(Path(directory), kind, instance), kind, instance)


def prepare_mixed(deployment: Deployment, checkpoint_id: str) -> PrepareResult:
    """Prepare with both rollouts held at their first call: ready everywhere, `restart` reported as a restart."""
    prepared = deployment.control.prepare(checkpoint_id, deadline())
    assert prepared.prepared, prepared.blockers()
    assert prepared.restarts() == {RESTART}
    reporting = {name for name, reply in prepared.replies.items() if reply["report"]["restarts"]}
    assert reporting == set(REPORTING)
    return prepared


def assert_scope_with_restart_refused(deployment: Deployment, checkpoint_id: str, directory: str) -> None:
    """Each participant that reported `restart` refuses a commit naming it (409 restart_in_scope), stays prepared
    and writes nothing. Sent to those alone: the others would commit that scope, and the good commit would
    then conflict with it."""
    scope = [CONTINUED, RESTART]
    body = request_body("commit", checkpoint_id, deadline(), checkpoint_dir=directory, episode_ids=scope)
    answers = deployment.control.post_each("commit", body, deadline(), names=set(REPORTING))
    for name, answer in answers.items():
        assert isinstance(answer, ParticipantFailure), f"{name} accepted a scope naming a restart: {answer}"
        assert (answer.http_status, answer.code) == (409, "restart_in_scope"), answer.describe()
        assert deployment.status(name)["phase"] == "prepared"
        assert not participant_dir(Path(directory), REPORTING[name], name).exists()


def mixed_checkpoint(deployment: Deployment, checkpoint_id: str) -> tuple[str, dict[str, Any]]:
    """Gym's `_mixed_checkpoint`: prepare, then commit the continued rollouts only; the directory and replies."""
    prepared = prepare_mixed(deployment, checkpoint_id)
    directory = str(deployment.stack.checkpoint_root / checkpoint_id)
    assert_scope_with_restart_refused(deployment, checkpoint_id, directory)
    scope = prepared.continued([CONTINUED, RESTART])
    assert scope == [CONTINUED]
    return directory, deployment.control.commit(checkpoint_id, directory, scope, deadline())


def reward(reply: Any) -> float:
    assert reply.status_code == 200, reply.text
    return reply.json()["result"]["reward"]


def test_a_restart_episode_never_holds_up_a_checkpoint_and_starts_over_after_a_crash(deploy: Deploy) -> None:
    """Gym's scenario 15."""
    deployment = deploy("mixed")
    originals = deployment.start_mixed()
    directory, committed = mixed_checkpoint(deployment, "c1")
    assert committed["environment"]["episode_ids"] == ["continued"]
    assert committed["restart_environment"]["episode_ids"] == []

    deployment.crash_and_restart()
    restored = deployment.control.restore("r1", directory, [CONTINUED], deadline())
    deployment.control.resume("r1", deadline())
    deployment.control.retire("retire", [RESTART], deadline())
    continued = deployment.run(native_run_body("continued", 1))
    restart = deployment.run(native_run_body("restart", 1), "restart_environment")

    assert (restored["environment"]["restored"], restored["restart_environment"]["restored"]) == (["continued-a1"], [])
    (record,) = records(directory, "environment", "environment")
    assert record["episode_id"] == {"rollout_id": "continued", "attempt": 0}
    assert records(directory, "environment", "restart_environment") == []
    assert records(directory, "resources", "restart_resources") == []
    assert (reward(continued), reward(restart)) == (1.0, 1.0)
    for original in originals:
        original.wait()
        assert original.error is not None, "a crashed attempt's /run should have been cut off"


def test_a_restart_episode_keeps_running_through_a_checkpoint_without_a_crash(deploy: Deploy) -> None:
    """Gym's scenario 16; neither episode replies while the checkpoint is open (reference invariant 18)."""
    deployment = deploy("mixed")
    continued, restart = deployment.start_mixed()
    mixed_checkpoint(deployment, "c1")

    deployment.backend("/_ctl/release")
    model = deployment.control.participants.of_kind("model")[0]
    wait_until(lambda: deployment.control.status(model)["report"]["counts"]["held"] == 2, "both responses held")
    assert not continued.done, "the continued /run replied while the checkpoint was open"
    assert not restart.done, "the restart /run replied while the checkpoint was open"
    deployment.control.resume("c1", deadline())

    assert (reward(continued.result()), reward(restart.result())) == (1.0, 1.0)
    assert restart.result().json()["episode_id"] == {"rollout_id": "restart", "attempt": 0}


def test_a_restart_only_resources_server_reports_its_sessions_and_holds_only_seeds(deploy: Deploy) -> None:
    deployment = deploy("mixed")
    deployment.backend("/_ctl/hold", {"after_calls": 1})
    deployment.run_in_background(native_run_body("r", 0), "restart_environment")
    wait_until(lambda: len(deployment.calls()) == 2, "the second model call, after the tool call, to be held")

    statuses = deployment.control.status_all()
    restart_resources = statuses["restart_resources"]
    assert (restart_resources["mode"], restart_resources["report"]["restarts"]) == ("restart_only", ["r"])
    assert statuses["restart_environment"]["report"]["restarts"] == ["r"]
    assert statuses["restart_environment"]["report"]["counts"]["episodes"] == 1
    # The agent sent the tool call where the session's seed said: the plain resources server never saw it.
    assert (restart_resources["report"]["counts"]["sessions"], statuses["resources"]["report"]["counts"]) == (
        1,
        {"inflight": 0, "sessions": 0},
    )

    prepared = deployment.control.prepare("c1", deadline())
    assert prepared.prepared, prepared.blockers()
    url = deployment.url("restart_resources")
    probe = {"episode_id": {"rollout_id": "probe", "attempt": 0}}
    seed = InBackground(lambda: deployment.http.post(f"{url}/ng-rollout/probe/seed_session", json=probe))
    cookie = {"cookie": f"{SESSION_COOKIE}={session_id_for('r')}"}
    weather = deployment.http.post(f"{url}/ng-rollout/r/get_weather", json={"city": "SF"}, headers=cookie)
    assert weather.status_code == 200, weather.text
    assert not seed.done, "a seed was served while a checkpoint was open"
    assert deployment.status("restart_resources")["report"]["restarts"] == ["r"]

    deployment.control.resume("c1", deadline())
    seeded = seed.result()
    assert seeded.status_code == 200, seeded.text
    assert (seeded.headers["x-ng-checkpoint-restart"], seeded.headers["x-ng-checkpoint-verify"]) == ("1", "wait")
    assert deployment.status("restart_resources")["report"]["restarts"] == ["probe", "r"]
