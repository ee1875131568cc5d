"""What a power cut keeps of a checkpoint directory: only what was fsynced.

A SIGKILL loses nothing that was written: the page cache belongs to the kernel. A power cut loses every write that
was not made durable, and that is where a writer that skips an fsync loses a checkpoint it already published. The
store records each fsync in a journal (one JSON line each, appended by every server of the stack): a file's
contents are durable up to the size they had when the file was fsynced (`{"ino", "size"}`), a directory's
entries are durable as they stood when the directory was fsynced (`{"dir", "entries": {name: ino}}`), and each
checkpoint directory written to is named once per write (`{"root"}`).

`lose_unsynced` applies a power cut to every checkpoint directory the journal names, once every writer is dead:
an entry not in its directory's last fsynced listing (or naming another inode now) is removed, and a file is cut
back to its last fsynced size (to nothing if it never was). Directories themselves are kept: Gym's write
protocol fsyncs only the participant directory, not the parents `mkdir` created, and relies on the file system
keeping those (as ext4's ordered journal does); a stricter model would fault Gym's own layout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Journal:
    """Appends the durability events of one writer process to a shared journal file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def writing(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        """A write into the checkpoint directory `checkpoint_dir` begins: a power cut applies there."""
        self._append({"root": str(Path(checkpoint_dir).resolve())})

    def file_synced(self, fd: int) -> None:
        """The file open as `fd` was just fsynced: its contents up to its size survive a power cut."""
        stat = os.fstat(fd)
        self._append({"ino": stat.st_ino, "size": stat.st_size})

    def directory_synced(self, directory: Path) -> None:
        """`directory` was just fsynced: its entries as they stand now survive a power cut."""
        entries = {entry.name: entry.inode() for entry in os.scandir(directory)}
        self._append({"dir": str(Path(directory).resolve()), "entries": entries})

    def _append(self, event: dict[str, Any]) -> None:
        # One write of one line with O_APPEND: lines of concurrent writers never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(event) + "\n").encode())
        finally:
            os.close(fd)


def lose_unsynced(journal_path: str | os.PathLike[str]) -> list[str]:
    """Cut the power: keep only what the journal says was made durable; return what changed.

    The journal is then rewritten to what is left (the roots that still exist, and each kept file's entry and
    fsynced size), so it stays as small as the live checkpoints however many examples wrote to it before."""
    roots: dict[str, None] = {}
    synced_sizes: dict[int, int] = {}
    listings: dict[str, dict[str, int]] = {}
    path = Path(journal_path)
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if "root" in event:
            roots[event["root"]] = None
        elif "dir" in event:
            listings[event["dir"]] = event["entries"]
        else:
            synced_sizes[event["ino"]] = event["size"]
    kept = Journal(path.with_name(path.name + ".compacted"))
    kept.path.unlink(missing_ok=True)
    changed: list[str] = []
    for root in (root for root in roots if Path(root).is_dir()):
        kept._append({"root": root})
        changed += _cut(root, listings, synced_sizes, kept)
    os.replace(kept.path, path)
    return changed


def _cut(root: str, listings: dict[str, dict[str, int]], synced_sizes: dict[int, int], kept: Journal) -> list[str]:
    """Apply the cut under `root`; record in `kept` what survived it."""
    changed = []
    for directory, _, files in os.walk(root):
        durable = listings.get(directory, {})
        survivors: dict[str, int] = {}
        for name in files:
            file = Path(directory) / name
            stat = file.stat()
            if durable.get(name) != stat.st_ino:
                file.unlink()
                changed.append(f"{file}: its entry was never made durable")
                continue
            size = synced_sizes.get(stat.st_ino, 0)
            if stat.st_size > size:
                os.truncate(file, size)
                changed.append(f"{file}: cut to its last fsynced size {size}")
            survivors[name] = stat.st_ino
            kept._append({"ino": stat.st_ino, "size": size})
        if survivors:
            kept._append({"dir": directory, "entries": survivors})
    return changed
