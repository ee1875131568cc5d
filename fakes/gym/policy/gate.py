"""The admission gate of one serving process of the policy model (reference 7.1): tickets, holds, restored cuts.

Generation calls wait here while admission is closed, replies are held until it opens, and retire cancels the
covered calls. `fakes.gym.policy.model` serves calls through it; token capture (`fakes.gym.policy.capture`) reads its
tickets.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from pydantic import ValidationError

from fakes.gym.control.retired import covers
from fakes.gym.protocol.errors import InvalidRolloutIdError, StaleAttemptError
from fakes.gym.protocol.wire import EpisodeId

CUT_COUNTS = ("cut", "cut_failed", "cut_skipped")


def episode_of(capture_key: str | None) -> EpisodeId | None:
    """The attempt a call belongs to; None for untagged calls (evals, judges, probes)."""
    if capture_key is None:
        return None
    try:
        return EpisodeId.from_capture_key(capture_key)
    except ValidationError as exc:
        problems = "; ".join(error["msg"] for error in exc.errors())
        raise InvalidRolloutIdError(
            f"'/ng-rollout/<capture_key>' must name an episode (got {capture_key!r}: {problems}); "
            "send the capture key of the rollout attempt, or call /v1/chat/completions untagged"
        ) from None


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@attrs.define(eq=False)
class Ticket:
    """One admitted generation call; counted in flight until its handler exits."""

    ticket_id: int
    capture_key: str
    episode_id: EpisodeId | None
    admitted_at: float
    work: asyncio.Future[Any] | None = None
    held: bool = False
    retired: bool = False
    # Token capture: the call's identity and conversation, where it is, and the cuts that froze its prefix.
    model_call_id: str | None = None
    parent_call_id: str | None = None
    request_digest: str = ""
    cuttable: bool = False
    at_backend: bool = False
    delivered: bool = False
    cuts: list[dict[str, Any]] = attrs.Factory(list)
    claimed_cut: bool = False

    def stale(self, when: str) -> StaleAttemptError:
        return StaleAttemptError(
            f"attempt {self.capture_key!r} was retired {when}; its generation was cancelled and not delivered"
        )


@attrs.define(eq=False)
class RestoredCut:
    """A restored generation cut; `claimed_by` is the ticket whose call carries it until delivery."""

    record: dict[str, Any]
    claimed_by: int | None = None


class PolicyGate:
    """Admission and delivery of generation calls in one process; `changed()` wakes every wait on it."""

    def __init__(
        self,
        *,
        holds_responses: bool,
        is_retired: Callable[[EpisodeId], bool],
        notify: Callable[[], None],
    ) -> None:
        self.holds_responses = holds_responses
        self.is_retired = is_retired
        self.notify = notify
        self.open = True
        self.served = False
        self.tickets: dict[int, Ticket] = {}
        # Kept as a count: the readiness wait reads it after every change, with thousands of calls in flight.
        self.held = 0
        self.restored_targets: set[str] = set()
        # Next-attempt capture key -> a restored cut its first matching call continues (kept until delivered).
        self.restored_cuts: dict[str, RestoredCut] = {}
        # The current checkpoint's cut round; cleared when admission opens.
        self.cut_counts = dict.fromkeys(CUT_COUNTS, 0)
        self._ticket_ids = itertools.count()
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Wake the gate's own waits and the control plane's readiness wait."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        self.notify()

    def set_open(self, open_: bool) -> None:
        self.open = open_
        self.changed()

    async def admit(self, capture_key: str | None) -> Ticket:
        """Refuse invalid keys and retired attempts; wait (uncounted) while closed, re-checking retirement."""
        episode_id = episode_of(capture_key)
        while True:
            if episode_id is not None and self.is_retired(episode_id):
                raise StaleAttemptError(
                    f"attempt {capture_key!r} is retired; run a later attempt, or forget the rollout first"
                )
            if self.open:
                break
            await self._changed.wait()
        ticket = Ticket(next(self._ticket_ids), capture_key or "", episode_id, time.time())
        self.tickets[ticket.ticket_id] = ticket
        self.served = True
        self.restored_targets.discard(ticket.capture_key)
        self.changed()
        return ticket

    async def run(self, ticket: Ticket, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run the backend call as its own task, so retire can cancel it without cancelling the handler."""
        if ticket.retired:
            raise ticket.stale("before it reached the backend")
        ticket.work = asyncio.ensure_future(call())
        ticket.at_backend = True
        try:
            return await ticket.work
        except asyncio.CancelledError:
            if ticket.retired and not _being_cancelled():
                raise ticket.stale("while it generated") from None
            raise
        finally:
            ticket.at_backend = False

    async def deliver(self, ticket: Ticket) -> None:
        """Hold the reply while the gate is closed; the planted fault delivers it anyway."""
        try:
            while self.holds_responses and not self.open and not ticket.retired:
                if not ticket.held:
                    ticket.held = True
                    self.held += 1
                    self.changed()
                await self._changed.wait()
        finally:
            if ticket.held:
                ticket.held = False
                self.held -= 1
                self.changed()
        if ticket.retired:
            raise ticket.stale("while its reply was held")
        ticket.delivered = True
        if ticket.claimed_cut:
            # The continuation reached its episode: the cut is used up.
            self.restored_cuts.pop(ticket.capture_key, None)

    def exit(self, ticket: Ticket) -> None:
        del self.tickets[ticket.ticket_id]
        restored = self.restored_cuts.get(ticket.capture_key)
        if ticket.claimed_cut and not ticket.delivered and restored is not None:
            restored.claimed_by = None  # the call failed before delivery: the next matching call may use the cut
        self.changed()

    def claim_cut(self, ticket: Ticket) -> dict[str, Any] | None:
        """The continuation of the key's restored cut, if unclaimed and cut from this very conversation."""
        restored = self.restored_cuts.get(ticket.capture_key)
        if restored is None or restored.claimed_by is not None:
            return None
        if restored.record["request_digest"] != ticket.request_digest:
            return None
        restored.claimed_by = ticket.ticket_id
        ticket.claimed_cut = True
        continuation: dict[str, Any] = restored.record["continuation"]
        return continuation

    def restore_cuts(self, cuts: dict[str, dict[str, Any]]) -> None:
        self.restored_cuts = {key: RestoredCut(record) for key, record in cuts.items()}

    def undelivered_call_ids(self) -> set[str]:
        return {t.model_call_id for t in self.tickets.values() if t.model_call_id is not None and not t.delivered}

    def episode_cuts(self, capture_key: str) -> list[dict[str, Any]]:
        """The cuts of the latest-admitted call of the key that has any, else the key's unconsumed restored cut."""
        cut_tickets = [t for t in self.tickets.values() if t.capture_key == capture_key and t.cuts]
        if cut_tickets:
            return list(max(cut_tickets, key=lambda ticket: ticket.ticket_id).cuts)
        restored = self.restored_cuts.get(capture_key)
        return [] if restored is None else [restored.record]

    def clear_cuts(self, *, per_ticket: bool) -> None:
        self.cut_counts = dict.fromkeys(CUT_COUNTS, 0)
        if per_ticket:
            for ticket in self.tickets.values():
                ticket.cuts.clear()

    async def retire(self, episode_ids: list[EpisodeId]) -> None:
        """Wake waiting calls (their marks refuse them), cancel covered admitted calls, wait until gone."""
        covered = covers(episode_ids)
        victims = [t for t in self.tickets.values() if t.episode_id is not None and covered(t.episode_id)]
        for ticket in victims:
            ticket.retired = True
            if ticket.work is not None:
                ticket.work.cancel()
        self.restored_targets = {key for key in self.restored_targets if not covered(EpisodeId.from_capture_key(key))}
        self.restored_cuts = {
            key: cut for key, cut in self.restored_cuts.items() if not covered(EpisodeId.from_capture_key(key))
        }
        self.changed()
        while any(ticket.ticket_id in self.tickets for ticket in victims):
            await self._changed.wait()
