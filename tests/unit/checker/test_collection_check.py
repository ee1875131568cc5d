"""`ckpt-model check --controller collection`'s replay command, on hand-built values."""

from __future__ import annotations

from hypothesis import settings

from ckpt_model.collection_check import replay_command
from ckpt_model.deployment import collection_fault_catalogue


def test_the_replay_command_names_the_search_it_repeats() -> None:
    faults = collection_fault_catalogue()[:2]
    chosen = settings(max_examples=7, stateful_step_count=5)

    seeded = replay_command("legacy", faults, chosen, 41)
    derandomized = replay_command("native", (), chosen, None)

    names = ",".join(fault.name for fault in faults)
    assert seeded == (
        f"ckpt-model check --controller collection --topology legacy --examples 7 --steps 5 --faults {names} --seed 41"
    )
    assert derandomized == "ckpt-model check --controller collection --topology native --examples 7 --steps 5"
