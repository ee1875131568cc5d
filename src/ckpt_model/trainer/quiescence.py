"""Waiting for the quiet state the model predicts, and deciding what a difference means.

After every rule the machine polls the backend's call list and every participant's status until they show what
`expectation.expect(model)` derives. Calls, replies, refusals and phases are definite: a wrong one is a violation at
once, a missing one is waited for. A participant's counts, marks and admission are judged only once nothing else
is pending, and only when confirmed: by the step's own reply (`counts_final`: retire and forget free everything
before they reply, reference section 10), or by a mismatch that outlived the whole settle timeout and one fresh
poll. Slowness alone is never a verdict.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import attrs

from ckpt_model import timing
from ckpt_model.deployments.clocks import Clocks
from ckpt_model.deployments.observe import (
    POLL_INTERVAL_MAX_S,
    POLL_INTERVAL_MIN_S,
    Observation,
    Observes,
    backend_calls,
    observe,
    poll,
    read_statuses,
)
from ckpt_model.errors import PropertyViolation, QuiescenceTimeout
from ckpt_model.model.contract import Model
from ckpt_model.model.expectation import Expectation, expect
from ckpt_model.properties.clocks import p20_budget_kept
from ckpt_model.properties.continuation import (
    p2_held_responses,
    p3_reply_complete,
    p3_run_reply_shape,
    p3_still_running,
    p4_calls,
)
from ckpt_model.properties.fencing import (
    REFUSAL_PENDING,
    p10_admission_agrees,
    p10_admission_refused,
    p10_lease_held,
    p10_lease_lapsed,
    p10_phase,
    p10_refusal_came,
    p10_refused_runs_made_no_calls,
    p10_report_consistent,
    p10_status_agrees,
    status_mismatches,
)
from ckpt_model.properties.identifiers import (
    p15_capture_keys,
    p15_rejected_id_refused,
    p15_rejected_ids_called_nothing,
    p15_run_names_episode,
    p15_status_names_participant,
)
from ckpt_model.properties.state import p7_refused
from ckpt_model.properties.verification import p11_preparing
from ckpt_model.trainer.runs import RunPool

SETTLE_TIMEOUT_S = 10.0
# While a call or a reply is still to come, the participants' phases are first read after this long: a step that
# waits for something is over in 12 ms at the median and 48 ms at the 95th percentile (a minute on `native`), and its
# statuses are read once it is anyway, so reading them at the first poll as well cost a status round per such step.
# A phase no wait fixes is then reported this much later.
PHASES_WHILE_PENDING_AFTER_S = 0.05


class Quiescence:
    """Settles each step: polls until the system shows the model's prediction, raising what cannot be fixed."""

    def __init__(
        self, harness: Observes, clocks: Clocks, runs: RunPool, reward: float, timeout_s: float = SETTLE_TIMEOUT_S
    ) -> None:
        self.harness = harness
        self.clocks = clocks
        self.runs = runs
        self.reward = reward
        self.timeout_s = timeout_s
        # Attempts parked while time passed (`CheckpointMachine.time_passes`), with the seconds that passed (P20).
        self.outlasted: dict[str, float] = {}

    def settle(
        self, model: Model, violation: type[PropertyViolation] | None = None, counts_final: bool = False
    ) -> Observation:
        with timing.span("settle"):
            return self._settle(model, violation, counts_final)

    def _settle(self, model: Model, violation: type[PropertyViolation] | None, counts_final: bool) -> Observation:
        """Poll until the prediction holds. Each poll reads the backend's calls; the statuses are read after them
        once nothing is pending, or once something was pending for `PHASES_WHILE_PENDING_AFTER_S`, so a wrong phase
        (which nothing in a settle changes, and no wait fixes) fails then instead of at the timeout."""
        expected = expect(model)
        now = time.monotonic()
        deadline, phases_due = now + self.timeout_s, now + PHASES_WHILE_PENDING_AFTER_S
        interval = POLL_INTERVAL_MIN_S
        observation, statuses_fresh, phases_read = Observation(*backend_calls(self.harness), statuses={}), False, False
        while True:
            timing.count("settle.polls")
            pending = self._pending(model, expected, observation)
            if not statuses_fresh and (not pending or (not phases_read and time.monotonic() > phases_due)):
                observation, statuses_fresh = attrs.evolve(observation, statuses=read_statuses(self.harness)), True
                phases_read = True
                pending = self._pending(model, expected, observation)
            if not pending:
                if not _status_mismatches(expected, observation):
                    return observation
                if counts_final or time.monotonic() > deadline:
                    fresh = observe(self.harness)
                    fresh_mismatches = _status_mismatches(expected, fresh)
                    if not self._pending(model, expected, fresh):
                        if fresh_mismatches:
                            self._status_violation(model, expected, fresh, violation)
                        return fresh
            if time.monotonic() > deadline:
                self._timed_out(model, expected, violation)
            with timing.span("sleep"):
                time.sleep(interval)
            interval = min(interval * 2, POLL_INTERVAL_MAX_S)
            if pending:
                calls, waiting = backend_calls(self.harness)
                observation, statuses_fresh = attrs.evolve(observation, calls=calls, waiting=waiting), False
            else:
                observation, statuses_fresh = observe(self.harness), True

    def wait_preparing(self, owner: str, checkpoint_id: str, blockers: list[str], future: Future[Any]) -> None:
        """Until the episode owner reports the prepare waiting on exactly `blockers` (P11: `wait` blocks)."""
        control = self.harness.control
        assert control is not None
        seen: list[Any] = []

        def preparing() -> bool:
            status = control.status_all()[owner]
            seen[:] = [status["phase"], status.get("checkpoint_id"), sorted(status["report"].get("blockers", ()))]
            return seen == ["preparing", checkpoint_id, blockers] or future.done()

        with timing.span("wait_preparing"):
            poll(preparing, self.timeout_s)
        p11_preparing(checkpoint_id, owner, blockers, seen, future.done())

    def wait_lease_lapsed(self, checkpoint_id: str, lapses_at_ts: float) -> None:
        """Until every participant is idle again after the lease of `checkpoint_id` lapsed (P10)."""
        control = self.harness.control
        assert control is not None
        phases: dict[str, Any] = {}

        def idle() -> bool:
            statuses = control.status_all()
            phases.update({name: (s["phase"], s.get("checkpoint_id")) for name, s in statuses.items()})
            return all(phase == ("idle", None) for phase in phases.values())

        with timing.span("wait_lease_lapsed"):
            poll(idle, self._until(lapses_at_ts) + self.timeout_s)
        p10_lease_lapsed(checkpoint_id, phases, self.clocks.now() - lapses_at_ts)

    def wait_lapsed(self, name: str, checkpoint_id: str, lapses_at_ts: float) -> None:
        """Until participant `name` is idle again after its lease of `checkpoint_id` lapsed (`lapses_at_ts` on the
        controller's clock; a skewed participant's own clock decides) (P10)."""
        control = self.harness.control
        assert control is not None
        (member,) = [m for m in control.participants if m.name == name]
        phases: dict[str, Any] = {}

        def idle() -> bool:
            status = control.status(member)
            phases[name] = (status["phase"], status.get("checkpoint_id"))
            return phases[name] == ("idle", None)

        with timing.span("wait_lease_lapsed"):
            poll(idle, self._until(lapses_at_ts) + self.timeout_s)
        p10_lease_lapsed(checkpoint_id, phases, self.clocks.now() - lapses_at_ts)

    def _until(self, lapses_at_ts: float) -> float:
        """The seconds of real time left before the lease lapses at `lapses_at_ts`: none where the checker owns
        time, whose clocks jump past it now (`Clocks.jump_to`: the servers' lease timers fire at once), else the
        lease itself (deadline + grace) in real time."""
        if self.clocks.jump_to(lapses_at_ts):
            return 0.0
        return max(lapses_at_ts - self.clocks.now(), 0.0)

    # -- what is pending, and what is already wrong ------------------------------------------------------------

    def _pending(self, model: Model, expected: Expectation, observation: Observation) -> list[str]:
        """What has not arrived yet; raises at once on what no amount of waiting can fix."""
        p10_refused_runs_made_no_calls(self.runs.refused_closed.values(), observation.calls)
        if self.runs.rejected:
            owners = {a.key: (a.rollout, a.attempt) for a in model.attempts}
            p15_rejected_ids_called_nothing(self.runs.rejected.values(), owners, expected.calls, observation.calls)
        pending = [f"call of {key}" for key in p4_calls(expected.calls, observation.calls)]
        pending += [f"{key} waiting at the backend" for key in expected.waiting if key not in observation.waiting]
        pending += [f"{key} released" for key in observation.waiting if key not in expected.waiting]
        pending += self._pending_runs(model)
        kinds = {member.name: member.kind for member in self.harness.control.participants}  # type: ignore[union-attr]
        for name, status in observation.statuses.items():
            p10_phase(name, (expected.phase, expected.checkpoint_id), status)
            judge_status_fields(name, kinds[name], status)
        return pending

    def _pending_runs(self, model: Model) -> list[str]:
        runs = self.runs
        pending = []
        for attempt in model.attempts:
            outcome = runs.outcomes.get(attempt.run)
            if outcome is not None:
                p20_budget_kept(attempt.key, self.outlasted.get(attempt.key), outcome.status_code, outcome.body)
                if self.harness.spec.traits.native_run:
                    p3_run_reply_shape(attempt.key, outcome.status_code, outcome.body)
            if attempt.status == "replied" and attempt.run >= 0:
                if outcome is None:
                    pending.append(f"{attempt.key} reply")
                else:
                    p3_reply_complete(attempt.key, outcome.status_code, outcome.body, self.reward)
                    sent = self.harness.spec.traits.run_body(attempt.rollout, attempt.attempt, attempt.task)
                    p15_run_names_episode(attempt.key, sent, outcome.body)
            elif attempt.status == "running" and outcome is not None and attempt.run not in runs.refused_stale:
                p3_still_running(
                    attempt.key,
                    attempt.calls_made,
                    len(attempt.script),
                    model.open_checkpoint,
                    outcome.status_code,
                    outcome.body,
                    outcome.error,
                )
        for run, key in sorted(runs.refused_stale.items()):
            outcome = runs.outcomes.get(run)
            if outcome is None:
                pending.append(f"{key} {REFUSAL_PENDING} after retire")
            elif outcome.error is None:
                p7_refused(key, outcome.status_code, outcome.body)
        for run, key in sorted(runs.refused_closed.items()):
            outcome = runs.outcomes.get(run)
            if outcome is None:
                pending.append(f"{key} {REFUSAL_PENDING} while a checkpoint is open")
            else:
                p10_admission_refused(key, outcome.status_code, outcome.body)
        for run, (rollout_id, number) in sorted(runs.rejected.items()):
            outcome = runs.outcomes.get(run)
            if outcome is None:
                pending.append(f"{rollout_id!r} {REFUSAL_PENDING} of its rollout ID")
            else:
                sent = self.harness.spec.traits.run_body(rollout_id, number)
                p15_rejected_id_refused(rollout_id, number, sent, outcome.status_code, outcome.body)
        return pending

    def _timed_out(self, model: Model, expected: Expectation, violation: type[PropertyViolation] | None) -> None:
        """The whole settle timeout passed with something still pending; one fresh poll decides what it was.

        A participant whose admission contradicts the model (closed after a resume, open while prepared)
        explains whatever stalled behind it, so it is P10. A refusal that never came while the statuses show the
        request was taken in (an episode counted) is the step's own property. Anything else is a harness error
        that names what was predicted and what is still pending."""
        fresh = observe(self.harness)
        pending = self._pending(model, expected, fresh)
        mismatches = _status_mismatches(expected, fresh)
        p10_admission_agrees(describe(expected), mismatches, pending, self.timeout_s)
        p10_refusal_came(violation, describe(expected), pending, mismatches)
        raise QuiescenceTimeout(
            prediction=describe(expected),
            observed=fresh.summary(),
            pending=pending + mismatches,
            timeout_s=self.timeout_s,
        )

    def _status_violation(
        self,
        model: Model,
        expected: Expectation,
        observation: Observation,
        violation: type[PropertyViolation] | None,
    ) -> None:
        """A confirmed status mismatch: a held response delivered while prepared is P2; otherwise the step's own
        property (P7 after retire and forget) or P10."""
        held = _model_counts(observation.statuses).get("held")
        if model.checkpoint_open and held != expected.held:
            p2_held_responses(model.open_checkpoint or "", expected.held, held)
        p10_status_agrees(violation, describe(expected), _status_mismatches(expected, observation))


