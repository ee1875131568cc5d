"""The look-alike collector (`python -m fakes.collection`) against the look-alike stack: Gym's two rollout
collection scenarios (reference 12.2) and what a preempted run must leave behind (Appendix C)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.collection.machine import input_row
from ckpt_model.deployments.collection_run import CollectionAudit, CollectionRun
from ckpt_model.deployments.harness import Harness
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.protocol import collection_files as files
from tests.stack.conftest import Deployment, wait_until

pytestmark = pytest.mark.processes

Deploy = Callable[..., Deployment]

EXIT_PREEMPTED = 75
COMMAND = (sys.executable, "-m", "fakes.collection")


class Collection:
    """One collection directory and its runs, each audited as it exits (P22-P24; `CollectionAudit`)."""

    def __init__(self, deployment: Deployment, root: Path, topology: str, rollouts: list[str]) -> None:
        self.deployment = deployment
        self.root = root
        self.checkpoints = root / "collection-ckpt"
        self.output = root / "output.jsonl"
        inputs = root / "input.jsonl"
        traits = TOPOLOGIES[topology]
        inputs.write_text("".join(json.dumps(input_row(traits, each)) + "\n" for each in rollouts))
        self.config: dict[str, Any] = {
            "input_jsonl_fpath": str(inputs),
            "output_jsonl_fpath": str(self.output),
            "checkpoint_dir": str(self.checkpoints),
            "servers": {name: server.url for name, server in deployment.stack.gym.items()},
            "run_server": "environment",
            "run_format": "legacy" if traits.episode_owner == "agent" else "native",
            "token": deployment.stack.token,
        }
        self.runs: list[CollectionRun] = []
        self.rollouts = rollouts
        self.audit = CollectionAudit.for_topology(self.checkpoints, traits)

    def start(self, **overrides: Any) -> CollectionRun:
        self.runs.append(CollectionRun(COMMAND, {**self.config, **overrides}, self.root, len(self.runs)))
        return self.runs[-1]

    def log(self) -> str:
        return self.runs[-1].log()

    def exit_code(self, run: CollectionRun) -> int:
        """Wait for the run to exit, then audit what it left; its exit code."""
        code = run.wait()
        self.audit.exited(code, run.latest_at_start)
        return code

    def latest_id(self) -> str | None:
        return files.latest_id(self.checkpoints)

    def latest(self) -> dict[str, Any]:
        checkpoint_id = self.latest_id()
        assert checkpoint_id is not None, "no LATEST"
        return dict(json.loads((self.checkpoints / checkpoint_id / "collection.json").read_text()))

    def latest_still_kept(self) -> dict[str, Any] | None:
        """The latest checkpoint's `collection.json`, or None if a newer one replaced it while it was read."""
        try:
            return self.latest()
        except FileNotFoundError:
            return None

    def rows(self) -> list[tuple[str, int, float | None]]:
        return [(row.rollout_id, row.attempt, row.reward) for row in files.output_rows(self.output)]

    def audit_rows(self, attempts: dict[str, int]) -> None:
        """Every input row exactly once, with reward 1.0 and the attempt the scenario predicts (P25)."""
        self.audit.rows(self.output, self.rollouts, 1.0, attempts)

    def stop_all(self) -> None:
        for run in self.runs:
            run.kill()


@pytest.fixture
def collection(deploy: Deploy, tmp_path: Path) -> Iterator[Any]:
    made: list[Collection] = []

    def make(topology: str, rollouts: list[str]) -> Collection:
        made.append(Collection(deploy(topology), tmp_path, topology, rollouts))
        return made[-1]

    yield make
    for each in made:
        each.stop_all()


def n_messages(deployment: Deployment) -> list[int]:
    return [call["n_messages"] for call in deployment.calls()]


