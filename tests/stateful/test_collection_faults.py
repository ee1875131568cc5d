"""Every planted fault of the look-alike collector (`fakes.collection.config.COLLECTION_FAULTS`) is caught by the
collection property it names: in the default run through fixed steps of the collection machine (which pass on the
fault-free collector), and in the nightly's `pytest -m search` by a derandomized random search of the machine
that stops at the first failure, measured and minimised as the trainer machine's are (`ckpt_model.search.faultsearch`
with the collection controller)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

from ckpt_model.collection.machine import CollectionMachine, collection_machine_for
from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import PropertyViolation
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties import collection as props
from ckpt_model.properties.continuation import P3Violation, P4Violation
from ckpt_model.properties.fencing import P10Violation
from ckpt_model.properties.telemetry import P26Violation
from ckpt_model.protocol import collection_files as files
from ckpt_model.search import profiles
from ckpt_model.search.checking import without_shrink
from ckpt_model.search.controllers import Collection
from ckpt_model.search.faultsearch import search
from fakes.collection.config import COLLECTION_FAULTS

pytestmark = pytest.mark.processes

NATIVE = DeploymentSpec("native")
Steps = Callable[[CollectionMachine], None]
MachineOf = Callable[[tuple[str, ...]], CollectionMachine]


def _request_twice_then_fail_a_save(machine: CollectionMachine) -> None:
    machine.start_run()
    machine.request_checkpoint()
    machine.request_checkpoint()
    machine.failing_save(victim=0, point=0, errno="ENOSPC", stop=False)


def _finish_then_rerun(machine: CollectionMachine) -> None:
    machine.start_run()
    for _ in range(20):  # each release lets one held call return; the run exits 0 after its last row
        if machine.run is None:
            break
        machine.release(pick=0)
    machine.start_run()
    machine.teardown()


# For each fault: the steps that show it, and a phrase of what its property then says the system showed.
STEPS: dict[str, tuple[Steps, str]] = {
    "resume_skips_in_flight": (
        lambda m: (m.start_run(), m.kill_run(), m.start_run()),
        "0 rows",
    ),
    "rerun_redoes_finished": (_finish_then_rerun, "2 rows"),
    "rerun_skips_restore": (
        lambda m: (m.start_run(), m.release(pick=0), m.preempt(), m.start_run()),
        r"calls \[4\]",
    ),
    "manifest_names_next_attempt": (
        lambda m: (m.start_run(), m.request_checkpoint()),
        "continued",
    ),
    "failed_save_publishes": (
        lambda m: (m.start_run(), m.failing_save(victim=0, point=0, errno="ENOSPC", stop=False)),
        "cannot read",
    ),
    "prunes_before_publish": (_request_twice_then_fail_a_save, "gone"),
    "exit_75_without_checkpoint": (
        lambda m: (m.start_run(), m.failing_save(victim=1, point=1, errno="EIO", stop=True)),
        "exit 75",
    ),
    "commit_in_its_own_trace": (
        lambda m: (m.start_run(), m.request_checkpoint(), m.teardown()),
        "2 traces",
    ),
    "second_sigterm_exits_at_once": (
        lambda m: (m.start_run(), m.second_sigterm(victim=0, point=0)),
        "exit 75",
    ),
}
VIOLATIONS: dict[str, type[PropertyViolation]] = {
    "P4": P4Violation,
    "P22": props.P22Violation,
    "P23": props.P23Violation,
    "P24": props.P24Violation,
    "P25": props.P25Violation,
    "P26": P26Violation,
}
SHRUNK_STEPS_MAX = 6


def test_every_collector_fault_has_fixed_steps() -> None:
    assert sorted(STEPS) == sorted(COLLECTION_FAULTS)
    assert {fault.caught_by for fault in COLLECTION_FAULTS.values()} == set(VIOLATIONS)


@pytest.fixture
def machine_of(harness_of: Callable[[DeploymentSpec], Harness]) -> Iterator[MachineOf]:
    """A machine on `native` with the collector's `faults` planted; its run is killed at the end."""
    machines: list[CollectionMachine] = []

    def machine(faults: tuple[str, ...]) -> CollectionMachine:
        machines.append(collection_machine_for(harness_of(NATIVE), faults)())
        return machines[-1]

    yield machine
    for each in machines:
        each.stop()


@pytest.mark.parametrize("fault", sorted(COLLECTION_FAULTS))
def test_the_steps_break_the_fault_s_property(machine_of: MachineOf, fault: str) -> None:
    steps, observed = STEPS[fault]
    violation = VIOLATIONS[COLLECTION_FAULTS[fault].caught_by]
    with pytest.raises(violation, match=observed) as caught:
        steps(machine_of((fault,)))
    assert type(caught.value) is violation  # not a subclass standing in for another property


@pytest.mark.parametrize("fault", sorted(COLLECTION_FAULTS))
def test_the_same_steps_pass_on_the_fault_free_collector(machine_of: MachineOf, fault: str) -> None:
    machine = machine_of(())
    STEPS[fault][0](machine)
    machine.teardown()
    assert sorted(dict(machine.model.finished_as)) == ["row-0", "row-1", "row-2"]


