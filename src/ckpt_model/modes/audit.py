"""`ckpt-model audit`: what checkpoint directories prove on their own, read after the fact with no live system.

A Gym user with the directories of a real preemption has no server to ask; the files must speak for themselves.
The audit reads them with the checker's own readers (`ckpt_model.protocol.storage`,
`ckpt_model.protocol.collection_files`), never the system's, and judges them with the same named checks the live
properties use:

- P9, every participant directory `gym/<kind>/<instance>` of every checkpoint (in a collection's root, of every
  published one) verifies (manifest fields, records digest and count, every record JSON) against the checkpoint's
  one ID: the ID its `collection.json` names, else its directory's name when that is a collection checkpoint ID,
  else the ID most of its manifests name, which every other manifest must share; a checkpoint without a
  participant directory holds nothing to restore;
- P5 and P12, each record of a policy model's share (token capture's rows and generation cuts) carries rows or a
  cut, no call's row twice, and at most one cut (reference 7.2: what an export emits and a restore accepts); rows
  stamped only with earlier attempts of their rollout, cuts only of undelivered calls; and from the earlier
  published checkpoint to the one `LATEST` names, each rollout's rows kept, or carried whole through a restore;
- P22, `LATEST` is absent, or one checkpoint ID and a newline naming a published checkpoint that reads and
  verifies and holds a directory of every participant kind the root's checkpoints hold;
- P23, at most the two newest published checkpoints, each one's `collection.json` reading; no partial checkpoint
  (a directory named as one, without `collection.json`) begun before the one `LATEST` names, to the second (one
  begun after may be a save under way, or a failed one the next success deletes);
- P24, each published checkpoint's `continued` names exactly the episodes the episode owner's records hold
  (the environment's where it is a participant, as with Gym's native agents, else the agent's, as with legacy ones
  whose environment is a relay), and `restarted` none of them.

With `--telemetry`, the spans and metrics the run wrote are judged against the checkpoints (P26,
`ckpt_model.modes.audit_telemetry`).

ROOT is one checkpoint directory (it holds `gym/`) or a directory of them (each subdirectory that holds `gym/`, as
a trainer keeps them), and a rollout collection's checkpoint root adds `LATEST` and `collection.json`. A ROOT that is
neither but holds exactly one directory of checkpoints a few levels down (a tree `check --keep-artifacts DIR` kept:
`DIR/checkpoints/example-N/checkpoints`) is audited there, and the report says so; with several, the usage error
lists them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from ckpt_model.errors import PropertyViolation
from ckpt_model.model.lineage import (
    p5_chain_carried,
    p5_record_rows,
    p5_row_stamps,
    p12_cut_of_undelivered_call,
    p12_one_cut_per_record,
)
from ckpt_model.model.topologies import EPISODE_OWNERS
from ckpt_model.modes.audit_telemetry import TelemetryRead, audit_telemetry
from ckpt_model.properties import collection
from ckpt_model.properties.durability import p9_verifies
from ckpt_model.protocol.collection_files import (
    CHECKPOINT_ID,
    LATEST,
    MANIFEST,
    CollectionUnreadable,
    latest_id,
    read_checkpoint,
)
from ckpt_model.protocol.storage import MANIFEST_NAME, CheckpointUnreadable, Fingerprint, read_share

GYM_DIR = "gym"
# How far below ROOT the audit looks for a directory of checkpoints when ROOT holds none (a kept artifacts tree
# holds them three levels down: checkpoints/example-N/checkpoints), and how many directories it reads at most.
NESTED_DEPTH = 4
NESTED_DIRECTORIES_READ = 2000
MODEL_KIND = "model"
JSON_FORMAT_VERSION = 1
JSON_PARTICIPANT = frozenset({"kind", "instance", "records"})


class NothingToAudit(Exception):
    """ROOT does not exist, or holds no checkpoint: neither `gym/` nor a subdirectory with one, nor `LATEST`, nor
    exactly one directory of checkpoints a few levels down."""


@attrs.frozen
class Finding:
    """One property a file breaks: what it should be and what it is."""

    property_id: str
    message: str


@attrs.frozen
class Participant:
    kind: str
    instance: str
    records: int | None  # None: the directory does not verify (P9)
    # The capture keys its records name (P24 reads the episode owner's); not part of the JSON.
    episode_ids: tuple[str, ...] = attrs.field(default=(), repr=False)
    # A policy model's records, for the chain from one published checkpoint to the next (P5); not in the JSON.
    model_records: tuple[Any, ...] = attrs.field(default=(), repr=False)


@attrs.frozen
class Checkpoint:
    """One audited checkpoint directory: its ID, whether it is published (`collection.json`), its participants."""

    path: Path
    checkpoint_id: str | None
    published: bool
    participants: tuple[Participant, ...]


@attrs.frozen
class Audit:
    """What one audit read and found. `asked`: the path the user named, when the checkpoints were found below it
    (`root`), else None."""

    root: Path
    checkpoints: tuple[Checkpoint, ...]
    latest: str | None
    findings: tuple[Finding, ...]
    telemetry: TelemetryRead | None = None
    asked: Path | None = None

    @property
    def passed(self) -> bool:
        return not self.findings

    def document(self) -> dict[str, object]:
        """The audit as `ckpt-model audit --json` writes it."""
        return {
            "format": JSON_FORMAT_VERSION,
            "root": str(self.root),
            "asked": str(self.asked) if self.asked is not None else None,
            "verdict": "passed" if self.passed else "violation",
            "properties_violated": sorted({finding.property_id for finding in self.findings}),
            "latest": self.latest,
            "checkpoints": [
                {
                    "path": str(checkpoint.path),
                    "checkpoint_id": checkpoint.checkpoint_id,
                    "published": checkpoint.published,
                    "participants": [
                        attrs.asdict(participant, filter=lambda field, _: field.name in JSON_PARTICIPANT)
                        for participant in checkpoint.participants
                    ],
                }
                for checkpoint in self.checkpoints
            ],
            "telemetry": self.telemetry.document() if self.telemetry is not None else None,
            "findings": [attrs.asdict(finding) for finding in self.findings],
        }

    def json_text(self) -> str:
        return json.dumps(self.document(), indent=2) + "\n"

    def report(self) -> str:
        """What was read, then every finding, then the verdict, as `ckpt-model audit` prints it."""
        records = sum(p.records or 0 for c in self.checkpoints for p in c.participants)
        directories = sum(len(c.participants) for c in self.checkpoints)
        lines = []
        if self.asked is not None:
            lines.append(
                f"{self.asked} holds no checkpoint itself; the one directory of checkpoints under it is {self.root}"
            )
        lines.append(
            f"audit of {self.root}: {len(self.checkpoints)} checkpoint(s), {directories} participant "
            f"director{'y' if directories == 1 else 'ies'}, {records} record(s); LATEST {self.latest or 'absent'}"
        )
        for checkpoint in self.checkpoints:
            state = "published" if checkpoint.published else "not published"
            held = ", ".join(
                f"{p.kind}/{p.instance} ({'does not verify' if p.records is None else p.records})"
                for p in checkpoint.participants
            )
            named = checkpoint.checkpoint_id or "no ID"
            lines.append(f"  {checkpoint.path.name} [{named}, {state}]: {held or 'nothing'}")
        if self.telemetry is not None:
            lines.append(self.telemetry.report_line())
        lines.extend(f"{finding.property_id}: {finding.message}" for finding in self.findings)
        if self.passed:
            judged = "P5, P9, P12, P22, P23, P24" + (", P26" if self.telemetry is not None else "")
            lines.append(f"PASSED: every file verifies ({judged}: what needs no live system)")
        else:
            ids = sorted({finding.property_id for finding in self.findings})
            lines.append(f"FAILED: {len(self.findings)} finding(s) ({', '.join(ids)})")
        return "\n".join(lines)


def audit(root: Path, episode_owner: str | None = None, telemetry: Path | None = None) -> Audit:
    """Read every checkpoint under `root` and judge it, and with `telemetry` the spans and metrics a run wrote
    against them; raises `NothingToAudit` when there is no checkpoint, `NoTelemetry` when the path holds no file."""
    if episode_owner is not None and episode_owner not in EPISODE_OWNERS:
        raise ValueError(f"episode owner must be one of {EPISODE_OWNERS} (got {episode_owner!r})")
    asked, root = _found_root(Path(root))
    directories = _checkpoint_dirs(root)
    has_latest = (root / LATEST).exists()
    findings: list[Finding] = []
    # In a collection's root only what was published is a checkpoint: a directory without collection.json is a
    # save that failed or is under way (P23 judges it), its shares possibly half written.
    collection = has_latest or any((path / MANIFEST).exists() for path in directories)
    checkpoints = [
        _checkpoint(path, findings) if (path / MANIFEST).exists() or not collection else _unpublished(path)
        for path in directories
    ]
    latest = _latest(root, checkpoints, findings) if has_latest else None
    _published(root, checkpoints, latest, episode_owner, findings)
    read = None
    if telemetry is not None:
        read = audit_telemetry(Path(telemetry), _shares(checkpoints, collection), functools.partial(_found, findings))
    return Audit(
        root=root,
        checkpoints=tuple(checkpoints),
        latest=latest,
        findings=tuple(findings),
        telemetry=read,
        asked=asked,
    )


def _found_root(asked: Path) -> tuple[Path | None, Path]:
    """Where the checkpoints are: `asked` itself when it holds them (then None and it), else the one directory of
    checkpoints below it (then `asked` and that directory); `NothingToAudit` naming the path and what to name
    instead when it does not exist, holds none, or holds several."""
    if not asked.exists():
        raise NothingToAudit(f"{asked} does not exist: name a checkpoint directory, or a directory of them")
    if not asked.is_dir():
        raise NothingToAudit(f"{asked} is not a directory: name a checkpoint directory, or a directory of them")
    if _holds_checkpoints(asked):
        return None, asked
    nested = _nested_roots(asked)
    if len(nested) == 1:
        return asked, nested[0]
    if nested:
        listed = "\n".join(f"  {path}" for path in nested)
        raise NothingToAudit(
            f"{asked} holds no checkpoint itself, and {len(nested)} directories of checkpoints under it; audit one "
            f"at a time:\n{listed}"
        )
    raise NothingToAudit(
        f"{asked} holds no checkpoint: no {GYM_DIR}/, no subdirectory with one, no {LATEST}, and no directory of "
        f"checkpoints up to {NESTED_DEPTH} levels below it (a tree `check --keep-artifacts DIR` kept holds its "
        "failing example's under DIR/checkpoints/example-N/checkpoints, when the example wrote any)"
    )


def _holds_checkpoints(path: Path) -> bool:
    return bool(_checkpoint_dirs(path)) or (path / LATEST).exists()


def _nested_roots(asked: Path) -> list[Path]:
    """The directories of checkpoints below `asked`, breadth first to `NESTED_DEPTH` levels, not looking inside
    one (nor inside a checkpoint directory)."""
    found: list[Path] = []
    level, read = [asked], 0
    for _ in range(NESTED_DEPTH):
        below: list[Path] = []
        for directory in level:
            try:
                children = _subdirs(directory)
            except OSError:  # unreadable: nothing to find there
                continue
            for child in children:
                read += 1
                if read > NESTED_DIRECTORIES_READ:
                    return found
                if _holds_checkpoints(child):
                    found.append(child)
                elif child.name != GYM_DIR and not child.is_symlink():
                    below.append(child)
        level = below
    return found


def _shares(checkpoints: list[Checkpoint], collection: bool) -> dict[str, set[tuple[str, str]]]:
    """The participant directories of each checkpoint a commit must have written: in a collection's root, of the
    published ones (a partial one may be a save under way)."""
    return {
        checkpoint.checkpoint_id: {(p.kind, p.instance) for p in checkpoint.participants}
        for checkpoint in checkpoints
        if checkpoint.checkpoint_id is not None and (checkpoint.published or not collection)
    }


def _checkpoint_dirs(root: Path) -> list[Path]:
    if (root / GYM_DIR).is_dir():
        return [root]
    if not root.is_dir():
        return []
    return [path for path in sorted(root.iterdir()) if (path / GYM_DIR).is_dir()]


def _checkpoint(path: Path, findings: list[Finding]) -> Checkpoint:
    """P9 on every participant directory, against the checkpoint's one ID."""
    published = (path / MANIFEST).exists()
    checkpoint_id = _declared_id(path, published)
    participants: list[Participant] = []
    directories = [(kind.name, each) for kind in _subdirs(path / GYM_DIR) for each in _subdirs(kind)]
    if not directories:
        findings.append(Finding("P9", f"{path}: no participant directory under {GYM_DIR}/: nothing to restore"))
    if checkpoint_id is None:
        checkpoint_id = _most_named([_named_id(directory / MANIFEST_NAME) for _, directory in directories])
    for kind, directory in directories:
        read: Fingerprint | CheckpointUnreadable
        try:
            read, records = read_share(directory, kind, directory.name, checkpoint_id=checkpoint_id)
        except CheckpointUnreadable as exc:
            read, records = exc, []
        _judged(findings, p9_verifies, path.name, {f"{kind}/{directory.name}": read})
        if not isinstance(read, Fingerprint):
            participants.append(Participant(kind, directory.name, None))
            continue
        model_records: tuple[Any, ...] = ()
        if kind == MODEL_KIND:
            named = f"{path.name} ({kind}/{directory.name})"
            for check in (p5_record_rows, p12_one_cut_per_record, p5_row_stamps, p12_cut_of_undelivered_call):
                _judged(findings, check, named, records)
            model_records = tuple(records)
        participants.append(Participant(kind, directory.name, read.record_count, read.episode_ids, model_records))
    return Checkpoint(path=path, checkpoint_id=checkpoint_id, published=published, participants=tuple(participants))


