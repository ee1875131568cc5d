"""What a deployment lets the checker check (`ckpt_model.steps.checkable`): its tables agree with the machine's own
preconditions, and the unchecked properties of hand-built capabilities are exactly those no rule or site judges.

The machine's preconditions are evaluated as they are (`steplog.gates`), on a machine whose harness, controller
and ledger watch are stand-ins with chosen capabilities, over every model state the pure model reaches in a few
steps when each rule that is enabled takes its model transition (`DEPTH` steps reach every rule the tables allow;
one the rules' needs allow and no state enables fails too). A rule is enabled somewhere exactly when what it
declares it needs (`steplog.Declaration.needs`) says this deployment has it."""

from __future__ import annotations

import types
from collections.abc import Iterator

import attrs
import pytest

from ckpt_model.model.contract import Model
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties.registry import REGISTRY
from ckpt_model.steps import checkable
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.steps.steplog import declarations, gates
from ckpt_model.trainer.machine import CheckpointMachine
from ckpt_model.trainer.moves import MOVES
from ckpt_model.trainer.stand_in import stand_in

DEPTH = 5
RULES = declarations(CheckpointMachine)
# Every harness capability on, as the look-alike stack with every option has it (each topology adds its traits).
EVERYTHING = Capabilities(
    gate=True,
    crashes=True,
    restart_one=True,
    failpoints=True,
    lose_unsynced=True,
    break_storage=True,
    pause=True,
    lose_replies=True,
    fail_hooks=True,
    skew_clocks=True,
    jump_clocks=True,
    lease_lapses=True,
    telemetry=True,
)
# A real Gym as `GymDeployment` drives it: none of the look-alike's extra capabilities.
REAL_GYM = Capabilities()


def topology_of(capabilities: Capabilities) -> tuple[str, str]:
    if capabilities.judge:
        return "slow", "wait" if capabilities.verify_wait else "replay"
    return ("mixed" if capabilities.restart_environment else "native"), "wait"


def reachable(capabilities: Capabilities) -> Iterator[Model]:
    """Every model state within `DEPTH` rule steps of a fresh example, on this deployment (one rollout at most),
    each enabled rule taking its first model transition (`ckpt_model.trainer.moves`)."""
    topology, verify_mode = topology_of(capabilities)
    start = Model(topology=topology, verify_mode=verify_mode, rollouts_max=1)  # type: ignore[arg-type]
    seen = {start}
    frontier = [start]
    for _ in range(DEPTH):
        following = []
        for model in frontier:
            yield model
            machine = stand_in(capabilities, model)
            for rule in enabled_rules(capabilities, model):
                _, successor = next(iter(MOVES[rule](machine)))
                if successor not in seen:
                    seen.add(successor)
                    following.append(successor)
        frontier = following
    yield from frontier


def enabled_rules(capabilities: Capabilities, model: Model) -> set[str]:
    machine = stand_in(capabilities, model)
    return {rule for rule, gate in gates(CheckpointMachine).items() if gate(machine)}


def ever_enabled(capabilities: Capabilities) -> set[str]:
    found: set[str] = set()
    for model in reachable(capabilities):
        found |= enabled_rules(capabilities, model)
    return found


def without(capabilities: Capabilities, name: str) -> Capabilities:
    return attrs.evolve(capabilities, **{name: False})


