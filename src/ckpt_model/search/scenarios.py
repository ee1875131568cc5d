"""Fixed scenarios: known-important sequences, run as the state machine's own rules in a fixed order.

Each is a named list of rule calls (the same vocabulary Hypothesis draws from), so a scenario checks exactly
what a random run checks after every step and at the drain. Two things keep a scenario meaning what its name
says: every step's precondition must hold when it runs (a step the machine would never draw there is a harness
error, `StepNotEnabled`), and most scenarios pin Gym's own facts, the backend calls each attempt made (by script
position, so one fact serves every weather topology: native weather calls carry 2 and 4 messages, legacy 1 and 3;
the counter row makes a third call, so its facts are pinned apart, `COUNTER_CALLS`), and for the counter the count
each checkpoint's resources records hold. Each planted fault has a scenario that must trip the property the
catalogue names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import observe
from ckpt_model.errors import StepNotEnabled
from ckpt_model.model.contract import ScriptCall
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.properties.state import record_key
from ckpt_model.protocol.gym_tasks import COUNTER_SCRIPT
from ckpt_model.protocol.storage import participant_dir, read_records
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


FIRST = {"pick": 0}
CHECKPOINT = ("checkpoint", {"then_resume": True})
RETIRE_AGAIN = ("retire", {"pick": 0, "again": True})

# r0 delivered its first call, was checkpointed in c1 before its second, and Gym crashed and restored c1.
RESTORED_AT_CALL_1 = steps("dispatch", ("release", FIRST), "prepare", "commit", "crash", ("restore", FIRST))

SCENARIOS: dict[str, Scenario] = {
    # Gym's scenario 1: the continuation makes only the call still needed (weather [2, 4, 4]).
    "crash_after_prepare__continues_from_boundary": Scenario(
        RESTORED_AT_CALL_1 + steps(("start_replacement", FIRST)), calls={"r0": (0, 1), "r0-a1": (1,)}
    ),
    # Checkpointed at its first call, nothing delivered: the continuation starts at the first call again.
    "checkpoint_at_first_call__restored_from_the_start": Scenario(
        steps("dispatch", "prepare", "commit", "crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
    ),
    # Gym's scenario 8: park then release; exactly two calls, the second delivered only after the resume.
    "checkpoint_without_crash__parks_then_resumes": Scenario(
        steps("dispatch", "prepare", ("release", FIRST), "commit", "resume"), calls={"r0": (0, 1)}
    ),
    # Gym's scenario 2: a second checkpoint carries the restored-pending episode through a second crash.
    "second_crash_before_replacement__still_continues": Scenario(
        RESTORED_AT_CALL_1
        + steps("prepare", "commit", "crash", ("restore", {"pick": 1}), ("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a2": (1,)},
    ),
    # Gym's scenario 3 (without token capture): the same checkpoint restored again after its replacement made
    # a call; each replacement continues from the checkpoint's boundary.
    "same_checkpoint_restored_again__continues_from_its_boundary": Scenario(
        RESTORED_AT_CALL_1
        + steps(
            ("start_replacement", FIRST), ("release", FIRST), "crash", ("restore", FIRST), ("start_replacement", FIRST)
        ),
        calls={"r0": (0, 1), "r0-a1": (1, 1)},
    ),
    # Gym's scenario 14: retire stops everywhere, a late /run is refused until forget.
    "retired_episode__stops_everywhere": Scenario(
        steps("dispatch", ("release", FIRST), ("retire", {"pick": 0, "again": False}), ("late_run", FIRST), "forget"),
        calls={"r0": (0, 1)},
    ),
    # A server restarted alone forgets its marks; a late /run still meets one: the environment's (the first
    # stop) or, once the environment itself restarted, the resources server's, whose seed comes first.
    "restarted_alone__late_run_still_refused": Scenario(
        steps(
            "dispatch",
            ("release", FIRST),
            ("retire", {"pick": 0, "again": False}),
            ("crash_participant", {"pick": 1}),
            ("late_run", FIRST),
            "forget",
        ),
        calls={"r0": (0, 1)},
    ),
    # The others keep their resumed IDs while one restarts alone, and new work runs through the restarted one.
    "restarted_alone__others_keep_their_fences": Scenario(
        steps(
            "dispatch",
            CHECKPOINT,
            ("release", FIRST),
            ("release", FIRST),
            ("crash_participant", FIRST),
            ("late_call", {"pick": 0}),
            "dispatch",
            ("release", FIRST),
            ("release", FIRST),
        ),
        calls={"r0": (0, 1), "r1": (0, 1)},
    ),
    # Work in flight when one server crashes alone (the policy model; legacy: resources) is retired everywhere,
    # what failed by itself included; new work then runs clean.
    "restarted_alone__running_work_is_retired_everywhere": Scenario(
        steps(
            "dispatch",
            "dispatch",
            ("release", FIRST),
            ("crash_participant", {"pick": 2}),
            ("late_run", FIRST),
            "dispatch",
            ("release", FIRST),
            ("release", FIRST),
        ),
        calls={"r0": (0, 1), "r1": (0,), "r2": (0, 1)},
    ),
    "retired_then_started_over__completes": Scenario(
        steps("dispatch", ("retire", {"pick": 0, "again": True})), calls={"r0": (0,), "r0-a1": (0, 1)}
    ),
    # The false alarm of issue 7: a continuation that died in a crash is retired, then the same checkpoint is
    # restored again, which reuses its attempt number. Marks outlive a restore (reference section 10), so the
    # controller forgets the rollout first; the replacement then runs.
    "retired_continuation__forgotten_before_its_checkpoint_is_restored_again": Scenario(
        RESTORED_AT_CALL_1
        + steps(
            ("start_replacement", FIRST),
            "crash",
            ("retire", {"pick": 0, "again": False}),
            ("restore", FIRST),
            ("start_replacement", FIRST),
        ),
        calls={"r0": (0, 1), "r0-a1": (1, 1)},
    ),
    # A false alarm the nightly found: c2's snapshot holds r0-a1 as replied (and r1 in flight); restoring c1 again
    # re-sends r0-a1,
    # a crash cuts that /run off, and restoring c2 must judge r0-a1 by the /run that replied, not the later one.
    "replied_continuation__judged_by_its_own_run_after_a_later_restore": Scenario(
        RESTORED_AT_CALL_1
        + steps(
            ("start_replacement", FIRST),
            ("release", FIRST),
            "dispatch",
            CHECKPOINT,
            "crash",
            ("restore", FIRST),
            ("start_replacement", FIRST),
            "crash",
            ("restore", {"pick": 1}),
        ),
        calls={"r0": (0, 1), "r0-a1": (1, 1), "r1": (0,), "r1-a1": (0, 1)},
    ),
    # P8: each participant in turn finds its records file damaged (victims 0-3, a crash between, since a refused
    # restore leaves processes that served it), then each one holding a record (two in native: the environment and
    # the agent) finds its record rejected; then the checkpoint itself restores and continues from call 1.
    "failed_restore__refused_by_one_leaves_nothing": Scenario(
        steps("dispatch", ("release", FIRST), ("checkpoint", {"then_resume": False}), "crash")
        + tuple(
            step
            for rejected_record, victims in ((False, 4), (True, 2))
            for victim in range(victims)
            for step in steps(
                ("failed_restore", {"pick": 0, "victim": victim, "rejected_record": rejected_record}), "crash"
            )
        )
        + steps(("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
    ),
    # P8: the first two participants by name in turn die during their own restore while the others restore (a
    # crash between, since the processes served a restore); then the checkpoint itself restores and continues.
    "dies_in_restore__the_others_restored_and_nothing_stays": Scenario(
        steps("dispatch", ("release", FIRST), ("checkpoint", {"then_resume": False}), "crash")
        + steps(("dies_in_restore", {"pick": 0, "victim": 0}), "crash", ("dies_in_restore", {"pick": 0, "victim": 1}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
    ),
    # A power cut after a checkpoint, which then restores and continues; and one right after a second checkpoint
    # (not resumed: the cut ends it, as a crash does, so the rollout started over replies outside it, P2). Every
    # commit was durable, so both checkpoints still verify unchanged (P9).
    "power_loss__committed_checkpoints_survive": Scenario(
        steps(
            "dispatch", CHECKPOINT, ("release", FIRST), "power_loss", ("restore", FIRST), ("start_replacement", FIRST)
        )
        + steps(("release", FIRST), ("checkpoint", {"then_resume": False}), "power_loss", ("start_over", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (0, 1), "r0-a2": (0, 1)},
    ),
    # The attempt a refused restore would have continued is burned: the rollout starts over as the one after it.
    "failed_restore__rollouts_start_over": Scenario(
        steps(
            "dispatch",
            ("release", FIRST),
            ("checkpoint", {"then_resume": False}),
            "crash",
            ("failed_restore", {"pick": 0, "victim": 0, "rejected_record": False}),
            ("start_over", FIRST),
        ),
        calls={"r0": (0, 1), "r0-a2": (0, 1)},
    ),
    # A crash inside a commit that reached two of the four participants (agent and environment, by name): the
    # controller never publishes it; restoring it anyway is refused by the policy model and the resources server,
    # which have no share, and leaves nothing; the rollout starts over as the attempt after the burned one.
    "crash_in_commit__incomplete_checkpoint_is_refused": Scenario(
        steps(
            "dispatch",
            ("release", FIRST),
            "prepare",
            ("crash_in_commit", {"committed": 2, "inside": False}),
            ("restore_incomplete", FIRST),
            ("start_over", FIRST),
        ),
        calls={"r0": (0, 1), "r0-a2": (0, 1)},
    ),
    # A crash while the second participant by name (the environment in native) stands between its records file
    # and its manifest: its share is not published, so restoring the checkpoint is refused by all but the first.
    "crash_in_commit__between_a_participants_files_is_no_share": Scenario(
        steps(
            "dispatch",
            ("release", FIRST),
            "prepare",
            ("crash_in_commit", {"committed": 1, "inside": True}),
            ("restore_incomplete", FIRST),
            ("start_over", FIRST),
        ),
        calls={"r0": (0, 1), "r0-a2": (0, 1)},
    ),
    # Crashes inside a forget (two stages reached), a restore (two participants) and a retire of the lost attempt
    # (one stage): nothing of them outlives the crash, and the checkpoint then restores and continues from call 1.
    "crash_in_operation__nothing_of_it_outlives_the_crash": Scenario(
        steps(
            "dispatch",
            ("retire", {"pick": 0, "again": False}),
            ("crash_in_operation", {"pick": 0, "reached": 2}),
            "dispatch",
            ("release", FIRST),
            ("checkpoint", {"then_resume": False}),
            "crash",
            ("crash_in_operation", {"pick": 0, "reached": 2}),
            ("crash_in_operation", {"pick": 1, "reached": 1}),
            ("restore", FIRST),
            ("start_replacement", FIRST),
        ),
        calls={"r0": (0,), "r1": (0, 1), "r1-a1": (1,)},
    ),
    # A crash inside a commit that reached no participant leaves the earlier checkpoint to restore, untouched.
    "crash_in_commit__earlier_checkpoint_still_restores": Scenario(
        steps(
            "dispatch",
            CHECKPOINT,
            ("release", FIRST),
            "prepare",
            ("crash_in_commit", {"committed": 0, "inside": False}),
            ("restore_incomplete", FIRST),
            "crash",
            ("restore", FIRST),
            ("start_replacement", FIRST),
        ),
        calls={"r0": (0, 1), "r0-a1": (0, 1)},
    ),
    "resumed_id__is_refused": Scenario(steps("dispatch", "prepare", "resume"), calls={"r0": (0, 1)}),
    # Every operation of an older controller naming the older resumed ID (pick 0) after each later resume.
    "late_calls_of_an_older_controller__are_refused": Scenario(
        steps("dispatch") + steps("prepare", "resume", ("late_call", {"pick": 0})) * 2, calls={"r0": (0, 1)}
    ),
    "run_while_open__is_refused": Scenario(
        steps(
            "dispatch", "prepare", "run_while_open", "commit", "resume", "prepare", "commit", "run_while_open", "resume"
        ),
        calls={"r0": (0, 1)},
    ),
    "retried_calls__return_their_first_result": Scenario(
        steps(
            "dispatch",
            "prepare",
            "retry",
            "commit",
            "retry",
            "resume",
            "retry",
            ("retire", {"pick": 0, "again": True}),
            "retry",
            "forget",
            "retry",
        ),
        calls={"r0": (0,), "r0-a1": (0, 1)},
    ),
    "commit_retried_after_a_crash__is_refused": Scenario(
        steps("dispatch", "prepare", "commit", "crash", "retry", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
    ),
    "quiet_controller__lease_lapses_and_admission_reopens": Scenario(
        steps("dispatch", "quiet_controller", ("late_call", {"pick": 0})), calls={"r0": (0, 1)}
    ),
    "earlier_checkpoint__restored_after_later_work": Scenario(
        steps(
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
        calls={"r0": (0, 1), "r1": (0,), "r0-a1": (0, 1)},
    ),
}

# The same scenarios' calls on the counter topology: a counter row makes three calls (1, 3 and 5 messages), so an
# attempt that finishes makes one more than a weather episode, and one released twice is still running.
COUNTER_CALLS: dict[str, Facts] = {
    "crash_after_prepare__continues_from_boundary": {"r0": (0, 1), "r0-a1": (1, 2)},
    "checkpoint_at_first_call__restored_from_the_start": {"r0": (0,), "r0-a1": (0, 1, 2)},
    "checkpoint_without_crash__parks_then_resumes": {"r0": (0, 1, 2)},
    "second_crash_before_replacement__still_continues": {"r0": (0, 1), "r0-a2": (1, 2)},
    "same_checkpoint_restored_again__continues_from_its_boundary": {"r0": (0, 1), "r0-a1": (1, 2, 1, 2)},
    "retired_episode__stops_everywhere": {"r0": (0, 1)},
    "restarted_alone__late_run_still_refused": {"r0": (0, 1)},
    "restarted_alone__others_keep_their_fences": {"r0": (0, 1, 2), "r1": (0, 1, 2)},
    "restarted_alone__running_work_is_retired_everywhere": {"r0": (0, 1), "r1": (0,), "r2": (0, 1, 2)},
    "retired_then_started_over__completes": {"r0": (0,), "r0-a1": (0, 1, 2)},
    "retired_continuation__forgotten_before_its_checkpoint_is_restored_again": {"r0": (0, 1), "r0-a1": (1, 1, 2)},
    "replied_continuation__judged_by_its_own_run_after_a_later_restore": {
        "r0": (0, 1),
        "r0-a1": (1, 2, 1),
        "r0-a2": (2,),
        "r1": (0,),
        "r1-a1": (0, 1, 2),
    },
    "resumed_id__is_refused": {"r0": (0, 1, 2)},
    "late_calls_of_an_older_controller__are_refused": {"r0": (0, 1, 2)},
    "run_while_open__is_refused": {"r0": (0, 1, 2)},
    "retried_calls__return_their_first_result": {"r0": (0,), "r0-a1": (0, 1, 2)},
    "commit_retried_after_a_crash__is_refused": {"r0": (0,), "r0-a1": (0, 1, 2)},
    "quiet_controller__lease_lapses_and_admission_reopens": {"r0": (0, 1, 2)},
    "earlier_checkpoint__restored_after_later_work": {"r0": (0, 1), "r1": (0,), "r0-a1": (0, 1, 2)},
    "failed_restore__refused_by_one_leaves_nothing": {"r0": (0, 1), "r0-a1": (1, 2)},
    "failed_restore__rollouts_start_over": {"r0": (0, 1), "r0-a2": (0, 1, 2)},
    "dies_in_restore__the_others_restored_and_nothing_stays": {"r0": (0, 1), "r0-a1": (1, 2)},
    "power_loss__committed_checkpoints_survive": {"r0": (0, 1), "r0-a1": (0, 1), "r0-a2": (0, 1, 2)},
    "crash_in_commit__incomplete_checkpoint_is_refused": {"r0": (0, 1), "r0-a2": (0, 1, 2)},
    "crash_in_commit__between_a_participants_files_is_no_share": {"r0": (0, 1), "r0-a2": (0, 1, 2)},
    "crash_in_operation__nothing_of_it_outlives_the_crash": {"r0": (0,), "r1": (0, 1), "r1-a1": (1, 2)},
    "crash_in_commit__earlier_checkpoint_still_restores": {"r0": (0, 1), "r0-a1": (0, 1, 2)},
}
SCENARIOS = {name: attrs.evolve(scenario, counter_calls=COUNTER_CALLS[name]) for name, scenario in SCENARIOS.items()}

# Storage that fails or stalls under a commit (`storage_fault`, `stalled_write`, P16), on the second participant in
# name order (the environment on the native topology, the policy model with its ledgers on the counter's): a full
# disk while it writes its manifest, retried in the same process;
# a failing disk after its records took their digest name, given up; a write that stalls past the commit's
# deadline, then retried once it finished; and one a resume stopped, which must never publish.
ON_THE_SECOND = {"victim": 1}
STORAGE_SCENARIOS: dict[str, Scenario] = {
    "failed_write__retried_in_the_same_process_stores_the_first_export": Scenario(
        steps("dispatch", ("release", FIRST), "prepare")
        + steps(("storage_fault", {**ON_THE_SECOND, "point": 2, "errno": "ENOSPC", "then_retry": True}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
        counter_calls={"r0": (0, 1), "r0-a1": (1, 2)},
    ),
    "failed_write__given_up_is_an_incomplete_checkpoint": Scenario(
        steps("dispatch", "prepare")
        + steps(("storage_fault", {**ON_THE_SECOND, "point": 3, "errno": "EIO", "then_retry": False}))
        + steps("crash", ("restore_incomplete", FIRST)),
    ),
    "stalled_write__retried_once_it_finished": Scenario(
        steps("dispatch", "prepare")
        + steps(("stalled_write", {**ON_THE_SECOND, "point": 1, "then_retry": True}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
        counter_calls={"r0": (0,), "r0-a1": (0, 1, 2)},
    ),
    "stalled_write__stopped_by_a_resume_never_publishes": Scenario(
        steps("dispatch", "prepare")
        + steps(("stalled_write", {**ON_THE_SECOND, "point": 2, "then_retry": False}))
        + steps(("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
}

# Nemeses that kill nothing (P16, P17): a participant frozen across its commit's deadline, and replies lost after
# the call ran. Each ends as a plain checkpoint would, so a crash and a restore afterwards continue the rollout.
# `lost_reply`'s `operation` picks among the calls allowed then: a prepare (index 0) while none is open; a commit
# (0) or a resume (1) once prepared.
NEMESIS_SCENARIOS: dict[str, Scenario] = {
    "paused_commit__refused_on_waking_then_retried": Scenario(
        steps("dispatch", "prepare")
        + steps(("paused_commit", {**ON_THE_SECOND, "then_retry": True}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
        counter_calls={"r0": (0,), "r0-a1": (0, 1, 2)},
    ),
    "lost_prepare_reply__retried_then_committed": Scenario(
        steps("dispatch")
        + steps(("lost_reply", {**ON_THE_SECOND, "operation": 0, "then_retry": True}))
        + steps("commit", "crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
        counter_calls={"r0": (0,), "r0-a1": (0, 1, 2)},
    ),
    "lost_commit_reply__retried_then_restored": Scenario(
        steps("dispatch", "prepare")
        + steps(("lost_reply", {**ON_THE_SECOND, "operation": 0, "then_retry": True}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
        counter_calls={"r0": (0,), "r0-a1": (0, 1, 2)},
    ),
    # A close that fails after closing on the agent (victims count the members in name order: agent, environment,
    # policy model, resources), then a new prepare; an export hook that raises on the agent, then the commit
    # retried; each
    # participant's install hook failing in turn (a crash between: a refused restore leaves processes that served
    # it), then the checkpoint itself restores.
    "failing_close__reopens_then_prepares_again": Scenario(
        steps("dispatch", ("failing_close", {"victim": 0, "then_retry": True}))
        + steps("commit", "crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
        counter_calls={"r0": (0,), "r0-a1": (0, 1, 2)},
    ),
    "failing_export__retried_exports_afresh": Scenario(
        steps("dispatch", "prepare", ("failing_export", {"victim": 0, "then_retry": True}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r0-a1": (0, 1)},
        counter_calls={"r0": (0,), "r0-a1": (0, 1, 2)},
    ),
    "failing_install__refused_by_one_leaves_nothing": Scenario(
        steps("dispatch", ("release", FIRST), ("checkpoint", {"then_resume": False}), "crash")
        + tuple(
            step for victim in range(4) for step in steps(("failing_install", {"pick": 0, "victim": victim}), "crash")
        )
        + steps(("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
        counter_calls={"r0": (0, 1), "r0-a1": (1, 2)},
    ),
    # A clock ahead (the resources server's) lapses first and refuses the controller's commit; a clock behind (the
    # agent's) outholds the others, whose refusals fail a stale controller's commit. Both need libfaketime.
    "skewed_clock__ahead_lapses_first_and_refuses_the_commit": Scenario(
        steps("dispatch", ("skewed_clock", {"victim": 3, "behind": False}))
        + steps(("release", FIRST), ("release", FIRST), "crash", ("restore_incomplete", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2), "r0-a2": (0, 1, 2)},
    ),
    # After a delivered call (with token capture, the policy model writes that attempt's ledger rows in its share
    # of the commit the agent refuses): the watchers learn the share of a commit that failed elsewhere.
    "skewed_clock__ahead_after_a_delivered_call": Scenario(
        steps("dispatch", ("release", FIRST), ("skewed_clock", {"victim": 0, "behind": False}), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
    "skewed_clock__behind_outholds_a_stale_controller": Scenario(
        steps("dispatch", ("skewed_clock", {"victim": 0, "behind": True}))
        + steps(("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
    # The agent cut off from the controller: a prepare that reached the environment and the policy model and never
    # the agent or the resources server, given up by a resume that must fence the ID on all four; a commit that
    # reached all but the environment, retried once it is back; a resume that left the policy model prepared.
    # The agent frozen while a prepare reaches it, until the prepare's deadline passed: it refuses on waking and
    # stays open; the controller resumes, then prepares anew (and commits) or not. The agent frozen past its lease:
    # it lapses on waking, and the controller's commit, which the others take, is refused by it.
    "paused_prepare__prepared_anew_then_committed": Scenario(
        steps("dispatch", ("paused_prepare", {"victim": 0, "then_retry": True}), "commit", ("release", FIRST)),
    ),
    "paused_prepare__given_up_fences_the_id": Scenario(
        steps("dispatch", ("paused_prepare", {"victim": 0, "then_retry": False}))
        + steps(("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
    "paused_lease__lapses_on_waking_and_refuses_the_commit": Scenario(
        steps("dispatch", ("release", FIRST), ("paused_lease", {"victim": 0}), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
    "unreachable_prepare__resume_fences_it_everywhere": Scenario(
        steps("dispatch", ("unreachable", {"victim": 0, "operation": 0, "then_retry": False}))
        + steps(("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
    "unreachable_commit__retried_then_restored": Scenario(
        steps("dispatch", ("release", FIRST), "prepare")
        + steps(("unreachable", {**ON_THE_SECOND, "operation": 0, "then_retry": True}))
        + steps("crash", ("restore", FIRST), ("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
        counter_calls={"r0": (0, 1), "r0-a1": (1, 2)},
    ),
    "unreachable_resume__retried_reopens_it": Scenario(
        steps("dispatch", "prepare", ("unreachable", {"victim": 2, "operation": 1, "then_retry": True}))
        + steps(("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
    "lost_resume_reply__took_effect": Scenario(
        steps("dispatch", "prepare")
        + steps(("lost_reply", {"victim": 2, "operation": 1, "then_retry": False}))
        + steps(("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1)},
        counter_calls={"r0": (0, 1, 2)},
    ),
}

# Gym's scenario 5 (counter): the counter, seeded at 3, is checkpointed at 4 after its first increment; only a
# restored counter lets the continuation's second increment reach the expected 6 (reward 1.0, P3). Its negative
# control is the planted fault `resources_restore_skipped` (P6).
COUNTER_SCENARIOS: dict[str, Scenario] = {
    "resources_state__restored_with_the_episode": Scenario(
        RESTORED_AT_CALL_1 + steps(("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1, 2)},
        counts={"c1": {"r0": 4}},
    ),
}

# Token capture on the counter topology (Gym's scenarios 3 and 6, and 14's ledger): the facts are each ledger's
# chain at the end, as backend call indices (the machine's P5 checks every step on top). Call 0 is r0's first,
# delivered before c1; call 1 its second, in flight at c1 and lost in the crash.
CAPTURE_SCENARIOS: dict[str, Scenario] = {
    # Gym's 6: the first call after the restore (2) links to call 0; call 1 is in no chain.
    "token_lineage__continues_across_a_crash": Scenario(
        RESTORED_AT_CALL_1 + steps(("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1, 2)},
        chains={"r0-a1": (0, 2, 3)},
    ),
    # The same, with the example ending at the crash: the drain recovers as the controller does (it restores c1,
    # the latest checkpoint), so the continuation's lineage is checked, not a start over's.
    "token_lineage__the_drain_recovers_after_a_crash": Scenario(
        steps("dispatch", ("release", FIRST), "prepare", "commit", "crash"),
        calls={"r0": (0, 1), "r0-a1": (1, 2)},
        chains={"r0-a1": (0, 2, 3)},
    ),
    # A restore of c3 installed r0-a2's ledger; Gym crashed and the controller restored the earlier c1 (r0-a1
    # again), then retired r0-a1 and started r0 over as r0-a2: the key comes round again, and the rows the
    # abandoned restore left under it are deleted first, so the fresh run's chain is its own (P14; a false alarm
    # of the fault-free stack before the trainer deleted such a ledger, 2026-12-02).
    "token_lineage__a_key_a_rolled_back_restore_left_starts_afresh": Scenario(
        RESTORED_AT_CALL_1
        + steps("prepare", "commit", "crash", ("restore", {"pick": 1}), "crash", ("restore", FIRST))
        + steps(("retire", {"pick": 0, "again": True})),
        calls={"r0": (0, 1), "r0-a2": (0, 1, 2)},
        chains={"r0-a2": (2, 3, 4)},
    ),
    # Gym's 3: the replacement made calls (2 returned, 3 in flight), Gym crashed, and c1 was restored again: the
    # dead run's rows are replaced, and the new first call (4) links to call 0 again.
    "token_lineage__same_checkpoint_restored_again_replaces_the_dead_run": Scenario(
        RESTORED_AT_CALL_1
        + steps(
            ("start_replacement", FIRST), ("release", FIRST), "crash", ("restore", FIRST), ("start_replacement", FIRST)
        ),
        calls={"r0": (0, 1), "r0-a1": (1, 2, 1, 2)},
        chains={"r0-a1": (0, 4, 5)},
    ),
    # A reply that returns while the checkpoint is open is held: its row is in the ledger but not in the export.
    "token_lineage__held_reply_is_not_exported": Scenario(
        steps("dispatch", ("release", FIRST), "prepare", ("release", FIRST), "commit", "resume"),
        calls={"r0": (0, 1, 2)},
        chains={"r0": (0, 1, 2)},
    ),
    # The same with r0's calls placed on a second policy worker (a single worker ignores the placement).
    "token_lineage__held_reply_on_a_second_worker_is_not_exported": Scenario(
        steps(("dispatch", {"worker": 1}), ("release", FIRST), "prepare", ("release", FIRST), "commit", "resume"),
        calls={"r0": (0, 1, 2)},
        chains={"r0": (0, 1, 2)},
    ),
    # Gym's 14, ledger part: a retired attempt's ledger answers 410 "is retired", also after forget.
    "token_lineage__retired_ledger_answers_410": Scenario(
        steps("dispatch", ("release", FIRST), ("retire", {"pick": 0, "again": False}), "forget"),
        calls={"r0": (0, 1)},
    ),
    # A restore of an earlier checkpoint rolls attempt numbers back: r0-a2, retired before the crash, runs again
    # once the restored r0-a1 is retired, so its stale ledger is deleted first (the trainer's delete, P5); the new
    # execution's ledger then holds only its own calls.
    "token_lineage__retired_ledger_run_again_is_deleted_first": Scenario(
        steps("dispatch", CHECKPOINT, RETIRE_AGAIN, RETIRE_AGAIN, RETIRE_AGAIN, "crash", ("restore", FIRST))
        + steps(("start_replacement", FIRST), RETIRE_AGAIN),
        calls={"r0": (0,), "r0-a1": (0, 0), "r0-a2": (0, 0, 1, 2), "r0-a3": (0,)},
        chains={"r0-a2": (5, 6, 7)},
    ),
    # The trainer's ledger retire and delete are refused while a checkpoint is open.
    "ledger_removal__refused_while_a_checkpoint_is_open": Scenario(
        steps("dispatch", ("release", FIRST), "prepare", "remove_ledgers_while_open", "commit", "resume"),
        calls={"r0": (0, 1, 2)},
        chains={"r0": (0, 1, 2)},
    ),
}

# Generation cuts on the native topology (Gym's scenario 7): call 1 generates when c1 is prepared and is cut.
CUT_SCENARIOS: dict[str, Scenario] = {
    # Gym's 7: one round cuts call 1; the continuation's call (2) continues its prefix.
    "generation_cut__in_flight_call_continued_from_its_prefix": Scenario(
        RESTORED_AT_CALL_1 + steps(("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
        chains={"r0-a1": (0, 2)},
        cut_rounds=((1,),),
        continued={2: 1},
    ),
    # A cut endpoint that hangs costs the prepare at most half its deadline, and the continuation regenerates.
    "generation_cut__hung_cut_costs_only_a_regeneration": Scenario(
        steps("dispatch", ("release", FIRST), "prepare_with_hung_cut", "commit", "crash", ("restore", FIRST))
        + steps(("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
        chains={"r0-a1": (0, 2)},
        cut_rounds=(),
        continued={},
    ),
    # Each prepare cuts the call again; after a resume the older cut is gone, so the record carries one cut.
    "generation_cut__one_cut_per_record_after_a_resume": Scenario(
        steps("dispatch", ("release", FIRST), "prepare", "resume", "prepare", "commit", "crash", ("restore", FIRST))
        + steps(("start_replacement", FIRST)),
        calls={"r0": (0, 1), "r0-a1": (1,)},
        chains={"r0-a1": (0, 2)},
        cut_rounds=((1,), (1,)),
        continued={2: 1},
    ),
}

# The mixed topology (Gym's scenarios 15, 16 and the restart half of 12): r0 runs on the checkpointable
# environment, the restarts on the restart environment, whose `restart_only` resources server makes them restarts.
# Every prepare checks the restart servers report exactly the running restarts (and nobody else any), every commit
# that a commit naming them is refused with `restart_in_scope` and that the restart servers write nothing.
RESTART = ("retire", {"pick": 1, "again": True})
MIXED_SCENARIOS: dict[str, Scenario] = {
    # Gym's 15: the restart never holds up the checkpoint; after the crash r0 continues from its boundary and the
    # restart, retired, starts over as attempt 1; both reply with the full reward.
    "restart__never_holds_up_a_checkpoint_and_starts_over_after_a_crash": Scenario(
        steps("dispatch", "dispatch_restart", "prepare", "commit", "crash", ("restore", FIRST))
        + steps(RESTART, ("start_replacement", FIRST)),
        calls={"r0": (0,), "r1": (0,), "r0-a1": (0, 1), "r1-a1": (0, 1)},
    ),
    # Gym's 16: the same checkpoint, resumed without a crash: the restart's attempt 0 replies after the resume.
    "restart__keeps_running_through_a_checkpoint_without_a_crash": Scenario(
        steps("dispatch", "dispatch_restart", "prepare", "commit", "resume")
        + steps(("release", {"pick": 1}), ("release", {"pick": 1}), ("release", FIRST), ("release", FIRST)),
        calls={"r0": (0, 1), "r1": (0, 1)},
    ),
    # Gym's 12, restart half: two restarts, one past its tool round and one whose call returns during the
    # checkpoint (held by the model server); both start over after the crash, r0 continues.
    "restarts__run_through_a_checkpoint_then_start_over_after_a_crash": Scenario(
        steps("dispatch", "dispatch_restart", ("release", {"pick": 1}), "dispatch_restart", "prepare")
        + steps(("release", {"pick": 2}), "commit", "crash", ("restore", FIRST))
        + steps(RESTART, ("retire", {"pick": 2, "again": True}), ("start_replacement", FIRST)),
        calls={"r0": (0,), "r1": (0, 1), "r2": (0,), "r0-a1": (0, 1), "r1-a1": (0, 1), "r2-a1": (0, 1)},
    ),
}

# The slow topology's verification (Gym's scenarios 9 and 10), per verify mode: `wait` blocks a prepare, which
# the controller either ends by retiring and redispatching the blocker, or waits out while the verification
# finishes during it; `replay` does not block, is exported as the step still to do, and runs again.
SLOW_SCENARIOS: dict[str, dict[str, Scenario]] = {
    "wait": {
        "verification_in_flight__blocks_prepare_then_redispatched": Scenario(
            steps("dispatch", ("release_to_verification", FIRST), "prepare_blocked"),
            calls={"r0": (0, 1, 2), "r0-a1": (0, 1, 2)},
        ),
        "blocker_redispatched__checkpointed_and_restored_with_the_rest": Scenario(
            steps(
                "dispatch",
                ("release_to_verification", FIRST),
                "dispatch",
                "prepare_blocked",
                CHECKPOINT,
                ("recover", FIRST),
            )
        ),
        # Gym's scenario 10, without a crash: the episode finishes during the prepare and replies at the resume,
        # its verification run once.
        "finished_during_prepare__replies_at_resume": Scenario(
            steps("dispatch", ("release_to_verification", FIRST), "prepare_waiting", "commit", "resume"),
            calls={"r0": (0, 1, 2)},
        ),
        # ... and with a crash: the continuation replies with no call at all (verification never runs again).
        "finished_during_prepare__neither_lost_nor_redone": Scenario(
            steps(
                "dispatch",
                ("release_to_verification", FIRST),
                "prepare_waiting",
                "commit",
                ("recover", FIRST),
                ("start_replacement", FIRST),
            ),
            calls={"r0": (0, 1, 2)},
        ),
    },
    "replay": {
        "verification_in_flight__exported_and_run_again": Scenario(
            steps(
                "dispatch",
                ("release_to_verification", FIRST),
                CHECKPOINT,
                ("recover", FIRST),
                ("start_replacement", FIRST),
            ),
            calls={"r0": (0, 1, 2), "r0-a1": (2,)},
        ),
    },
}

# A checkpoint held open while twice an episode's budget passes (a deployment whose time can pass): r0 parked at its
# first model call, and (with a replay verification) r0 in its verification, each goes on with the time it had left.
TIME_SCENARIOS: dict[str, Scenario] = {
    "time_passes__parked_episode_keeps_its_budget": Scenario(
        steps("dispatch", "time_passes", ("release", FIRST), ("release", FIRST)),
    ),
    "time_passes__replay_verification_keeps_its_budget": Scenario(
        steps("dispatch", ("release_to_verification", FIRST), "time_passes", ("release", FIRST)),
    ),
}

# The scenario that trips each planted fault (`fakes.faults`).
# Two workers on every server (`server_workers=2`): each rule's `worker` places the attempt on that worker of each.
# `kill_worker`'s pick names the member by name (agent 0, environment 1, resources 2); `then_prepare` prepares next.
KILL_RESOURCES_WORKER_1_THEN_PREPARE = ("kill_worker", {"pick": 2, "worker": 1, "then_prepare": True})
SERVER_WORKER_SCENARIOS: dict[str, Scenario] = {
    # Gym's concurrent sessions across workers: one episode held on each worker, both exported and both continued.
    "workers__held_episodes_on_both_workers_are_exported": Scenario(
        steps(("dispatch", {"worker": 0}), ("dispatch", {"worker": 1}), ("release", FIRST), ("release", {"pick": 1}))
        + steps("prepare", "commit", "crash", ("restore", FIRST))
        + steps(("start_replacement", {"pick": 0, "worker": 1}), ("start_replacement", {"pick": 0, "worker": 0})),
        calls={"r0": (0, 1), "r1": (0, 1), "r0-a1": (1,), "r1-a1": (1,)},
    ),
    # A replacement continues on another worker than its attempt ran on: the restored record follows it.
    "workers__continuation_on_another_worker": Scenario(
        RESTORED_AT_CALL_1 + steps(("start_replacement", {"pick": 0, "worker": 1})),
        calls={"r0": (0, 1), "r0-a1": (1,)},
    ),
    # Gym's session routing: a killed resources worker takes its episode (retired), the other completes, and a
    # checkpoint after it is ready (a worker lost between checkpoints blocks nothing).
    "workers__killed_worker_loses_only_its_episodes": Scenario(
        steps(("dispatch", {"worker": 0}), ("dispatch", {"worker": 1}), KILL_RESOURCES_WORKER_1_THEN_PREPARE)
        + steps(("release", FIRST), "commit", "resume"),
        calls={"r0": (0, 1), "r1": (0,)},
    ),
}

FAULT_SCENARIOS: dict[str, str] = {
    "model_delivers_held": "checkpoint_without_crash__parks_then_resumes",
    "environment_drops_restored_pending": "second_crash_before_replacement__still_continues",
    "environment_restore_ignores_boundary": "crash_after_prepare__continues_from_boundary",
    "agent_restore_drops_outputs": "crash_after_prepare__continues_from_boundary",
    "agent_retire_keeps_sessions": "retired_episode__stops_everywhere",
    "resumed_id_not_fenced": "resumed_id__is_refused",
    "resume_deletes_records": "checkpoint_without_crash__parks_then_resumes",
    "environment_verify_never_waits": "verification_in_flight__blocks_prepare_then_redispatched",
    "agent_export_drops_unstarted": "checkpoint_at_first_call__restored_from_the_start",
    "agent_forgets_resumed_ids": "resumed_id__is_refused",
    "resources_restore_skips_fence": "late_calls_of_an_older_controller__are_refused",
    "resources_retire_keeps_sessions": "retired_episode__stops_everywhere",
    "environment_admits_while_closed": "run_while_open__is_refused",
    "lease_never_expires": "quiet_controller__lease_lapses_and_admission_reopens",
    "retried_commit_conflicts": "retried_calls__return_their_first_result",
    "agent_stays_closed_after_commit": "checkpoint_without_crash__parks_then_resumes",
    "environment_drops_finished_during_prepare": "finished_during_prepare__neither_lost_nor_redone",
    "agent_retire_skips_failed_sessions": "restarted_alone__running_work_is_retired_everywhere",
    "environment_retire_leaves_restored": "failed_restore__rollouts_start_over",
    "model_restore_accepts_missing_share": "crash_in_commit__incomplete_checkpoint_is_refused",
    "store_publishes_manifest_first": "crash_in_commit__between_a_participants_files_is_no_share",
    "resources_restore_skipped": "resources_state__restored_with_the_episode",
    "store_skips_records_fsync": "power_loss__committed_checkpoints_survive",
    "resume_refuses_unknown_id": "dies_in_restore__the_others_restored_and_nothing_stays",
    "environment_exports_restarts": "restart__never_holds_up_a_checkpoint_and_starts_over_after_a_crash",
    "restarts_block_prepare": "restart__never_holds_up_a_checkpoint_and_starts_over_after_a_crash",
    "resources_restart_unreported": "restart__never_holds_up_a_checkpoint_and_starts_over_after_a_crash",
    "restart_in_scope_accepted": "restart__never_holds_up_a_checkpoint_and_starts_over_after_a_crash",
    "ledger_exports_undelivered": "token_lineage__held_reply_is_not_exported",
    "ledger_refuses_dead_rows": "token_lineage__same_checkpoint_restored_again_replaces_the_dead_run",
    "ledger_appends_on_restore": "token_lineage__same_checkpoint_restored_again_replaces_the_dead_run",
    "lineage_forgets_restored_parent": "token_lineage__continues_across_a_crash",
    "ledger_source_not_retired": "token_lineage__continues_across_a_crash",
    "ledger_retire_skipped": "token_lineage__retired_ledger_answers_410",
    "ledger_removal_while_open": "ledger_removal__refused_while_a_checkpoint_is_open",
    "cut_not_attached": "generation_cut__in_flight_call_continued_from_its_prefix",
    "cut_without_timeout": "generation_cut__hung_cut_costs_only_a_regeneration",
    "cuts_pile_up": "generation_cut__one_cut_per_record_after_a_resume",
    "workers_export_ignores_snapshots": "token_lineage__held_reply_is_not_exported",
    "ledger_reuses_call_ids": "token_lineage__same_checkpoint_restored_again_replaces_the_dead_run",
    "environment_resume_deletes_records_sometimes": "checkpoint_without_crash__parks_then_resumes",
    "second_worker_delivers_held": "token_lineage__held_reply_on_a_second_worker_is_not_exported",
    "agent_restore_drops_tool_results": "crash_after_prepare__continues_from_boundary",
    "store_error_is_internal": "failed_write__retried_in_the_same_process_stores_the_first_export",
    "store_failed_write_leaves_manifest": "failed_write__retried_in_the_same_process_stores_the_first_export",
    "failed_write_abandons_checkpoint": "failed_write__retried_in_the_same_process_stores_the_first_export",
    "stalled_write_publishes_after_resume": "stalled_write__stopped_by_a_resume_never_publishes",
    "prepare_ignores_past_deadline": "checkpoint_without_crash__parks_then_resumes",
    "resources_checks_only_session_cookies": "retired_episode__stops_everywhere",
    "replay_recorded_once_delivered": "lost_prepare_reply__retried_then_committed",
    "failed_close_stays_closed": "failing_close__reopens_then_prepares_again",
    "failed_install_stays_closed": "failing_install__refused_by_one_leaves_nothing",
    "failed_export_retried_empty": "failing_export__retried_exports_afresh",
    "clock_read_once_at_start": "skewed_clock__ahead_lapses_first_and_refuses_the_commit",
    "idle_resume_not_fenced": "unreachable_prepare__resume_fences_it_everywhere",
    "parked_time_counts": "time_passes__parked_episode_keeps_its_budget",
    "prepare_closes_before_deadline_check": "paused_prepare__given_up_fences_the_id",
    "lapse_forgets_id": "paused_lease__lapses_on_waking_and_refuses_the_commit",
    "workers_export_first_worker_only": "workers__held_episodes_on_both_workers_are_exported",
    "restored_records_claimed_by_first_worker_only": "workers__continuation_on_another_worker",
    "lost_worker_blocks_prepare": "workers__killed_worker_loses_only_its_episodes",
    "span_outcome_always_ok": "checkpoint_without_crash__parks_then_resumes",
    "trace_context_dropped": "checkpoint_without_crash__parks_then_resumes",
    "lease_expired_not_counted": "paused_lease__lapses_on_waking_and_refuses_the_commit",
}


def named(name: str) -> Scenario:
    """A scenario by name, from any topology's list."""
    for scenarios in (
        SCENARIOS,
        COUNTER_SCENARIOS,
        CAPTURE_SCENARIOS,
        CUT_SCENARIOS,
        MIXED_SCENARIOS,
        STORAGE_SCENARIOS,
        NEMESIS_SCENARIOS,
        TIME_SCENARIOS,
        SERVER_WORKER_SCENARIOS,
        *SLOW_SCENARIOS.values(),
    ):
        if name in scenarios:
            return scenarios[name]
    raise KeyError(f"no scenario {name!r}")