def _unpublished(path: Path) -> Checkpoint:
    return Checkpoint(path=path, checkpoint_id=None, published=False, participants=())


def _declared_id(path: Path, published: bool) -> str | None:
    """The ID the checkpoint must carry everywhere: its `collection.json`'s, else its name when it is an ID."""
    named = _named_id(path / MANIFEST) if published else None  # P22/P23 say what is wrong with collection.json
    return named or (path.name if CHECKPOINT_ID.match(path.name) else None)


def _most_named(named: list[str | None]) -> str | None:
    """The ID most manifests name (the first in name order among equals): the others are the ones to report."""
    ids = [each for each in named if each is not None]
    return max(ids, key=ids.count) if ids else None


def _named_id(document: Path) -> str | None:
    """The `checkpoint_id` a JSON file names, if it reads and names one (the readers say what is wrong if not)."""
    try:
        named = json.loads(document.read_text()).get("checkpoint_id")
    except (OSError, ValueError, AttributeError):
        return None
    return named if isinstance(named, str) else None


def _latest(root: Path, checkpoints: list[Checkpoint], findings: list[Finding]) -> str | None:
    """P22: `LATEST` names a complete checkpoint with a directory of every kind the root's checkpoints hold."""
    kinds = {participant.kind for checkpoint in checkpoints for participant in checkpoint.participants}
    _judged(findings, collection.p22_latest_complete, root, kinds)
    try:
        return latest_id(root)
    except CollectionUnreadable:
        return None


