"""The abstract state of a `Model`: what the explorer counts once and a run's transition coverage names.

Two models that differ only in bookkeeping the contract never branches on are one abstract state: the calls sent
so far (`sent`, what the backend must have recorded, checked against the real system, not a choice), the counters
that number the next rollout, checkpoint, `/run` and retire (`rollout_seq`, `checkpoint_seq`, `runs_sent`,
`control_seq`), each attempt's `/run` number and its script (the topology's), and which participants published
their share of an incomplete checkpoint (only its refusal's words depend on it). Names are renamed by order of
appearance, rollouts `R0`, `R1`, ... and checkpoints `C0`, `C1`, ... (a restore's ID keeps the checkpoint it
restored: `C0-restore.C2`), so two states that are the same up to the names they were given count once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Hashable
from typing import Any

from ckpt_model.model.contract import Attempt, Checkpoint, Model

# A capture key: a rollout, with `-a<N>` after attempt 0.
_KEY = re.compile(r"^(?P<rollout>.+?)(?P<attempt>-a[1-9][0-9]*)?$")
AbstractState = Hashable
# The explorer's default bounds: rule steps from a fresh example, and rollouts live at once (as the checker's own
# runs keep: depth 6 is enumerable in under a minute on 2 cores, docs/explore.md).
EXPLORED_DEPTH = 6
EXPLORED_ROLLOUTS = 3
# The depth a `check` run's transition coverage is reckoned to (`check --transition-depth`).
COVERAGE_DEPTH = 5
# Attempt statuses that a restore brings back as work: running or waiting to continue, or lost and started over.
_CONTINUABLE = ("running", "pending", "dead")


class _Names:
    """Rollout and checkpoint names, renamed by the order the traversal meets them."""

    def __init__(self) -> None:
        self.rollouts: dict[str, str] = {}
        self.checkpoints: dict[str, str] = {}

    def rollout(self, name: str) -> str:
        return self.rollouts.setdefault(name, f"R{len(self.rollouts)}")

    def key(self, key: str) -> str:
        match = _KEY.match(key)
        assert match is not None
        return self.rollout(match["rollout"]) + (match["attempt"] or "")

    def checkpoint(self, name: str | None) -> str | None:
        if name is None:
            return None
        restored, is_restore, _ = name.rpartition("-restore")
        if is_restore:
            return f"{self.checkpoint(restored)}-restore.{self._renamed(name)}"
        return self._renamed(name)

    def _renamed(self, name: str) -> str:
        return self.checkpoints.setdefault(name, f"C{len(self.checkpoints)}")


def abstract(model: Model) -> AbstractState:
    """The model's abstract state: a tuple two models share exactly when the contract's rules cannot tell them
    apart (see the module)."""
    names = _Names()
    kept = _rollouts_that_matter(model)
    current = tuple(_attempt(a, names) for a in model.current().values() if a.rollout in kept)
    return (
        model.topology,
        model.verify_mode,
        model.rollouts_max,
        current,
        model.phase,
        names.checkpoint(model.open_checkpoint),
        tuple(_checkpoint(checkpoint, names) for checkpoint in model.committed),
        tuple(_checkpoint(checkpoint, names) for checkpoint in model.incomplete),
        bool(model.resumed),
        _last_restored(model, names),
        _retire_marks(model, names),
        model.fresh,
        tuple(sorted(names.key(key) for key in model.restored_pending_reported)),
        tuple(sorted((r.kind, _marks(r.marks, names)) for r in model.restarted)),
        tuple(names.rollout(rollout) for rollout in model.late_runs()),
        tuple(sorted(_attempt(a, names) for a in model.retired_attempts)),
    )


def _rollouts_that_matter(model: Model) -> set[str]:
    """The rollouts a rule can still act on or a restore can bring back: live, in a checkpoint's snapshot, marked
    or remembered as retired. A rollout that replied (or was retired and forgotten) and that no checkpoint holds
    is done: nothing the controller does can touch it again."""
    matter = {a.rollout for a in model.live()}
    for checkpoint in (*model.committed, *model.incomplete):
        matter |= {a.rollout for a in checkpoint.snapshot if a.status in _CONTINUABLE}
    matter |= {rollout for rollout, _ in model.retired_marks}
    matter |= {a.rollout for a in model.retired_attempts}
    for restarted in model.restarted:
        matter |= {rollout for rollout, _ in restarted.marks}
    return matter


def _last_restored(model: Model, names: _Names) -> str | None:
    """The checkpoint a second restore of the same one would pick (`Model.last_restored`), renamed."""
    index = model.last_restored()
    return None if index is None else names.checkpoint(model.committed[index].checkpoint_id)


def _attempt(attempt: Attempt, names: _Names) -> tuple[Any, ...]:
    return (
        names.rollout(attempt.rollout),
        attempt.attempt,
        attempt.status,
        attempt.start_call,
        attempt.calls_made,
        attempt.delivered,
        attempt.held,
        attempt.continued,
        attempt.restart,
    )


def _checkpoint(checkpoint: Checkpoint, names: _Names) -> tuple[Any, ...]:
    """What a restore of it brings back: its ID, and the attempts of its snapshot that run again (a replied or
    retired one comes back finished)."""
    return (
        names.checkpoint(checkpoint.checkpoint_id),
        tuple(_attempt(a, names) for a in checkpoint.snapshot if a.status in _CONTINUABLE),
        tuple(sorted(names.key(key) for key in checkpoint.exported)),
    )


def _retire_marks(model: Model, names: _Names) -> tuple[tuple[str, int], ...]:
    """The retire marks, renamed. The rollouts the state holds only by their marks, or by a retired attempt, are
    named first, before any is met in the marks (which are kept sorted by the real names): the retired attempts in
    the order they were retired, then the rest by what their marks hold. Two rollouts that tie there are
    interchangeable, so the state is the same whichever is named first, and no renaming of the rollouts changes
    the abstract state."""
    for attempt in model.retired_attempts:
        names.rollout(attempt.rollout)
    marked = {rollout for rollout, _ in model.retired_marks}
    for restarted in model.restarted:
        marked |= {rollout for rollout, _ in restarted.marks}
    marks = dict(model.retired_marks)

    def held(rollout: str) -> tuple[Any, ...]:
        kept_by = sorted((r.kind, dict(r.marks).get(rollout, -1)) for r in model.restarted)
        return (marks.get(rollout, -1), tuple(kept_by))

    for rollout in sorted((r for r in marked if r not in names.rollouts), key=held):
        names.rollout(rollout)
    return _marks(model.retired_marks, names)


def _marks(marks: tuple[tuple[str, int], ...], names: _Names) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((names.rollout(rollout), attempt) for rollout, attempt in marks))


def digest(state: AbstractState) -> str:
    """A short stable name of an abstract state (what a run's executed transitions and `--json` hold)."""
    return hashlib.blake2b(repr(state).encode(), digest_size=8).hexdigest()


def state_digest(model: Model) -> str:
    """The digest of the model's abstract state."""
    return digest(abstract(model))
