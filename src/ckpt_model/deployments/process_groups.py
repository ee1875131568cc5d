"""The no-harm rule's test: which process groups a real Gym's deployment may signal (`ckpt_model.deployments.gym`).

Only groups the checker created itself, and, in own-start mode, the groups a description file lists
(`servers.<name>.pgid`) whose every process, read from `/proc` before any signal is sent, descends from the
checker's own start command and started after it. Where there is no `/proc`, none of the listed groups passes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

PROC = Path("/proc")


@attrs.frozen
class ProcessInfo:
    """One process as `/proc/<pid>/stat` shows it: its parent, its group, and when it started (clock ticks)."""

    ppid: int
    pgid: int
    start_ticks: int


def process_table(proc: Path = PROC) -> dict[int, ProcessInfo]:
    """Every process now (empty where there is no `/proc`); one that ends while it is read is left out."""
    table: dict[int, ProcessInfo] = {}
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if entry.name.isdigit():
            info = read_stat(entry / "stat")
            if info is not None:
                table[int(entry.name)] = info
    return table


def read_stat(path: Path) -> ProcessInfo | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    # The command name (in parentheses) may hold spaces and parentheses: the fields follow the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcessInfo(ppid=int(fields[1]), pgid=int(fields[2]), start_ticks=int(fields[19]))
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    info = read_stat(proc / str(pid) / "stat")
    return None if info is None else info.start_ticks


def descends_from(pid: int, ancestor: int, table: Mapping[int, ProcessInfo]) -> bool:
    """Whether `ancestor` is `pid` or one of its ancestors, by the parent links of `table`."""
    seen: set[int] = set()
    while pid not in seen and pid in table:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = table[pid].ppid
    return pid == ancestor


def own_groups(
    listed: Sequence[int], root_pid: int, root_ticks: int | None, table: Mapping[int, ProcessInfo]
) -> list[int]:
    """The listed process groups the checker may signal: each has some process now, and every process in it
    descends from the checker's start command (`root_pid`) and started no earlier (`root_ticks`). The start
    command's own group is left out (it is stopped on its own), and nothing passes without `root_ticks`."""
    if root_ticks is None:
        return []
    mine = []
    for pgid in dict.fromkeys(listed):
        members = [pid for pid, info in table.items() if info.pgid == pgid]
        if pgid == root_pid or not members:
            continue
        if all(descends_from(pid, root_pid, table) and table[pid].start_ticks >= root_ticks for pid in members):
            mine.append(pgid)
    return mine


def described_pgids(description_file: Path | None) -> list[int]:
    """The `servers.<name>.pgid` a description file lists (none when it is missing or unreadable)."""
    if description_file is None:
        return []
    try:
        described = json.loads(Path(description_file).read_text())
        servers: Any = described.get("servers", {})
        return [int(server["pgid"]) for server in servers.values() if "pgid" in server]
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return []
