"""Token lineage (P5): what every capture ledger must hold, predicted by the checker as a pure value.

With token capture on, the policy model server keeps one ledger per attempt (capture key): a row for every call
whose response came back from the backend, each naming the call it continues (`parent_call_id`). The checker
never takes the ledger's word for it. It learns each captured call's `model_call_id` from the backend (the
admission the model server sent with the call), and derives every ledger from the controller's own history:

- an execution (one `/run` of an attempt) starts from the rows its ledger already holds: none for a fresh
  attempt, the chain a restore wrote for a continued one;
- each of its calls that returned at the backend adds a row, unless the policy model died before the reply
  reached it (such a call is *lost*: nobody wrote its row);
- a commit exports, per scoped attempt, its rows up to its last *delivered* call (a held reply is not delivered);
- a restore writes the exported chain under the next attempt, replacing whatever a dead execution left there, and
  retires the source attempt's ledger; a retire retires the ledgers of every covered attempt; a failed restore's
  cleanup retire covers the next attempts it burned.

`Lineage` holds that bookkeeping; `expected` says what a ledger must show, the `p5_*` functions compare.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ckpt_model.contract import capture_key
from ckpt_model.errors import PropertyViolation
from ckpt_model.ledger import Manifest, RetiredLedger


class P5Violation(PropertyViolation):
    property_id = "P5"
    title = (
        "token lineage: every ledger is one chain of its attempt's calls, a continued attempt's starts with the "
        "checkpointed calls and links its first call to the last delivered one, no undelivered or dead call is "
        "exported or kept, retired ledgers answer 410"
    )


@attrs.frozen
class CapturedCall:
    """A policy call as the backend saw it: the admission the model server attached, and whether it returned."""

    index: int
    capture_key: str
    model_call_id: str
    parent_call_id: str | None
    returned: bool

    @classmethod
    def from_wire(cls, call: Mapping[str, Any]) -> CapturedCall | None:
        """None for a call without a capture admission (untagged, a judge call, or capture off)."""
        admission = call.get("admission")
        if not isinstance(admission, Mapping) or not isinstance(admission.get("model_call_id"), str):
            return None
        return cls(
            index=call["index"],
            capture_key=str(admission.get("rollout_id")),
            model_call_id=admission["model_call_id"],
            parent_call_id=admission.get("parent_call_id"),
            returned=bool(call.get("returned")),
        )


@attrs.frozen
class Execution:
    """One `/run` of an attempt: the rows its ledger held when it started, and its calls' backend indices."""

    capture_key: str
    base: tuple[str, ...]
    indices: tuple[int, ...] = ()