@pytest.mark.parametrize(("topology", "first"), [("native", 2), ("legacy", 1)])
def test_preemption_checkpoints_exits_75_and_a_rerun_continues_the_rollout(
    collection: Any, topology: str, first: int
) -> None:
    """Gym's scenario: SIGTERM after two calls; exit 75; `LATEST` names a checkpoint that continues `long-1`
    attempt 0; crash, release, restart; the rerun with `resume_from_cache` exits 0 with reward 1.0 at attempt 1."""
    run = collection(topology, ["long-1"])
    run.deployment.backend("/_ctl/hold", {"after_calls": 1})
    first_run = run.start()
    wait_until(lambda: len(run.deployment.calls()) == 2, "the second model call to be held")

    first_run.signal(signal.SIGTERM)

    assert run.exit_code(first_run) == EXIT_PREEMPTED, run.log()
    latest = run.latest()
    assert latest["continued"] == [{"rollout_id": "long-1", "attempt": 0}]
    assert latest["restarted"] == []
    assert not run.output.exists() or run.rows() == []

    run.deployment.crash_and_restart()
    rerun = run.start(resume_from_cache=True)

    assert run.exit_code(rerun) == 0, run.log()
    assert run.rows() == [("long-1", 1, 1.0)]
    run.audit_rows({"long-1": 1})
    assert n_messages(run.deployment) == [first, first + 2, first + 2]


def test_a_checkpoint_on_request_lets_collection_continue(collection: Any) -> None:
    """Gym's scenario: SIGUSR1 -> `LATEST` appears; release; the run exits 0 with reward 1.0 (legacy)."""
    run = collection("legacy", ["usr-1"])
    run.deployment.backend("/_ctl/hold", {"after_calls": 1})
    process = run.start()
    wait_until(lambda: len(run.deployment.calls()) == 2, "the second model call to be held")

    process.signal(signal.SIGUSR1)
    wait_until(lambda: (run.checkpoints / "LATEST").exists(), "LATEST to appear")
    run.deployment.backend("/_ctl/release")

    assert run.exit_code(process) == 0, run.log()
    assert run.rows() == [("usr-1", 0, 1.0)]
    run.audit_rows({})
    assert n_messages(run.deployment) == [1, 3]
    assert run.latest()["continued"] == [{"rollout_id": "usr-1", "attempt": 0}]


def published_checkpoints(run: Collection) -> list[str]:
    return sorted(path.name for path in run.checkpoints.iterdir() if (path / "collection.json").exists())


def test_every_checkpoint_moves_latest_forward_and_only_the_two_newest_are_kept(collection: Any) -> None:
    run = collection("native", ["kept-1"])
    run.deployment.backend("/_ctl/hold", {"after_calls": 1})
    process = run.start()
    wait_until(lambda: len(run.deployment.calls()) == 2, "the second model call to be held")
    seen: list[str] = []
    created: list[float] = []

    for number in range(1, 4):
        process.signal(signal.SIGUSR1)
        seen.append(
            wait_until(lambda: run.latest_id() not in (None, *seen) and run.latest_id(), f"checkpoint {number}")
        )
        created.append(run.latest()["created_at"])

    assert created == sorted(created), "LATEST moved back"
    wait_until(lambda: published_checkpoints(run) == sorted(seen[1:]), "the oldest checkpoint to be pruned")
    run.deployment.backend("/_ctl/release")
    assert run.exit_code(process) == 0, run.log()
    assert run.rows() == [("kept-1", 0, 1.0)]
    run.audit_rows({})


def test_a_rerun_continues_what_latest_names_and_starts_over_what_ran_after_it(collection: Any) -> None:
    """Three runs: the first is preempted with `a` in flight (`b` not yet sent); the second continues `a` to its
    reply, sends `b` and is killed; the third retires `b`'s logged attempt and runs it again as attempt 1."""
    run = collection("native", ["a", "b"])
    run.config["concurrency"] = 1
    run.deployment.backend("/_ctl/hold", {"after_calls": 1})
    first = run.start()
    wait_until(lambda: len(run.deployment.calls()) == 2, "a's second model call to be held")
    first.signal(signal.SIGTERM)
    assert run.exit_code(first) == EXIT_PREEMPTED, run.log()

    run.deployment.crash_and_restart()
    run.deployment.backend("/_ctl/hold", {"after_calls": 3})  # a@1 makes one call (2); b@0's first (3) is held
    second = run.start(resume_from_cache=True)
    wait_until(lambda: len(run.deployment.calls()) == 4, "b's first model call to be held")
    second.kill()
    assert run.exit_code(second) == -signal.SIGKILL
    assert run.rows() == [("a", 1, 1.0)]

    run.deployment.crash_and_restart()
    third = run.start(resume_from_cache=True)

    assert run.exit_code(third) == 0, run.log()
    assert run.rows() == [("a", 1, 1.0), ("b", 1, 1.0)]
    run.audit_rows({"a": 1, "b": 1})
    assert "1 started over" in run.log()
    # b's retire mark was forgotten once b@1 replied.
    for name in ("environment", "agent", "resources", "policy_model"):
        assert run.deployment.status(name)["retired_rollouts"] == 0, name


