"""The start-and-crash role: fresh Gym processes for every example, crashes of all of them or of one, and the
deployment's capabilities that start, kill or place processes.

- `RestartsOne`: `restart_server(name)` crashes one server alone and starts it again (returns every server's URL,
  like `start_gym`); without it the machine never crashes one participant alone.
- `LosesUnsynced`: `lose_unsynced()`, after `crash_gym`, cuts the power: the checkpoint directories keep only what
  the writers made durable (fsynced); without it the machine never cuts the power.
- `KillsWorkers`: `kill_worker(name, index)`, SIGKILL one worker of a multi-worker server alone.
- `PlacesCalls`: `place_calls(placement)`, with several workers: every request of capture key K (a generation
  call, an episode's or a session's) is served by worker `placement[K]` (an index, modulo the server's workers),
  whichever worker accepts it (`ckpt_model.trainer.placement`); without it the worker race is only observed, where
  the backend's call list names the worker.
- `PlantsFaults`: the next servers start with another set of planted faults (`Harness.replant`).
- `CollectsRollouts`: the system's rollout collection program, started on the running servers.

`Lifecycle` is what a caller that starts and crashes needs of the harness; `ckpt_model.deployments.harness.Harness`
is the one that does it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ckpt_model.deployments.collection_run import CollectionRun
from ckpt_model.model.spec import DeploymentSpec


@runtime_checkable
class RestartsOne(Protocol):
    """Crash one Gym server alone and start it again; returns every server's URL, as `start_gym` does."""

    def restart_server(self, name: str) -> dict[str, str]: ...


@runtime_checkable
class LosesUnsynced(Protocol):
    """After `crash_gym`, a power cut: the checkpoint directories keep only what was fsynced."""

    def lose_unsynced(self) -> None: ...


@runtime_checkable
class KillsWorkers(Protocol):
    """SIGKILL one worker of a multi-worker server (by index), leaving its siblings and coordinator running."""

    def kill_worker(self, name: str, index: int) -> int: ...


@runtime_checkable
class PlacesCalls(Protocol):
    """Serve each capture key's generation calls on a chosen policy worker (the whole placement, replacing the
    last; kept across restarts of the servers)."""

    def place_calls(self, placement: Mapping[str, int]) -> None: ...


@runtime_checkable
class PlantsFaults(Protocol):
    """Start the next servers with another set of planted faults (the running ones keep theirs): how one stack
    serves the scenario of each fault its deployment shows, without starting anew (`Harness.replant`)."""

    def plant_faults(self, faults: Sequence[str]) -> None: ...


@runtime_checkable
class CollectsRollouts(Protocol):
    """Rollout collection against the running servers (reference Appendix C): the argv of the system's collection
    program, to which the checker appends one argument, its config file (docs/collection.md)."""

    def collection_command(self) -> list[str]: ...


class Lifecycle(Protocol):
    """Start and crash: what a caller that starts examples, kills processes or places them needs of the harness."""

    @property
    def spec(self) -> DeploymentSpec: ...

    @property
    def checkpoint_dir(self) -> Path: ...

    @property
    def can_crash(self) -> bool: ...

    @property
    def can_lose_unsynced(self) -> bool: ...

    @property
    def can_restart_one(self) -> bool: ...

    @property
    def can_kill_workers(self) -> bool: ...

    @property
    def places_calls(self) -> bool: ...

    @property
    def workers(self) -> int: ...

    @property
    def dead_workers(self) -> Mapping[str, int]: ...

    def begin_example(self) -> None: ...

    def crash(self, power_loss: bool = False) -> None: ...

    def restart_server(self, name: str) -> None: ...

    def kill_worker(self, name: str, index: int) -> None: ...

    def place_calls(self, placement: Mapping[str, int]) -> None: ...

    def start_collection(
        self, config: Mapping[str, Any], number: int, through: Mapping[str, str] | None = None
    ) -> CollectionRun: ...
