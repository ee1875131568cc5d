"""Reading the shrunk steps off a failure, whatever header the Hypothesis version prints."""

from __future__ import annotations

import pytest

from ckpt_model.faultsearch import shrunk_steps


@pytest.mark.parametrize("header", ["Falsifying example:", "Failing test case: <state machine>"])
def test_shrunk_steps_are_the_rule_calls_after_the_machine(header: str) -> None:
    error = AssertionError("P9")
    error.add_note("Steps (model names):\n  1. prepare() -> c1")
    for line in [header, "state = CheckpointMachine()", "state.prepare()", "state.commit()", "state.teardown()"]:
        error.add_note(line)
    assert shrunk_steps(error) == ("state.prepare()", "state.commit()")


def test_no_example_means_no_steps() -> None:
    assert shrunk_steps(AssertionError("no notes")) == ()