DEPLOYMENTS: dict[str, Capabilities] = {
    "everything": EVERYTHING,
    "slow+everything": attrs.evolve(EVERYTHING, judge=True),
    "slow-replay+everything": attrs.evolve(EVERYTHING, judge=True, verify_wait=False),
    "mixed+everything": attrs.evolve(EVERYTHING, restart_environment=True),
    "capture+cuts+everything": attrs.evolve(EVERYTHING, token_capture=True, generation_cuts=True),
    "capture+everything": attrs.evolve(EVERYTHING, token_capture=True),
    "real-gym": REAL_GYM,
    "real-gym-no-gate": without(REAL_GYM, "gate"),
    "real-gym-no-crashes": without(REAL_GYM, "crashes"),
    "real-gym-no-gate-no-crashes": Capabilities(gate=False, crashes=False),
    "real-gym-long-lease": without(REAL_GYM, "lease_lapses"),
    **{
        f"everything-but-{name}": without(EVERYTHING, name)
        for name in (
            "gate",
            "crashes",
            "restart_one",
            "failpoints",
            "lose_unsynced",
            "break_storage",
            "pause",
            "lose_replies",
            "fail_hooks",
            "skew_clocks",
            "jump_clocks",
            "lease_lapses",
        )
    },
    "capture+cuts-but-crashes": attrs.evolve(without(EVERYTHING, "crashes"), token_capture=True, generation_cuts=True),
}


@pytest.mark.parametrize("name", list(DEPLOYMENTS))
def test_a_rule_is_ever_enabled_exactly_when_the_deployment_has_what_rule_needs_says(name: str) -> None:
    capabilities = DEPLOYMENTS[name]

    enabled = ever_enabled(capabilities)

    drawable = {rule for rule, declared in RULES.items() if not checkable.missing(declared.needs, capabilities)}
    assert enabled == drawable, (
        f"enabled but not in the table: {sorted(enabled - drawable)}; "
        f"in the table but never enabled: {sorted(drawable - enabled)}"
    )


def test_every_property_is_judged_somewhere_and_every_site_judges_one() -> None:
    judged_by = checkable.judged_by(RULES)
    assert all(judged_by.values())
    assert {property_id for declared in RULES.values() for property_id in declared.judges} <= set(REGISTRY)
    assert set(checkable.JUDGED_AT) <= set(REGISTRY)
    assert set(checkable.SITES) <= {site for sites in checkable.JUDGED_AT.values() for site in sites}
    assert {site for sites in checkable.JUDGED_AT.values() for site in sites} <= set(checkable.SITES)


def ids(found: list[checkable.Unchecked]) -> list[str]:
    return [item.name for item in found]


def test_a_real_gym_with_a_gate_and_crashes_checks_all_but_the_look_alikes_nemeses() -> None:
    unchecked = checkable.unchecked_properties(REAL_GYM, RULES)

    assert ids(unchecked) == ["P5", "P11", "P12", "P16", "P17", "P18", "P20", "P21", "P26"]
    why = {item.name: item.why for item in unchecked}
    assert why["P16"] == (
        "judged only in failing_export (which needs hooks that raise (fail_hook)), paused_commit (which needs "
        "servers frozen and let go (pause_server)) or stalled_write and storage_fault (which need storage faults "
        "(break_storage))"
    )
    assert why["P11"] == (
        "judged only on the judge calls (which need a topology whose verification asks a judge (slow))"
    )


def test_without_a_gated_backend_nothing_a_rollout_makes_is_judged() -> None:
    unchecked = checkable.unchecked_properties(without(REAL_GYM, "gate"), RULES)

    assert ids(unchecked) == [
        "P2",
        "P3",
        "P4",
        "P5",
        "P6",
        "P7",
        "P11",
        "P12",
        "P14",
        "P16",
        "P17",
        "P18",
        "P20",
        "P21",
        "P26",
    ]
    why = {item.name: item.why for item in unchecked}
    assert why["P3"] == ("judged only on the rollouts (which need a gated backend to hold model calls (backend_url))")
    assert why["P7"].startswith("judged only in crash_participant (which needs one server restarted alone")
    assert "forget, late_run and retire (which need a gated backend" in why["P7"]


