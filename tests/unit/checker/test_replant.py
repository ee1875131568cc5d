"""`Harness.replant`: the next examples' servers start with other planted faults, only ones this deployment shows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import HarnessError
from ckpt_model.model.spec import DeploymentSpec


class StartsNothing:
    """A deployment with no gated backend that never starts a server: enough for what a harness does at its start."""

    topology = "native"
    verify_mode = "wait"
    faults: tuple[str, ...] = ()

    def __init__(self, root: Path) -> None:
        self.logs_dir = root / "logs"

    def start_backend(self) -> None:
        return None

    def close(self) -> None:
        return None


class Plants(StartsNothing):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.planted: list[tuple[str, ...]] = []

    def plant_faults(self, faults: Sequence[str]) -> None:
        self.planted.append(tuple(faults))


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    spec = DeploymentSpec("native", faults=("resume_deletes_records",))
    made = Harness(Plants(tmp_path), spec=spec, root=tmp_path / "root")  # type: ignore[arg-type]
    yield made
    made.close()


def test_the_next_servers_get_the_new_faults_and_the_spec_names_them(harness: Harness) -> None:
    harness.replant(("agent_export_drops_unstarted",))
    assert harness.deployment.planted == [("agent_export_drops_unstarted",)]  # type: ignore[attr-defined]
    assert harness.spec == DeploymentSpec("native", faults=("agent_export_drops_unstarted",))
    assert harness.spec.faults == ("agent_export_drops_unstarted",)
    assert harness.spec.file_words == ("native", "agent_export_drops_unstarted")
    harness.replant(())
    assert (harness.deployment.planted[-1], harness.spec) == ((), DeploymentSpec("native"))  # type: ignore[attr-defined]


def test_a_fault_of_another_deployment_is_refused_and_nothing_changes(harness: Harness) -> None:
    """second_worker_delivers_held shows only with token capture and two policy workers: not on native."""
    before = harness.spec
    with pytest.raises(HarnessError, match=r"second_worker_delivers_held show\(s\) in the counter\+capture\+workers2"):
        harness.replant(("second_worker_delivers_held",))
    assert (harness.spec, harness.deployment.planted) == (before, [])  # type: ignore[attr-defined]


def test_a_deployment_that_cannot_plant_says_so(tmp_path: Path) -> None:
    harness = Harness(StartsNothing(tmp_path), spec=DeploymentSpec("native"), root=tmp_path / "root")  # type: ignore[arg-type]
    try:
        with pytest.raises(HarnessError, match=r"plant_faults\(faults\)"):
            harness.replant(("resume_deletes_records",))
        assert harness.spec == DeploymentSpec("native")
    finally:
        harness.close()
