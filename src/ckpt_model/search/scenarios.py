"""Fixed scenarios: known-important sequences, run as the state machine's own rules in a fixed order.

Each is a named list of rule calls (the same vocabulary Hypothesis draws from), so a scenario checks exactly
what a random run checks after every step and at the drain. Two things keep a scenario meaning what its name
says: every step's precondition must hold when it runs (a step the machine would never draw there is a harness
error, `StepNotEnabled`), and most scenarios pin Gym's own facts, the backend calls each attempt made (by script
position, so one fact serves every weather topology: native weather calls carry 2 and 4 messages, legacy 1 and 3;
the counter row makes a third call, so its facts are pinned apart, `Scenario.counter_calls`), and for the counter
the count each checkpoint's resources records hold.

A scenario must also reach the situation it is named for: a rule that can take another branch on a slow machine (a
prepare that missed its short deadline, so no lease lapsed and no time passed) records it (`MachineBase.missed`), and
the scenario then ends in a harness error naming why (`SituationNotReached`), never a pass or a fault "not shown";
the rules force the branch where they can (the checker's own clocks jump past a deadline instead of racing it).

Here is what a scenario is and how one runs (`run`), which is also how a regression file replays (`replay`). The
scenarios themselves: the protocol's, on every topology (`ckpt_model.search.protocol_scenarios`), and those of one
topology, option or fault family, with the scenario that must trip each planted fault's property
(`ckpt_model.search.deployment_scenarios`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import observe
from ckpt_model.errors import PropertyViolation, SituationNotReached
from ckpt_model.model.contract import ScriptCall
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.properties.state import record_key
from ckpt_model.protocol.gym_tasks import COUNTER_SCRIPT
from ckpt_model.protocol.storage import participant_dir, read_records
from ckpt_model.results import runstore
from ckpt_model.results.regression import Origin
from ckpt_model.search import controllers
from ckpt_model.steps.playback import play
from ckpt_model.trainer.machine import CheckpointMachine
from ckpt_model.trainer.quiescence import SETTLE_TIMEOUT_S

Step = tuple[str, dict[str, Any]]
# Per capture key, the script positions of the calls the backend saw for it, in order.
Facts = Mapping[str, tuple[int, ...]]
# Per checkpoint ID, per capture key, the count its resources record holds (the counter topology).
Counts = Mapping[str, Mapping[str, int]]


class ScenarioFactMismatch(AssertionError):
    """A scenario ran clean but the system did not show the facts Gym's own e2e test asserts for it."""


@attrs.frozen
class Scenario:
    steps: tuple[Step, ...]
    calls: Facts | None = None
    # The same steps' calls where the task runs the counter script, whose rows make three calls (None: as `calls`).
    counter_calls: Facts | None = None
    counts: Counts | None = None
    # Token capture: per capture key, the backend call indices its ledger chain holds at the end, in order.
    chains: Facts | None = None
    # Generation cuts: the backend call indices cut in each round, and per continued call the call it continues.
    cut_rounds: tuple[tuple[int, ...], ...] | None = None
    continued: Mapping[int, int] | None = None

    def facts(self, topology: str) -> Facts | None:
        """The calls pinned for `topology`'s task."""
        if TOPOLOGIES[topology].script == COUNTER_SCRIPT and self.counter_calls is not None:
            return self.counter_calls
        return self.calls


def steps(*calls: str | tuple[str, dict[str, Any]]) -> tuple[Step, ...]:
    return tuple((call, {}) if isinstance(call, str) else call for call in calls)


# Steps the scenarios share: the first of whatever a rule picks from, a checkpoint resumed at once, and a retire
# of the first rollout that it runs again.
FIRST = {"pick": 0}
CHECKPOINT = ("checkpoint", {"then_resume": True})
RETIRE_AGAIN = ("retire", {"pick": 0, "again": True})


