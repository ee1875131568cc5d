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

With generation cuts on (P12), closing admission also cuts every generation still in flight at the backend: the
backend stages its prefix and the model server keeps the cut with the ticket until admission opens again. A
commit exports, per scoped attempt, the cut of its undelivered call (or a restored cut not yet used); a restore
hands it to the next attempt, whose first call must continue that prefix (`continued_from` on the backend) and
whose tokens are the prefix and the continuation, the prefix once. A cut the backend never answered costs only a
regeneration: no cut is exported and the continued call starts from scratch.

`Lineage` holds that bookkeeping; `expected` says what a ledger must show, the `p5_*` and `p12_*` functions
compare.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ckpt_model.errors import PropertyViolation
from ckpt_model.model.contract import capture_key
from ckpt_model.protocol.ledger import Manifest, Refusal, RetiredLedger
from ckpt_model.protocol.wire import split_capture_key


class P12Violation(PropertyViolation):
    property_id = "P12"
    title = (
        "generation cuts: every generation in flight at a prepare is cut once, a continued attempt's re-issued "
        "call continues exactly the exported prefix, and its tokens hold the prefix once"
    )


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
    waiting: bool = False
    n_messages: int = 0
    continued_from: str | None = None
    reused_prefix_tokens: int | None = None

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
            waiting=bool(call.get("waiting")),
            n_messages=int(call.get("n_messages", 0)),
            continued_from=call.get("continued_from"),
            reused_prefix_tokens=call.get("reused_prefix_tokens"),
        )


@attrs.frozen
class Execution:
    """One `/run` of an attempt: the rows its ledger held when it started, and its calls' backend indices."""

    capture_key: str
    base: tuple[str, ...]
    indices: tuple[int, ...] = ()
    # The cut a restore handed this attempt: its first call must continue that call's prefix.
    continues: str | None = None


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
    # Generation cuts: per key, the call cut at the open checkpoint's prepare; per key, the cut a restore handed
    # it and no call has used yet; per committed checkpoint, per exported key, the cut its record carries.
    open_cuts: Mapping[str, str] = attrs.field(factory=dict)
    restored_cuts: Mapping[str, str] = attrs.field(factory=dict)
    exported_cuts: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)

    # -- what the rules do to the ledgers ------------------------------------------------------------------

    def start(self, key: str) -> Lineage:
        """An execution of `key` starts: from the rows its ledger holds (a previous writer's become rows)."""
        settled = self._retire_writer(key)
        execution = Execution(key, settled.rows.get(key, ()), continues=settled.restored_cuts.get(key))
        restored_cuts = {k: v for k, v in settled.restored_cuts.items() if k != key}
        return attrs.evolve(settled, writers={**settled.writers, key: execution}, restored_cuts=restored_cuts)

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
        # Cuts live in the model server's memory: a restored cut dies with it, as does the open checkpoint.
        return attrs.evolve(self, lost=self.lost | outstanding, open_cuts={}, restored_cuts={})

    def commit(self, checkpoint_id: str, delivered: Mapping[str, int]) -> Lineage:
        """A commit exports, per scoped key, the rows up to its last delivered call (`delivered`: how many of the
        writer's calls were delivered; a key without a writer is restored and not started: its rows)."""
        chains, cuts = {}, {}
        for key, count in delivered.items():
            writer = self.writers.get(key)
            if writer is None:
                chains[key] = self.rows.get(key, ())
                unused = self.restored_cuts.get(key)
            else:
                chains[key] = (*writer.base, *self._ids(writer.indices[:count]))
                unused = writer.continues if count == 0 else None
            cut = self.open_cuts.get(key, unused)
            if cut is not None:
                cuts[key] = cut
        return attrs.evolve(
            self,
            chains={**self.chains, checkpoint_id: chains},
            exported_cuts={**self.exported_cuts, checkpoint_id: cuts},
        )

    def in_flight(self) -> tuple[CapturedCall, ...]:
        """The captured calls generating at the backend now (sent, no reply yet), by call ID."""
        live = [self.calls[i] for w in self.writers.values() for i in w.indices if i not in self.lost]
        return tuple(sorted((call for call in live if call.waiting), key=lambda call: call.model_call_id))

    def cut(self, durable: bool) -> Lineage:
        """Admission closed for a prepare: every call in flight is cut (`durable`: the backend answered)."""
        cuts = {call.capture_key: call.model_call_id for call in self.in_flight()} if durable else {}
        return attrs.evolve(self, open_cuts=cuts)

    def opened(self) -> Lineage:
        """Admission opened again: the open checkpoint's cuts are dropped."""
        return self if not self.open_cuts else attrs.evolve(self, open_cuts={})

    def restore(self, checkpoint_id: str) -> Lineage:
        """A restore writes each exported chain under the next attempt (replacing a dead execution's rows and
        fences) and retires the source attempts' ledgers."""
        rows, writers, retired = dict(self.rows), dict(self.writers), set(self.retired)
        restored_cuts = dict(self.restored_cuts)
        cuts = self.exported_cuts.get(checkpoint_id, {})
        for key, chain in self.chains[checkpoint_id].items():
            target = next_key(key)
            retired.add(key)
            retired.discard(target)
            writers.pop(key, None)
            writers.pop(target, None)
            rows[target] = chain
            restored_cuts.pop(key, None)
            restored_cuts.pop(target, None)
            if key in cuts:
                restored_cuts[target] = cuts[key]
        return attrs.evolve(self, rows=rows, writers=writers, retired=frozenset(retired), restored_cuts=restored_cuts)

    def retire(self, rollout: str, attempt: int) -> Lineage:
        """A retire of `attempt` retires the ledgers of every attempt of `rollout` up to it."""
        keys = {capture_key(rollout, covered) for covered in range(attempt + 1)}
        settled = self
        for key in keys & set(self.writers):
            settled = settled._retire_writer(key)
        restored_cuts = {k: v for k, v in settled.restored_cuts.items() if k not in keys}
        return attrs.evolve(settled, retired=settled.retired | keys, restored_cuts=restored_cuts)

    def delete(self, key: str) -> Lineage:
        """The trainer deleted the ledger of `key`: no rows, no marker (a later attempt under that key starts
        afresh)."""
        rows = {k: v for k, v in self.rows.items() if k != key}
        writers = {k: w for k, w in self.writers.items() if k != key}
        return attrs.evolve(self, rows=rows, writers=writers, retired=self.retired - {key})

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

    def expected_continuations(self) -> list[tuple[CapturedCall, str | None]]:
        """Every writer's calls with the call each must continue: the first call of an attempt a restore handed a
        cut continues it; every other call generates from scratch."""
        pairs = []
        for writer in self.writers.values():
            for position, index in enumerate(writer.indices):
                pairs.append((self.calls[index], writer.continues if position == 0 else None))
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
    """The capture key of the attempt after the one `key` names (`x-a0` is attempt 0 of rollout `x-a0`)."""
    rollout, attempt = split_capture_key(key)
    return capture_key(rollout, attempt + 1)


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
    by_key = _by_capture_key(records, lambda record: [row.get("model_call_id") for row in record.get("rows", [])])
    for key in sorted(set(chains) | set(by_key)):
        want = list(chains.get(key, ()))
        got = by_key.get(key, [])
        if got != want:
            raise P5Violation(
                rollout=key,
                expected=f"the model record of {key!r} in {checkpoint_id} carries rows {want}",
                observed=f"it carries {got}" if key in by_key else "there is no model record of it",
            )


