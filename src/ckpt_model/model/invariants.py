"""The contract model's own invariants: what must hold of every `Model` the rules can reach.

The properties judge the real system against what the model predicts (`expect`, `exports`, `scope`, the marks);
a model that contradicts itself makes those verdicts wrong in ways no run on the real processes can show. So the
explorer (`ckpt_model.search.explore`) checks each of these on every state it reaches. Each is a named function
from a model to the problems it finds (empty when it holds), in the words a report prints; `drain_reaches_a_clean_end`
is the model's liveness: from any state, the controller's drain ends with every rollout finished and nothing held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ckpt_model.model.contract import Model

Invariant = Callable[[Model], list[str]]
KINDS: tuple[str, ...] = ("environment", "agent", "resources", "model")
# The drain releases every waiting call at once, round after round: no script has more calls than this.
DRAIN_ROUNDS_MAX = 16


def replied_means_finished(model: Model) -> list[str]:
    """An attempt the model says replied ran its whole script, has no call outstanding and nothing held, and is
    nowhere among what a commit would export (P3 expects its reply; continued after a restore, it would run
    twice)."""
    problems = []
    for a in model.attempts:
        if a.status != "replied":
            continue
        if not a.finished_script or a.outstanding is not None or a.held:
            out = a.calls_made - a.delivered
            problems.append(f"{a.key} replied at call {a.boundary} of {len(a.script)} with {out} call out")
    replied = {a.key for a in model.attempts if a.status == "replied"}
    for kind in KINDS:
        problems += [f"{key} replied and the {kind} exports it" for key in model.exports(kind) if key in replied]
    return problems


def checkpoints_name_held_attempts(model: Model) -> list[str]:
    """Every checkpoint (committed or incomplete) exports only attempts its snapshot holds, and never a replied,
    retired or dead one (its scope was what ran or waited to continue)."""
    problems = []
    for checkpoint in (*model.committed, *model.incomplete):
        held = {a.key: a for a in checkpoint.snapshot}
        for key in checkpoint.exported:
            if key not in held:
                problems.append(f"{checkpoint.checkpoint_id} exports {key}, which its snapshot does not hold")
            elif held[key].status not in ("running", "pending"):
                problems.append(f"{checkpoint.checkpoint_id} exports {key}, which was {held[key].status}")
    return problems


def one_live_attempt_per_rollout(model: Model) -> list[str]:
    """A rollout's attempts are numbered upward in the order they were made, capture keys are unique, and only its
    latest attempt may run or wait to continue (an earlier one replied, was retired, or died in a crash)."""
    problems = []
    keys = [a.key for a in model.attempts]
    problems += [f"capture key {key} names two attempts" for key in sorted({k for k in keys if keys.count(k) > 1})]
    latest = model.current()
    last_number: dict[str, int] = {}
    for attempt in model.attempts:
        if attempt.attempt <= last_number.get(attempt.rollout, -1):
            problems.append(f"{attempt.key} comes after attempt {last_number[attempt.rollout]} of {attempt.rollout}")
        last_number[attempt.rollout] = attempt.attempt
        if attempt is not latest[attempt.rollout] and attempt.status in ("running", "pending"):
            problems.append(f"{attempt.key} is {attempt.status} though a later attempt of {attempt.rollout} exists")
    return problems


def calls_add_up(model: Model) -> list[str]:
    """Each attempt has at most one call outstanding, never more calls than its script has left, and a held
    response only on a running attempt with a call outstanding while a checkpoint is open."""
    problems = []
    for a in model.attempts:
        if not 0 <= a.calls_made - a.delivered <= 1:
            problems.append(f"{a.key} made {a.calls_made} calls and got {a.delivered} responses")
        if a.start_call + a.calls_made > len(a.script):
            problems.append(f"{a.key} made more calls than its script has ({a.start_call} + {a.calls_made})")
        if a.held and not (a.status == "running" and a.calls_made > a.delivered and model.checkpoint_open):
            problems.append(f"{a.key} has a held response while {a.status}, with no checkpoint open or no call out")
    return problems


def phase_names_the_open_checkpoint(model: Model) -> list[str]:
    """A checkpoint is open exactly when the phase is not idle."""
    if (model.phase == "idle") != (model.open_checkpoint is None):
        return [f"phase {model.phase} with open checkpoint {model.open_checkpoint!r}"]
    return []


def within_capacity(model: Model) -> list[str]:
    """No more rollouts live than the controller dispatches at once."""
    live = model.live()
    if len(live) > model.rollouts_max:
        return [f"{len(live)} rollouts live ({sorted(a.key for a in live)}), at most {model.rollouts_max}"]
    return []


def retired_attempts_marked(model: Model) -> list[str]:
    """Every retired attempt whose late `/run` the model remembers is covered by its rollout's retire mark, and the
    restored-pending report names only attempts still waiting to continue."""
    marks = dict(model.retired_marks)
    problems = [
        f"{a.key} is remembered as retired, but the mark of {a.rollout} is {marks.get(a.rollout)}"
        for a in model.retired_attempts
        if marks.get(a.rollout, -1) < a.attempt
    ]
    pending = {a.key for a in model.with_status("pending")}
    problems += [
        f"{key} is reported restored-pending but is not pending"
        for key in model.restored_pending_reported
        if key not in pending
    ]
    return problems


def drained(model: Model) -> Model:
    """The model after the controller's drain at the end of an example (`CheckpointMachine._drain`, rule by rule):
    resume; after a crash, restore the latest checkpoint if it continues something (forgetting the marks that
    would refuse it first); start every restored and every lost rollout; release every waiting call until none
    waits; forget every mark."""
    if model.checkpoint_open:
        model = model.resume()
    if model.can_restore() and model.committed[-1].exported:
        latest = model.committed[-1].checkpoint_id
        covered = model.marks_covering(latest)
        if covered:
            model = model.forget(tuple(covered))
        model, _ = model.restore(latest)
    for attempt in model.with_status("pending"):
        model = model.start_replacement(attempt.rollout)
    for attempt in model.with_status("dead"):
        model = model.start_over(attempt.rollout)
    for _ in range(DRAIN_ROUNDS_MAX):
        if not model.waiting():
            break
        for rollout in model.waiting():
            model = model.release(rollout)
    if model.retired_marks:
        model = model.forget(model.marked_rollouts())
    return model


def drain_reaches_a_clean_end(model: Model) -> list[str]:
    """Liveness: from this state the drain ends with no checkpoint open, every rollout replied or retired, no call
    waiting and no mark left."""
    try:
        end = drained(model)
    except (AssertionError, ValueError, KeyError, IndexError) as error:
        return [f"the drain fails: {type(error).__name__}: {error}"]
    problems = []
    if end.checkpoint_open:
        problems.append(f"a checkpoint is still open ({end.open_checkpoint})")
    unfinished = [a.key for a in end.current().values() if a.status not in ("replied", "retired")]
    if unfinished:
        problems.append(f"the drain leaves {sorted(unfinished)} unfinished")
    if end.retired_marks:
        problems.append(f"the drain leaves the marks {end.retired_marks}")
    return problems


INVARIANTS: Mapping[str, Invariant] = {
    invariant.__name__: invariant
    for invariant in (
        replied_means_finished,
        checkpoints_name_held_attempts,
        one_live_attempt_per_rollout,
        calls_add_up,
        phase_names_the_open_checkpoint,
        within_capacity,
        retired_attempts_marked,
        drain_reaches_a_clean_end,
    )
}
