"""One rollout collection run as the checker drives it: its config written, the program started in a process group
of its own, signalled (SIGUSR1, SIGTERM, SIGKILL: only that group, which the checker started), and what it leaves
audited with the collection properties after it exits (`CollectionAudit`).

The program is the system's: the look-alike's `python -m fakes.collection`, or another that reads the same config
(`docs/collection.md`); the checker only gives it the argv.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_model.errors import HarnessError
from ckpt_model.model.topologies import Topology
from ckpt_model.properties.collection import (
    p22_latest_complete,
    p22_latest_forward,
    p23_earlier_intact,
    p23_kept,
    p23_stop_published,
    p24_continued_exported,
    p25_rows,
)
from ckpt_model.protocol import collection_files as files
from ckpt_model.protocol.collection_files import CollectionCheckpoint
from ckpt_model.protocol.storage import Fingerprint

EXIT_TIMEOUT_S = 60.0
PARTICIPANT_KINDS = ("environment", "agent", "resources", "model")


class CollectionRunError(HarnessError):
    """A collection run that never exited in time: the outcome is unknown, not a violation."""


class CollectionAudit:
    """What the collection runs of one collection directory must leave, checked after every exit and every
    checkpoint (P22-P24) and at the end (P25); it remembers `LATEST` across runs, so a later run moving it back is
    seen, and every checkpoint `LATEST` named with its participants' fingerprints, so a later save that removes or
    changes one before two newer ones were published is seen."""

    def __init__(self, root: Path, kinds: Collection[str], owner: str) -> None:
        self.root = root
        self.kinds = tuple(kinds)
        self.owner = owner
        self.latest: CollectionCheckpoint | None = None
        self.seen: dict[str, tuple[CollectionCheckpoint, Mapping[str, Fingerprint]]] = {}

    @classmethod
    def for_topology(cls, root: Path, topology: Topology) -> CollectionAudit:
        """The audit of a collection on `topology`'s servers: every participant kind it has (legacy rows go through a
        relay that takes no part in checkpoints, so no environment participant there), and its episode owner."""
        owner = topology.episode_owner
        return cls(root, [kind for kind in PARTICIPANT_KINDS if kind != "environment" or owner == "environment"], owner)

    def published(self) -> CollectionCheckpoint | None:
        """A checkpoint was asked for while the run goes on: `LATEST` (P22) and what it continues (P24)."""
        latest = self._latest()
        if latest is not None:
            p24_continued_exported(latest, self.exported(latest))
        return latest

    def exited(self, exit_code: int, latest_at_start: str | None) -> None:
        latest = self._latest()
        p23_stop_published(exit_code, latest_at_start, files.latest_id(self.root))
        if exit_code >= 0:  # a run that exited by itself (not killed) left no partial checkpoint behind
            p23_kept(*files.checkpoint_dirs(self.root))
        if latest is not None:
            p24_continued_exported(latest, self.exported(latest))

    def _latest(self) -> CollectionCheckpoint | None:
        """`LATEST` complete, and not behind the one this audit saw last (P22); remembered for the next, with its
        fingerprints; then every checkpoint seen before still intact (P23)."""
        latest = p22_latest_complete(self.root, self.kinds)
        p22_latest_forward(self.latest, latest)
        self.latest = latest
        if latest is not None and latest.checkpoint_id not in self.seen:
            fingerprints = files.participant_fingerprints(self.root, latest.checkpoint_id)
            self.seen[latest.checkpoint_id] = (latest, fingerprints)
        self.intact()
        return latest

    def intact(self) -> None:
        """Each checkpoint `LATEST` named is still there unchanged, unless two newer ones were published since (those
        seen, and those on disk now whose `collection.json` says they were created after it) (P23)."""
        created = {name: each.created_at for name, (each, _) in self.seen.items()}
        for name in files.checkpoint_dirs(self.root)[0]:
            with contextlib.suppress(files.CollectionUnreadable):  # P22 judges what LATEST names; not this
                created.setdefault(name, files.read_checkpoint(self.root, name).created_at)
        for checkpoint_id, (checkpoint, fingerprints) in self.seen.items():
            newer = [name for name, at in created.items() if at > checkpoint.created_at]
            p23_earlier_intact({checkpoint_id: fingerprints}, self.root, newer)

    def exported(self, checkpoint: CollectionCheckpoint) -> list[str]:
        """The capture keys the episode owner's records of `checkpoint` hold (every instance of that kind)."""
        written = files.participant_fingerprints(self.root, checkpoint.checkpoint_id)
        owners = [each for name, each in written.items() if name.startswith(self.owner + "/")]
        return [key for each in owners for key in each.episode_ids]

    def rows(self, output: Path, rollouts: Sequence[str], reward: float, attempts: Mapping[str, int]) -> None:
        p25_rows(rollouts, files.output_rows(output), reward, attempts)


class CollectionRun:
    """One run of the collection program, in a session (and process group) of its own."""

    def __init__(self, argv: Sequence[str], config: Mapping[str, Any], directory: Path, number: int) -> None:
        self.config_path = directory / f"collection-{number}.json"
        self.log_path = directory / f"collection-{number}.log"
        self.config_path.write_text(json.dumps(dict(config)))
        self.checkpoints = Path(config["checkpoint_dir"])
        self.latest_at_start = files.latest_id(self.checkpoints)
        with open(self.log_path, "wb") as log:
            try:
                self.process = subprocess.Popen(
                    [*argv, str(self.config_path)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as error:
                raise CollectionRunError(f"the collection program {[*argv]} could not start: {error}") from error

    def signal(self, signum: int) -> None:
        """SIGUSR1 or SIGTERM to the program itself; nothing once it exited."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the run's own process group (as a cluster ends a job), and reap it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def wait(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        """Its exit code (negative: the signal that killed it); one that does not exit in time is killed."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise CollectionRunError(f"the collection run did not exit within {timeout_s:g} s: {self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
