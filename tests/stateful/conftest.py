"""Stateful suite: our Hypothesis profile loaded explicitly, and one harness per deployment per session.

`CKPT_MODEL_EXAMPLES=N` runs N examples per machine test instead of the profile's number, with everything else of
the profile: how the nightly's search is sized to a time budget, and how its throughput is measured
(docs/parallel.md). Under the nightly's profile (`ci`) each fault-free deployment's search must also reach every
coverage goal that applies to it (`GOALS_REQUIRED`, `ckpt_model.steps.goals.require`); a few default examples cannot.
Under pytest-xdist each worker process builds its own harnesses; the example database is shared.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from hypothesis import settings

from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.search import profiles

EXAMPLES_ENV = "CKPT_MODEL_EXAMPLES"


def examples_override() -> int | None:
    """`CKPT_MODEL_EXAMPLES` as a positive number of examples; None if unset or empty; anything else ends the run."""
    text = os.environ.get(EXAMPLES_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"{EXAMPLES_ENV} must be a positive integer (got {text!r}); unset it for the profile's")
    return int(text)


ACTIVE_PROFILE = profiles.load()
EXAMPLES = examples_override()
# The nightly's deep search must reach every applicable coverage goal; the default run's few examples need not.
GOALS_REQUIRED = ACTIVE_PROFILE == "ci"
# What the state machine tests pass explicitly: the profile loaded above, as it is in force here (CI or not).
ACTIVE_SETTINGS = profiles.profile_for(ACTIVE_PROFILE, profiles.in_ci())
if EXAMPLES is not None:
    ACTIVE_SETTINGS = settings(ACTIVE_SETTINGS, max_examples=EXAMPLES)


# A test that repeats, on another deployment or end to end, a check the default run already makes (a scenario of the
# native set on legacy, the same contract on a deployment another one includes, the minimiser on a P14 failure): it
# runs in the nightly's deep step (`pytest -m deep`), not in the default run (`pyproject.toml` deselects it there).
DEEP = pytest.mark.deep


def scenario_params(own: Iterable[str], repeated: Iterable[str] = ()) -> list[Any]:
    """Scenario names as parameters: `own` (what only this deployment checks) in the default run, the `repeated`
    ones not among them (checked on another deployment in the default run) marked `deep`, all sorted by name."""
    kept = set(own)
    names = sorted(kept | set(repeated))
    return [pytest.param(name, marks=() if name in kept else DEEP) for name in names]


def pytest_report_header() -> str:
    examples = "" if EXAMPLES is None else f"; {EXAMPLES} examples per machine test ({EXAMPLES_ENV})"
    return f"ckpt-model: Hypothesis profile {profiles.describe()}{examples}"


@pytest.fixture(scope="session")
def harness_of() -> Iterator[Callable[[DeploymentSpec], Harness]]:
    """One harness per deployment per session (per xdist worker), started when a test first asks for it."""
    started: dict[DeploymentSpec, Harness] = {}

    def harness(spec: DeploymentSpec) -> Harness:
        if spec not in started:
            started[spec] = Harness.embedded(spec)
        return started[spec]

    try:
        yield harness
    finally:
        for each in started.values():
            each.close()


def deployment_fixture(spec: DeploymentSpec, doc: str | None = None) -> Any:
    """A session fixture: the harness of `spec`, shared with every other test of that deployment."""

    def fixture(harness_of: Callable[[DeploymentSpec], Harness]) -> Harness:
        return harness_of(spec)

    fixture.__doc__ = doc or f"The {spec.label} deployment."
    return pytest.fixture(scope="session")(fixture)


native_harness = deployment_fixture(DeploymentSpec("native"))
legacy_harness = deployment_fixture(DeploymentSpec("legacy"))
counter_harness = deployment_fixture(DeploymentSpec("counter"))
counter_capture_harness = deployment_fixture(
    DeploymentSpec("counter", token_capture=True), "Gym's lineage scenarios' deployment: counter, token capture."
)
native_cuts_harness = deployment_fixture(
    DeploymentSpec("native", token_capture=True, generation_cuts=True),
    "Gym's cut scenario's deployment: the native topology with token capture and generation cuts.",
)
counter_capture_two_workers_harness = deployment_fixture(
    DeploymentSpec("counter", token_capture=True, policy_workers=2),
    "The lineage scenarios' deployment with two policy-model workers behind one port (Gym runs them with 1 and 2).",
)
native_cuts_two_workers_harness = deployment_fixture(
    DeploymentSpec("native", token_capture=True, generation_cuts=True, policy_workers=2),
    "The cut scenario's deployment with two policy-model workers behind one port.",
)
native_two_servers_harness = deployment_fixture(
    DeploymentSpec("native", server_workers=2),
    "The native topology with two workers on the environment, agent and resources servers each.",
)
slow_wait_harness = deployment_fixture(DeploymentSpec("slow", "wait"))
slow_replay_harness = deployment_fixture(DeploymentSpec("slow", "replay"))
slow_replay_jumps_harness = deployment_fixture(
    DeploymentSpec("slow", "replay", time_jumps=True), "slow/replay whose servers' time can pass (the default suite's)."
)
slow_replay_jumps_two_workers_harness = deployment_fixture(
    DeploymentSpec("slow", "replay", policy_workers=2, time_jumps=True),
    "slow/replay whose time can pass, with two policy-model workers: a jump moves every worker's clock.",
)
mixed_harness = deployment_fixture(DeploymentSpec("mixed"))