def judge_status_fields(name: str, kind: str, status: Mapping[str, Any]) -> None:
    """What one status must say whatever the model predicts (docs/fields.md): it names its participant, its report
    agrees with itself, an active checkpoint holds a lease, and every key it lists is a capture key (P10, P15)."""
    p15_status_names_participant(name, kind, status)
    p10_report_consistent(f"{name}'s status", status["report"])
    p10_lease_held(name, status)
    for field in ("blockers", "restarts"):
        p15_capture_keys(f"{name}'s status report.{field}", status["report"][field])
    for field in ("restored_pending", "restored_generation_cuts"):
        if field in status:
            p15_capture_keys(f"{name}'s status {field}", status[field])


def _status_mismatches(expected: Expectation, observation: Observation) -> list[str]:
    return [
        f"status of {name} {problem}"
        for name, status in observation.statuses.items()
        for problem in status_mismatches(expected, status)
    ]


def _model_counts(statuses: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    for status in statuses.values():
        if status.get("kind") == "model":
            return status.get("report", {}).get("counts", {})
    return {}


def describe(expected: Expectation) -> str:
    return (
        f"phase {expected.phase} ({expected.checkpoint_id}); calls {expected.calls}; "
        f"waiting {sorted(expected.waiting)}; "
        f"model inflight {expected.inflight} held {expected.held}; episodes {expected.episodes}; "
        f"sessions {expected.sessions}; resources sessions {expected.resources_sessions}; "
        f"restored_pending {list(expected.restored_pending)}; retired_rollouts {expected.retired_rollouts}"
        + "".join(f" ({kind} restarted alone: {count})" for kind, count in expected.retired_by_kind)
        + "; "
        f"admission {'open' if expected.accepting else 'closed'}"
    )
