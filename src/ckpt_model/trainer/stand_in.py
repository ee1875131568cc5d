"""A machine that only decides: its preconditions and participant choices read chosen capabilities and a model.

The explorer (`ckpt_model.search.explore`) and the tables' tests ask the machine's own preconditions, as they are
(`steplog.gates`), on model states no real process ever served: this machine's harness, controller and ledger watch
are stand-ins that answer what the capabilities say, so nothing is started and nothing is called.
"""

from __future__ import annotations

import types

from ckpt_model.model.contract import Model
from ckpt_model.protocol.client import Participant
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.trainer.machine import CheckpointMachine

# The participant kinds of every topology; a restart environment adds a second environment and resources server.
KINDS = ("agent", "environment", "model", "resources")


def participants(capabilities: Capabilities) -> list[Participant]:
    """The stand-in deployment's participants, named `<kind><index>` in name order."""
    kinds = [*KINDS, *(("environment", "resources") if capabilities.restart_environment else ())]
    members = [Participant(f"{kind}{index}", kind, f"http://127.0.0.1:{index + 1}") for index, kind in enumerate(kinds)]
    return sorted(members, key=lambda member: member.name)


def stand_in(capabilities: Capabilities, model: Model, server_workers: int = 1) -> CheckpointMachine:
    """A machine whose preconditions read `capabilities` and whose state is `model`."""
    members = participants(capabilities)
    harness = types.SimpleNamespace(
        backend=object() if capabilities.gate else None,
        can_crash=capabilities.crashes,
        can_restart_one=capabilities.restart_one,
        can_kill_workers=capabilities.kill_workers,
        can_lose_unsynced=capabilities.lose_unsynced,
        faults=types.SimpleNamespace(
            can_stop_inside_commit=capabilities.failpoints,
            can_break_storage=capabilities.break_storage,
            can_pause=capabilities.pause,
            can_lose_replies=capabilities.lose_replies,
            can_fail_hooks=capabilities.fail_hooks,
        ),
        clocks=types.SimpleNamespace(
            can_skew_clocks=capabilities.skew_clocks, can_jump_clocks=capabilities.jump_clocks
        ),
        control=types.SimpleNamespace(participants=members),
        spec=types.SimpleNamespace(server_workers=server_workers),
    )
    controller = types.SimpleNamespace(
        may_lapse=capabilities.lease_lapses,
        can_retry=True,
        control=harness.control,
        members=lambda: list(members),
    )
    ledgers_on = capabilities.gate and capabilities.token_capture
    machine = object.__new__(CheckpointMachine)
    machine.harness = harness  # type: ignore[assignment]
    machine.controller = controller  # type: ignore[assignment]
    machine.ledgers = types.SimpleNamespace(enabled=ledgers_on, cuts=ledgers_on and capabilities.generation_cuts)  # type: ignore[assignment]
    machine.model = model
    return machine