def run(harness: Harness, scenario: Scenario | Sequence[Step], settle_timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Run the rules in order on a fresh machine, each only if enabled, then drain, check the end and the facts."""
    if not isinstance(scenario, Scenario):
        scenario = Scenario(tuple(scenario))
    machine = CheckpointMachine(harness, settle_timeout_s=settle_timeout_s)
    try:
        for index, (rule, arguments) in enumerate(scenario.steps, start=1):
            check_enabled(machine, rule, arguments, index)
            getattr(machine, rule)(**arguments)
    finally:
        machine.teardown()
    facts = scenario.facts(harness.spec.topology)
    if facts is not None:
        check_calls(facts, machine.model.script, observe(harness).calls)
    if scenario.counts is not None:
        check_counts(scenario.counts, harness)
    if scenario.chains is not None or scenario.cut_rounds is not None or scenario.continued is not None:
        check_lineage(scenario, harness)


def check_enabled(machine: CheckpointMachine, rule: str, arguments: Mapping[str, Any], index: int) -> None:
    """Raise `StepNotEnabled` unless every precondition of `rule` holds now, as Hypothesis would require."""
    declared = getattr(getattr(type(machine), rule, None), "hypothesis_stateful_rule", None)
    if declared is None:
        raise StepNotEnabled(step=f"{rule}({arguments})", index=index, rule=f"{rule} (no such rule)")
    if not all(precondition(machine) for precondition in declared.preconditions):
        raise StepNotEnabled(step=f"{rule}({dict(arguments)})", index=index, rule=rule)


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


def replay(document: Mapping[str, Any], *, artifacts: Path | None = None) -> None:
    """Run a regression file's steps on a fresh embedded deployment of the file's (`DeploymentSpec.from_document`);
    raises what the run raises (`ckpt_model.results.regression.load` reads the file). With `artifacts`
    (`--keep-artifacts`) the failure's regression file, history, checkpoints and logs stay there."""
    with Harness.embedded(DeploymentSpec.from_document(document), artifacts=artifacts) as harness:
        if artifacts is None:  # a replay does not overwrite the file it replays
            harness.regressions_dir = harness.root / "regressions"
        run(harness, [(name, arguments) for name, arguments in document["steps"]])
