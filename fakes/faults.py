"""The catalogue of injectable faults: each a real bug class, planted in one server, off by default.

Select faults when a deployment starts (`python -m fakes.stack --faults a,b`, `Stack(faults=...)`,
`Harness(faults=...)`); every server reads the list once at start, so a fault costs nothing when off. The
checker must find each one and shrink it to a short sequence (`tests/stateful/test_finds_faults.py`); the
property named here is the one expected to catch it.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs


@attrs.frozen
class Fault:
    """A planted bug; `topology`, `verify_mode`, `token_capture`, `generation_cuts`, `policy_workers`,
    `server_workers` and `time_jumps` name the deployment it shows in."""

    name: str
    server: str
    caught_by: str
    description: str
    topology: str = "native"
    verify_mode: str = "wait"
    token_capture: bool = False
    generation_cuts: bool = False
    policy_workers: int = 1
    server_workers: int = 1
    time_jumps: bool = False
    # A fault that shows only on some runs of the same steps (it tosses a coin): its fixed scenario is judged over
    # several runs (`tests/stateful/test_fixed_scenarios.py`), and a search reports it with its reproduction rate.
    intermittent: bool = False
    # Properties a random search may report first: a bug with more than one symptom shows the one it reaches first.
    also_shows_as: tuple[str, ...] = ()

    @property
    def shows_as(self) -> tuple[str, ...]:
        return (self.caught_by, *self.also_shows_as)


CATALOGUE: tuple[Fault, ...] = (
    Fault(
        "model_delivers_held",
        "policy_model",
        "P2",
        "a model server that delivers held responses while a checkpoint is open",
    ),
    Fault(
        "environment_drops_restored_pending",
        "environment",
        "P1",
        "restored-pending episodes dropped by a second checkpoint taken before their replacement starts",
    ),
    Fault(
        "environment_restore_ignores_boundary",
        "environment",
        "P4",
        "a restore that installs an episode without its boundary, so the continuation redoes delivered calls",
        # With no call delivered yet nothing is redone, but the continuation seeds a new agent session and the
        # restored one is left behind, which the agent's status counts show.
        also_shows_as=("P10",),
    ),
    Fault(
        "environment_retire_leaves_restored",
        "environment",
        "P8",
        "a retire while a restore is installed and not yet resumed only marks the attempts, leaving the episodes "
        "that restore installed (so a restore another participant refused leaves them behind)",
        # The episode left behind stays in the environment's restored_pending, which its status shows (P10) when
        # the cleanup's resume comes before any restore of it is judged (a dies_in_restore that crashes first).
        also_shows_as=("P10",),
    ),
    Fault(
        "model_restore_accepts_missing_share",
        "policy_model",
        "P8",
        "a policy model with nothing to restore treats a missing share as an empty one, so it installs a "
        "checkpoint whose commit a crash cut short before reaching it instead of refusing it",
    ),
    Fault(
        "store_publishes_manifest_first",
        "every participant",
        "P9",
        "the writer every participant shares publishes the manifest before the records file, so a crash between "
        "the two leaves a manifest naming records that are not there",
        # A disk failing once the records carry their digest name and before the manifest is linked never fails
        # this writer's commit: it has linked its manifest before it gets there.
        also_shows_as=("P16",),
    ),
    Fault(
        "store_skips_records_fsync",
        "every participant",
        "P9",
        "the writer every participant shares renames and publishes its records file without fsyncing it, so a power "
        "cut after the commit leaves a manifest whose records are empty",
        # A disk that fails the records' fsync never fails this writer's commit: it never calls fsync.
        also_shows_as=("P16",),
    ),
    Fault(
        "resume_refuses_unknown_id",
        "every participant",
        "P8",
        "a resume that ends only a checkpoint the participant knows, so one that never saw the restore (it refused "
        "it, or died in it and started again) refuses the controller's cleanup resume instead of remembering the ID",
        # A prepare stopped short (one participant's close hook failed) never reached the others either, and the
        # controller's resume of it there is refused too (P10: a resume is accepted idle, the ID remembered).
        also_shows_as=("P10",),
    ),
    Fault(
        "agent_restore_drops_outputs",
        "agent",
        "P3",
        "an agent restore that rebuilds the loop without the outputs made before the checkpoint",
    ),
    Fault(
        "agent_retire_keeps_sessions",
        "agent",
        "P7",
        "a retire that stops an attempt but leaves its agent session tracked",
        # The controller's cleanup after a refused restore is a retire too: the restored session stays (P8).
        also_shows_as=("P8",),
    ),
    Fault(
        "resumed_id_not_fenced",
        "every participant",
        "P10",
        "a control plane that forgets resumed checkpoint IDs, so a delayed prepare of one is accepted",
    ),
    Fault(
        "resume_deletes_records",
        "every participant",
        "P9",
        "a resume that cleans up the records file of the checkpoint it just committed",
    ),
    Fault(
        "environment_verify_never_waits",
        "environment",
        "P11",
        "an environment that runs `wait` verification as `replay`, so a checkpoint does not wait for it",
        topology="slow",
    ),
    Fault(
        "agent_export_drops_unstarted",
        "agent",
        "P1",
        "an agent export that drops sessions with no delivered response yet, so a checkpoint at a first call loses"
        " them",
    ),
    Fault(
        "agent_forgets_resumed_ids",
        "agent",
        "P10",
        "an agent control plane that forgets resumed checkpoint IDs while the other participants fence them",
    ),
    Fault(
        "resources_restore_skips_fence",
        "resources",
        "P10",
        "a resources control plane whose restore skips the resumed-ID fence, so a stale controller's restore is not"
        " refused with stale_checkpoint",
    ),
    Fault(
        "resources_retire_keeps_sessions",
        "resources",
        "P7",
        "a resources retire that marks the attempt but leaves its session tracked",
    ),
    Fault(
        "environment_admits_while_closed",
        "environment",
        "P10",
        "an environment that admits a new /run while a checkpoint is open instead of refusing it with admission_closed",
    ),
    Fault(
        "lease_never_expires",
        "every participant",
        "P10",
        "a control plane that never arms its lease, so a controller that went quiet leaves admission closed for good",
    ),
    Fault(
        "retried_commit_conflicts",
        "environment",
        "P10",
        "idempotent replay that compares the whole request, deadline included, so a retried commit is refused with"
        " checkpoint_conflict instead of returning the first result",
        # The controller's retry after an unreachable participant's commit meets it too (P19: the retry completes),
        # and so does its retry after a participant frozen across the commit's deadline (P16: the retry commits).
        also_shows_as=("P19", "P16"),
    ),
    Fault(
        "agent_stays_closed_after_commit",
        "agent",
        "P10",
        "an agent whose resume after a committed checkpoint re-opens its phase but not session admission",
    ),
    Fault(
        "environment_drops_finished_during_prepare",
        "environment",
        "P1",
        "an environment export that leaves out an episode whose verification finished while a prepare waited for it",
        topology="slow",
    ),
    Fault(
        "agent_retire_skips_failed_sessions",
        "agent",
        "P7",
        "an agent retire that stops and frees only sessions still running, so a session whose activation failed"
        " (its policy model crashed alone) stays tracked for good",
    ),
    Fault(
        "resources_restore_skipped",
        "resources",
        "P6",
        "a restore that skips the resources participant's install: the exported session states never come back, so"
        " a continued counter counts from 0",
        topology="counter",
    ),
    Fault(
        "environment_exports_restarts",
        "restart_environment",
        "P1",
        "an environment export that writes restart episodes too, as if they could continue from their boundary",
        topology="mixed",
    ),
    Fault(
        "restarts_block_prepare",
        "restart_environment",
        "P10",
        "an environment that lists restart episodes among its prepare blockers, so a checkpoint waits for episodes"
        " it will never export",
        topology="mixed",
    ),
    Fault(
        "resources_restart_unreported",
        "restart_resources",
        "P1",
        "a restart-only resources server whose seed replies omit x-ng-checkpoint-restart, so the environment"
        " exports the episode as if it could continue (the server still reports it as a restart)",
        topology="mixed",
    ),
    Fault(
        "restart_in_scope_accepted",
        "every participant",
        "P1",
        "a commit that skips the restart_in_scope check, so a participant accepts a scope naming an episode it"
        " reported as a restart",
        topology="mixed",
    ),
    Fault(
        "ledger_exports_undelivered",
        "policy_model",
        "P5",
        "a capture-ledger export that keeps the rows of calls whose replies are still held, so a restored lineage"
        " names a call its episode never saw",
        topology="counter",
        token_capture=True,
    ),
    Fault(
        "ledger_refuses_dead_rows",
        "policy_model",
        "P9",
        "Gym's old model.py: a restore refused because the next attempt's ledger already holds rows from another"
        " execution, so a checkpoint cannot be restored again after its replacement made calls and crashed",
        topology="counter",
        token_capture=True,
        # Its refusal also meets a restore that a damaged share makes fail: the model refuses beside the victim.
        also_shows_as=("P8",),
    ),
    Fault(
        "ledger_appends_on_restore",
        "policy_model",
        "P5",
        "a restore that appends the checkpoint's rows after a dead execution's rows instead of replacing them, so"
        " the lineage keeps calls nobody continued",
        topology="counter",
        token_capture=True,
        # Appending also keeps a dead execution's retired marker, which refuses the restore outright (P9), and a
        # damaged copy's restore then has the policy model refusing beside the damaged participant (P8).
        also_shows_as=("P9", "P8"),
    ),
    Fault(
        "lineage_forgets_restored_parent",
        "policy_model",
        "P5",
        "a parent lookup that considers only rows the attempt staged itself, so the first call after a restore"
        " starts a new lineage instead of continuing the checkpoint's",
        topology="counter",
        token_capture=True,
    ),
    Fault(
        "ledger_source_not_retired",
        "policy_model",
        "P5",
        "a restore that leaves the source attempts' ledgers live, so the lineage the checkpoint continued can still"
        " be read and written as if it were current",
        topology="counter",
        token_capture=True,
    ),
    Fault(
        "ledger_retire_skipped",
        "policy_model",
        "P5",
        "a participant retire that cancels the attempt's calls but leaves its capture ledgers live",
        topology="counter",
        token_capture=True,
    ),
    Fault(
        "ledger_removal_while_open",
        "policy_model",
        "P10",
        "ledger retire and delete routes that run while a checkpoint is open, so a commit may name ledgers that are"
        " already gone",
        topology="counter",
        token_capture=True,
    ),
    Fault(
        "cut_not_attached",
        "policy_model",
        "P12",
        "restored generation cuts that are never attached to the re-issued call, so it regenerates from scratch",
        token_capture=True,
        generation_cuts=True,
    ),
    Fault(
        "cut_without_timeout",
        "policy_model",
        "P10",
        "a cut request sent without a timeout (instead of half the remaining prepare time), so a hung cut endpoint"
        " holds the prepare past its deadline",
        token_capture=True,
        generation_cuts=True,
    ),
    Fault(
        "cuts_pile_up",
        "policy_model",
        "P12",
        "per-ticket cut state that survives a resume, so a call cut at two prepares exports two cuts and the"
        " checkpoint's restore is refused",
        token_capture=True,
        generation_cuts=True,
    ),
    Fault(
        "workers_export_ignores_snapshots",
        "policy_model",
        "P5",
        "a multi-worker policy model whose coordinator exports the ledger without asking its workers which calls are"
        " still undelivered, so a reply a worker holds is exported as if its episode had seen it",
        topology="counter",
        token_capture=True,
        policy_workers=2,
    ),
    Fault(
        "ledger_reuses_call_ids",
        "policy_model",
        "P15",
        "a restore that rebuilds a ledger's call counter from the rows it installs, so restoring a checkpoint again"
        " hands the dead execution's undelivered call IDs to the new execution's calls",
        topology="counter",
        token_capture=True,
    ),
    Fault(
        "environment_resume_deletes_records_sometimes",
        "environment",
        "P9",
        "an environment whose resume cleans up the records file of the checkpoint it just committed on a random"
        " half of its resumes (a coin tossed from the OS's randomness), so the same steps fail only on some runs",
        intermittent=True,
    ),
    Fault(
        "second_worker_delivers_held",
        "policy_model",
        "P2",
        "a multi-worker policy model whose second worker (index 1) delivers the replies it should hold while a"
        " checkpoint is open; the first holds them, so the bug shows only when a held call is served by worker 1",
        topology="counter",
        token_capture=True,
        policy_workers=2,
    ),
    Fault(
        "agent_restore_drops_tool_results",
        "agent",
        "P14",
        "an agent restore that rebuilds the loop without the tool results (function_call_output items) made before"
        " the checkpoint: the tool calls stay, so the reward and the model calls are an uninterrupted run's, but the"
        " reply the trainer reads lacks the outputs its loop saw",
        topology="legacy",
    ),
    Fault(
        "legacy_keys_skip_reservation",
        "agent",
        "P15",
        "a legacy /run that derives its capture key as nemo-gym 0.7.0 does: the row's _ng_rollout_id is checked"
        " against the alphabet but not against the reserved trailing -a<N>, so a row naming x-a1 at attempt 0 is"
        " taken in as attempt 1 of x, and two (rollout, attempt) pairs share one capture key",
        topology="legacy",
    ),
    Fault(
        "agent_strips_checkpoint_ids",
        "agent",
        "P15",
        "an agent that strips the whitespace around a control body's checkpoint_id before validating it, so"
        " 'c1\\n' or ' c1' is taken as c1 instead of refused with 422: a prepare, a resume or any other call acts on,"
        " or is refused as, a checkpoint the controller never named",
    ),
    Fault(
        "store_error_is_internal",
        "every participant",
        "P16",
        "a writer that lets an OSError from a full or failing disk escape unwrapped, so a commit that could not"
        " write answers 500 checkpoint_error (a server bug to the controller) instead of 422"
        " invalid_checkpoint_state, the storage failure a controller retries",
    ),
    Fault(
        "store_failed_write_leaves_manifest",
        "every participant",
        "P16",
        "a writer that creates manifest.json where it is read and writes it there, instead of linking a complete"
        " fsynced copy: a write that fails half-way leaves a torn manifest, and the retried commit is refused"
        " because the directory 'already holds a different commit'",
    ),
    Fault(
        "failed_write_abandons_checkpoint",
        "every participant",
        "P16",
        "a participant that gives the checkpoint up when its write fails (back to idle, admission open) instead of"
        " staying prepared, so the controller's retry of the commit in the same process is refused",
    ),
    Fault(
        "stalled_write_publishes_after_resume",
        "every participant",
        "P16",
        "a writer that checks the stop flag before each record but not again under the publication lock, so a"
        " write that stalled past its commit's deadline publishes its manifest after the controller resumed",
    ),
    Fault(
        "prepare_ignores_past_deadline",
        "agent",
        "P10",
        "an agent whose prepare uses its deadline only to bound the readiness wait, so a prepare whose deadline had"
        " already passed when it arrived (it sat in a controller's queue) closes admission and answers prepared"
        " instead of being refused with deadline_exceeded",
    ),
    Fault(
        "resources_checks_only_session_cookies",
        "resources",
        "P7",
        "a resources server that refuses a retired attempt's work only by its session cookie, so a tool call or a"
        " verify sent straight to it with the attempt's rollout prefix and no cookie (a late or confused caller)"
        " is served",
    ),
    Fault(
        "replay_recorded_once_delivered",
        "every participant",
        "P17",
        "a participant that counts a prepare or commit as done only once its reply went out, so after a lost reply"
        " the controller's retry of the same call is refused (the work is done, but nothing replays it)",
    ),
    Fault(
        "failed_close_stays_closed",
        "agent",
        "P10",
        "an agent whose prepare, when closing its admission fails after it closed, goes back to idle without"
        " re-opening it, so new sessions wait for a resume that has nothing left to re-open",
    ),
    Fault(
        "failed_install_stays_closed",
        "agent",
        "P8",
        "an agent whose restore, when its install hook fails, goes back to idle without re-opening the admission"
        " the restore closed, so the cleanup's resume leaves it closed",
    ),
    Fault(
        "failed_export_retried_empty",
        "every participant",
        "P1",
        "a participant that marks an export as under way before its hook runs and keeps the mark when the hook"
        " fails, so the retried commit stores an empty export instead of exporting again",
    ),
    Fault(
        "clock_read_once_at_start",
        "every participant",
        "P18",
        "a participant that reads the wall clock once at start and carries it on with the monotonic clock (to be"
        " immune to clock steps), so once its clock is stepped it judges deadlines and its lease on a time that is"
        " no longer its own: it accepts a call its own clock says is past its deadline",
        # The checker's own clock steps show it too: where the checker owns time, a deadline waited out is a jump of
        # every clock, and processes started after it are stepped to it; the controller's probe of a deadline
        # already passed is then accepted (P10: a call past its deadline is refused with deadline_exceeded).
        also_shows_as=("P10",),
    ),
    Fault(
        "idle_resume_not_fenced",
        "every participant",
        "P10",
        "a participant that answers a resume of a checkpoint it never saw (idle: the prepare never reached it) as"
        " idempotent without remembering the ID, so that prepare, arriving late, closes its admission again",
    ),
    Fault(
        "parked_time_counts",
        "environment",
        "P20",
        "an episode deadline that keeps running while the episode is parked for a checkpoint (or in a replay step"
        " under one), so a checkpoint held open longer than an episode has left times it out when admission re-opens",
        time_jumps=True,
    ),
    Fault(
        "prepare_closes_before_deadline_check",
        "agent",
        "P21",
        "a prepare that closes admission before it checks its deadline, so one read past its deadline (the agent was"
        " frozen while it waited) is refused with admission left closed",
        # A prepare whose deadline is already past when it is sent (`prepare` with a past deadline) meets it too.
        also_shows_as=("P10",),
    ),
    Fault(
        "lapse_forgets_id",
        "agent",
        "P21",
        "an agent whose lease lapse re-opens admission as a resume would but does not remember the checkpoint ID, so"
        " a stale controller's commit finds it idle (invalid_phase, not stale_checkpoint) and a late prepare of that"
        " ID would close it again",
        # A quiet controller's lapse, or a clock ahead that lapses first, meets it too.
        also_shows_as=("P10", "P18"),
    ),
    Fault(
        "workers_export_first_worker_only",
        "environment",
        "P1",
        "a multi-worker environment whose coordinator exports only its first worker's episodes, so an episode held"
        " on another worker at the checkpoint is in the commit's scope but not in the checkpoint",
        server_workers=2,
    ),
    Fault(
        "restored_records_claimed_by_first_worker_only",
        "environment",
        "P4",
        "a multi-worker environment where only its first worker claims restored records, so a replacement routed to"
        " another worker finds none and starts its episode over, redoing the model calls it had made",
        server_workers=2,
        # The record it never claimed stays pending in the status, and the restored sessions stay beside the new.
        also_shows_as=("P10",),
    ),
    Fault(
        "lost_worker_blocks_prepare",
        "resources",
        "P10",
        "a multi-worker resources server whose readiness counts every worker lost since it started, not only one"
        " lost while admission was closed, so once a worker died between checkpoints no prepare is ever ready",
        server_workers=2,
    ),
    Fault(
        "span_outcome_always_ok",
        "every participant",
        "P26",
        "telemetry that records an operation's outcome before it knows it, so every span and every outcome count"
        " says ok, a refused call (stale_checkpoint, deadline_exceeded) too",
    ),
    Fault(
        "trace_context_dropped",
        "agent",
        "P26",
        "an agent whose control routes do not extract the caller's traceparent, so each of its operations starts a"
        " trace of its own and a checkpoint's trace misses the agent",
    ),
    Fault(
        "lease_expired_not_counted",
        "every participant",
        "P26",
        "a lease lapse that re-opens admission and makes its span but records no lease_expired count, so a"
        " dashboard never sees a controller that went away",
    ),
)
BY_NAME: dict[str, Fault] = {fault.name: fault for fault in CATALOGUE}


def validate(names: Iterable[str]) -> tuple[str, ...]:
    """The names, checked against the catalogue; an unknown name is an error that lists the known ones."""
    chosen = tuple(names)
    unknown = sorted(set(chosen) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known faults: {', '.join(sorted(BY_NAME))}")
    return chosen
