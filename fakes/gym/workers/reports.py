"""A multi-worker server's report and status, merged from its workers' (pure; any participant kind).

Each worker reports its own readiness (`PrepareReport` as JSON) and status extras to its coordinator after every
change (`fakes.gym.workers.link`); the coordinator answers `GET status` and judges readiness from the merge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fakes.gym.control.participant import PrepareReport


def merge_reports(
    own: PrepareReport,
    reports: Sequence[Mapping[str, Any]],
    *,
    label: str,
    workers: int,
    unreported: int,
    lost: bool,
) -> PrepareReport:
    """The server's report: the coordinator's own (zero counts of every key, restored state) with every worker's.

    Ready only if every worker is, every live worker has reported for the current close generation, and no worker
    was lost while admission was closed; those two are blockers of their own."""
    counts = dict(own.counts)
    blockers, restarts = set(own.blockers), set(own.restarts)
    ready = own.ready
    for report in reports:
        ready = ready and bool(report["ready"])
        blockers.update(report["blockers"])
        restarts.update(report["restarts"])
        for name, count in report["counts"].items():
            counts[name] = counts.get(name, 0) + count
    counts["workers"] = workers
    if unreported:
        blockers.add(f"{label}-workers-unreported:{unreported}")
    if lost:
        blockers.add(f"{label}-worker-lost")
    return PrepareReport(
        ready=ready and not unreported and not lost,
        blockers=tuple(sorted(blockers)),
        counts=counts,
        restarts=tuple(sorted(restarts)),
    )


def merge_extras(own: Mapping[str, Any], extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Status extras of the whole server: the coordinator's own (`own`, which names every key) with each worker's.

    Lists are united (sorted), integers summed, booleans true only if true everywhere; anything else (a mode, a
    verify policy: the server's configuration) is the coordinator's."""
    merged = dict(own)
    for worker in extras:
        for name, value in worker.items():
            mine = merged.get(name)
            if isinstance(value, bool) and isinstance(mine, bool):
                merged[name] = mine and value
            elif isinstance(value, int) and isinstance(mine, int) and not isinstance(mine, bool):
                merged[name] = mine + value
            elif isinstance(value, list) and isinstance(mine, list):
                merged[name] = sorted({*mine, *value})
    return merged
