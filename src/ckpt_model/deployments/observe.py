"""The observe role: what the checker reads of the running system (`Observes`: the participants and their
statuses, the backend's calls, the capture ledgers, the telemetry files, the logs), one poll of it as the checker
sees it (the backend's calls, every participant's status), and the one back-off poll every wait of the checker uses
(the trainer's settle, the collection machine, scale mode).

- `ExportsTelemetry`: every Gym server process writes its spans and metrics into the deployment's `telemetry_dir`
  (P26); without it no step reads telemetry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from ckpt_model import timing
from ckpt_model.deployments.gate import Gate
from ckpt_model.model.contract import VERIFY, ScriptCall
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.protocol.client import ControlClient
from ckpt_model.protocol.ledger import LedgerClient

# Polls back off from the first to the last interval, doubling: quick when the state is almost there, and gentle on
# two loaded cores when a participant lags or a mismatch is waited out to the timeout (every poll reads every
# participant's status; a last interval of 100 ms, not 20, cut the CPU of such waits by a third: docs/parallel.md).
POLL_INTERVAL_MIN_S = 0.001
POLL_INTERVAL_MAX_S = 0.1


@runtime_checkable
class ExportsTelemetry(Protocol):
    """Every Gym server process writes its spans and metrics as JSON lines into `telemetry_dir` (docs/protocol.md;
    None: this start writes none); `clear_telemetry` removes them while no Gym server runs."""

    @property
    def telemetry_dir(self) -> Path | None: ...

    def clear_telemetry(self) -> None: ...


class Observes(Protocol):
    """What a caller that only reads the running system needs of the harness
    (`ckpt_model.deployments.harness.Harness`)."""

    @property
    def spec(self) -> DeploymentSpec: ...

    @property
    def checkpoint_dir(self) -> Path: ...

    @property
    def backend(self) -> Gate | None: ...

    @property
    def control(self) -> ControlClient | None: ...

    def statuses(self) -> dict[str, Any]: ...

    @property
    def servers(self) -> dict[str, str]: ...

    @property
    def ledger(self) -> LedgerClient: ...

    @property
    def telemetry_dir(self) -> Path | None: ...

    def log_tails(self, lines: int = 15) -> str: ...


@attrs.frozen
class Observation:
    """One poll of the system: backend calls per capture key, waiting keys, and every participant's status."""

    calls: dict[str, tuple[ScriptCall, ...]]
    waiting: dict[str, int]
    statuses: dict[str, dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        phases = {name: (s["phase"], s.get("checkpoint_id")) for name, s in self.statuses.items()}
        counts = {name: s["report"]["counts"] for name, s in self.statuses.items()}
        return {"calls": self.calls, "waiting": sorted(self.waiting), "phases": phases, "counts": counts}


def observe(system: Observes) -> Observation:
    """The backend's calls (message counts, or `verify` for a judge call), then every participant's status.

    In that order: whatever a participant did before a model call it made shows in statuses read after the call
    was seen (the settle's verdicts rely on it)."""
    with timing.span("observe"):
        calls, waiting = _backend_calls(system)
        return Observation(calls=calls, waiting=waiting, statuses=read_statuses(system))


def backend_calls(system: Observes) -> tuple[dict[str, tuple[ScriptCall, ...]], dict[str, int]]:
    """Only the backend's calls per capture key, and the index each waiting key's call waits under."""
    with timing.span("observe_calls"):
        return _backend_calls(system)


def _backend_calls(system: Observes) -> tuple[dict[str, tuple[ScriptCall, ...]], dict[str, int]]:
    calls: dict[str, tuple[ScriptCall, ...]] = {}
    waiting: dict[str, int] = {}
    for call in system.backend.calls() if system.backend is not None else ():
        key = call.get("capture_key")
        if key is None:
            continue
        made = VERIFY if call.get("kind") == "judge" else call["n_messages"]
        calls[key] = (*calls.get(key, ()), made)
        if call.get("waiting"):
            waiting[key] = call["index"]
    return calls, waiting


def read_statuses(system: Observes) -> dict[str, dict[str, Any]]:
    timing.count("status_rounds")
    return system.statuses()


def poll(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` with back-off until it holds (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    interval = POLL_INTERVAL_MIN_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
        interval = min(interval * 2, POLL_INTERVAL_MAX_S)
    return True