@attrs.frozen
class Lineage:
    """The checker's account of every capture ledger, updated as the machine's rules run."""

    # Per capture key: the rows of executions that write no more (a restore's chain, or a finished writer's).
    rows: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    # The execution now writing each key's ledger.
    writers: Mapping[str, Execution] = attrs.field(factory=dict)
    retired: frozenset[str] = frozenset()
    # Backend calls whose replies never reached a policy model (it died first): they wrote no row.
    lost: frozenset[int] = frozenset()
    calls: Mapping[int, CapturedCall] = attrs.field(factory=dict)
    # Calls of no execution the checker started (reported by P5 at once).
    strays: tuple[CapturedCall, ...] = ()
    # Per committed checkpoint, per exported capture key, the chain its model record must carry.
    chains: Mapping[str, Mapping[str, tuple[str, ...]]] = attrs.field(factory=dict)

    # -- what the rules do to the ledgers ------------------------------------------------------------------

    def start(self, key: str) -> Lineage:
        """An execution of `key` starts: from the rows its ledger holds (a previous writer's become rows)."""
        settled = self._retire_writer(key)
        execution = Execution(key, settled.rows.get(key, ()))
        return attrs.evolve(settled, writers={**settled.writers, key: execution})

    def learn(self, wire_calls: Iterable[Mapping[str, Any]]) -> Lineage:
        """Take in the backend's calls: new captured calls join their key's writer; every call's `returned`
        flag is refreshed."""
        calls = dict(self.calls)
        writers = dict(self.writers)
        strays = list(self.strays)
        for wire in wire_calls:
            call = CapturedCall.from_wire(wire)
            if call is None:
                continue
            if call.index not in calls:
                writer = writers.get(call.capture_key)
                if writer is None:
                    strays.append(call)
                else:
                    writers[call.capture_key] = attrs.evolve(writer, indices=(*writer.indices, call.index))
            calls[call.index] = call
        return attrs.evolve(self, calls=calls, writers=writers, strays=tuple(strays))

    def model_died(self) -> Lineage:
        """The policy model server was killed: no reply still outstanding at the backend ever becomes a row."""
        outstanding = {i for w in self.writers.values() for i in w.indices if not self.calls[i].returned}
        return attrs.evolve(self, lost=self.lost | outstanding)

    def commit(self, checkpoint_id: str, delivered: Mapping[str, int]) -> Lineage:
        """A commit exports, per scoped key, the rows up to its last delivered call (`delivered`: how many of the
        writer's calls were delivered; a key without a writer is restored and not started: its rows)."""
        chains = {}
        for key, count in delivered.items():
            writer = self.writers.get(key)
            if writer is None:
                chains[key] = self.rows.get(key, ())
            else:
                chains[key] = (*writer.base, *self._ids(writer.indices[:count]))
        return attrs.evolve(self, chains={**self.chains, checkpoint_id: chains})

    def restore(self, checkpoint_id: str) -> Lineage:
        """A restore writes each exported chain under the next attempt (replacing a dead execution's rows and
        fences) and retires the source attempts' ledgers."""
        rows, writers, retired = dict(self.rows), dict(self.writers), set(self.retired)
        for key, chain in self.chains[checkpoint_id].items():
            target = next_key(key)
            retired.add(key)
            retired.discard(target)
            writers.pop(key, None)
            writers.pop(target, None)
            rows[target] = chain
        return attrs.evolve(self, rows=rows, writers=writers, retired=frozenset(retired))

    def retire(self, rollout: str, attempt: int) -> Lineage:
        """A retire of `attempt` retires the ledgers of every attempt of `rollout` up to it."""
        keys = {capture_key(rollout, covered) for covered in range(attempt + 1)}
        settled = self
        for key in keys & set(self.writers):
            settled = settled._retire_writer(key)
        return attrs.evolve(settled, retired=settled.retired | keys)

    # -- what the ledgers must show ------------------------------------------------------------------------

    def ledger_keys(self) -> list[str]:
        return sorted(set(self.rows) | set(self.writers) | self.retired)

    def expected(self, key: str) -> tuple[str, ...] | None:
        """The model call IDs the ledger of `key` holds, in order; None when it is retired."""
        if key in self.retired:
            return None
        writer = self.writers.get(key)
        if writer is None:
            return self.rows.get(key, ())
        written = [i for i in writer.indices if self.calls[i].returned and i not in self.lost]
        return (*writer.base, *self._ids(written))

    def expected_parents(self) -> list[tuple[CapturedCall, str | None]]:
        """Every writer's calls with the parent each must name: the row before it in the chain it extends."""
        pairs = []
        for writer in self.writers.values():
            chain = list(writer.base)
            for index in writer.indices:
                call = self.calls[index]
                pairs.append((call, chain[-1] if chain else None))
                chain.append(call.model_call_id)
        return pairs

    def _ids(self, indices: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.calls[i].model_call_id for i in indices)

    def _retire_writer(self, key: str) -> Lineage:
        """The writer of `key` writes no more: what it wrote becomes the key's rows."""
        if key not in self.writers:
            return self
        rows = {**self.rows, key: self.expected(key) or ()}
        writers = {k: w for k, w in self.writers.items() if k != key}
        return attrs.evolve(self, rows=rows, writers=writers)


def next_key(key: str) -> str:
    rollout, _, attempt = key.rpartition("-a")
    if rollout and attempt.isdigit():
        return capture_key(rollout, int(attempt) + 1)
    return capture_key(key, 1)


# -- the checks ------------------------------------------------------------------------------------------------