def test_without_crashes_and_with_a_gate_no_restore_can_be_judged() -> None:
    """Every checkpoint then holds a rollout, and only a crash gives a restore processes that served nothing."""
    capabilities = without(REAL_GYM, "crashes")

    unchecked = ids(checkable.unchecked_properties(capabilities, RULES))
    rules = ids(checkable.undrawable_rules(capabilities, RULES))

    assert "P8" in unchecked
    assert "P9" not in unchecked
    for rule in ("crash", "crash_in_commit", "crash_in_operation", "recover", "restore", "failed_restore"):
        assert rule in rules
    assert {"dispatch", "release", "retire", "commit", "unreachable"}.isdisjoint(rules)


def test_without_crashes_and_without_a_gate_restores_of_empty_checkpoints_remain() -> None:
    capabilities = Capabilities(gate=False, crashes=False)

    unchecked = ids(checkable.unchecked_properties(capabilities, RULES))
    rules = ids(checkable.undrawable_rules(capabilities, RULES))

    assert "P8" not in unchecked
    assert {"restore", "failed_restore", "restore_incomplete"}.isdisjoint(rules)
    assert {"crash", "crash_in_commit", "crash_in_operation", "recover", "dispatch"} <= set(rules)


def test_the_look_alike_with_every_capability_checks_everything_its_topology_has() -> None:
    assert ids(checkable.unchecked_properties(EVERYTHING, RULES)) == ["P5", "P11", "P12"]
    everything = attrs.evolve(EVERYTHING, judge=True, token_capture=True, generation_cuts=True)
    assert checkable.unchecked_properties(everything, RULES) == []
    assert checkable.verdict_scope(everything, RULES) == "checked: P1-P21, P26"


def test_the_summary_lists_what_is_not_checked_and_the_verdict_says_it() -> None:
    capabilities = Capabilities(gate=False, crashes=False)

    lines = checkable.summary(capabilities, RULES, rule_shown=lambda rule: rule != "dispatch_restart")

    assert lines[0] == "not checked on this deployment:"
    assert any(line.startswith("  P3 continuations complete: judged only on the rollouts") for line in lines)
    assert "rules never drawn on this deployment:" in lines
    assert not any("dispatch_restart" in line for line in lines)
    assert any(line.startswith("  crash: needs crashes") for line in lines)
    assert checkable.verdict_scope(capabilities, RULES) == (
        "checked: P1, P8-P10, P13, P15, P19; not checked: P2-P7, P11-P12, P14, P16-P18, P20-P21, P26 (listed above)"
    )


def test_capabilities_of_a_harness_read_its_capabilities() -> None:
    spec = types.SimpleNamespace(
        token_capture=False,
        generation_cuts=False,
        verify_mode="replay",
        lease_grace_s=600.0,
        traits=types.SimpleNamespace(judge=True, restart_environment=False),
    )
    faults = types.SimpleNamespace(
        can_stop_inside_commit=False,
        can_break_storage=False,
        can_pause=True,
        can_lose_replies=False,
        can_fail_hooks=False,
    )
    harness = types.SimpleNamespace(
        backend=None,
        can_crash=False,
        can_restart_one=False,
        can_kill_workers=False,
        can_lose_unsynced=False,
        faults=faults,
        clocks=types.SimpleNamespace(can_skew_clocks=False, can_jump_clocks=False),
        spec=spec,
        telemetry_dir=None,
    )

    capabilities = Capabilities.of(harness)  # type: ignore[arg-type]

    assert capabilities == Capabilities(
        gate=False, crashes=False, pause=True, lease_lapses=False, judge=True, verify_wait=False
    )


def test_the_look_alike_stack_has_every_nemesis_its_spec_allows() -> None:
    plain = Capabilities.of_look_alike(DeploymentSpec("slow", "replay"))
    jumping = Capabilities.of_look_alike(DeploymentSpec("native", server_workers=2, time_jumps=True))

    assert plain == attrs.evolve(EVERYTHING, jump_clocks=False, judge=True, verify_wait=False)
    assert (jumping.kill_workers, jumping.skew_clocks, jumping.jump_clocks) == (True, False, True)
    assert not plain.kill_workers
