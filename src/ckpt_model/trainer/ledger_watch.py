"""P5 and P12 at the edges: keeps the checker's `Lineage` in step with the controller and reads the ledgers.

A watcher of the controller (`observe`): every journal event of what the controller did (an attempt started, a
prepare, a commit, a restore, a retire, the policy model died) moves the predicted lineage, so no rule can forget
one. After every step it learns the backend's captured calls and reads, with its own ledger client, every ledger
whose predicted rows changed since it last read it; at teardown it reads them all and the token store. Without
token capture every method does nothing; without generation cuts nothing is cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ckpt_model import timing
from ckpt_model.deployments.observe import Observes
from ckpt_model.model.lineage import (
    Lineage,
    next_key,
    p5_exported,
    p5_manifest,
    p5_no_strays,
    p5_parent_links,
    p5_staged,
    p5_stale_ledger_deleted,
    p12_continuations,
    p12_cut_round,
    p12_exported_cuts,
    p12_tokens,
)
from ckpt_model.properties.identifiers import (
    p15_admission_names_attempt,
    p15_ledger_identifiers,
    p15_model_call_ids_unique,
)
from ckpt_model.protocol.ledger import Manifest
from ckpt_model.protocol.storage import participant_dir, read_records
from ckpt_model.protocol.wire import EpisodeId
from ckpt_model.trainer.controller import Operation

_UNREAD = object()


class LedgerWatch:
    """The lineage the checker predicts, and what it last verified of each ledger."""

    def __init__(self, harness: Observes) -> None:
        self.harness = harness
        self.enabled = harness.spec.token_capture and harness.backend is not None
        self.cuts = self.enabled and harness.spec.generation_cuts
        self.lineage = Lineage()
        self.verified: dict[str, Any] = {}
        self._cut_rounds_before = 0

    # -- what the controller did ---------------------------------------------------------------------------

    def observe(self, operation: Operation) -> None:
        """Move the lineage by one journal event of the controller (`ckpt_model.trainer.controller.Watcher`)."""
        if not self.enabled:
            return
        reached_model = any(member.kind == "model" for member in operation.reached)
        event = (operation.f, operation.type)
        if event == ("run", "invoke"):
            assert operation.key is not None
            self.started(operation.key, operation.continues)
        elif event == ("prepare", "invoke"):
            self._cut_rounds_before = self.cut_rounds_before()
        elif event == ("prepare", "ok") and operation.cut is not None:
            assert operation.checkpoint_id is not None
            self.cut(operation.checkpoint_id, self._cut_rounds_before, durable=operation.cut == "durable")
        elif event == ("crash", "ok") and reached_model:
            self.model_died()
        elif event in (("commit", "ok"), ("commit", "fail")) and reached_model:
            # A failed commit that the policy model answered was still written by it (another refused).
            assert operation.checkpoint_id is not None
            assert operation.directory is not None
            self.committed(operation.checkpoint_id, operation.delivered, operation.directory)
        elif event == ("restore", "ok") and reached_model and operation.source is not None:
            self.restored(operation.source)
        elif event == ("restore", "fail") and operation.source is not None:
            # Gym's client cleaned up: it retired the next attempts of everything the restore would continue.
            self.burned(episode.capture_key for episode in operation.episodes)
        elif event == ("retire", "ok") and reached_model:
            self.retired(operation.episodes)

    def started(self, key: str, continues: bool = False) -> None:
        """An execution of `key` starts. A ledger of that key left from before is stale, and the controller
        deletes it first, as a trainer must before it runs the attempt: one it retired (a retired ledger takes no
        more calls), or, for an attempt that starts from its script's start (not `continues`), one holding rows of
        an execution or a restore the controller abandoned (a restore of an earlier checkpoint rolled the attempt
        numbers back, so the key comes round again: the fresh run must not append to those rows)."""
        if not self.enabled:
            return
        abandoned = not continues and (key in self.lineage.rows or key in self.lineage.writers)
        if key in self.lineage.retired or abandoned:
            p5_stale_ledger_deleted(key, self.harness.ledger.delete([key]))
            self.lineage = self.lineage.delete(key)
        self.lineage = self.lineage.start(key)

    def model_died(self) -> None:
        """The policy model server was killed: learn which replies had reached it first."""
        if self.enabled:
            self.lineage = self._learned().model_died()

    def cut_rounds_before(self) -> int:
        """How many cut rounds the backend answered so far (read before a prepare; 0 without cuts)."""
        return len(self.harness.backend.cuts()) if self.cuts else 0  # type: ignore[union-attr]

    def cut(self, checkpoint_id: str, rounds_before: int, durable: bool = True) -> None:
        """After a prepare: the backend answered one round cutting every call in flight (`durable`), or, its cut
        endpoint hung (not `durable`), none; P12."""
        if not self.cuts:
            return
        in_flight = self.lineage.in_flight() if durable else ()
        rounds = self.harness.backend.cuts()[rounds_before:]  # type: ignore[union-attr]
        p12_cut_round(checkpoint_id, in_flight, rounds, self.harness.spec.policy_workers)
        self.lineage = self.lineage.cut(durable)

    def committed(self, checkpoint_id: str, delivered: Mapping[str, int], directory: Path) -> None:
        """Record the chains and cuts the commit exports and check the model's records against them (P5, P12)."""
        self.lineage = self._learned().commit(checkpoint_id, delivered)
        chains = self.lineage.chains[checkpoint_id]
        records: list[Any] = []
        for member in self.harness.control.participants:  # type: ignore[union-attr]
            if member.kind == "model":
                with timing.span("fingerprint"):
                    records += read_records(
                        participant_dir(directory, "model", member.name),
                        "model",
                        member.name,
                        checkpoint_id=checkpoint_id,
                    )
        p5_exported(checkpoint_id, chains, records)
        cuts = self.lineage.exported_cuts[checkpoint_id]
        if self.cuts:
            p12_exported_cuts(checkpoint_id, cuts, records)

    def exported_keys(self, checkpoint_id: str) -> list[str]:
        """The capture keys the policy model must have written at a commit: those with rows or a cut (none
        without token capture)."""
        if not self.enabled or checkpoint_id not in self.lineage.chains:
            return []
        cuts = self.lineage.exported_cuts[checkpoint_id]
        return sorted(key for key, chain in self.lineage.chains[checkpoint_id].items() if chain or key in cuts)

    def restored(self, checkpoint_id: str) -> None:
        if self.enabled:
            self.lineage = self.lineage.restore(checkpoint_id)

    def retired(self, episodes: Iterable[EpisodeId]) -> None:
        if self.enabled:
            for episode in episodes:
                self.lineage = self.lineage.retire(episode.rollout_id, episode.attempt)

    def burned(self, exported: Iterable[str]) -> None:
        """A failed restore's cleanup retired the next attempts of everything it would have continued."""
        self.retired(EpisodeId.from_capture_key(next_key(key)) for key in exported)

    # -- checks --------------------------------------------------------------------------------------------

    def check(self, checkpoint_open: bool, everything: bool = False) -> None:
        """P5 and P12 after a step: captured calls link into their chains and continue what they must, and every
        ledger whose predicted rows changed (all of them, and the token store, when `everything`) holds exactly
        those rows. With admission open the last prepare's cuts are gone."""
        if not self.enabled:
            return
        with timing.span("p5_lineage"):
            calls = self.harness.backend.calls()  # type: ignore[union-attr]
            p15_model_call_ids_unique(calls)
            p15_admission_names_attempt(calls)
            self.lineage = self.lineage.learn(calls)
            if not checkpoint_open:
                self.lineage = self.lineage.opened()
            p5_no_strays(self.lineage.strays)
            p5_parent_links(self.lineage.expected_parents())
            p12_continuations(self.lineage.expected_continuations())
            staged = self.harness.backend.staged() if everything else None  # type: ignore[union-attr]
            if staged is not None:
                p12_tokens(list(self.lineage.calls.values()), staged)
            for key in self.lineage.ledger_keys():
                expected = self.lineage.expected(key)
                if not everything and self.verified.get(key, _UNREAD) == expected:
                    continue
                manifest = self.harness.ledger.manifest(key)
                p5_manifest(key, expected, manifest)
                if isinstance(manifest, Manifest):
                    p15_ledger_identifiers(key, manifest.answered_for, [row.capture_key for row in manifest.rows])
                if staged is not None and isinstance(manifest, Manifest):
                    p5_staged(key, manifest.rows, staged)
                self.verified[key] = expected

    def _learned(self) -> Lineage:
        return self.lineage.learn(self.harness.backend.calls())  # type: ignore[union-attr]
