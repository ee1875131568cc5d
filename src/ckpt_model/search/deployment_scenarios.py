"""Fixed scenarios of one deployment's topology, option or fault family: storage faults and the nemeses that kill
nothing, the counter's state, token capture, generation cuts, the mixed topology's restarts, the slow topology's
verification, time passing, two workers on every server; and the scenario that trips each planted fault
(`FAULT_SCENARIOS`). `named` finds a scenario of any list, the protocol's too
(`ckpt_model.search.protocol_scenarios`). What a scenario is and how it runs: `ckpt_model.search.scenarios`.
"""

from __future__ import annotations

from ckpt_model.search.protocol_scenarios import RESTORED_AT_CALL_1, SCENARIOS
from ckpt_model.search.scenarios import CHECKPOINT, FIRST, RETIRE_AGAIN, Scenario, steps

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

# The scenario that trips each planted fault (`fakes.faults`).
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
    "legacy_keys_skip_reservation": "rejected_rollout_ids__refused_and_change_nothing",
    "agent_strips_checkpoint_ids": "checkpoint_ids_at_the_edges__restored_and_rejected_ids_refused",
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