def run(harness: Harness, scenario: Scenario | Sequence[Step], settle_timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Run the rules in order on a fresh machine, each only if enabled, then drain, check the end and the facts."""
    if not isinstance(scenario, Scenario):
        scenario = Scenario(tuple(scenario))
    machine = CheckpointMachine(harness, settle_timeout_s=settle_timeout_s)
    try:
        play(machine, scenario.steps)
    except PropertyViolation:
        raise
    except Exception as error:  # what a missed situation led to is not what the scenario checks
        check_reached(scenario.steps, machine.missed, error)
        raise
    check_reached(scenario.steps, machine.missed)
    facts = scenario.facts(harness.spec.topology)
    if facts is not None:
        check_calls(facts, machine.model.script, observe(harness).calls)
    if scenario.counts is not None:
        check_counts(scenario.counts, harness)
    if scenario.chains is not None or scenario.cut_rounds is not None or scenario.continued is not None:
        check_lineage(scenario, harness)


def check_reached(steps: Sequence[Step], missed: Sequence[str], cause: BaseException | None = None) -> None:
    """Raise `SituationNotReached` (from `cause`, what the run raised after) if any step took the branch that skips
    its situation (`missed`, in the words of the rule that took it)."""
    if missed:
        raise SituationNotReached(scenario=", ".join(rule for rule, _ in steps), missed=missed) from cause


def check_calls(facts: Facts, script: tuple[ScriptCall, ...], observed: Mapping[str, tuple[ScriptCall, ...]]) -> None:
    """The backend saw exactly the pinned calls per capture key (by script position), and no other key."""
    expected = {key: tuple(script[i] for i in positions) for key, positions in facts.items() if positions}
    if dict(observed) != expected:
        raise ScenarioFactMismatch(f"backend calls per attempt: expected {expected}, observed {dict(observed)}")


def check_counts(counts: Counts, harness: Harness) -> None:
    """Each checkpoint's resources records hold exactly the pinned counts (read with the checker's own reader)."""
    for checkpoint_id, expected in counts.items():
        directory = participant_dir(harness.checkpoint_dir / checkpoint_id, "resources", "resources")
        records = read_records(directory, "resources", "resources", checkpoint_id=checkpoint_id)
        observed = {record_key(record): record["state"]["count"] for record in records}
        if observed != dict(expected):
            raise ScenarioFactMismatch(
                f"counts in {checkpoint_id}'s resources records: expected {dict(expected)}, observed {observed}"
            )


def check_lineage(scenario: Scenario, harness: Harness) -> None:
    """Gym's ledger and cut facts, by backend call index: each pinned ledger's chain (read with the checker's
    own ledger client), the backend's cut rounds, and which calls continued which."""
    assert harness.backend is not None
    ids: dict[int, str] = {
        call["index"]: str((call.get("admission") or {}).get("model_call_id")) for call in harness.backend.calls()
    }
    for key, indices in (scenario.chains or {}).items():
        manifest = harness.ledger.manifest(key)
        observed = getattr(manifest, "model_call_ids", manifest)
        if observed != tuple(ids.get(i) for i in indices):
            raise ScenarioFactMismatch(
                f"ledger of {key}: expected calls {indices} ({[ids.get(i) for i in indices]}), observed {observed}"
            )
    if scenario.cut_rounds is not None:
        rounds = [sorted(r) for r in harness.backend.cuts()]
        expected = [sorted(ids.get(i, "") for i in r) for r in scenario.cut_rounds]
        if rounds != expected:
            raise ScenarioFactMismatch(
                f"cut rounds: expected {expected} (calls {scenario.cut_rounds}), observed {rounds}"
            )
    if scenario.continued is not None:
        continued = {
            call["index"]: call.get("continued_from") for call in harness.backend.calls() if call.get("continued_from")
        }
        expected_continued = {index: ids.get(source) for index, source in scenario.continued.items()}
        if continued != expected_continued:
            raise ScenarioFactMismatch(f"continued calls: expected {expected_continued}, observed {continued}")


def replay(document: Mapping[str, Any], *, artifacts: Path | None = None, run_store: Path | None = None) -> None:
    """Run a regression file's steps on a fresh embedded deployment of the file's (`DeploymentSpec.from_document`),
    with the machine of the controller it names (`Origin.from_document`: the trainer's if it names none); raises what
    the run raises (`ckpt_model.results.regression.load` reads the file). With `artifacts` (`--keep-artifacts`) the
    failure's regression file, history, checkpoints and logs stay there; with `run_store` (`ckpt-model replay`) the
    failure is kept in a run directory there (`ckpt_model.results.runstore`), which the report's paths name."""
    controller = controllers.for_origin(Origin.from_document(document))
    with Harness.embedded(DeploymentSpec.from_document(document), artifacts=artifacts) as harness:
        if artifacts is None:  # a replay does not overwrite the file it replays
            harness.regressions_dir = harness.root / "regressions"
        if run_store is not None:
            runstore.begin(harness, run_store)
        controllers.replay(controller, harness, [(name, arguments) for name, arguments in document["steps"]])
