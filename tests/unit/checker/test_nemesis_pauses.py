"""The pauses family's jump waits for the victim's stage peers (hand-built stand-ins): on `mixed`, two participants
of one kind take a staged prepare together, and a jump of the clocks while the peer still checked its deadline had it
refuse the prepare too (P21 in 1 to 2 of 10 runs), and once under the nightly's load a peer whose call was not yet
sent when the wait looked."""

from __future__ import annotations

import types

from ckpt_model.protocol.telemetry import ControlCall
from ckpt_model.trainer.nemeses.pauses import Pauses


def call(participant: str, answered: bool) -> ControlCall:
    return ControlCall(participant, "prepare", "c1", "trace", f"span-{participant}", answered=answered)


def pauses_over(*rounds: list[ControlCall]) -> tuple[Pauses, list[int]]:
    """The pauses family's rules, nothing else built, whose controller shows each of `rounds` of calls in turn (the
    last one repeats); and how many times they were read."""
    reads = [0]

    def control_calls() -> list[ControlCall]:
        reads[0] += 1
        return rounds[min(reads[0], len(rounds)) - 1]

    machine = object.__new__(Pauses)
    machine.controller = types.SimpleNamespace(control=types.SimpleNamespace(control_calls=control_calls))  # type: ignore[assignment]
    # Far longer than the few polls each wait needs: a loaded machine can hold this thread for a while.
    machine.quiescence = types.SimpleNamespace(timeout_s=30.0)  # type: ignore[assignment]
    return machine, reads


def test_the_jump_waits_until_the_victims_stage_peer_answered() -> None:
    earlier = call("agent", answered=False)  # a call before this one that never answered: not waited for
    in_flight = [earlier, call("environment", False), call("restart_environment", False)]
    answered = [earlier, call("environment", False), call("restart_environment", True)]
    pauses, reads = pauses_over(in_flight, in_flight, answered)
    pauses._wait_others_answered("environment", calls_before=1, sent_with_it=["restart_environment"])
    assert reads[0] == 3, "it read the calls until the peer's was answered, not the frozen victim's"


def test_the_jump_does_not_wait_for_the_frozen_victim() -> None:
    pauses, reads = pauses_over([call("environment", False)])
    pauses._wait_others_answered("environment", calls_before=0, sent_with_it=[])
    assert reads[0] == 1


def test_the_jump_waits_for_a_stage_peer_whose_call_is_not_yet_sent() -> None:
    """The nightly's false alarm (P21 on `mixed`, under load): the peer's call was not yet in the journal when the
    wait first looked, so every call it saw was answered."""
    victim_only = [call("environment", False)]
    answered = [call("environment", False), call("restart_environment", True)]
    pauses, reads = pauses_over(victim_only, victim_only, answered)
    pauses._wait_others_answered("environment", calls_before=0, sent_with_it=["restart_environment"])
    assert reads[0] == 3, "it read the calls until the peer's was sent and answered"
