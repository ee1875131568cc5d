"""The state machine as rollout collection's environment (reference Appendix C): it starts collection runs of a
few rows against the deployment's servers and, as a cluster would, draws SIGUSR1, SIGTERM, SIGKILL of the run,
a save that fails part-way, a SIGTERM while a checkpoint is written (the stop's own, or a requested one), SIGKILL of
the whole Gym, and reruns with `resume_from_cache` on fresh servers, while releasing held model calls one at a time
so a checkpoint meets rollouts at every boundary. Every run's exit is audited (P22-P24, and P13 on the servers
after an exit 0), every published checkpoint when it appears (P22-P24), and the end drains the collection to its
last row (P25).

It runs on the search machinery the trainer's machine runs on: each rule is a `steplog.action` (the step recorder,
its precondition, its family and coverage goals: `ckpt_model.collection.coverage`), the failure report and the
regression file come from the step log, and what it predicts is a frozen value (`Prediction`), computed from what
the checker reads before each run starts: a row `LATEST` continues goes as its attempt + 1, one the dispatch log
names otherwise starts over as its logged attempt + 1, any other as attempt 0. Each rerun starts on fresh Gym
servers (the job restarted: a crash of the whole Gym first).
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
from collections.abc import Callable
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize

from ckpt_model.collection.coverage import CRASHES, LONGER_RUN, RELEASES, REQUESTS, RUNS, SAVES, STOPS
from ckpt_model.collection.prediction import Prediction
from ckpt_model.collection.relay import CallRelay
from ckpt_model.deployments.collection_run import CollectionAudit, CollectionRun
from ckpt_model.deployments.faults import STALL_POINTS, STORAGE_FAILURES, STORAGE_POINTS
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import backend_calls, poll
from ckpt_model.errors import HarnessError, PropertyViolation
from ckpt_model.interrupts import interrupt_prevails
from ckpt_model.model.contract import SCRIPTS, capture_key
from ckpt_model.model.topologies import Topology
from ckpt_model.modes.audit_telemetry import NoTelemetry, audit_telemetry
from ckpt_model.properties.collection_calls import CallAudit
from ckpt_model.properties.continuation import p4_calls
from ckpt_model.properties.fencing import p10_open_after_resume
from ckpt_model.properties.state import p13_clean_end
from ckpt_model.protocol import collection_files as files
from ckpt_model.protocol.history import History
from ckpt_model.protocol.wire import EpisodeId
from ckpt_model.results.regression import COLLECTION_CONTROLLER, Origin
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps import checkable
from ckpt_model.steps.steplog import StepLog, action, mechanisms_of, rule_names
from ckpt_model.steps.swarm import Swarm, swarms
from ckpt_model.trainer.telemetry_watch import raise_violation

ROWS = ("row-0", "row-1", "row-2")
PICK = st.integers(0, 7)  # an index into a list known only when the rule runs (taken modulo its length)
SETTLE_TIMEOUT_S = 30.0
# The rules no swarm leaves out: every situation starts with a run, and a row moves only when a call is released.
ALWAYS_KEPT = frozenset({"start_run", "release"})


# The rules that signal the run while one participant's checkpoint write stalls: one declaration, for each of them.
during_a_stalled_write = action(
    lambda self: self.run is not None and self.harness.faults.can_break_storage,
    family=SAVES,
    needs=(checkable.BREAK_STORAGE,),
    victim=PICK,
    point=PICK,
)


def input_row(topology: Topology, rollout_id: str) -> dict[str, Any]:
    """A collection input row of the topology's task: native `{rollout_id, task}`, or the legacy `/run` row
    without its attempt (the collector sets it)."""
    body = topology.run_body(rollout_id, 0)
    if topology.episode_owner == "agent":
        return {key: value for key, value in body.items() if key != "_ng_attempt_index"}
    return {"rollout_id": rollout_id, "task": body["task"]}


class CollectionMachine(RuleBasedStateMachine):
    """Plays the cluster around one collection directory on `harness`, with the collector's planted `faults`
    (docs/collection.md); bound by `collection_machine_for`, one machine per example."""

    # What its coverage table says reaches more: more examples or longer ones (`steplog.coverage`).
    LONGER_RUN = LONGER_RUN

    def __init__(
        self,
        harness: Harness,
        faults: tuple[str, ...] = (),
        stats: SearchStats | None = None,
        settle_timeout_s: float = SETTLE_TIMEOUT_S,
    ) -> None:
        super().__init__()
        if harness.backend is None:
            raise HarnessError("the collection machine holds model calls: it needs a gated backend")
        self.harness = harness
        self.faults = faults
        self.settle_timeout_s = settle_timeout_s
        if stats is not None:
            stats.example_started()
        harness.begin_example()
        traits = harness.spec.traits
        self.reward = traits.reward(traits.script)
        self.directory = harness.checkpoint_dir.parent / "collection"
        self.directory.mkdir()
        self.inputs = self.directory / "input.jsonl"
        self.inputs.write_text("".join(json.dumps(input_row(traits, rollout)) + "\n" for rollout in ROWS))
        self.output = self.directory / "output.jsonl"
        self.checkpoints = self.directory / "checkpoints"
        self.audit = CollectionAudit.for_topology(self.checkpoints, traits)
        self.participants = sorted(harness.statuses())
        self.run: CollectionRun | None = None
        self.model = Prediction(ROWS)
        # Every run reaches the servers through the relay, which journals its calls for the servers' properties.
        self.calls = History()
        kinds = {name: status["kind"] for name, status in harness.statuses().items()}
        self.call_audit = CallAudit(self.calls, kinds, self.reward)
        self.relay = CallRelay(harness.servers, self.calls, self.call_audit.observe)
        self.relay.start()
        self.log = StepLog(harness, self.calls, stats, Origin(COLLECTION_CONTROLLER, faults))

    # -- rules ------------------------------------------------------------------------------------------------

    @action(lambda self: self.run is None, family=RUNS)
    def start_run(self) -> None:
        """A collection run; after the first, a rerun with `resume_from_cache` on fresh servers (after the last row,
        one that must add no row)."""
        self._start_run()

    def _start_run(self) -> None:
        if self.model.runs:
            self._crash_gym()
        self._predict()
        config = {
            "input_jsonl_fpath": str(self.inputs),
            "output_jsonl_fpath": str(self.output),
            "checkpoint_dir": str(self.checkpoints),
            "resume_from_cache": self.model.runs > 1,
            **({"faults": list(self.faults)} if self.faults else {}),
        }
        self.run = self.harness.start_collection(config, self.model.runs - 1, through=self.relay.urls)
        self._settle()

    @action(lambda self: self.run is not None, family=RELEASES, pick=st.integers(0, len(ROWS) - 1))
    def release(self, pick: int) -> None:
        """Let one held model call return (among the waiting calls, by capture key)."""
        waiting = self._waiting()
        if waiting:
            key, index = waiting[pick % len(waiting)]
            self._label(f"release({key}'s call #{index})")
            self._backend().release([index])
        else:
            self._label("release(): no call held")
        self._settle()

    @action(lambda self: self.run is not None, family=REQUESTS)
    def request_checkpoint(self) -> None:
        """SIGUSR1: checkpoint, then continue; the new checkpoint must be complete and continue what was exported."""
        run = self._running()
        before = files.latest_id(self.checkpoints)
        sent_from = len(self.calls.events)
        run.signal(signal.SIGUSR1)
        self._until(
            lambda: files.latest_id(self.checkpoints) != before and self._resumed(),
            "a checkpoint published for SIGUSR1, then the participants resumed",
        )
        self._label(f"request_checkpoint() -> {files.latest_id(self.checkpoints)}")
        self._judged_once_resumed(functools.partial(p10_open_after_resume, "the SIGUSR1 checkpoint"), sent_from)
        self.audit.published()
        self._note_boundaries()
        self._settle()

    @action(lambda self: self.run is not None, family=STOPS)
    def preempt(self) -> None:
        """SIGTERM: checkpoint, then stop with exit 75."""
        run = self._running()
        self._label("preempt(): SIGTERM")
        run.signal(signal.SIGTERM)
        self._exited(run.wait())

    @action(lambda self: self.run is not None, family=STOPS)
    def kill_run(self) -> None:
        """SIGKILL of the run, as a cluster ends a job whose grace period ran out."""
        run = self._running()
        self._label("kill_run(): SIGKILL")
        run.kill()
        self._exited(run.wait())

    @action(
        lambda self: self.run is not None and self.harness.faults.can_break_storage,
        family=SAVES,
        needs=(checkable.BREAK_STORAGE,),
        mechanisms=("stop",),
        victim=PICK,
        point=PICK,
        errno=st.sampled_from(STORAGE_FAILURES),
        stop=st.booleans(),
    )
    def failing_save(self, victim: int, point: int, errno: str, stop: bool) -> None:
        """A checkpoint (SIGTERM when `stop`, else SIGUSR1) whose save fails part-way: one participant's write
        meets a full or failing disk. `LATEST` and every checkpoint published before must be untouched; a stop must
        not exit 75; a request's run resumes and goes on."""
        run = self._running()
        name = self._victim(victim)
        where = STORAGE_POINTS[point % len(STORAGE_POINTS)]
        self.harness.faults.break_storage(name, where, errno)
        before = files.latest_id(self.checkpoints)
        sent_from = len(self.calls.events)
        self._label(f"failing_save(): {name}'s write meets {errno} at {where}; {'SIGTERM' if stop else 'SIGUSR1'}")
        try:
            run.signal(signal.SIGTERM if stop else signal.SIGUSR1)
            if stop:
                self._exited(run.wait())
                return
            self._until(lambda: self._storage_met(name) and self._resumed(), f"the save failed on {name}, resumed")
        finally:
            self.harness.faults.release_storage(name)  # a fault no write met must not meet a later one
        self._judged_once_resumed(functools.partial(p10_open_after_resume, "the failed save"), sent_from)
        if files.latest_id(self.checkpoints) != before:
            self.audit.published()  # a failed save published: P22 says what is wrong with it, then P23 as below
            self._note_boundaries()
        else:
            self.audit.intact()
        self._settle()

    @during_a_stalled_write
    def second_sigterm(self, victim: int, point: int) -> None:
        """SIGTERM, and a second SIGTERM while the stop's checkpoint is being written (one participant's write
        stalls until the second has landed): the run must still publish it and exit 75."""
        self._sigterm_during_write("second_sigterm", signal.SIGTERM, victim, point)

    @during_a_stalled_write
    def sigterm_during_request(self, victim: int, point: int) -> None:
        """SIGUSR1, and SIGTERM while that checkpoint is being written (one participant's write stalls until the
        SIGTERM has landed): the requested checkpoint becomes the stop's, so the run must publish it and exit 75."""
        self._sigterm_during_write("sigterm_during_request", signal.SIGUSR1, victim, point)

    @action(lambda self: self.run is not None and self.harness.can_crash, family=CRASHES, needs=(checkable.CRASHES,))
    def crash_gym(self) -> None:
        """SIGKILL of every Gym server while the run waits on them, then fresh servers on the same ports (a node
        lost): the run's `/run`s fail, and each unfinished row must start over as its next attempt."""
        before = {index for _, index in self._waiting()}
        self.model = self.model.crashed(self._made())  # before the crash: no call of theirs can come sooner
        self._label(f"crash_gym(): {self._sent()}")
        self._crash_gym()
        self._until(lambda: not before & {index for _, index in self._waiting()}, "the killed servers' calls dropped")
        self._settle()

    # -- the end ----------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        """Drain and judge the end of the run, then stop what runs; after an interrupt only stop, and let the
        interrupt go on whatever stopping raises (`interrupts.interrupt_prevails`)."""
        with interrupt_prevails():
            try:
                self.log.drain(self._drain)
            finally:
                self.stop()
                self.log.finished(self.model.crashes, 0)

    def _drain(self) -> None:
        """Run the collection to its last row: the current run to its exit and reruns until one exits 0, releasing
        every held call; then every row once (P25) and the telemetry (P26)."""
        for _ in range(len(ROWS) + 2):
            if self.run is None:
                if not self._unfinished():
                    break
                self._start_run()
            while self.run is not None:
                waiting = self._waiting()
                if waiting:
                    self._backend().release([index for _, index in waiting])
                self._settle()
        if self._unfinished():
            raise HarnessError(f"rows {self._unfinished()} never finished in {self.model.runs} runs")
        self.audit.rows(self.output, ROWS, self.reward, dict(self.model.finished_as))
        self._telemetry_tells_the_truth()

    def _telemetry_tells_the_truth(self) -> None:
        """P26 as the offline audit judges it, on this example's spans (the collector's and every server's) and the
        checkpoints still published: one trace per checkpoint, every share written by an ok commit after an ok
        prepare, steps inside their operations, metrics agreeing with spans. The run has ended, so every span of
        a reply it got is on disk."""
        telemetry = self.harness.telemetry_dir
        if telemetry is None:
            return
        with contextlib.suppress(NoTelemetry):  # no server ran a control operation in this example
            audit_telemetry(telemetry, files.published_shares(self.checkpoints), raise_violation)

    def stop(self) -> None:
        """Kill the run, if one runs, and close the relay: the end of every example, also one that stopped before
        its teardown."""
        if self.run is not None:
            self.run.kill()
        self.relay.close()

    # -- predicting --------------------------------------------------------------------------------------------

    def _predict(self) -> None:
        """The attempt each unfinished row must be sent as in the next run (`Prediction.started`), from the output,
        `LATEST` and the dispatch log as they are now."""
        finished = {row.rollout_id for row in files.output_rows(self.output)}
        latest = files.latest_id(self.checkpoints)
        exported = () if latest is None else files.read_checkpoint(self.checkpoints, latest).continued
        logged: dict[str, int] = {}
        for rollout, attempt in files.dispatched(self.checkpoints):
            logged[rollout] = max(attempt, logged.get(rollout, -1))
        continued = {episode.rollout_id: episode.attempt for episode in exported}
        self.model = self.model.started(finished, latest, continued, logged, self._made())
        restored = f" continuing {latest}" if self.model.runs > 1 and latest is not None else ""
        self._label(f"start_run() -> run {self.model.runs}{restored}: {self._sent()}")

    def _sent(self) -> str:
        """The attempts the current run sends, each with the script call it starts from."""
        starts = dict(self.model.starts)
        keys = [capture_key(rollout, attempt) for rollout, attempt in self.model.attempts]
        return ", ".join(f"{key} from call {starts[key]}" for key in keys) or "no row left"

    def _made(self) -> dict[str, int]:
        """The backend's calls so far per capture key."""
        made, _ = backend_calls(self.harness)
        return {key: len(calls) for key, calls in made.items()}

    def _note_boundaries(self) -> None:
        """When a checkpoint first shows as `LATEST`: the boundary each attempt had then (`Prediction.taken`)."""
        latest = files.latest_id(self.checkpoints)
        if latest is not None:
            self.model = self.model.taken(latest, self._backend().calls())

    def _note_finished(self) -> None:
        """Rows that replied since: each finished at the attempt predicted for this run."""
        self.model = self.model.finished(row.rollout_id for row in files.output_rows(self.output))

    def _calls_continue(self) -> None:
        """P4: each predicted attempt's backend calls so far are its script from where it starts (a continued
        attempt re-sends only what its checkpoint left: none is redone from scratch when it could continue).
        Attempts the machine did not predict are P25's to judge, from the rows they write."""
        observed, _ = backend_calls(self.harness)
        expected = self.model.expected_calls(SCRIPTS[self.harness.spec.topology])
        p4_calls(expected, self.model.this_execution(observed))

    # -- observing ---------------------------------------------------------------------------------------------

    def _sigterm_during_write(self, rule: str, first: signal.Signals, victim: int, point: int) -> None:
        run = self._running()
        name = self._victim(victim)
        stall_point = STALL_POINTS[point % len(STALL_POINTS)]
        self._label(f"{rule}(): {first.name}, then SIGTERM while {name}'s write stalls at {stall_point}")
        self.harness.faults.break_storage(name, stall_point, "stall")
        try:
            run.signal(first)
            self._until(lambda: self._stalled_at(name, stall_point), f"{name}'s write to stall at {stall_point}")
            run.signal(signal.SIGTERM)
        finally:
            self.harness.faults.release_storage(name)
        self._exited(run.wait())

    def _crash_gym(self) -> None:
        """SIGKILL of every Gym server, then fresh ones on the same ports; noted in the calls' journal (it ends a
        prepared interval, P2)."""
        self.calls.note("cluster", "crash")
        self.harness.crash()

    def _victim(self, pick: int) -> str:
        return self.participants[pick % len(self.participants)]

    def _resumed(self) -> bool:
        """Every participant idle again (read after what must have happened first)."""
        return all(status["phase"] == "idle" for status in self.harness.statuses().values())

    def _storage_met(self, name: str) -> bool:
        """The write fault armed in `name` was met, and no write runs there."""
        state = self.harness.faults.storage_state(name)
        return state["armed"] is None and state["writes"] == 0

    def _stalled_at(self, name: str, point: str) -> bool:
        return bool(self.harness.faults.storage_state(name)["stalled_at"] == point)

    def _unfinished(self) -> list[str]:
        finished = {row.rollout_id for row in files.output_rows(self.output)}
        return [rollout for rollout in ROWS if rollout not in finished]

    def _waiting(self) -> list[tuple[str, int]]:
        """The held calls as (capture key, index), sorted by capture key then index."""
        calls = self._backend().calls()
        held = [call for call in calls if call["waiting"] and not call["cancelled"]]
        return sorted((call["capture_key"], call["index"]) for call in held)

    def _quiet(self) -> bool:
        """The run exited, or it waits on held calls only: some call is held and every unfinished row waits on one
        (a run whose every row replied is quiet only once it exited, or if it sent a row again, which P25 judges
        once that row replies)."""
        run = self.run
        if run is None or run.process.poll() is not None:
            return True
        held = {EpisodeId.from_capture_key(key).rollout_id for key, _ in self._waiting()}
        return bool(held) and held.issuperset(self._unfinished())

    def _settle(self) -> None:
        self._until(self._quiet, "every unfinished row to wait on one held model call")
        run = self.run
        if run is not None and run.process.poll() is not None:
            self._exited(run.wait())
        self._note_finished()
        self.call_audit.check()
        self._calls_continue()

    def _exited(self, exit_code: int) -> None:
        run = self._running()
        self.run = None
        self.model = self.model.exited(exit_code)
        self._label(f"run {self.model.runs} exited {exit_code}")
        self._note_finished()
        self.audit.exited(exit_code, run.latest_at_start)
        self._note_boundaries()
        self.call_audit.check()
        if exit_code == 0:  # "collection done": every row must be in the output now, and the servers clean
            self.audit.rows(self.output, ROWS, self.reward, dict(self.model.finished_as))
            self._clean_end()

    def _clean_end(self) -> None:
        """P13 on the collector's own control calls: after a run that said it is done, every participant idle and
        accepting with nothing left (its retire marks forgotten, nothing restored pending)."""
        self._judged_when_settled(p13_clean_end)

    def _judged_when_settled(self, verdict: Callable[[dict[str, Any]], None]) -> None:
        """`verdict` on the participants' statuses, waited for up to the settle timeout first (slowness is never a
        verdict), then judged on one fresh read."""
        with contextlib.suppress(HarnessError):
            self._until(lambda: _holds(verdict, self.harness.statuses()), "the participants' statuses to settle")
        verdict(self.harness.statuses())

    def _judged_once_resumed(self, verdict: Callable[[dict[str, Any]], None], sent_from: int) -> None:
        """`verdict` on the participants' statuses read once every participant has replied to a resume the program
        sent after history event `sent_from` (waited for up to the settle timeout: slowness is never a verdict)."""
        with contextlib.suppress(HarnessError):
            self._until(lambda: self.call_audit.resumed_since(sent_from), "every participant's resume reply")
        verdict(self.harness.statuses())

    def _until(self, condition: Callable[[], bool], what: str) -> None:
        """Poll `condition` (each poll reads the backend's calls and the collection's files) with the checker's one
        back-off poll (`observe.poll`); a state that never comes is a harness error naming `what`."""
        if not poll(condition, self.settle_timeout_s):
            log = self.run.log()[-2000:] if self.run is not None else ""
            raise HarnessError(f"timed out after {self.settle_timeout_s:g} s waiting for {what}\n{log}")

    def _label(self, text: str) -> None:
        """What a step did, in the report's steps (and for the coverage goals that read them)."""
        self.log.labels.append(text)

    def _running(self) -> CollectionRun:
        assert self.run is not None, "a rule's precondition says a run is running"
        return self.run

    def _backend(self) -> Any:
        assert self.harness.backend is not None
        return self.harness.backend


