"""The planted faults a control plane carries (`fakes/faults.py` says what each plants), read once when it starts
so that each costs nothing when off: a switch per bug, named by what the control plane then does wrong."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import attrs

from fakes.gym.control.store import WriterFaults


def clock_read_once() -> Callable[[], float]:
    """A wall clock read once, now, and carried on by the monotonic clock (the planted `clock_read_once_at_start`)."""
    wall_at_start, monotonic_at_start = time.time(), time.monotonic()
    return lambda: wall_at_start + time.monotonic() - monotonic_at_start


def coin_toss() -> bool:
    """Heads half the time, from the OS's randomness: a planted fault that acts on it misbehaves on some runs of
    the same steps and not on others, whatever the checker does (`environment_resume_deletes_records_sometimes`)."""
    return os.urandom(1)[0] < 128


@attrs.frozen
class PlantedFaults:
    """One participant server's switches, each True only where its fault is planted (and for its kind)."""

    resumed_ids_unfenced: bool
    restore_skips_fence: bool
    retire_leaves_restored: bool
    missing_share_is_empty: bool
    resume_needs_known_id: bool
    idle_resume_unfenced: bool
    manifest_first: bool
    skip_records_fsync: bool
    resume_deletes_records: bool
    resume_deletes_records_sometimes: bool
    restart_in_scope_accepted: bool
    # The agent goes back to idle when a hook fails, without re-opening its admission.
    failed_close_stays_closed: bool
    failed_install_stays_closed: bool
    export_placeholder: bool
    replay_recorded_once_delivered: bool
    writer: WriterFaults
    failed_write_abandons: bool
    prepare_ignores_past_deadline: bool
    closes_before_deadline_check: bool
    lapse_forgets_id: bool
    retried_commit_conflicts: bool
    lease_never_expires: bool
    # A wall clock read once at start and carried on by the monotonic clock (immune to clock steps, so deaf to its
    # own clock's offset), for deadlines and the lease; else the true wall clock.
    wall_clock: Callable[[], float]

    @classmethod
    def read(cls, kind: str, faults: frozenset[str]) -> PlantedFaults:
        """The switches of a server of `kind` started with the planted `faults`."""
        agent = kind == "agent"
        environment = kind == "environment"
        return cls(
            resumed_ids_unfenced="resumed_id_not_fenced" in faults or (agent and "agent_forgets_resumed_ids" in faults),
            restore_skips_fence=kind == "resources" and "resources_restore_skips_fence" in faults,
            retire_leaves_restored=environment and "environment_retire_leaves_restored" in faults,
            missing_share_is_empty=kind == "model" and "model_restore_accepts_missing_share" in faults,
            resume_needs_known_id="resume_refuses_unknown_id" in faults,
            idle_resume_unfenced="idle_resume_not_fenced" in faults,
            manifest_first="store_publishes_manifest_first" in faults,
            skip_records_fsync="store_skips_records_fsync" in faults,
            resume_deletes_records="resume_deletes_records" in faults,
            resume_deletes_records_sometimes=environment and "environment_resume_deletes_records_sometimes" in faults,
            restart_in_scope_accepted="restart_in_scope_accepted" in faults,
            failed_close_stays_closed=agent and "failed_close_stays_closed" in faults,
            failed_install_stays_closed=agent and "failed_install_stays_closed" in faults,
            export_placeholder="failed_export_retried_empty" in faults,
            replay_recorded_once_delivered="replay_recorded_once_delivered" in faults,
            writer=WriterFaults(
                os_errors_escape="store_error_is_internal" in faults,
                manifest_in_place="store_failed_write_leaves_manifest" in faults,
                ignores_stop_when_publishing="stalled_write_publishes_after_resume" in faults,
            ),
            failed_write_abandons="failed_write_abandons_checkpoint" in faults,
            prepare_ignores_past_deadline=agent and "prepare_ignores_past_deadline" in faults,
            closes_before_deadline_check=agent and "prepare_closes_before_deadline_check" in faults,
            lapse_forgets_id=agent and "lapse_forgets_id" in faults,
            retried_commit_conflicts=environment and "retried_commit_conflicts" in faults,
            lease_never_expires="lease_never_expires" in faults,
            wall_clock=clock_read_once() if "clock_read_once_at_start" in faults else time.time,
        )