def p5_no_strays(strays: Sequence[CapturedCall]) -> None:
    """Every captured call belongs to an attempt the controller runs."""
    if strays:
        call = strays[0]
        raise P5Violation(
            rollout=call.capture_key,
            expected=f"captured calls only for attempts the controller runs ({call.capture_key!r} runs none)",
            observed=f"backend call #{call.index} ({call.model_call_id}) was captured under {call.capture_key!r}",
        )


def p5_parent_links(pairs: Iterable[tuple[CapturedCall, str | None]]) -> None:
    """Each captured call names as its parent the row before it: for the first call after a restore, the last
    delivered call of the attempt it continues."""
    for call, parent in pairs:
        if call.parent_call_id != parent:
            first = "the first call of its run" if parent is None else f"the call after {parent}"
            raise P5Violation(
                rollout=call.capture_key,
                expected=f"backend call #{call.index} ({call.model_call_id}), {first}, has parent_call_id {parent!r}",
                observed=f"its admission names parent_call_id {call.parent_call_id!r}",
            )


def p5_manifest(key: str, expected: tuple[str, ...] | None, manifest: Manifest | RetiredLedger) -> None:
    """The ledger of `key` answers 410 when retired; otherwise it holds exactly the expected rows, as one chain
    (each row's parent is the row before it), with no failures."""
    if expected is None:
        if not isinstance(manifest, RetiredLedger):
            raise P5Violation(
                rollout=key,
                expected=f"the ledger of {key!r} is retired (its manifest answers 410 'is retired')",
                observed=f"it answers 200 with rows {list(manifest.model_call_ids)}",
            )
        return
    if isinstance(manifest, RetiredLedger):
        raise P5Violation(
            rollout=key,
            expected=f"the ledger of {key!r} is live with rows {list(expected)}",
            observed=f"it answers 410: {manifest.detail}",
        )
    got = manifest.model_call_ids
    if got != expected:
        missing = [i for i in expected if i not in got]
        extra = [i for i in got if i not in expected]
        raise P5Violation(
            rollout=key,
            expected=f"the ledger of {key!r} holds {list(expected)}",
            observed=f"it holds {list(got)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; not delivered, dead or duplicated {extra}" if extra else "")
            + ("; same rows, another order" if not missing and not extra else ""),
        )
    for before, row in zip((None, *got), manifest.rows, strict=False):
        if row.parent_call_id != before:
            raise P5Violation(
                rollout=key,
                expected=f"each row of the ledger of {key!r} links to the row before it",
                observed=f"row {row.model_call_id} names parent {row.parent_call_id!r}, not {before!r}",
            )
    if manifest.failures:
        raise P5Violation(
            rollout=key,
            expected=f"the ledger of {key!r} records no failures",
            observed=f"its manifest lists failures {list(manifest.failures)}",
        )


def p5_exported(checkpoint_id: str, chains: Mapping[str, tuple[str, ...]], records: Sequence[Any]) -> None:
    """At a commit: the model's record of each scoped attempt carries exactly its chain up to the last delivered
    call (no row of an undelivered call, none twice); an attempt without rows has no record."""
    by_key: dict[str, list[str]] = {}
    for record in records:
        episode = record.get("episode_id") or {}
        key = capture_key(str(episode.get("rollout_id")), int(episode.get("attempt", 0)))
        by_key[key] = [row.get("model_call_id") for row in record.get("rows", [])]
    for key in sorted(set(chains) | set(by_key)):
        want = list(chains.get(key, ()))
        got = by_key.get(key, [])
        if got != want:
            raise P5Violation(
                rollout=key,
                expected=f"the model record of {key!r} in {checkpoint_id} carries rows {want}",
                observed=f"it carries {got}" if key in by_key else "there is no model record of it",
            )


def p5_staged(key: str, rows: Sequence[Any], staged: Mapping[str, Any]) -> None:
    """Every row of a ledger names a staging key the token store holds, for that very call (no orphan row)."""
    for row in rows:
        entry = staged.get(row.staging_key) if row.staging_key else None
        if not isinstance(entry, Mapping) or entry.get("model_call_id") != row.model_call_id:
            raise P5Violation(
                rollout=key,
                expected=f"row {row.model_call_id} of {key!r} names tokens staged for it",
                observed=f"staging key {row.staging_key!r} holds {entry!r}",
            )
