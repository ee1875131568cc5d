"""What a server plugs into the shared control plane: its readiness report and its checkpoint hooks.

The control plane (`fakes.gym.control.plane`) owns phases, fencing, idempotent replay, the lease, storage and the
retired marks; a participant owns only its live state. Keeping that split is what lets every server share one
implementation of the wire contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from fakes.gym.protocol.wire import BLOCKERS_SHOWN_MAX, EpisodeId

if TYPE_CHECKING:
    from fakes.gym.control.store import EncodedRecord


@attrs.frozen
class PrepareReport:
    """A participant's readiness: `ready` once nothing it owns would change under a commit."""

    ready: bool
    blockers: tuple[str, ...] = ()
    counts: dict[str, int] = attrs.field(factory=dict)
    restarts: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        blockers = sorted(self.blockers)
        return {
            "ready": self.ready,
            "blockers": blockers[:BLOCKERS_SHOWN_MAX],
            "blocker_count": len(blockers),
            "counts": dict(self.counts),
            "restarts": sorted(self.restarts),
        }


class Participant(Protocol):
    """Checkpoint hooks of one server. Every hook runs on the server's event loop."""

    kind: str

    def report(self) -> PrepareReport:
        """Current readiness; cheap, called after every change notification."""

    async def close_admission(self, deadline_ts: float | None) -> None:
        """Stop admitting new work and ask running work to park at its next boundary.

        `deadline_ts` is the prepare's deadline (the policy model cuts generations within it); None when a restore
        closes a fresh process, where nothing runs yet."""

    async def open_admission(self) -> None:
        """Admit again and wake parked work (resume, lease expiry, failed prepare or restore)."""

    async def export(self, scope: list[EpisodeId] | None) -> Sequence[dict[str, Any] | EncodedRecord]:
        """Records to write for a commit; each is a JSON object with an `episode_id` field, or one already encoded as
        its line of the records file (`store.EncodedRecord`)."""

    def validate_record(self, record: dict[str, Any]) -> None:
        """Raise `CheckpointStateError` if an in-scope record is not one this participant could install."""

    async def install(self, records: list[dict[str, Any]], scope: list[EpisodeId]) -> list[str]:
        """Install validated records under the next attempt; return the installed next-attempt capture keys.

        Raise `ControlError` (409 checkpoint_error) when the process already has live state."""

    async def delete_restored(self, keep: AbstractSet[str]) -> None:
        """Free restored-pending state whose next-attempt capture key is not in `keep` (commit cleanup)."""

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        """Stop, wait for and free every attempt covered (attempt <= given) of each rollout."""

    async def check_forget(self, rollout_ids: list[str]) -> None:
        """Raise if forgetting now would be unsafe (resources: a retired session is still unfreed)."""

    async def forget(self, rollout_ids: list[str]) -> None:
        """Drop what the participant keeps of retired rollouts beyond the marks (e.g. retired sessions)."""

    def status_extras(self) -> dict[str, Any]:
        """Kind-specific status fields (environment `restored_pending`, agent `accepting`, ...)."""


class ServerPlane(Protocol):
    """What a participant's data plane reads of its server: the retired marks, the phase, and whom to tell of a
    change. A single-process server's `ControlPlane` is one; a worker's
    `fakes.gym.servers.participant_workers.WorkerPlane` is another, so each role's routes are written once for both."""

    @property
    def retired(self) -> Any: ...

    @property
    def phase(self) -> str: ...

    def notify(self) -> None: ...


class LatePlane:
    """A `ServerPlane` bound after the participant is built: the control plane needs the participant first."""

    def __init__(self) -> None:
        self.target: ServerPlane | None = None

    def _bound(self) -> ServerPlane:
        assert self.target is not None, "the server binds its plane before it serves"
        return self.target

    @property
    def retired(self) -> Any:
        return self._bound().retired

    @property
    def phase(self) -> str:
        return self._bound().phase

    def notify(self) -> None:
        self._bound().notify()
