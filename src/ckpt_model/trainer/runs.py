"""The `/run` pool: every rollout's `/run` runs in the background and its completion becomes a history event.

A reply that arrives late is still attributed to its attempt; the quiescence check reads the outcomes, and the
refusals the model expects (a retired attempt's `stale_attempt`, a `/run` sent while a checkpoint is open and
refused with `admission_closed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs
import httpx

from ckpt_model import timing
from ckpt_model.errors import QuiescenceTimeout
from ckpt_model.model.contract import Attempt
from ckpt_model.protocol.history import Event, History

RUN_THREADS_MAX = 16


@attrs.frozen
class RunOutcome:
    """How one `/run` ended: an HTTP reply, or a transport error (a crash cut it off)."""

    status_code: int | None
    body: Any
    error: str | None = None


class RunPool:
    """Sends `/run`s for attempts and keeps how each ended, by capture key."""

    def __init__(
        self,
        http: httpx.Client,
        run_url: Callable[[Attempt], str],
        body: Callable[[Attempt], dict[str, Any]],
        history: History,
    ) -> None:
        self._http = http
        self._run_url = run_url
        self._body = body
        self._history = history
        self._pool = ThreadPoolExecutor(max_workers=RUN_THREADS_MAX, thread_name_prefix="run")
        # By `/run` number (`Attempt.run`): restoring a checkpoint again re-sends a capture key, and a snapshot's
        # attempt that replied is judged by its own `/run`, not by a later one of the same key.
        self.outcomes: dict[int, RunOutcome] = {}
        self._futures: dict[int, Future[RunOutcome]] = {}
        # `/run`s that must be refused: with `stale_attempt` (retired while running), or with `admission_closed`
        # (sent while a checkpoint was open); each mapped to its capture key, for messages.
        self.refused_stale: dict[int, str] = {}
        self.refused_closed: dict[int, str] = {}
        # `/run`s whose rollout ID Gym's rules reject, each mapped to the rollout ID and attempt it named (P15).
        self.rejected: dict[int, tuple[str, int]] = {}

    def post(self, attempt: Attempt) -> RunOutcome:
        """One `/run`, in the caller's thread."""
        with timing.span("run"):
            return self._post(attempt)

    def _post(self, attempt: Attempt) -> RunOutcome:
        invocation = self._history.invoke(attempt.key, "run", {"attempt": attempt.attempt})
        return journaled_post(
            self._history, invocation, lambda: self._http.post(self._run_url(attempt), json=self._body(attempt))
        )

    def send(self, attempt: Attempt) -> None:
        """`/run` in the background: its completion is an event, attributed to its `/run` whenever it arrives."""
        if attempt.run < 0:
            raise ValueError(f"'attempt.run' must be the model's number of this /run (got {attempt.run})")
        run = attempt.run

        def record(done: Future[RunOutcome]) -> None:
            self.outcomes[run] = done.result()

        with timing.span("runs.send"):
            future: Future[RunOutcome] = self._pool.submit(self.post, attempt)
            future.add_done_callback(record)
        self._futures[run] = future

    def submit(self, call: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run another blocking call in the background (a prepare left waiting)."""
        return self._pool.submit(call, *args)

    def wait_ended(
        self, timeout_s: float, runs: Collection[int] | None = None, why: str = "its server is killed"
    ) -> None:
        """Wait (bounded) until every `/run` in flight, or those numbered `runs`, has ended: after a crash each
        ends with a transport error; after one server crashed alone, those that needed it fail."""
        with timing.span("runs.wait_ended"):
            self._wait_ended(timeout_s, runs, why)

    def _wait_ended(self, timeout_s: float, runs: Collection[int] | None, why: str) -> None:
        deadline = time.monotonic() + timeout_s
        waited = [(run, future) for run, future in self._futures.items() if runs is None or run in runs]
        for run, future in waited:
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise QuiescenceTimeout(
                    prediction=f"every /run in flight ends when {why}",
                    observed=f"/run #{run} is still open",
                    pending=[f"/run #{run}"],
                    timeout_s=timeout_s,
                ) from None
        for run, _ in waited:
            del self._futures[run]

    def shutdown(self) -> None:
        with timing.span("runs.shutdown"):
            self._pool.shutdown(wait=False, cancel_futures=True)


def journaled_post(history: History, invocation: Event, send: Callable[[], httpx.Response]) -> RunOutcome:
    """Send the request of an invocation already journaled and journal how it ended: `ok` on HTTP 200, `fail` on
    any other reply, `info` when no reply came (a transport error: the outcome is unknown)."""
    try:
        response = send()
    except httpx.HTTPError as error:
        history.complete(invocation, "info", f"{type(error).__name__}: {error}")
        return RunOutcome(status_code=None, body=None, error=str(error))
    body = _decoded(response)
    history.complete(invocation, "ok" if response.status_code == 200 else "fail", body)
    return RunOutcome(status_code=response.status_code, body=body)


def _decoded(response: httpx.Response) -> Any:
    """A reply's JSON, or its text when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        return response.text
