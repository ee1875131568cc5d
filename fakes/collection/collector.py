"""The collection run: rows sent to `/run` a few at a time, replies appended to the output, and checkpoints on
SIGUSR1, SIGTERM and a timer (reference Appendix C).

One thread decides (this module's `Collector.run`); `/run` calls wait on a thread pool and report back through a
queue, as do the signal handlers, so a checkpoint always sees a settled picture of what is in flight. A checkpoint
stops dispatch, prepares, commits the rollouts in flight and the restored ones not yet sent again (less the
restarts the participants report), publishes `collection.json` and `LATEST`, prunes, then resumes, or after
SIGTERM stops with exit code 75. A failed checkpoint deletes only its own directory and resumes.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import queue
import shutil
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import attrs
import httpx

from fakes.collection import layout
from fakes.collection.config import CollectionConfig
from fakes.collection.control import Control, ControlFailed
from fakes.collection.layout import CollectionManifest, DispatchLog, Episode
from fakes.collection.rows import finished_rollouts, output_row, read_inputs
from fakes.collection.tracing import ControllerTracing

log = logging.getLogger("fakes.collection")

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_PREEMPTED = 75  # checkpointed, then stopped (SIGTERM)
# Failed `/run`s (no reply) are retired in batches of at most this many between checkpoints.
RETIRE_BATCH = 1024
RETIRE_RETRY_S = 1.0
RUN_CONNECT_TIMEOUT_S = 10.0


class Trigger(enum.Enum):
    REQUEST = "SIGUSR1"
    PREEMPTION = "SIGTERM"
    TIMER = "timer"


@attrs.frozen
class RunEnded:
    """A `/run` call came back: its reply (status and JSON body), or the transport error it met."""

    episode: Episode
    status: int | None
    body: Any
    error: str = ""


class Collector:
    def __init__(
        self, config: CollectionConfig, clock: Callable[[], float] = time.time, telemetry_dir: Path | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        self.telemetry_dir = telemetry_dir
        self.events: queue.SimpleQueue[RunEnded | Trigger] = queue.SimpleQueue()
        self.rows = {row.rollout_id: row for row in read_inputs(config.input_jsonl_fpath, config.run_format)}
        self.run_id = uuid.uuid4().hex
        self.pending: deque[str] = deque()
        self.attempt: dict[str, int] = {}
        self.in_flight: dict[str, Episode] = {}
        self.restored_pending: dict[str, Episode] = {}  # restored, not yet sent again
        self.failed: list[Episode] = []  # no reply: retired before the row starts over
        self.marked: set[str] = set()  # rollouts with retire marks, forgotten once a later attempt replies
        self.forgettable: set[str] = set()
        self.control: Control | None = None
        self.dispatch_log: DispatchLog | None = None
        self.run_url = config.servers[config.run_server].rstrip("/") + "/run"
        self.http = httpx.Client(timeout=httpx.Timeout(None, connect=RUN_CONNECT_TIMEOUT_S))
        self.pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="collection-run")
        self.output: Any = None
        self.stopping = False

    # --- the run --------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Collect every row; the exit code."""
        self._install_signals()
        root = self.config.checkpoint_dir
        finished: set[str] = set()
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
            tracing = ControllerTracing(self.telemetry_dir)
            self.control = Control(self.config.servers, self.config.token, self.clock, tracing)
        if self.config.resume_from_cache and "rerun_redoes_finished" not in self.config.faults:
            finished = finished_rollouts(self.config.output_jsonl_fpath)  # planted fault: finished rows go again
        # Open for the run's whole life, line-buffered: a row is written through as its reply arrives.
        mode = "a" if self.config.resume_from_cache else "w"
        self.output = open(self.config.output_jsonl_fpath, mode, buffering=1)  # noqa: SIM115
        if root is not None:
            if self.config.resume_from_cache:
                self._resume_from_cache(root, finished)
            self.dispatch_log = DispatchLog(root, self.run_id)
        skips_in_flight = "resume_skips_in_flight" in self.config.faults
        for rollout_id in self.rows:
            if skips_in_flight and rollout_id in self.marked:
                continue  # planted: taken for done, as the rows in flight were in NeMo-RL #3599
            if rollout_id not in finished and rollout_id not in self.pending:
                self.pending.append(rollout_id)
        next_timer = self._next_timer()
        while True:
            self._tidy_marks()
            self._dispatch()
            if not (self.pending or self.in_flight or self.failed):
                break
            waits = [max(next_timer - self.clock(), 0.0)] if next_timer is not None else []
            if self.failed:
                waits.append(RETIRE_RETRY_S)  # a retire that failed is tried again
            try:
                event = self.events.get(timeout=min(waits, default=None))
            except queue.Empty:
                if next_timer is None or self.clock() < next_timer:
                    continue
                event = Trigger.TIMER
                next_timer = self._next_timer()
            if isinstance(event, RunEnded):
                self._ended(event)
            elif (code := self._checkpoint(event)) is not None:
                return code
        self.output.close()
        log.info("collection done: %d rows", len(self.rows))
        return EXIT_DONE

    def _next_timer(self) -> float | None:
        every = self.config.checkpoint_every_s
        return None if every is None or self.control is None else self.clock() + every

    def _dispatch(self) -> None:
        """Send rows while there is room, unless a stop is under way."""
        while self.pending and len(self.in_flight) < self.config.concurrency and not self.stopping:
            rollout_id = self.pending.popleft()
            episode = Episode(rollout_id, self.attempt.get(rollout_id, 0))
            if self.dispatch_log is not None:
                self.dispatch_log.record(rollout_id, episode.attempt)
            self.restored_pending.pop(rollout_id, None)
            self.in_flight[rollout_id] = episode
            body = self.rows[rollout_id].run_body(self.config.run_format, episode.attempt)
            self.pool.submit(self._send, episode, body)

    def _send(self, episode: Episode, body: dict[str, Any]) -> None:
        try:
            response = self.http.post(self.run_url, json=body)
        except httpx.HTTPError as exc:
            self.events.put(RunEnded(episode, None, None, f"{type(exc).__name__}: {exc}"))
            return
        try:
            reply = response.json()
        except ValueError:
            reply = response.text
        self.events.put(RunEnded(episode, response.status_code, reply))

    def _ended(self, ended: RunEnded) -> None:
        episode = ended.episode
        if self.in_flight.get(episode.rollout_id) != episode:
            return  # an attempt already given up
        del self.in_flight[episode.rollout_id]
        if ended.status == 200:
            self.output.write(output_row(episode.rollout_id, episode.attempt, ended.body) + "\n")
            if episode.rollout_id in self.marked:
                self.forgettable.add(episode.rollout_id)
            return
        code = _error_code(ended.body)
        if code == "admission_closed":
            self.pending.appendleft(episode.rollout_id)  # sent again after the checkpoint resumes
            return
        log.warning("/run of %s failed: %s", episode.capture_key, ended.error or f"HTTP {ended.status} {code}")
        self.failed.append(episode)

    def _tidy_marks(self) -> None:
        """Between checkpoints: retire failed attempts (then start their rows over), forget rollouts whose later
        attempt replied."""
        if self.control is None:
            self._start_over(self.failed)
            self.failed = []
            return
        while self.failed:
            batch, self.failed = self.failed[:RETIRE_BATCH], self.failed[RETIRE_BATCH:]
            tidy_id = f"retire-{uuid.uuid4().hex[:12]}"
            try:
                self.control.retire(tidy_id, batch, self._deadline())
            except ControlFailed as exc:
                log.warning("%s", exc)
                self.failed = batch + self.failed
                return
            self.marked.update(episode.rollout_id for episode in batch)
            self._start_over(batch)
        if self.forgettable:
            forget_id = f"forget-{uuid.uuid4().hex[:12]}"
            try:
                self.control.forget(forget_id, sorted(self.forgettable), self._deadline())
            except ControlFailed as exc:
                log.warning("%s", exc)
                return
            self.marked -= self.forgettable
            self.forgettable = set()

    def _start_over(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self.attempt[episode.rollout_id] = episode.attempt + 1
            self.pending.append(episode.rollout_id)

    def _deadline(self) -> float:
        return self.clock() + self.config.checkpoint_timeout_s

    # --- checkpoints ----------------------------------------------------------------------------------------

    def _checkpoint(self, trigger: Trigger) -> int | None:
        """Checkpoint for `trigger`; an exit code when the run must end now."""
        stop = trigger is Trigger.PREEMPTION
        root = self.config.checkpoint_dir
        if self.control is None or root is None:
            if stop:
                log.error("SIGTERM: no checkpoint_dir, so nothing to checkpoint; stopping")
                return self._exit(EXIT_FAILED)
            return None
        self.stopping = stop
        published = self._write_checkpoint(root, self.control)
        if self.stopping:
            if published is None:
                log.error("SIGTERM: the checkpoint failed; stopping without one")
                planted = "exit_75_without_checkpoint" in self.config.faults
                return self._exit(EXIT_PREEMPTED if planted else EXIT_FAILED)
            log.info("SIGTERM: checkpoint %s published; stopping", published)
            return self._exit(EXIT_PREEMPTED)
        return None

    def _write_checkpoint(self, root: Path, control: Control) -> str | None:
        """Prepare, commit, publish, prune and (unless stopping) resume, in one trace; the published ID, or None if
        it failed."""
        checkpoint_id = layout.new_checkpoint_id(self.clock())
        with control.tracing.trace("checkpoint", checkpoint_id):
            return self._write(root, control, checkpoint_id)

    def _write(self, root: Path, control: Control, checkpoint_id: str) -> str | None:
        directory = root / checkpoint_id
        if "prunes_before_publish" in self.config.faults:
            layout.prune(root, keep=layout.PUBLISHED_KEPT - 1)  # planted: room made before the save succeeded
        directory.mkdir()
        deadline = self._deadline()
        scope: list[Episode] = []
        restarts: set[str] = set()
        try:
            prepared, replies = control.prepare(checkpoint_id, deadline)
            if not prepared:
                raise ControlFailed("prepare", {"blockers": str(_blockers(replies))})
            restarts = {key for reply in replies.values() for key in reply.get("report", {}).get("restarts", [])}
            candidates = [*self.in_flight.values(), *self.restored_pending.values()]
            scope = [episode for episode in candidates if episode.capture_key not in restarts]
            own_trace = "commit_in_its_own_trace" in self.config.faults  # planted: a trace of its own
            with control.tracing.trace("commit", checkpoint_id) if own_trace else contextlib.nullcontext():
                commits = control.commit(checkpoint_id, str(directory), scope, deadline)
            written = {key for reply in commits.values() for key in reply.get("episode_ids", [])}
        except ControlFailed as exc:
            if exc.operation == "commit" and "failed_save_publishes" in self.config.faults:
                written = {episode.capture_key for episode in scope}  # planted: a refused commit taken as written
            else:
                log.warning("checkpoint %s failed: %s", checkpoint_id, exc)
                shutil.rmtree(directory, ignore_errors=True)
                if self._termination_pending():
                    self.stopping = True
                if not self.stopping:
                    self._resume(control, checkpoint_id)
                return None
        continued = tuple(e for e in scope if e.capture_key in written)
        if "manifest_names_next_attempt" in self.config.faults:
            continued = tuple(Episode(e.rollout_id, e.attempt + 1) for e in continued)  # planted: off by one
        manifest = CollectionManifest(
            checkpoint_id=checkpoint_id,
            run_id=self.run_id,
            created_at=self.clock(),
            continued=continued,
            restarted=tuple(e for e in self.in_flight.values() if e.capture_key in restarts),
        )
        layout.publish(root, manifest)
        layout.prune(root)
        if self._termination_pending():
            self.stopping = True  # a SIGTERM while it was written: this checkpoint is the stop's
        if not self.stopping:
            self._resume(control, checkpoint_id)
        return checkpoint_id

    def _resume(self, control: Control, checkpoint_id: str) -> None:
        try:
            control.resume(checkpoint_id, self._deadline())
        except ControlFailed as exc:
            log.warning("resume of %s failed: %s", checkpoint_id, exc)  # the lease re-opens admission

    def _resume_from_cache(self, root: Path, finished: set[str]) -> None:
        """Restore the latest checkpoint into fresh servers: its continued rollouts go again as attempt + 1, every
        other unfinished rollout the dispatch log names is retired at its logged attempt and starts over."""
        assert self.control is not None
        manifest = layout.latest(root)
        logged = layout.dispatched_attempts(root)
        continued = [] if manifest is None else [e for e in manifest.continued if e.rollout_id not in finished]
        continued_ids = {episode.rollout_id for episode in continued}
        stale = [
            Episode(rollout_id, attempt)
            for rollout_id, attempt in sorted(logged.items())
            if rollout_id in self.rows and rollout_id not in finished and rollout_id not in continued_ids
        ]
        restore_id = f"restore-{uuid.uuid4().hex[:12]}"
        with self.control.tracing.trace("restore", restore_id):
            if manifest is not None and "rerun_skips_restore" not in self.config.faults:  # planted: not restored
                self.control.restore(restore_id, str(root / manifest.checkpoint_id), continued, self._deadline())
            for start in range(0, len(stale), RETIRE_BATCH):
                self.control.retire(restore_id, stale[start : start + RETIRE_BATCH], self._deadline())
            if manifest is not None or stale:
                self.control.resume(restore_id, self._deadline())
        for episode in continued:
            self.attempt[episode.rollout_id] = episode.attempt + 1
            self.restored_pending[episode.rollout_id] = Episode(episode.rollout_id, episode.attempt + 1)
            self.pending.append(episode.rollout_id)
        for episode in stale:
            self.attempt[episode.rollout_id] = episode.attempt + 1
            self.marked.add(episode.rollout_id)
        log.info(
            "resumed from %s: %d continued, %d started over",
            manifest.checkpoint_id if manifest else "no checkpoint",
            len(continued),
            len(stale),
        )

    # --- signals and exit -----------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM and self.stopping and "second_sigterm_exits_at_once" in self.config.faults:
            os._exit(EXIT_PREEMPTED)  # planted: "the second SIGTERM forces the exit", the stop's checkpoint unwritten
        # SimpleQueue.put is reentrant: safe in a handler that may interrupt the decider inside `get`.
        self.events.put(Trigger.PREEMPTION if signum == signal.SIGTERM else Trigger.REQUEST)

    def _termination_pending(self) -> bool:
        """Whether a SIGTERM is queued; the other events stay queued, in order."""
        held: list[RunEnded | Trigger] = []
        found = False
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                break
            found = found or event is Trigger.PREEMPTION
            held.append(event)
        for event in held:
            if event is not Trigger.PREEMPTION:
                self.events.put(event)
        return found

    def _exit(self, code: int) -> NoReturn:
        """End now: flush what is written, leave the `/run`s in flight (the servers keep them parked)."""
        if self.output is not None:
            self.output.close()
        if self.dispatch_log is not None:
            self.dispatch_log.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _error_code(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("code", "")) if isinstance(error, dict) else ""


def _blockers(replies: dict[str, Any]) -> dict[str, Any]:
    unready = {name: reply for name, reply in replies.items() if reply.get("phase") != "prepared"}
    return {name: reply.get("report", {}).get("blockers") for name, reply in unready.items()}