def _by_capture_key(records: Sequence[Any], pick: Callable[[Any], list[Any]]) -> dict[str, list[Any]]:
    """What `pick` reads of each model record, by the record's capture key."""
    return {capture_key(*_episode(record)): pick(record) for record in records}


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


def p5_stale_ledger_deleted(key: str, outcome: Any) -> None:
    """A stale ledger (retired, or left by an abandoned execution or restore) the controller runs an attempt under
    again is deleted first: with admission open the policy model must not refuse the trainer's delete."""
    if isinstance(outcome, Refusal):
        raise P5Violation(
            rollout=key,
            expected=f"the stale ledger of {key!r} is deleted while no checkpoint is open",
            observed=f"the delete was refused: HTTP {outcome.status}: {outcome.text}",
        )


# -- P12 ----------------------------------------------------------------------------------------------------------


def p12_cut_round(
    checkpoint_id: str, in_flight: Sequence[CapturedCall], rounds: Sequence[Sequence[str]], workers: int = 1
) -> None:
    """At a prepare: every call in flight is cut exactly once, in the rounds the backend answered for it (one per
    policy-model worker that had a call generating, so at most `workers`, none empty; none when nothing was in
    flight)."""
    want = sorted(call.model_call_id for call in in_flight)
    got = sorted(call_id for round_ in rounds for call_id in round_)
    if got != want or len(rounds) > min(workers, len(want)) or any(not round_ for round_ in rounds):
        raise P12Violation(
            rollout=in_flight[0].capture_key if in_flight else None,
            expected=f"the prepare of {checkpoint_id} cuts each call in flight once, {want}, in at most "
            f"{min(workers, len(want))} round(s) (one per policy-model worker with a call generating)",
            observed=f"the backend answered cut rounds {[sorted(round_) for round_ in rounds]}",
        )


