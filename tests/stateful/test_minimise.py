"""The domain minimiser end to end: a longer failing run of a planted fault comes back as its known minimum.

`agent_retire_keeps_sessions` fails P7 with `dispatch; retire(pick=0, again=False)`. The run below holds those two
steps among others (a second rollout, a delivered call, a whole checkpoint, and a retire of the second rollout
by a pick that only selects it modulo the live rollouts), and fails with P7 as a search would report it.
"""

from __future__ import annotations

import json

from ckpt_model.properties.continuation import P14Violation
from ckpt_model.properties.state import P7Violation
from ckpt_model.results import regression
from ckpt_model.results.report import rule_calls_of
from ckpt_model.results.verdicts import shrunk_steps
from ckpt_model.search.faultsearch import harness_for
from ckpt_model.search.minimise import minimise_error, replay_once
from tests.stateful.conftest import DEEP

FAULT = "agent_retire_keeps_sessions"
LONGER = [
    ("dispatch", {}),
    ("release", {"pick": 0}),
    ("dispatch", {}),
    ("checkpoint", {"then_resume": True}),
    ("retire", {"pick": 3, "again": False}),
]
MINIMAL = (("dispatch", {}), ("retire", {"pick": 0, "again": False}))


def test_a_longer_failing_run_minimises_to_the_known_two_steps_everywhere_it_is_reported() -> None:
    with harness_for(FAULT) as harness:
        error = replay_once(harness, LONGER)
        assert isinstance(error, P7Violation), error
        assert rule_calls_of(error) == LONGER  # what the report attached: the run's own rule calls
        assert harness.regressions_dir is not None
        path = harness.regressions_dir / regression.file_name(f"P7-native-{FAULT}", LONGER)  # named by these steps
        assert len(regression.load(path)["steps"]) == len(LONGER)

        result = minimise_error(harness, error)

        assert result is not None
        assert result.steps == MINIMAL
        assert result.reproduced, result.final_outcome
        assert (result.steps_before, result.steps_after) == (5, 2)
        assert result.replayed > 0
        # The failure report and the regression file carry the minimal sequence; no candidate left a file.
        assert shrunk_steps(error) == ("state.dispatch()", "state.retire(pick=0, again=False)")
        document = json.loads(path.read_text())
        assert document["steps"] == [[name, arguments] for name, arguments in MINIMAL]
        assert document["failure"] == {"type": "P7Violation", "property": "P7"}
        assert document["minimised"]["steps_before"] == 5
        assert document["minimised"]["steps_found"] == [[name, arguments] for name, arguments in LONGER]
        # A definite failure: the run found and the minimal one each fail on all ten replays.
        assert document["minimised"]["found_reproduction"]["text"] == "P7 in 10 of 10 replays"
        assert document["reproduction"]["text"] == "P7 in 10 of 10 replays"
        # Beside it only its timeline picture, drawn from the minimal run (its two steps), not the run found.
        picture = path.with_suffix(".html")
        assert sorted(p.name for p in harness.regressions_dir.iterdir()) == sorted([path.name, picture.name])
        drawn = picture.read_text()
        assert "retire" in drawn
        assert "P7" in drawn
        assert "release" not in drawn  # the run found released a call; the minimal run does not
        # The rewritten file replays the same failure.
        assert isinstance(replay_once(harness, document["steps"]), P7Violation)


# P14 judges at the end, against the twin: a failure found by the second oracle minimises like any other. The
# minimiser end to end is the test above's (P7); the planted P14 faults' scenarios are caught in the default run; this
# combination of the two, about 25 s on loaded cores, runs in the nightly's deep step (`pytest -m deep`).
P14_FAULT = "agent_restore_drops_tool_results"
P14_LONGER = [
    ("dispatch", {}),
    ("dispatch", {}),
    ("release", {"pick": 0}),
    ("checkpoint", {"then_resume": False, "hold_one": False}),
    ("recover", {"pick": 0}),
]
# The restore goes too: an example that ends in a crash is recovered by the drain, as the controller would.
P14_MINIMAL = (
    ("dispatch", {}),
    ("release", {"pick": 0}),
    ("checkpoint", {"then_resume": False, "hold_one": False}),
    ("crash", {}),
)


@DEEP
def test_a_p14_failure_minimises_and_replays_as_p14() -> None:
    with harness_for(P14_FAULT) as harness:
        error = replay_once(harness, P14_LONGER)
        assert isinstance(error, P14Violation), error

        result = minimise_error(harness, error)

        assert result is not None
        assert result.steps == P14_MINIMAL
        assert result.reproduced, result.final_outcome
        assert isinstance(replay_once(harness, list(P14_MINIMAL)), P14Violation)