def _published(
    root: Path, checkpoints: list[Checkpoint], latest: str | None, owner: str | None, findings: list[Finding]
) -> None:
    """P23 on what is kept, and each published checkpoint's `collection.json` (P23 that it reads, P24)."""
    by_name = {checkpoint.path.name: checkpoint for checkpoint in checkpoints if checkpoint.path != root}
    published = sorted(name for name, checkpoint in by_name.items() if checkpoint.published)
    partial = sorted(
        name for name, checkpoint in by_name.items() if not checkpoint.published and CHECKPOINT_ID.match(name)
    )
    if latest is not None or published:
        # A partial checkpoint begun after LATEST's may be a save still under way (or failed, left for the next
        # success to delete); one begun before it was left behind. IDs order by their second only: the same second
        # as LATEST's counts as after.
        under_way = [name for name in partial if latest is not None and _second(name) >= _second(latest)]
        _judged(findings, collection.p23_kept, published, partial, under_way)
    for name in published:
        try:
            checkpoint = read_checkpoint(root, name)
        except CollectionUnreadable as exc:
            if name != latest:  # LATEST's own is P22's
                findings.append(Finding("P23", f"a published checkpoint's collection.json does not read: {exc}"))
            continue
        exported = _exported(by_name[name], owner or _owner_of(root / name))
        if exported is not None:
            _judged(findings, collection.p24_continued_exported, checkpoint, exported)
    if latest in published and len(published) == 2:
        (earlier,) = [name for name in published if name != latest]
        _chains(by_name[earlier], by_name[latest], findings)


