"""P10 phases and fencing: every participant's phase, checkpoint ID, counts and admission match the model; stale,
conflicting, past-deadline and repeated calls are answered as the protocol says; a lease is held, renewed and
lapses; replies and readiness reports agree with themselves. The settle's verdicts on statuses are here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckpt_model.errors import CoordinationError, ParticipantFailure, PropertyViolation
from ckpt_model.model.contract import RESTART_SERVERS, ScriptCall
from ckpt_model.model.expectation import Expectation
from ckpt_model.properties.evidence import not_idle_and_open, refused_409, shortened
from ckpt_model.properties.verification import P11Violation
from ckpt_model.protocol.wire import BLOCKERS_SHOWN_MAX


class P10Violation(PropertyViolation):
    property_id = "P10"
    title = (
        "phases and fencing: status (phase, checkpoint ID, counts, admission) matches the model, resumed IDs are "
        "refused, one checkpoint at a time, a retried call returns its first result, a lapsed lease re-opens"
    )


def p10_phase(participant: str, expected: tuple[str, str | None], status: Mapping[str, Any]) -> None:
    """The participant's phase and active checkpoint ID are the model's (changed only by control calls)."""
    observed = (status.get("phase"), status.get("checkpoint_id"))
    if observed != expected:
        raise P10Violation(
            rollout=None,
            expected=f"{participant} in phase {expected}",
            observed=f"{participant} in phase {observed}",
        )


# How a status mismatch on admission reads (`status_mismatches`), and how a refusal still to come reads among the
# settle's pending items: the settle's timeout verdicts tell them apart by these.
ADMISSION_MISMATCH = "accepting="
REFUSAL_PENDING = "refusal"


def status_mismatches(expected: Expectation, status: Mapping[str, Any]) -> list[str]:
    """Where one participant's status disagrees with the model's counts, marks and admission (empty: agrees).

    Counts come from each kind's report (reference 2.4): environment `episodes` and `restored_pending`, agent
    `sessions` and `accepting`, resources `sessions`, model `inflight` and `held`; `retired_rollouts` everywhere."""
    counts = status.get("report", {}).get("counts", {})
    kind = status.get("kind")
    restart_server = status.get("instance") in RESTART_SERVERS
    wanted: dict[str, int] = {}
    if kind == "environment":
        wanted["episodes"] = expected.restart_episodes if restart_server else expected.episodes
    elif kind == "agent":
        wanted["sessions"] = expected.sessions
    elif kind == "resources":
        wanted["sessions"] = expected.restart_sessions if restart_server else expected.resources_sessions
    elif kind == "model":
        wanted.update(inflight=expected.inflight, held=expected.held)
    problems = [f"counts {k}={counts.get(k)} (expected {v})" for k, v in wanted.items() if counts.get(k) != v]
    retired = expected.retired_for(kind)
    if status.get("retired_rollouts") != retired:
        problems.append(f"retired_rollouts={status.get('retired_rollouts')} (expected {retired})")
    restored_pending = () if restart_server else expected.restored_pending  # a restart is never restored
    if kind == "environment" and tuple(status.get("restored_pending", ())) != restored_pending:
        problems.append(f"restored_pending={status.get('restored_pending')} (expected {list(restored_pending)})")
    if "accepting" in status and status["accepting"] is not expected.accepting:
        problems.append(f"accepting={status['accepting']} (expected {expected.accepting})")
    return problems


def p10_status_agrees(violation: type[PropertyViolation] | None, prediction: str, mismatches: Sequence[str]) -> None:
    """A status mismatch that is confirmed (by the step's own reply, or by outliving the settle and one fresh poll)
    breaks the step's own property (`violation`: P7 after retire and forget, P8 after a failed restore), else P10."""
    if mismatches:
        raise (violation or P10Violation)(rollout=None, expected=prediction, observed="; ".join(mismatches))


def p10_admission_agrees(prediction: str, mismatches: Sequence[str], pending: Sequence[str], timeout_s: float) -> None:
    """Once the settle timed out: no participant's admission contradicts the model (closed after a resume, open
    while prepared), since such a participant explains whatever stalled behind it."""
    admission = [item for item in mismatches if ADMISSION_MISMATCH in item]
    if admission:
        raise P10Violation(
            rollout=None,
            expected=prediction,
            observed="; ".join(admission) + f" (still pending after {timeout_s:g} s: {list(pending)})",
        )


def p10_refusal_came(
    violation: type[PropertyViolation] | None, prediction: str, pending: Sequence[str], mismatches: Sequence[str]
) -> None:
    """Once the settle timed out: a refusal that never came while the statuses show the request was taken in (an
    episode counted) breaks the step's own property (`violation`), else P10. Anything else still pending is for
    the caller to report: it is no verdict."""
    if mismatches and pending and all(REFUSAL_PENDING in item for item in pending):
        raise (violation or P10Violation)(
            rollout=None, expected=prediction, observed="; ".join([*pending, *mismatches])
        )


def p10_lease_held(name: str, status: Mapping[str, Any]) -> None:
    """While a checkpoint is active on a participant (any phase but idle) its lease runs: `lease_expires_at` is
    a time (reference 2.4, 2.7)."""
    lease = status.get("lease_expires_at")
    if status.get("phase") != "idle" and (not isinstance(lease, int | float) or isinstance(lease, bool)):
        raise P10Violation(
            rollout=None,
            expected=f"{name}, in phase {status.get('phase')!r}, holds a lease",
            observed=f"lease_expires_at {lease!r}",
        )


def p10_lease_renewed(checkpoint_id: str, lease_until: float, replies: Mapping[str, Any]) -> None:
    """A renew extends every participant's lease to at least its deadline plus the lease grace (reference 2.7)."""
    short = {
        name: reply.get("lease_expires_at")
        for name, reply in replies.items()
        if not isinstance(reply.get("lease_expires_at"), int | float) or reply["lease_expires_at"] < lease_until
    }
    if short:
        raise P10Violation(
            rollout=None,
            expected=f"renew of {checkpoint_id} answered with lease_expires_at >= {lease_until:.3f}",
            observed=f"lease_expires_at {short}",
        )


def p10_lease_lapsed(checkpoint_id: str, phases: Mapping[str, Any], lapsed_s: float) -> None:
    """Once the lease of `checkpoint_id` lapsed (`lapsed_s` ago, grace included) every participant is idle again,
    as a resume would leave it (reference section 2.7)."""
    if not all(phase == ("idle", None) for phase in phases.values()):
        raise P10Violation(
            rollout=None,
            expected=f"every participant idle again once the lease of {checkpoint_id} lapsed",
            observed=f"phases {dict(phases)} {lapsed_s:.1f} s after it lapsed",
        )


def p10_report_consistent(where: str, report: Mapping[str, Any], phase: str | None = None) -> None:
    """A readiness report agrees with itself: `blocker_count` counts the blockers (shown up to 100), and a
    prepare's phase is `prepared` exactly when it is ready (2.4, 2.5). A participant may be unready with no
    blocker to name (a resources seed in progress), so `ready` is not held to the count."""
    blockers, count, ready = report.get("blockers", []), report.get("blocker_count"), report.get("ready")
    shown = min(count, BLOCKERS_SHOWN_MAX) if isinstance(count, int) else None
    problems = []
    if shown != len(blockers):
        problems.append(f"blocker_count {count!r} for {len(blockers)} blocker(s) shown")
    if phase is not None and (phase == "prepared") is not ready:
        problems.append(f"phase {phase!r} with ready {ready!r}")
    if problems:
        raise P10Violation(
            rollout=None, expected=f"{where}: a report that agrees with itself", observed="; ".join(problems)
        )


def p10_reply_phase(operation: str, checkpoint_id: str, expected: str, replies: Mapping[str, Any]) -> None:
    """Every participant's reply to `operation` names the phase the call leaves it in (reference 2.5)."""
    wrong = {name: reply.get("phase") for name, reply in replies.items() if reply.get("phase") != expected}
    if wrong:
        raise P10Violation(
            rollout=None,
            expected=f"{operation} {checkpoint_id} answered with phase {expected!r} by every participant",
            observed=f"phases {wrong}",
        )


def p10_prepared_everywhere(
    checkpoint_id: str,
    prepared: bool,
    blockers: Mapping[str, Any],
    verifying: Sequence[str],
    waited_s: float | None = None,
) -> None:
    """Every rollout waits at a model call, so a prepare must become prepared on every stage; an attempt in a
    `replay` verification never blocks (P11), anything else that blocks is P10. `waited_s`: the prepare had not
    answered after that long, and `blockers` are what the participants' statuses then reported."""
    if prepared:
        return
    observed = f"not prepared; blockers {dict(blockers)}"
    if waited_s is not None:
        observed = f"still preparing after {waited_s:.1f} s; the statuses report blockers {dict(blockers)}"
    raise (P11Violation if verifying else P10Violation)(
        rollout=None,
        expected=f"{checkpoint_id} prepared everywhere (every rollout waits at a model call"
        + (f"; {list(verifying)} verify in mode replay, which never blocks)" if verifying else ")"),
        observed=observed,
    )


def p10_prepared_despite_hung_cut(checkpoint_id: str, deadline_s: float, error: Any) -> None:
    """A prepare whose generation cut hangs is still prepared within its deadline: the model server gives the cut
    at most half the time left (reference 7.3). Called with the prepare's refusal."""
    raise P10Violation(
        rollout=None,
        expected=f"{checkpoint_id} prepared within {deadline_s:g} s although its cut hangs",
        observed=str(error),
    )


def p10_each_refused(operation: str, expected_code: str, outcomes: Mapping[str, Any]) -> None:
    """Every participant, asked on its own, refused `operation` with `expected_code`."""
    wrong = {
        name: outcome.describe() if isinstance(outcome, ParticipantFailure) else f"accepted: {shortened(outcome, 120)}"
        for name, outcome in outcomes.items()
        if not (isinstance(outcome, ParticipantFailure) and outcome.code == expected_code)
    }
    if wrong:
        raise P10Violation(
            rollout=None,
            expected=f"{operation} refused by every participant with {expected_code}",
            observed="; ".join(f"{name}: {what}" for name, what in sorted(wrong.items())),
        )


def p10_each_replied(operation: str, expected: Mapping[str, Any], outcomes: Mapping[str, Any]) -> None:
    """Every participant answered `operation` with exactly the expected reply (a retry returns the first result)."""
    wrong = {name: outcome for name, outcome in outcomes.items() if outcome != expected.get(name)}
    if wrong:
        name = sorted(wrong)[0]
        outcome = wrong[name]
        shown = outcome.describe() if isinstance(outcome, ParticipantFailure) else shortened(outcome)
        raise P10Violation(
            rollout=None,
            expected=f"{operation} answered by {name} with {shortened(expected.get(name))}",
            observed=f"{name} answered {shown}" + (f" (and {sorted(wrong)[1:]} differ too)" if len(wrong) > 1 else ""),
        )


def p10_retry_answered(
    label: str, operation: str, after_crash: bool, first: Mapping[str, Any], outcomes: Mapping[str, Any]
) -> None:
    """A retried control call: after a crash a commit is refused by the fresh processes (`invalid_phase`); a
    resume answers as an idempotent one; anything else answers exactly its first result again."""
    if after_crash:
        p10_each_refused(f"{label} after a crash", "invalid_phase", outcomes)
    elif operation == "resume":
        idempotent = {"phase": "idle", "idempotent": True}
        p10_each_replied(label, dict.fromkeys(outcomes, idempotent), outcomes)
    else:
        p10_each_replied(label, first, outcomes)


# A resume is accepted in every phase (reference 2.6 and 3): with the active ID, idle with nothing active
# (idempotent, the ID remembered), or an ID already resumed (idempotent). Refusals a resume never gets.
RESUME_NEVER_REFUSED_WITH = ("invalid_phase", "stale_checkpoint")


def p10_resume_accepted(checkpoint_id: str, error: CoordinationError) -> None:
    """No participant refused the controller's resume with a code the protocol never gives a resume; any other
    failure (no reply, a deadline passed, a server error) is left to the caller."""
    refused = {
        name: failure.describe()
        for name, failure in error.failures.items()
        if failure.code in RESUME_NEVER_REFUSED_WITH
    }
    if refused:
        raise P10Violation(
            rollout=None,
            expected=(
                f"resume {checkpoint_id} accepted by every participant: idempotent by one idle with nothing active "
                "or that resumed the ID already, which remembers it"
            ),
            observed="; ".join(f"{name}: {what}" for name, what in sorted(refused.items())),
        )


def p10_open_after_resume(operation: str, statuses: Mapping[str, Mapping[str, Any]]) -> None:
    """After a controller's `operation` resumed every participant: each idle, with no checkpoint, and admission
    open (`accepting` where the status has it), as a resume leaves it (reference section 3)."""
    for name, status in sorted(statuses.items()):
        if (observed := not_idle_and_open(status)) is not None:
            raise P10Violation(
                rollout=None,
                expected=f"{name} idle with no checkpoint and admission open after {operation}",
                observed=observed,
            )


def p10_admission_refused(key: str, status_code: int | None, body: Any) -> None:
    """A new `/run` while a checkpoint is open is refused with 409 admission_closed and owns nothing."""
    what = "a new /run while a checkpoint is open"
    refused_409(P10Violation, key, "admission_closed", what, "", status_code, body)


def p10_refused_runs_made_no_calls(refused: Iterable[str], calls: Mapping[str, tuple[ScriptCall, ...]]) -> None:
    """A `/run` sent while a checkpoint is open (capture keys `refused`) is refused at admission: it never reaches
    the backend. Judged before P4, whose "a call the model cannot explain" would otherwise name the consequence."""
    for key in sorted(set(refused)):
        if calls.get(key):
            raise P10Violation(
                rollout=key,
                expected="a new /run while a checkpoint is open is refused with 409 admission_closed, calling nothing",
                observed=f"admitted: backend calls {list(calls[key])}",
            )


LEDGER_REMOVAL_REFUSAL = "retry ledger retire and delete after it resumes"


def p10_ledger_removal_refused(checkpoint_id: str, outcomes: Mapping[str, Any]) -> None:
    """While a checkpoint is open, the policy model refuses a ledger retire and a ledger delete with 409, saying
    to retry after the resume (reference 7.2): its export must not lose rows under the commit."""
    for operation, outcome in outcomes.items():
        status = getattr(outcome, "status", 200)
        text = getattr(outcome, "text", str(outcome))
        if status != 409 or LEDGER_REMOVAL_REFUSAL not in text:
            raise P10Violation(
                rollout=None,
                expected=f"ledger {operation} refused (409, '{LEDGER_REMOVAL_REFUSAL}') while {checkpoint_id} is open",
                observed=f"HTTP {status}: {text}",
            )


def p10_failed_close_refused(checkpoint_id: str, victim: str, error: CoordinationError | None) -> None:
    """The prepare of `checkpoint_id`, whose close of admission failed on `victim` after it closed, failed there
    with 500 checkpoint_error (an unexpected exception inside the route) and nowhere else."""
    expected = f"prepare {checkpoint_id} refused by {victim} alone (its close failed), with HTTP 500 checkpoint_error"
    if error is None:
        raise P10Violation(rollout=None, expected=expected, observed="every participant prepared")
    refused = error.failures.get(victim)
    wrong = {name: failure.describe() for name, failure in sorted(error.failures.items()) if name != victim}
    if refused is None or (refused.http_status, refused.code) != (500, "checkpoint_error"):
        wrong[victim] = refused.describe() if refused is not None else "prepared"
    if wrong:
        raise P10Violation(rollout=None, expected=expected, observed="; ".join(f"{n}: {w}" for n, w in wrong.items()))


def p10_reopened_after_failed_close(checkpoint_id: str, victim: str, status: Mapping[str, Any]) -> None:
    """After its close failed, `victim` is idle with no checkpoint and admission open again (reference section 3:
    if closing raises, admission is re-opened and the phase is idle)."""
    if (observed := not_idle_and_open(status)) is not None:
        raise P10Violation(
            rollout=None,
            expected=f"{victim} idle with admission open again after its close for {checkpoint_id} failed",
            observed=observed,
        )