def p5_record_rows(checkpoint_id: str, records: Sequence[Any]) -> None:
    """A model share on its own (read offline): each record carries rows or a cut (an export emits no empty one,
    reference 7.2), and no call's row twice (a ledger holds a row per call)."""
    for key, rows in sorted(_by_capture_key(records, lambda record: record.get("rows") or []).items()):
        calls = [row.get("model_call_id") if isinstance(row, dict) else None for row in rows]
        twice = sorted({str(call) for call in calls if calls.count(call) > 1})
        if twice:
            raise P5Violation(
                rollout=key,
                expected=f"the model record of {key!r} in {checkpoint_id} carries each call's row once",
                observed=f"rows of {twice} more than once",
            )
    empty = sorted(
        key
        for key, (rows, cuts) in _by_capture_key(
            records, lambda record: [record.get("rows") or [], record.get("generation_cuts") or []]
        ).items()
        if not rows and not cuts
    )
    if empty:
        raise P5Violation(
            rollout=empty[0],
            expected=f"every model record in {checkpoint_id} carries rows or a generation cut",
            observed=f"the records of {empty} carry neither",
        )


def p12_one_cut_per_record(checkpoint_id: str, records: Sequence[Any]) -> None:
    """A model share on its own (read offline): each record carries at most one generation cut (an export takes
    the latest, and a restore refuses more, reference 7.2)."""
    for key, cuts in sorted(_by_capture_key(records, lambda record: record.get("generation_cuts") or []).items()):
        if len(cuts) > 1:
            raise P12Violation(
                rollout=key,
                expected=f"the model record of {key!r} in {checkpoint_id} carries at most one generation cut",
                observed=f"it carries {len(cuts)}",
            )


def p5_row_stamps(checkpoint_id: str, records: Sequence[Any]) -> None:
    """A model share on its own (read offline): a row stamped with a `capture_key` was staged by an earlier attempt
    of the record's own rollout (a restore stamps the rows it carries to the next attempt, reference 7.2); a row
    its own attempt staged carries no stamp."""
    for record in records:
        rollout, attempt = _episode(record)
        earlier = _keys_before(rollout, attempt)
        foreign = sorted(
            {str(row.get("capture_key")) for row in _rows(record) if "capture_key" in row} - earlier, key=str
        )
        if foreign:
            raise P5Violation(
                rollout=capture_key(rollout, attempt),
                expected=f"the rows of {capture_key(rollout, attempt)!r} in {checkpoint_id} stamped, if at all, with "
                f"an earlier attempt of {rollout!r} ({sorted(earlier) or 'none'})",
                observed=f"rows stamped {foreign}",
            )


def p12_cut_of_undelivered_call(checkpoint_id: str, records: Sequence[Any]) -> None:
    """A model share on its own (read offline): a record's generation cut is of a call of its rollout's attempt
    (or an earlier one's, a restored cut not yet used) that was never delivered, so no row of the record is that
    call's (an export leaves out every undelivered call's row, reference 7.2)."""
    for record in records:
        rollout, attempt = _episode(record)
        key = capture_key(rollout, attempt)
        calls = {row.get("model_call_id") for row in _rows(record)}
        own = _keys_before(rollout, attempt + 1)
        for cut in record.get("generation_cuts") or []:
            continuation = cut.get("continuation") or {} if isinstance(cut, dict) else {}
            source_key, source_call = continuation.get("source_capture_key"), continuation.get("source_model_call_id")
            if source_key not in own or source_call in calls:
                raise P12Violation(
                    rollout=key,
                    expected=f"the cut in {key!r}'s record in {checkpoint_id} of an undelivered call of {sorted(own)}",
                    observed=f"a cut of {source_call!r} of {source_key!r}"
                    + (", a call whose row the record carries" if source_call in calls else ""),
                )


def p5_chain_carried(earlier_id: str, earlier: Sequence[Any], later_id: str, later: Sequence[Any]) -> None:
    """Two model shares of one collection, `later` published after `earlier` (read offline): a rollout's ledger
    chain only grows. Where the later holds the same attempt, its rows include every row the earlier held (a live
    ledger only gains rows). Where it holds a later attempt whose rows were carried from the earlier's attempt or
    before (stamped so by a restore), those are exactly the earlier's rows of those attempts: a restore carries a
    chain whole, and after the earlier was published only it could be restored."""
    before: dict[str, list[tuple[int, Any]]] = {}
    for record in earlier:
        rollout, attempt = _episode(record)
        before.setdefault(rollout, []).append((attempt, record))
    for record in later:
        rollout, attempt = _episode(record)
        previous = [(was, source) for was, source in before.get(rollout, []) if was <= attempt]
        if len(previous) != 1:
            continue
        (was, source) = previous[0]
        was_key = capture_key(rollout, was)
        had = {_origin(row, was_key) for row in _rows(source)}
        if was == attempt:
            lost = sorted(had - {_origin(row, was_key) for row in _rows(record)}, key=str)
        else:
            up_to_was = _keys_before(rollout, was + 1)
            carried = {_origin(row, was_key) for row in _rows(record) if row.get("capture_key") in up_to_was}
            if not carried:
                continue  # the later attempt started over: nothing was carried
            lost = sorted(had ^ carried, key=str)
        if lost:
            raise P5Violation(
                rollout=capture_key(rollout, attempt),
                expected=f"the rows {sorted(had, key=str)} of {was_key!r} in {earlier_id} carried whole into "
                f"{capture_key(rollout, attempt)!r}'s record in {later_id}",
                observed=f"rows {lost} lost or added",
            )


