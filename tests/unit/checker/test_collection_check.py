"""`ckpt-model check --controller collection`'s report and replay command, on hand-built findings (the search is
replaced; no processes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings

from ckpt_model.deployments.catalogue import collection_fault_catalogue
from ckpt_model.properties.collection import P23Violation
from ckpt_model.results.verdicts import Exit
from ckpt_model.search import collection_check
from ckpt_model.search.collection_check import replay_command
from ckpt_model.search.collection_search import CollectionFinding
from ckpt_model.search.minimise import Minimised


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


class NoHarness:
    """Stands in for the embedded stack: the search below is replaced, so nothing runs on it."""

    def close(self) -> None:
        pass


def run_with(monkeypatch: pytest.MonkeyPatch, finding: CollectionFinding) -> int:
    monkeypatch.setattr(collection_check.Harness, "embedded", staticmethod(lambda _spec: NoHarness()))
    monkeypatch.setattr(collection_check, "search", lambda *_args: finding)
    faults = [fault for fault in collection_fault_catalogue() if fault.name == "exit_75_without_checkpoint"]
    chosen = settings(max_examples=9, stateful_step_count=4)
    return collection_check.run("native", faults, chosen, 7)


def test_a_violation_is_reported_with_its_minimal_steps_before_the_verdict_and_the_replay(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    violation = P23Violation(
        rollout=None, expected="exit 75 only after a checkpoint", observed="exit 75, LATEST absent"
    )
    steps: Any = (("start_run", {}), ("kill_run", {}), ("start_run", {}), ("failing_save", {"stop": True}))
    minimal = Minimised(
        original=steps, steps=(steps[0], steps[3]), replayed=5, cached=2, pass_removed=0, expanded=(), reproduced=True
    )
    finding = CollectionFinding(violation, violation, steps, minimal, examples=3, search_s=12.5, minimise_s=4.25)

    code = run_with(monkeypatch, finding)

    out = capsys.readouterr().out
    assert code == Exit.VIOLATION
    assert "collector faults: exit_75_without_checkpoint" in out
    assert "examples: 9, steps at most 4; seed 7" in out
    assert "=== property violation 1 of 1: P23 ===" in out
    assert "observed: exit 75, LATEST absent" in out
    tail = out[out.index("found after") :]
    assert tail == (
        "found after 3 examples in 12.5 s as 4 steps; minimised to 2 in 4.2 s (5 candidates replayed):\n"
        "  state.start_run()\n"
        "  state.failing_save(stop=True)\n"
        "FAILED: property violation (P23)\n"
        "replay: ckpt-model check --controller collection --topology native --examples 9 --steps 4 "
        "--faults exit_75_without_checkpoint --seed 7\n"
    )


def test_a_pass_says_how_many_examples_ran(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_with(monkeypatch, CollectionFinding(None, examples=11, search_s=30.0))

    assert code == Exit.PASSED
    assert "PASSED: 11 examples in 30.0 s, no collection property violated (P22 LATEST" in capsys.readouterr().out
