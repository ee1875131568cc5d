"""Fixed scenarios: known-important sequences, run as the state machine's own rules in a fixed order.

Each is a named list of rule calls (the same vocabulary Hypothesis draws from), so a scenario checks exactly
what a random run checks after every step and at the drain. They are the fast, explicit examples of the
contract, and each planted fault has one that must trip the property the catalogue names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckpt_model.deployment import Harness
from ckpt_model.machine import machine_for

Step = tuple[str, dict[str, Any]]


def steps(*calls: str | tuple[str, dict[str, Any]]) -> tuple[Step, ...]:
    return tuple((call, {}) if isinstance(call, str) else call for call in calls)


FIRST = {"pick": 0}
CHECKPOINT = ("checkpoint", {"then_resume": True})

# r0 delivered its first call, was checkpointed in c1 before its second, and Gym crashed and restored c1.
RESTORED_AT_CALL_1 = steps("dispatch", ("release", FIRST), "prepare", "commit", "crash", ("restore", FIRST))

SCENARIOS: dict[str, tuple[Step, ...]] = {
    "crash_after_prepare__continues_from_boundary": RESTORED_AT_CALL_1 + steps(("start_replacement", FIRST)),
    "checkpoint_without_crash__parks_then_resumes": steps(
        "dispatch",
        "prepare",
        ("release", FIRST),
        "commit",
        "resume",
    ),
    "second_crash_before_replacement__still_continues": RESTORED_AT_CALL_1
    + steps("prepare", "commit", "crash", ("restore", {"pick": 1}), ("start_replacement", FIRST)),
    "same_checkpoint_restored_again__continues_from_its_boundary": RESTORED_AT_CALL_1
    + steps(
        ("start_replacement", FIRST), ("release", FIRST), "crash", ("restore", FIRST), ("start_replacement", FIRST)
    ),
    "retired_episode__stops_everywhere": steps(
        "dispatch",
        ("release", FIRST),
        ("retire", {"pick": 0, "again": False}),
        ("late_run", FIRST),
        "forget",
    ),
    "retired_then_started_over__completes": steps("dispatch", ("retire", {"pick": 0, "again": True})),
    "resumed_id__is_refused": steps("prepare", "resume"),
    "earlier_checkpoint__restored_after_later_work": steps(
        "dispatch",
        "prepare",
        "commit",
        "resume",
        "dispatch",
        ("release", FIRST),
        "crash",
        ("restore", FIRST),
        ("start_replacement", FIRST),
    ),
}

# The slow topology's verification (Gym's scenario 9), per verify mode: `wait` blocks a prepare, which the
# controller ends by retiring and redispatching the blocker; `replay` does not block, is exported as the step
# still to do, and runs again for the continued attempt.
SLOW_SCENARIOS: dict[str, dict[str, tuple[Step, ...]]] = {
    "wait": {
        "verification_in_flight__blocks_prepare_then_redispatched": steps(
            "dispatch", ("release_to_verification", FIRST), "prepare_blocked"
        ),
        "blocker_redispatched__checkpointed_and_restored_with_the_rest": steps(
            "dispatch",
            ("release_to_verification", FIRST),
            "dispatch",
            "prepare_blocked",
            CHECKPOINT,
            ("recover", FIRST),
        ),
    },
    "replay": {
        "verification_in_flight__exported_and_run_again": steps(
            "dispatch",
            ("release_to_verification", FIRST),
            CHECKPOINT,
            ("recover", FIRST),
            ("start_replacement", FIRST),
        ),
    },
}

# The scenario that trips each planted fault (`fakes.faults`).
FAULT_SCENARIOS: dict[str, str] = {
    "model_delivers_held": "checkpoint_without_crash__parks_then_resumes",
    "environment_drops_restored_pending": "second_crash_before_replacement__still_continues",
    "environment_restore_ignores_boundary": "crash_after_prepare__continues_from_boundary",
    "agent_restore_drops_outputs": "crash_after_prepare__continues_from_boundary",
    "agent_retire_keeps_sessions": "retired_episode__stops_everywhere",
    "resumed_id_not_fenced": "resumed_id__is_refused",
    "resume_deletes_records": "checkpoint_without_crash__parks_then_resumes",
    "environment_verify_never_waits": "verification_in_flight__blocks_prepare_then_redispatched",
}


def named(name: str) -> tuple[Step, ...]:
    """A scenario by name, from any topology's list."""
    for scenarios in (SCENARIOS, *SLOW_SCENARIOS.values()):
        if name in scenarios:
            return scenarios[name]
    raise KeyError(f"no scenario {name!r}")


def run(harness: Harness, scenario: Sequence[Step]) -> None:
    """Run the rules in order on a fresh machine, then drain and check the end, as a random run would."""
    machine = machine_for(harness)()
    try:
        for rule, arguments in scenario:
            getattr(machine, rule)(**arguments)
    finally:
        machine.teardown()