def _keys_before(rollout: str, attempt: int) -> set[str]:
    """The capture keys of `rollout`'s attempts before `attempt`."""
    return {capture_key(rollout, each) for each in range(attempt)}


def _episode(record: Any) -> tuple[str, int]:
    episode = record.get("episode_id") or {}
    return str(episode.get("rollout_id")), int(episode.get("attempt", 0))


def _rows(record: Any) -> list[Any]:
    return [row for row in record.get("rows") or [] if isinstance(row, dict)]


def _origin(row: Any, own_key: str) -> tuple[str, str]:
    """A row's identity across a chain: the attempt that staged it and its call."""
    return (str(row.get("capture_key", own_key)), str(row.get("model_call_id")))


def p12_exported_cuts(checkpoint_id: str, cuts: Mapping[str, str], records: Sequence[Any]) -> None:
    """At a commit: the model record of each scoped attempt carries the cut of its undelivered call (or the
    restored cut it has not used), at most one, and no other."""
    by_key = _by_capture_key(
        records,
        lambda record: [
            (cut.get("continuation") or {}).get("source_model_call_id") for cut in record.get("generation_cuts", [])
        ],
    )
    for key in sorted(set(cuts) | set(by_key)):
        want = [cuts[key]] if key in cuts else []
        got = by_key.get(key, [])
        if got != want:
            raise P12Violation(
                rollout=key,
                expected=f"the model record of {key!r} in {checkpoint_id} carries the cuts of {want}",
                observed=f"it carries cuts of {got}" if key in by_key else "there is no model record of it",
            )


def p12_continuations(pairs: Iterable[tuple[CapturedCall, str | None]]) -> None:
    """A continued attempt's first call continues the cut the restore handed it; nothing else continues."""
    for call, source in pairs:
        if call.continued_from != source:
            raise P12Violation(
                rollout=call.capture_key,
                expected=f"backend call #{call.index} ({call.model_call_id}) "
                + (f"continues the prefix of {source}" if source else "generates from scratch"),
                observed=f"the backend records continued_from {call.continued_from!r}",
            )


def p12_tokens(calls: Sequence[CapturedCall], staged: Mapping[str, Any]) -> None:
    """Each continued call's staged tokens are the cut prefix followed by the continuation, the prefix once: they
    start with the prefix the backend staged at the cut (named by the entry's `prefix_staging_key`), that prefix is
    `reused_prefix_tokens` long, and they equal the tokens of a call with as many messages generated from scratch,
    when one is staged."""
    fresh: dict[int, Any] = {}
    for call in calls:
        entry = staged.get(staging_key(call))
        if call.continued_from is None and isinstance(entry, Mapping):
            fresh.setdefault(call.n_messages, entry.get("tokens"))
    for call in calls:
        if call.continued_from is None or not call.returned:
            continue
        entry = staged.get(staging_key(call))
        entry = entry if isinstance(entry, Mapping) else {}
        prefix_entry = staged.get(str(entry.get("prefix_staging_key")))
        prefix = prefix_entry.get("tokens") if isinstance(prefix_entry, Mapping) else None
        tokens = entry.get("tokens")
        reference = fresh.get(call.n_messages)
        if not isinstance(prefix, list) or not isinstance(tokens, list):
            problem = f"staged tokens {tokens!r} and prefix {prefix!r} (under {entry.get('prefix_staging_key')!r})"
        elif call.reused_prefix_tokens != len(prefix) or tokens[: len(prefix)] != prefix:
            problem = f"reused_prefix_tokens {call.reused_prefix_tokens}, prefix {prefix}, tokens {tokens}"
        elif reference is not None and tokens != reference:
            problem = f"tokens {tokens}; a call with as many messages generated from scratch has {reference}"
        else:
            continue
        raise P12Violation(
            rollout=call.capture_key,
            expected=f"call {call.model_call_id} holds the prefix of {call.continued_from} once, then its continuation",
            observed=problem,
        )


def staging_key(call: CapturedCall) -> str:
    """Where the backend stages a captured call's tokens (reference 11: `<rollout>/<model_call_id>`)."""
    return f"{call.capture_key}/{call.model_call_id}"
