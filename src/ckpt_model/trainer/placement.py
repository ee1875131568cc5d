"""Which worker of each multi-worker server serves each attempt: a choice of the checker, so the race between
workers replays.

With several workers behind one port the kernel decides which worker accepts a connection, so a violation that
depends on the serving worker would replay only sometimes. Instead the rules that start an attempt draw a worker
index (`worker`, a rule argument, so regression files carry it), and a deployment that can (`PlacesCalls`) serves
every request of that attempt's capture key on that worker of every server (the index modulo the server's
workers): the policy model's generation calls, and the environment's, agent's and resources server's episode and
session requests. After every step the backend's call list says which policy worker served each new call: each is
noted in the history (the failure report shows it), and where the checker placed the call a different worker is a
`PlacementMismatch`, a harness error (the checker did not own the race after all). A deployment that cannot place
calls (a real Gym) is only observed, where its backend names the worker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_model import timing
from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import HarnessError
from ckpt_model.protocol.history import History


class PlacementMismatch(HarnessError):
    """A call the checker placed on one policy worker was served by another."""

    def __init__(self, key: str, index: int, chosen: int, served: Any) -> None:
        self.key, self.index, self.chosen, self.served = key, index, chosen, served
        super().__init__(
            f"backend call {index} of {key} was placed on policy worker {chosen} but served by worker {served}: "
            "the deployment did not enforce the placement, so this run's worker race was not the checker's"
        )


def served_calls(records: Sequence[Mapping[str, Any]], since: int) -> list[tuple[int, str, Any]]:
    """`(index, capture_key, worker)` of each policy call from backend call `since` on that names its worker."""
    return [
        (record["index"], record["capture_key"], record["worker"])
        for record in records[since:]
        if record.get("capture_key") is not None and record.get("kind", "policy") == "policy" and "worker" in record
    ]


def placement_mismatches(served: Sequence[tuple[int, str, Any]], chosen: Mapping[str, int]) -> list[tuple[Any, ...]]:
    """`(key, index, chosen, served)` of every call whose key was placed on another worker than the one that
    served it."""
    return [
        (key, index, chosen[key], worker) for index, key, worker in served if key in chosen and worker != chosen[key]
    ]


def live_worker(drawn: int, workers: int, server_workers: int, dead: Mapping[str, int]) -> int:
    """The worker index an attempt drawn onto `drawn` is placed on: `drawn` (modulo `workers`, the most any server
    runs), or the next one that is live on every server that lost a worker (`dead`: server -> the index killed, each
    server taking the index modulo `server_workers`)."""
    for step in range(workers):
        index = (drawn + step) % workers
        if all(index % server_workers != killed for killed in dead.values()):
            return index
    raise HarnessError(f"no worker index is live on every server (killed: {dict(dead)}); nothing can be placed")


class Placement:
    """The checker's placement of an example's attempts on policy workers, and the audit of what served them."""

    def __init__(self, harness: Harness, history: History) -> None:
        self.harness, self.history = harness, history
        self.chosen: dict[str, int] = {}
        self._audited = 0  # backend calls before this index have been noted

    @property
    def observed(self) -> bool:
        """Only a deployment with several policy workers has a worker race to own or observe."""
        return self.harness.spec.policy_workers > 1 and self.harness.backend is not None

    def place(self, key: str, worker: int) -> str:
        """Serve capture key `key`'s calls on worker `worker` (modulo the workers); a label suffix for the step."""
        if not self.harness.places_calls:
            return ""
        self.chosen[key] = live_worker(
            worker, self.harness.workers, self.harness.spec.server_workers, self.harness.dead_workers
        )
        self.harness.place_calls(self.chosen)
        return f" on worker {self.chosen[key]}"

    def on_worker(self, key: str, index: int, workers: int) -> bool:
        """Whether capture key `key` runs on worker `index` of a server with `workers` workers."""
        return key in self.chosen and self.chosen[key] % workers == index

    def audit(self) -> None:
        """Note which worker served each call since the last audit; a placed call served elsewhere fails."""
        if not self.observed:
            return
        assert self.harness.backend is not None
        with timing.span("placement_audit"):
            records = self.harness.backend.calls()
        served = served_calls(records, self._audited)
        self._audited = len(records)
        for index, key, worker in served:
            self.history.note("backend", "served", f"call {index} of {key} by policy worker {worker}")
        if self.harness.places_calls:
            policy = {key: index % self.harness.spec.policy_workers for key, index in self.chosen.items()}
            for mismatch in placement_mismatches(served, policy):
                raise PlacementMismatch(*mismatch)
