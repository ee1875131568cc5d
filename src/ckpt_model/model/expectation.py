"""What the model predicts the system shows once it is quiet: `expect(model)`, derived from the pure model
(`ckpt_model.model.contract`), with each capture key's backend calls, the calls that wait, and each participant's
phase and counts. The settle (`ckpt_model.trainer.quiescence`) waits until its observations agree with it, and the
properties judge what differs.
"""

from __future__ import annotations

import attrs

from ckpt_model.model.contract import Model, ScriptCall


@attrs.frozen
class Expectation:
    """What the system must show once quiet: derived from the model, compared with observations."""

    calls: dict[str, tuple[ScriptCall, ...]]
    waiting: frozenset[str]
    phase: str
    checkpoint_id: str | None
    held: int
    inflight: int
    episodes: int
    sessions: int
    restored_pending: tuple[str, ...]
    retired_rollouts: int
    resources_sessions: int = 0
    # The mixed topology's restart environment and restart_only resources server count only restarts.
    restart_episodes: int = 0
    restart_sessions: int = 0
    accepting: bool = True
    # Participants restarted alone since the last crash hold fewer marks: (kind, count) for each of them.
    retired_by_kind: tuple[tuple[str, int], ...] = ()

    def retired_for(self, kind: str | None) -> int:
        return dict(self.retired_by_kind).get(kind or "", self.retired_rollouts)


def expect(model: Model) -> Expectation:
    """The quiescent state `model` predicts."""
    calls: dict[str, tuple[ScriptCall, ...]] = {}
    for key, messages in model.sent:
        calls[key] = (*calls.get(key, ()), messages)
    current = model.current().values()
    running = [a for a in current if a.status == "running"]
    owner_is_environment = model.episode_owner == "environment"
    return Expectation(
        calls=calls,
        waiting=frozenset(a.key for a in running if a.waiting),
        phase=model.phase,
        checkpoint_id=model.open_checkpoint,
        held=sum(1 for a in running if a.held),
        inflight=sum(1 for a in running if not a.verifying and not a.at_return),
        episodes=sum(1 for a in running if not a.restart) if owner_is_environment else 0,
        sessions=sum(1 for a in current if a.needs_agent),
        restored_pending=tuple(sorted(model.restored_pending_reported)) if owner_is_environment else (),
        retired_rollouts=len(model.retired_marks),
        resources_sessions=sum(1 for a in current if not a.restart and a.holds_resources_session(model.topology)),
        restart_episodes=sum(1 for a in running if a.restart),
        restart_sessions=sum(1 for a in current if a.restart and a.holds_resources_session(model.topology)),
        accepting=not model.checkpoint_open,
        retired_by_kind=tuple((r.kind, len(r.marks)) for r in model.restarted),
    )