def _chains(earlier: Checkpoint, later: Checkpoint, findings: list[Finding]) -> None:
    """P5 from the earlier published checkpoint to the one `LATEST` names, per policy model instance both hold."""
    before = {p.instance: p for p in earlier.participants if p.kind == MODEL_KIND and p.records is not None}
    for participant in later.participants:
        source = before.get(participant.instance)
        if participant.kind == MODEL_KIND and participant.records is not None and source is not None:
            _judged(
                findings,
                p5_chain_carried,
                f"{earlier.path.name} ({MODEL_KIND}/{participant.instance})",
                source.model_records,
                f"{later.path.name} ({MODEL_KIND}/{participant.instance})",
                participant.model_records,
            )


def _second(checkpoint_id: str) -> str:
    """`ckpt-YYYYmmddTHHMMSS`: when a checkpoint began, to the second (its random suffix orders nothing)."""
    return checkpoint_id[: checkpoint_id.rindex("-")]


def _owner_of(path: Path) -> str:
    """Whose records name a checkpoint's episodes: the environment's where it is a participant (Gym's native
    agents), else the agent's (legacy agents, whose environment is a relay that writes nothing)."""
    return "environment" if (path / GYM_DIR / "environment").is_dir() else "agent"


def _exported(checkpoint: Checkpoint, owner: str) -> list[str] | None:
    """The episodes (capture keys) the episode owner's records hold in this checkpoint, as its audit read them;
    None when a share of the owner does not verify (P9 names it, and what it exported cannot be known)."""
    shares = [participant for participant in checkpoint.participants if participant.kind == owner]
    if any(participant.records is None for participant in shares):
        return None
    return [key for participant in shares for key in participant.episode_ids]


def _subdirs(path: Path) -> Iterable[Path]:
    return sorted(child for child in path.iterdir() if child.is_dir()) if path.is_dir() else []


def _judged(findings: list[Finding], check: Callable[..., object], *arguments: object) -> None:
    """Run a named check; a violation becomes a finding."""
    try:
        check(*arguments)
    except PropertyViolation as violation:
        _found(findings, violation)


def _found(findings: list[Finding], violation: PropertyViolation) -> None:
    findings.append(Finding(violation.property_id, f"expected {violation.expected}; found {violation.observed}"))
