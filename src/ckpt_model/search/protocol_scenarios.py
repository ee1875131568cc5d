"""The protocol's fixed scenarios (Gym's e2e scenarios), run on every topology: crashes and restores, retires and
restarts of one participant, failed restores, crashes inside operations, late and repeated calls, a lapsed lease.
Each pins the backend calls of a weather episode and, where the task runs the counter script, those of a counter
row (`COUNTER_CALLS`). What a scenario is and how it runs: `ckpt_model.search.scenarios`.
"""

from __future__ import annotations

import attrs

from ckpt_model.search.scenarios import CHECKPOINT, FIRST, Facts, Scenario, steps

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
    # Rollout IDs at the edges of Gym's rules (reference 5.1): one that ends in `-a0` runs as any other; a /run
    # naming the capture key of its next attempt (the reserved `-a<N>`), and one with a leading dash, are refused
    # and change nothing (P15).
    "rejected_rollout_ids__refused_and_change_nothing": Scenario(
        steps(
            ("dispatch", {"rollout_id": "x.y_z-a0"}),
            ("run_rejected_id", {"rollout_id": "x", "reserved_of": 0}),
            ("run_rejected_id", {"rollout_id": "-x", "reserved_of": None}),
            ("release", FIRST),
            ("release", FIRST),
        ),
        calls={"x0.y_z-a0": (0, 1)},
    ),
    # Checkpoint IDs at the edges of Gym's rules (reference 2.2): a checkpoint of exactly 128 characters ending in
    # `-a1.` is committed and restored (its restore ID trimmed to 128); while it is open, and after the restore, a
    # resume and a prepare naming rejected IDs are refused with 422 and change nothing (P15).
    "checkpoint_ids_at_the_edges__restored_and_rejected_ids_refused": Scenario(
        steps(
            "dispatch",
            ("prepare", {"checkpoint_id": "ck." + "x" * 121 + "-a1."}),
            "commit",
            ("control_rejected_id", {"operation": "resume", "checkpoint_id": "ck1\n"}),
            ("control_rejected_id", {"operation": "commit", "checkpoint_id": "c" * 129}),
            "crash",
            ("restore", FIRST),
            ("control_rejected_id", {"operation": "prepare", "checkpoint_id": "-ck"}),
            ("start_replacement", FIRST),
        ),
        calls={"r0": (0,), "r0-a1": (0, 1)},
    ),
}

# The same scenarios' calls on the counter topology: a counter row makes three calls (1, 3 and 5 messages), so an
# attempt that finishes makes one more than a weather episode, and one released twice is still running.
COUNTER_CALLS: dict[str, Facts] = {
    "rejected_rollout_ids__refused_and_change_nothing": {"x0.y_z-a0": (0, 1, 2)},
    "checkpoint_ids_at_the_edges__restored_and_rejected_ids_refused": {"r0": (0,), "r0-a1": (0, 1, 2)},
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