# Planted faults of the servers that the collector's own calls show (`ckpt_model.properties.collection_calls`,
# docs/collection.md): the steps, the property, and a phrase of what it says the servers did.
SERVER_FAULTS: dict[str, tuple[Steps, type[PropertyViolation], str]] = {
    "agent_stays_closed_after_commit": (
        lambda m: (m.start_run(), m.request_checkpoint()),
        P10Violation,
        "accepting False",
    ),
    "agent_restore_drops_outputs": (
        lambda m: (m.start_run(), m.release(pick=0), m.preempt(), m.start_run(), m.teardown()),
        P3Violation,
        "row-0-a1",
    ),
}


@pytest.fixture
def native_planted(harness_of: Callable[[DeploymentSpec], Harness]) -> Iterator[Callable[[str], CollectionMachine]]:
    """A machine on `native` whose servers start with a planted server fault; the harness, shared with the other
    tests, is replanted fault-free afterwards."""
    harness = harness_of(NATIVE)
    machines: list[CollectionMachine] = []

    def machine(fault: str) -> CollectionMachine:
        harness.replant((fault,))
        machines.append(collection_machine_for(harness)())
        return machines[-1]

    try:
        yield machine
    finally:
        for each in machines:
            each.stop()
        harness.replant(())


@pytest.mark.parametrize("fault", sorted(SERVER_FAULTS))
def test_a_server_fault_shows_on_the_collector_s_calls(
    native_planted: Callable[[str], CollectionMachine], fault: str
) -> None:
    steps, violation, observed = SERVER_FAULTS[fault]
    with pytest.raises(violation, match=observed) as caught:
        steps(native_planted(fault))
    assert type(caught.value) is violation


# `rerun_redoes_finished` needed 128 started, fewer valid (docs/collection.md): room to spare, since a found fault
# stops the search.
SEARCH_EXAMPLES = 200


@pytest.mark.search
@pytest.mark.parametrize("fault", sorted(COLLECTION_FAULTS))
def test_a_derandomized_search_finds_the_fault_by_its_property(
    harness_of: Callable[[DeploymentSpec], Harness], fault: str
) -> None:
    violation = VIOLATIONS[COLLECTION_FAULTS[fault].caught_by]
    chosen = without_shrink(settings(profiles.profile_for("default", ci=True), max_examples=SEARCH_EXAMPLES))
    harness = harness_of(NATIVE)
    harness.regressions_dir = harness.root / "regressions"  # expected failures: kept with the harness, not the user

    finding = search(harness, chosen, controller=Collection((fault,)))

    assert type(finding.violation) is violation, finding.failures
    assert finding.minimised is not None
    assert finding.minimised.reproduced
    assert 0 < finding.minimised.steps_after <= SHRUNK_STEPS_MAX, finding.minimised.code
    print(
        f"\n{fault}: {finding.headline} after {finding.examples} examples in {finding.search_s:.1f} s "
        f"({finding.minimised.steps_before} steps), minimised in {finding.minimised.seconds:.1f} s "
        f"({finding.minimised.replayed} replays): {'; '.join(finding.minimised.code)}"
    )


def test_a_sigterm_during_a_requested_checkpoint_makes_it_the_stop_s(machine_of: MachineOf) -> None:
    """The path the faults above do not take: SIGUSR1, then SIGTERM while that checkpoint's write stalls; the run
    publishes the requested checkpoint as the stop's and exits 75 (audited by P22-P24), and a rerun continues it."""
    machine = machine_of(())
    machine.start_run()
    machine.sigterm_during_request(victim=0, point=0)
    assert machine.run is None
    assert machine.audit.latest is not None
    assert files.checkpoint_dirs(machine.checkpoints) == ([machine.audit.latest.checkpoint_id], [])  # one, not two
    assert sorted(episode.rollout_id for episode in machine.audit.latest.continued) == ["row-0", "row-1", "row-2"]
    machine.teardown()
    assert dict(machine.model.finished_as) == {"row-0": 1, "row-1": 1, "row-2": 1}  # each continued as its next attempt


def test_a_continuation_of_a_continuation_starts_where_its_checkpoint_left_it(machine_of: MachineOf) -> None:
    """P4's prediction across two preemptions (found by the random search when it was wrong): row-0 delivers its
    first call, is preempted and continued as attempt 1 from call 1; preempted again before that call returns, its
    attempt 2 must start from call 1 too, not from call 0, and makes only the last call."""
    machine = machine_of(())
    machine.start_run()
    machine.release(pick=0)
    machine.preempt()
    machine.start_run()
    machine.preempt()
    machine.start_run()
    starts = dict(machine.model.starts)
    assert (starts["row-0-a1"], starts["row-0-a2"]) == (1, 1)
    assert (starts["row-1-a1"], starts["row-1-a2"]) == (0, 0)
    machine.teardown()
    assert dict(machine.model.finished_as) == {"row-0": 2, "row-1": 2, "row-2": 2}


def test_a_checkpoint_restored_twice_sends_its_attempts_again_under_the_same_keys(machine_of: MachineOf) -> None:
    """P4 counts each execution of a capture key apart (found by the random search when it did not): the rerun
    after a kill restores the same `LATEST` again, so each row goes as attempt 1 a second time, from call 0."""
    machine = machine_of(())
    machine.start_run()
    machine.sigterm_during_request(victim=0, point=0)
    machine.start_run()
    machine.kill_run()
    machine.start_run()
    assert dict(machine.model.made_before)["row-0-a1"] == 1  # the killed run's call, left out of this execution's
    machine.teardown()
    assert dict(machine.model.finished_as) == {"row-0": 1, "row-1": 1, "row-2": 1}