class SwarmCollectionMachine(CollectionMachine):
    """The same machine, whose every example first draws the rules and mechanisms it leaves out (`swarm`)."""

    @initialize(chosen=swarms(rule_names(CollectionMachine), mechanisms_of(CollectionMachine), kept=ALWAYS_KEPT))
    def choose_swarm(self, chosen: Swarm) -> None:
        self.log.swarm = chosen


def collection_machine_for(
    harness: Harness, faults: tuple[str, ...] = (), stats: SearchStats | None = None, swarm: bool = False
) -> type[CollectionMachine]:
    """A factory of machines bound to `harness` and the collector's planted `faults`, for
    `run_state_machine_as_test` (Hypothesis builds machines without arguments); with `swarm`, of swarm machines.
    Hypothesis keys its example database (and, derandomized, its draws) on the factory's source plus this digest,
    so each deployment and each set of faults keeps its own examples."""

    def factory() -> CollectionMachine:
        return CollectionMachine(harness, faults, stats)

    def swarm_factory() -> CollectionMachine:
        return SwarmCollectionMachine(harness, faults, stats)

    chosen = swarm_factory if swarm else factory
    digest = f"{harness.spec.key}/{COLLECTION_CONTROLLER}/{','.join(faults)}"
    chosen._hypothesis_internal_add_digest = digest.encode()  # type: ignore[attr-defined]
    return cast(type[CollectionMachine], chosen)


def _holds(verdict: Callable[[dict[str, Any]], None], statuses: dict[str, Any]) -> bool:
    try:
        verdict(statuses)
    except PropertyViolation:
        return False
    return True
