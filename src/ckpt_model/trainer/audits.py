"""Audits: the checks of replies and of the disk beside the controller, and what each step re-reads.

After a prepare: prepared everywhere, or blocked by exactly the `wait` verifications (P10, P11), and the restarts
reported (P1). After a probe: refused by every participant with the code the protocol gives (P10; a commit naming
a restart, P1). After a commit: every participant's reply and records name exactly its share (P1), the checkpoint
verifies (P9), the resources records hold the state the checker computes (P6); a commit whose write failed on one
participant is refused by it alone and publishes nothing there (P16). After a restore: the resources participant
installed its sessions (P6); a refused restore is P9, or P8 when the model says who must refuse it. After every
step: the history's P2, the ledgers' P5 and P12, a re-read of every committed checkpoint, which must never change
(P9; read in full only when a file changed), and the telemetry files' new lines against the controller's calls
(P26). At the end: P5 over every ledger, P13 and P26. The audits judge with the properties' named functions; they
hold only what they must compare later (each committed checkpoint's fingerprints).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_model import timing
from ckpt_model.deployments.observe import Observes, observe
from ckpt_model.errors import CoordinationError, ParticipantFailure
from ckpt_model.model.contract import Attempt, Model
from ckpt_model.model.lineage import next_key
from ckpt_model.model.outcome import Identity, Outcome, ledger_chain, normalised
from ckpt_model.properties.continuation import p2_no_reply_while_prepared, p14_resumed_equals_uninterrupted
from ckpt_model.properties.durability import (
    p9_restores,
    p9_unchanged,
    p9_verifies,
    p16_no_manifest,
    p16_retry_commits,
    p16_still_prepared,
    p16_write_refused,
)
from ckpt_model.properties.fencing import (
    p10_each_refused,
    p10_prepared_despite_hung_cut,
    p10_prepared_everywhere,
    p10_reply_phase,
)
from ckpt_model.properties.identifiers import (
    p15_capture_keys_unique,
    p15_manifest_names_share,
    p15_restore_names_source,
    p15_restored_next_attempts,
)
from ckpt_model.properties.scope import (
    p1_exports_exact,
    p1_replied_or_exported,
    p1_restart_in_scope_refused,
    p1_restarts_reported,
)
from ckpt_model.properties.state import (
    p6_exported_state,
    p6_restored,
    p8_not_refused,
    p8_refused_by,
    p13_clean_end,
    record_key,
)
from ckpt_model.properties.verification import p11_blocked, p11_prepared_once_verified
from ckpt_model.protocol.client import Participant
from ckpt_model.protocol.history import History
from ckpt_model.protocol.ledger import LedgerRow, Manifest
from ckpt_model.protocol.storage import (
    MANIFEST_NAME,
    CheckpointUnreadable,
    Fingerprint,
    FingerprintCache,
    participant_dir,
    read_records,
)
from ckpt_model.protocol.wire import EpisodeId
from ckpt_model.trainer.controller import Prepared
from ckpt_model.trainer.ledger_watch import LedgerWatch
from ckpt_model.trainer.runs import RunPool
from ckpt_model.trainer.telemetry_watch import TelemetryWatch
from ckpt_model.trainer.twin import Twins


class Audits:
    """Judges each operation's replies and what it left on disk; re-reads the committed checkpoints every step."""

    def __init__(self, harness: Observes, ledgers: LedgerWatch, runs: RunPool, twins: Twins) -> None:
        self.harness = harness
        self.ledgers = ledgers
        self.runs = runs
        self.twins = twins
        # P14: per `/run` that replied, its ledger's rows when the reply came in (token capture).
        self.replied_rows: dict[int, tuple[LedgerRow, ...] | None] = {}
        self.fingerprints: dict[str, dict[str, Any]] = {}
        # P9 reads every committed directory after every step: in full only when a file changed.
        self.cache = FingerprintCache(harness.checkpoint_dir.parent)
        # P26: the deployment's spans and metrics against the controller's calls (a deployment that exports them).
        self.telemetry = TelemetryWatch(harness)

    @property
    def members(self) -> list[Participant]:
        return list(self.harness.control.participants)  # type: ignore[union-attr]

    # -- after an operation -----------------------------------------------------------------------------------

    def commit(self, model: Model, checkpoint_id: str, replies: Mapping[str, Any]) -> None:
        """P1 on every participant's reply and records, P9 (the checkpoint verifies) and P6 (exported state)."""
        owner = model.episode_owner
        replied = [a.key for a in model.with_status("replied")]
        scope = [a.key for a in model.scope()]
        p1_replied_or_exported(checkpoint_id, scope, replied, replies[owner]["episode_ids"], owner)
        p10_reply_phase("commit", checkpoint_id, "committed", replies)
        read = self.read(checkpoint_id)
        p9_verifies(checkpoint_id, read)
        self.shares(model, checkpoint_id, self.members, replies, read)
        self.exported_state(model, checkpoint_id)
        self.fingerprints[checkpoint_id] = read

    def partial_commit(self, model: Model, checkpoint_id: str, names: list[str], replies: Mapping[str, Any]) -> None:
        """A commit that reached only `names` before a crash: each replied with and wrote exactly its share (P1),
        which verifies (P9)."""
        read = self.read(checkpoint_id)
        p9_verifies(checkpoint_id, {name: read[name] for name in names})
        self.shares(model, checkpoint_id, [m for m in self.members if m.name in names], replies, read)

    def published_after_crash(self, checkpoint_id: str) -> frozenset[str]:
        """After a crash inside a commit, every share whose manifest was published verifies in full (P9: the
        manifest is the commit point, published only once the records are durable); returns who published."""
        read = self.read(checkpoint_id)
        published = [m.name for m in self.members if self.has_manifest(checkpoint_id, m.name)]
        p9_verifies(checkpoint_id, {name: read[name] for name in published})
        return frozenset(published)

    def has_manifest(self, checkpoint_id: str, name: str) -> bool:
        """Whether participant `name` published its share of `checkpoint_id` (its manifest is there)."""
        member = next(m for m in self.members if m.name == name)
        directory = self.harness.checkpoint_dir / checkpoint_id
        return (participant_dir(directory, member.kind, member.name) / MANIFEST_NAME).exists()

    def shares(
        self,
        model: Model,
        checkpoint_id: str,
        members: Iterable[Participant],
        replies: Mapping[str, Any],
        read: Mapping[str, Any],
    ) -> None:
        """P1: each member's commit reply and records on disk name exactly what the model says it writes. With
        token capture the policy model writes the scoped attempts with ledger rows or a cut (P5 judged them). P15:
        across every member's records, no capture key names two (rollout ID, attempt) pairs."""
        members = list(members)
        pairs = [pair for member in members for pair in read[member.name].episodes]
        p15_capture_keys_unique(f"the records of {checkpoint_id}", pairs)
        for member in members:
            expected = (
                self.ledgers.exported_keys(checkpoint_id)
                if member.kind == "model"
                else model.exports(member.kind, member.name)
            )
            p1_exports_exact(
                checkpoint_id,
                member.name,
                expected,
                replies[member.name]["episode_ids"],
                read[member.name].episode_ids,
                optional=model.may_also_export(member.kind),
            )
            manifest = replies[member.name]["manifest"]
            p15_manifest_names_share(checkpoint_id, member.name, member.kind, manifest, read[member.name])

    def exported_state(self, model: Model, checkpoint_id: str) -> None:
        """P6 at a commit: each resources record holds the state the checker computes for its attempt."""
        scoped = {a.key: a for a in model.scope()}
        for member in self._resources():
            expected = {
                key: self.harness.spec.traits.resources_state(scoped[key].tool_rounds)
                for key in model.exports("resources", member.name)
            }
            records = self._resources_records(self.harness.checkpoint_dir / checkpoint_id, checkpoint_id, member.name)
            p6_exported_state(checkpoint_id, member.name, expected, records)

    def restored(self, source: str, restore_id: str, exported: tuple[str, ...], replies: Mapping[str, Any]) -> None:
        """P6 at a restore: the resources participant installed the sessions of its in-scope records (read with the
        checker's own reader), under their next attempts: its reply names them, and its status counts them. P10
        and P15: every reply says restored, names the source, and names the next attempts of its records."""
        p10_reply_phase("restore", restore_id, "restored", replies)
        p15_restore_names_source(restore_id, source, replies)
        self.restored_keys(source, restore_id, exported, replies)
        directory = self.harness.checkpoint_dir / source
        for member in self._resources():
            records = self._resources_records(directory, source, member.name)
            keys = [record_key(record) for record in records]
            expected = [EpisodeId.from_capture_key(key).next_attempt().capture_key for key in keys if key in exported]
            sessions = self.harness.control.status(member)["report"]["counts"].get("sessions")  # type: ignore[union-attr]
            p6_restored(restore_id, member.name, expected, replies[member.name].get("restored"), sessions)

    def restored_keys(
        self, source: str, restore_id: str, exported: tuple[str, ...], replies: Mapping[str, Any]
    ) -> None:
        """P15: the environment and the agent restore the next attempts of their in-scope records on disk. The
        policy model installs a record, maybe empty, for every scoped attempt (its rows are P5's); the resources
        participant's restored sessions are P6's (`p6_restored`, which also counts them in its status)."""
        shares = self.fingerprints.get(source, {})
        for member in self.members:
            share = shares.get(member.name)
            if member.kind in ("model", "resources") or not isinstance(share, Fingerprint):
                continue
            expected = [next_key(key) for key in share.episode_ids if key in exported]
            p15_restored_next_attempts(restore_id, member.name, expected, replies[member.name].get("restored"))

    # -- a prepare's outcome ----------------------------------------------------------------------------------

    def prepared(self, model: Model, checkpoint_id: str, replies: Mapping[str, Any]) -> None:
        """P1 at a prepare: the restart servers report exactly the running restarts, and nobody reports another."""
        p1_restarts_reported(checkpoint_id, model.restarts(), replies)

    def prepared_everywhere(self, checkpoint_id: str, verifying: Sequence[str], outcome: Prepared) -> None:
        """A prepare the model says must succeed became prepared everywhere (P10; an attempt in a `replay`
        verification, among `verifying`, never blocks: P11)."""
        p10_prepared_everywhere(checkpoint_id, outcome.prepared, outcome.blockers, verifying, outcome.waited_s)

    def hung_cut_refused(self, checkpoint_id: str, deadline_s: float, error: CoordinationError) -> None:
        """A prepare whose generation cut hangs must still be prepared within `deadline_s` (P10): its refusal."""
        p10_prepared_despite_hung_cut(checkpoint_id, deadline_s, error)

    def blocked(self, model: Model, checkpoint_id: str, blockers: Sequence[str], outcome: Prepared) -> None:
        """P11: a short prepare meeting `wait` verifications ends blocked by exactly them, at the episode owner."""
        p11_blocked(checkpoint_id, model.episode_owner, blockers, outcome.prepared, outcome.blockers)

    def prepared_once_verified(self, checkpoint_id: str, verified: Sequence[str], outcome: Prepared) -> None:
        """P11: a prepare that waited for `wait` verifications is prepared once they finished."""
        p11_prepared_once_verified(checkpoint_id, verified, outcome.prepared, outcome.blockers)

    # -- probes and refusals ----------------------------------------------------------------------------------

    def refused(self, what: str, code: str, outcomes: Mapping[str, Any]) -> None:
        """P10: every participant, asked on its own (`what`: the call, in words), refused it with `code`."""
        p10_each_refused(what, code, outcomes)

    def restart_in_scope_refused(self, checkpoint_id: str, outcomes: Mapping[str, Any]) -> None:
        """P1: a commit naming a reported restart is refused with restart_in_scope by each participant asked."""
        p1_restart_in_scope_refused(checkpoint_id, outcomes)

    def restore_refused(self, source: str, restore_id: str, error: CoordinationError) -> None:
        """P9: a committed checkpoint restores into fresh processes; `error`, its restore's refusal."""
        p9_restores(source, restore_id, error)

    def refused_restore(
        self,
        restore_id: str,
        refusers: Collection[str],
        why: str,
        code: str,
        error: CoordinationError | None,
    ) -> None:
        """P8: a restore that exactly `refusers` cannot install (`why`) is refused by them alone, with `code`, and
        the controller's cleanup succeeds (`error`: the restore's refusal, None if every participant installed)."""
        if error is None:
            p8_not_refused(restore_id, refusers, why)
            return
        p8_refused_by(restore_id, refusers, why, error.failures, getattr(error, "__notes__", []), code)

    # -- a write that fails on one participant (P16) ----------------------------------------------------------

    def write_refused(
        self, checkpoint_id: str, victim: str, fault: str, how: str, refusal: ParticipantFailure | None
    ) -> None:
        """The commit of `checkpoint_id` whose write met `fault` on `victim` (`how` it must be refused, a key of
        `WRITE_REFUSAL`): refused by `victim` alone (`refusal`, None if it committed), its share holds no manifest,
        and it is still prepared for a retry (its status, read now)."""
        p16_write_refused(checkpoint_id, victim, fault, how, {} if refusal is None else {victim: refusal})
        self.unpublished(checkpoint_id, victim, f"after its write met {fault}")
        p16_still_prepared(checkpoint_id, victim, self.harness.statuses()[victim])

    def unpublished(self, checkpoint_id: str, victim: str, when: str) -> None:
        """P16: `victim`'s share of `checkpoint_id` holds no manifest `when` its write failed or was stopped."""
        p16_no_manifest(checkpoint_id, victim, when, self.has_manifest(checkpoint_id, victim))

    def retried_commit_refused(self, checkpoint_id: str, fault: str, error: CoordinationError) -> None:
        """P16: the controller's retry of a commit whose write met `fault` commits everywhere; `error`, its
        refusal."""
        p16_retry_commits(checkpoint_id, fault, error)

    # -- after every step, and at the end ---------------------------------------------------------------------

    def after_step(self, model: Model, history: History) -> None:
        """P5 and P12 on the ledgers that changed, P2 on the history, P9: every committed checkpoint as it was; and
        the ledgers of the replies that came in, for P14."""
        self.ledgers.check(model.checkpoint_open)
        with timing.span("p2_history"):
            p2_no_reply_while_prepared(history)
        with timing.span("p9_reread"):
            for checkpoint_id, before in self.fingerprints.items():
                p9_unchanged(checkpoint_id, before, self.read(checkpoint_id))
        with timing.span("p14_ledgers"):
            self.ledgers_of_replies(model)
        self.telemetry.check()

    def at_end(self, model: Model) -> None:
        """Drained: P5 over every ledger and the token store, P13 (everything idle and empty), then P14."""
        self.ledgers.check(model.checkpoint_open, everything=True)
        p13_clean_end(observe(self.harness).statuses)
        self.telemetry.check()
        with timing.span("p14_twin"):
            self.as_uninterrupted(model)

    def as_uninterrupted(self, model: Model) -> None:
        """P14: every attempt the model says replied ended with the normalised outcome of its task's twin: its
        `/run` reply body and, with token capture, its ledger chain as it stood when the reply came in."""
        staged = self._staged() if self.replied_rows else {}
        for attempt in _replied(model):
            twin = self.twins.of(attempt.restart)
            outcome = self.runs.outcomes.get(attempt.run)
            if twin is None or outcome is None:
                continue
            rows = self.replied_rows.get(attempt.run)
            chain = ledger_chain(rows, staged) if rows is not None and twin.chain is not None else None
            expected = twin if chain is not None else Outcome(twin.body)
            identity = Identity(attempt.rollout, attempt.attempt, attempt.key, attempt.task)
            completed = Outcome(normalised(outcome.body, identity), chain)
            p14_resumed_equals_uninterrupted(attempt.key, expected, completed)

    def ledgers_of_replies(self, model: Model) -> None:
        """With token capture, the ledger rows of each attempt whose reply came in during this step, read before a
        later step can rewrite its ledger (a restore of an earlier checkpoint writes the next attempt's ledger
        again); None for a retired ledger (P5 judges whether it should be)."""
        if not self.harness.spec.token_capture:
            return
        for attempt in _replied(model):
            if attempt.run in self.replied_rows or attempt.run not in self.runs.outcomes:
                continue
            manifest = self.harness.ledger.manifest(attempt.key)
            self.replied_rows[attempt.run] = manifest.rows if isinstance(manifest, Manifest) else None

    def _staged(self) -> dict[str, Any]:
        return self.harness.backend.staged() if self.harness.backend is not None else {}

    # -- reading the disk -------------------------------------------------------------------------------------

    def read(self, checkpoint_id: str) -> dict[str, Any]:
        """Every participant's share of `checkpoint_id`, fingerprinted (or why it cannot be read)."""
        directory = self.harness.checkpoint_dir / checkpoint_id
        read: dict[str, Any] = {}
        with timing.span("fingerprint"):
            for member in self.members:
                try:
                    read[member.name] = self.cache.fingerprint(
                        participant_dir(directory, member.kind, member.name),
                        member.kind,
                        member.name,
                        checkpoint_id=checkpoint_id,
                    )
                except CheckpointUnreadable as error:
                    read[member.name] = error
        return read

    def _resources(self) -> list[Participant]:
        return [m for m in self.members if m.kind == "resources"]

    def _resources_records(self, directory: Path, checkpoint_id: str, name: str) -> list[Any]:
        with timing.span("fingerprint"):
            return read_records(
                participant_dir(directory, "resources", name), "resources", name, checkpoint_id=checkpoint_id
            )


def _replied(model: Model) -> list[Attempt]:
    """The attempts the model says replied, each with its `/run`."""
    return [a for a in model.attempts if a.status == "replied" and a.run >= 0]