def test_a_checkpoint_that_fails_publishes_nothing_and_a_sigterm_then_exits_1(collection: Any) -> None:
    """`slow` in `wait` mode: a judge call the backend holds blocks prepare past the checkpoint's deadline."""
    run = collection("slow", ["judged-1"])
    run.deployment.backend("/_ctl/gate")
    process = run.start(checkpoint_timeout_s=1.0)
    run.deployment.release_when_waiting(0, "policy")
    run.deployment.release_when_waiting(1, "policy")
    run.deployment.wait_call_waiting(2, "judge")

    process.signal(signal.SIGTERM)

    assert run.exit_code(process) == 1, run.log()
    assert "the checkpoint failed" in run.log()
    assert not (run.checkpoints / "LATEST").exists()
    assert published_checkpoints(run) == []
    assert [path.name for path in run.checkpoints.iterdir()] == ["dispatched.jsonl"]


def test_the_harness_starts_the_system_s_collection_on_this_example_s_servers(tmp_path: Path) -> None:
    """`Harness.start_collection` (the `CollectsRollouts` capability): the config gets every server (the legacy
    relay too), the one whose `/run` the controller calls and the bearer; a SIGTERM while the gated backend holds
    the first model call ends the run with exit 75 and a checkpoint that continues the row."""
    inputs = tmp_path / "input.jsonl"
    inputs.write_text(json.dumps(input_row(TOPOLOGIES["legacy"], "seam-1")) + "\n")
    with Harness.embedded("legacy") as harness:
        harness.begin_example()
        assert harness.backend is not None
        checkpoints = harness.checkpoint_dir / "collection"
        config = {
            "input_jsonl_fpath": str(inputs),
            "output_jsonl_fpath": str(tmp_path / "output.jsonl"),
            "checkpoint_dir": str(checkpoints),
        }
        run = harness.start_collection(config, 0)
        try:
            given = json.loads(run.config_path.read_text())
            assert given["run_server"] == "environment"  # the legacy relay, which takes no part in checkpoints
            assert given["run_format"] == "legacy"
            assert given["token"] == harness.deployment.token
            assert sorted(given["servers"]) == ["agent", "environment", "policy_model", "resources"]
            wait_until(lambda: len(harness.backend.calls()) == 1, "the first model call to wait at the gate")
            run.signal(signal.SIGTERM)

            assert run.wait() == EXIT_PREEMPTED, run.log()
            audit = CollectionAudit.for_topology(checkpoints, TOPOLOGIES["legacy"])
            assert audit.kinds == ("agent", "resources", "model")  # the relay takes no part
            audit.exited(EXIT_PREEMPTED, run.latest_at_start)
            assert audit.latest is not None
            assert [episode.capture_key for episode in audit.latest.continued] == ["seam-1"]
        finally:
            run.kill()


def test_the_timer_checkpoints_without_a_signal(collection: Any) -> None:
    """The checkpoint judged is one the timer took while the call was held (read then: the run keeps only its
    latest), which must continue the row; once released the 0.2 s timer may checkpoint again after the rollout
    finished (on a loaded machine it did), and that later one, with nothing to continue, is judged by the audit as
    every checkpoint is."""
    run = collection("native", ["timed-1"])
    run.deployment.backend("/_ctl/hold", {"after_calls": 1})
    process = run.start(checkpoint_every_s=0.2)
    wait_until(lambda: len(run.deployment.calls()) == 2, "the second model call to be held")

    wait_until(lambda: run.latest_id() is not None, "a checkpoint the timer asked for")
    first = run.latest_id()
    wait_until(lambda: run.latest_id() != first, "the timer's next checkpoint")
    taken_while_held = wait_until(run.latest_still_kept, "the latest checkpoint read before the timer replaced it")
    run.deployment.backend("/_ctl/release")

    assert run.exit_code(process) == 0, run.log()
    assert taken_while_held["continued"] == [{"rollout_id": "timed-1", "attempt": 0}]
    run.audit_rows({})
