"""The controller contract, checked by the state machine against the fault-free stack, in every fault-free
deployment (`ckpt_model.model.spec.FAULT_FREE`). Each run's coverage table and transition coverage go to the JUnit
report; in the nightly (`GOALS_REQUIRED`) every coverage goal and rule that applies to the deployment must have
been reached; in every run, each transition a run takes from a state the explorer expanded must be one it predicted."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from hypothesis.stateful import run_state_machine_as_test

from ckpt_model.deployments.harness import Harness
from ckpt_model.model.abstract import COVERAGE_DEPTH
from ckpt_model.model.spec import FAULT_FREE, DeploymentSpec
from ckpt_model.results.stats import SearchStats
from ckpt_model.search import transition_coverage
from ckpt_model.steps import goals
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.steps.steplog import coverage
from ckpt_model.trainer.machine import CheckpointMachine, machine_for
from tests.stateful.conftest import ACTIVE_SETTINGS, DEEP, GOALS_REQUIRED

# The default run's depth for the transition coverage it records (explored in a second at most).
UNMODELLED_DEPTH = 4

# Deployments another fault-free deployment includes (it draws every rule and coverage goal of the smaller one, and
# more): the default run checks the contract on the larger one, the nightly on both (`pytest -m deep`). What the
# smaller one alone checks is a combination whose parts the default run checks apart:
# - counter inside counter+capture: the same deployment without token capture;
# - slow/replay inside slow/replay+jumps, whose one rule it cannot draw, skewed_clock, the default run draws on
#   every other deployment;
# - native inside slow/wait, the native topology with a judge; native's fixed scenarios run on native itself, and
#   episodes without a judge in the contract on mixed and native+capture+cuts+workers2;
# - legacy inside counter+capture: the agent's legacy rows through the same relay, with the counter task (and its
#   exported resources state) for the weather task, which the contract runs on the native-topology deployments;
# - native+capture+cuts+workers2 inside the same with two workers on every other server too (servers2): the same
#   rules on one-process environment, agent and resources servers, which every other deployment runs.
CUTS_WITH_POLICY_WORKERS = DeploymentSpec("native", token_capture=True, generation_cuts=True, policy_workers=2)
INCLUDED: dict[DeploymentSpec, DeploymentSpec] = {
    DeploymentSpec("counter"): DeploymentSpec("counter", token_capture=True),
    DeploymentSpec("slow", "replay"): DeploymentSpec("slow", "replay", time_jumps=True),
    DeploymentSpec("native"): DeploymentSpec("slow", "wait"),
    DeploymentSpec("legacy"): DeploymentSpec("counter", token_capture=True),
    CUTS_WITH_POLICY_WORKERS: attrs.evolve(CUTS_WITH_POLICY_WORKERS, server_workers=2),
}


@pytest.mark.parametrize(
    "spec",
    [pytest.param(spec, marks=DEEP if spec in INCLUDED else ()) for spec in FAULT_FREE],
    ids=lambda spec: spec.label,
)
def test_the_fault_free_stack_keeps_the_contract(
    harness_of: Callable[[DeploymentSpec], Harness],
    spec: DeploymentSpec,
    record_property: Callable[[str, object], None],
) -> None:
    stats = SearchStats()
    harness = harness_of(spec)
    run_state_machine_as_test(machine_for(harness, stats), settings=ACTIVE_SETTINGS)
    reachable = coverage(CheckpointMachine)
    record_property("coverage", goals.table(stats, spec, reachable))
    # The share of the model's transitions the run took (the nightly's to the depth `check` reckons, the default
    # run's shallower), and none taken that the explorer did not predict: its move table mirrors every rule and its
    # abstraction keeps what the rules branch on, so one is a checker bug (docs/explore.md names the two found).
    depth = COVERAGE_DEPTH if GOALS_REQUIRED else UNMODELLED_DEPTH
    explored = transition_coverage.explored(spec, depth, Capabilities.of(harness))
    taken = transition_coverage.coverage_of(explored, stats.transitions)
    record_property("transitions", "\n".join(taken.lines()))
    assert taken.unmodelled == (), "\n".join(taken.lines())
    if GOALS_REQUIRED:
        goals.require(stats, spec, reachable)


# What each included deployment draws that its includer cannot, each drawn in the default run elsewhere.
DRAWN_ONLY_BY_THE_INCLUDED: dict[DeploymentSpec, set[str]] = {
    DeploymentSpec("slow", "replay"): {"skewed_clock", "skewed_ahead_lapsed_first", "skewed_behind_outheld"},
}


def test_included_deployments_draw_every_rule_and_goal_of_theirs() -> None:
    """A deployment left to the nightly loses the default run nothing its includer cannot draw, but what the table
    above names, and that some deployment of the default run draws."""
    default_run = [spec for spec in FAULT_FREE if spec not in INCLUDED]
    reachable = coverage(CheckpointMachine)

    def draws(spec: DeploymentSpec) -> set[str]:
        drawn = {rule for rule, applies in reachable.rules.items() if applies(spec)}
        return drawn | {goal.name for goal in reachable.goals if goal.applies(spec)}

    for included, includer in INCLUDED.items():
        assert includer in default_run, f"{included.label} is left to {includer.label}, which the default run leaves"
        lost = draws(included) - draws(includer)
        assert lost == DRAWN_ONLY_BY_THE_INCLUDED.get(included, set()), f"{included.label}: {sorted(lost)}"
        for name in lost:
            assert any(name in draws(spec) for spec in default_run), f"{name} is drawn in no default deployment"
