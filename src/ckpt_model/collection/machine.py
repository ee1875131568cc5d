"""The state machine as rollout collection's environment (reference Appendix C): it starts collection runs of a
few rows against the deployment's servers and, as a cluster would, draws SIGUSR1, SIGTERM, SIGKILL of the run,
a save that fails part-way, a SIGTERM while a checkpoint is written (the stop's own, or a requested one), SIGKILL of
the whole Gym, and reruns with `resume_from_cache` on fresh servers, while releasing held model calls one at a time
so a checkpoint meets rollouts at every boundary. Every run's exit is audited (P22-P24, and P13 on the servers
after an exit 0), every published checkpoint when it appears (P22-P24), and the end drains the collection to its
last row (P25). Every rule call is recorded in `steps`, which `ckpt_model.search.collection_search` minimises.

Each rerun starts on fresh Gym servers (the job restarted: a crash of the whole Gym first), and the attempt each
unfinished row must be sent as is predicted from what the checker reads before it starts: a row `LATEST`
continues goes as its attempt + 1, one the dispatch log names otherwise starts over as its logged attempt + 1, any
other as attempt 0.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RULE_MARKER, RuleBasedStateMachine, precondition, rule

from ckpt_model.collection.relay import CallRelay
from ckpt_model.deployments.collection_run import CollectionAudit, CollectionRun
from ckpt_model.deployments.faults import STALL_POINTS, STORAGE_FAILURES, STORAGE_POINTS
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import backend_calls, poll
from ckpt_model.errors import HarnessError, PropertyViolation
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
from ckpt_model.trainer.telemetry_watch import raise_violation

F = TypeVar("F", bound=Callable[..., None])

ROWS = ("row-0", "row-1", "row-2")
PICK = st.integers(0, 7)  # an index into a list known only when the rule runs (taken modulo its length)
SETTLE_TIMEOUT_S = 30.0


def recorded(method: F) -> F:
    """A rule whose call is appended to the machine's `steps` (its name and arguments), for the minimiser."""

    @functools.wraps(method)
    def wrapper(self: CollectionMachine, **arguments: Any) -> None:
        self.steps.append((method.__name__, dict(arguments)))
        method(self, **arguments)

    return wrapper  # type: ignore[return-value]


def input_row(topology: Topology, rollout_id: str) -> dict[str, Any]:
    """A collection input row of the topology's task: native `{rollout_id, task}`, or the legacy `/run` row
    without its attempt (the collector sets it)."""
    body = topology.run_body(rollout_id, 0)
    if topology.episode_owner == "agent":
        return {key: value for key, value in body.items() if key != "_ng_attempt_index"}
    return {"rollout_id": rollout_id, "task": body["task"]}


class CollectionMachine(RuleBasedStateMachine):
    """Plays the cluster around one collection directory; `harness` is bound by `collection_machine_for`."""

    harness: Harness
    # Planted faults of the look-alike collector, handed to every run's config (docs/collection.md).
    collection_faults: tuple[str, ...] = ()
    # Examples begun by this bound machine (Hypothesis may run more or fewer than it was asked for), and the last
    # one: after a search that stopped at its first failure, the failing example
    # (`ckpt_model.search.collection_search`).
    examples: int = 0
    last: CollectionMachine | None = None

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        type(self).last = self
        self.steps: list[tuple[str, dict[str, Any]]] = []  # the rule calls so far, as `recorded` appends them
        harness = self.harness
        if harness.backend is None:
            raise HarnessError("the collection machine holds model calls: it needs a gated backend")
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
        self.runs = 0
        self.predicted: dict[str, int] = {}  # the attempt each unfinished row goes as in the current run
        # P4: the script call each predicted attempt starts from (a continued one from its checkpoint's boundary:
        # where the exported attempt started, plus the calls it had delivered when the checkpoint was taken), and
        # per checkpoint, how many calls each attempt had delivered then.
        self.starts: dict[str, int] = {}
        # Restoring a checkpoint again sends its continued attempts again under the same capture keys: the calls a
        # key had made before its current execution, which P4 leaves out.
        self.made_before: dict[str, int] = {}
        self.delivered_at: dict[str, dict[str, int]] = {}
        self.finished_as: dict[str, int] = {}  # the attempt predicted for the run in which each row finished
        # Every run reaches the servers through the relay, which journals its calls for the servers' properties.
        self.calls = History()
        kinds = {name: status["kind"] for name, status in harness.statuses().items()}
        self.call_audit = CallAudit(self.calls, kinds, self.reward)
        self.relay = CallRelay(harness.servers, self.calls, self.call_audit.observe)
        self.relay.start()

    # -- rules ------------------------------------------------------------------------------------------------

    @precondition(lambda self: self.run is None)
    @rule()
    @recorded
    def start_run(self) -> None:
        """A collection run; after the first, a rerun with `resume_from_cache` on fresh servers (after the last row,
        one that must add no row)."""
        self._start_run()

    def _start_run(self) -> None:
        if self.runs:
            self._crash_gym()
        self.predicted = self._predict()
        config = {
            "input_jsonl_fpath": str(self.inputs),
            "output_jsonl_fpath": str(self.output),
            "checkpoint_dir": str(self.checkpoints),
            "resume_from_cache": self.runs > 0,
            **({"faults": list(self.collection_faults)} if self.collection_faults else {}),
        }
        self.run = self.harness.start_collection(config, self.runs, through=self.relay.urls)
        self.runs += 1
        self._settle()

    @precondition(lambda self: self.run is not None)
    @rule(pick=st.integers(0, len(ROWS) - 1))
    @recorded
    def release(self, pick: int) -> None:
        """Let one held model call return (among the waiting calls, by capture key)."""
        waiting = self._waiting()
        if waiting:
            _, index = waiting[pick % len(waiting)]
            self._backend().release([index])
        self._settle()

    @precondition(lambda self: self.run is not None)
    @rule()
    @recorded
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
        self._judged_once_resumed(functools.partial(p10_open_after_resume, "the SIGUSR1 checkpoint"), sent_from)
        self.audit.published()
        self._note_boundaries()
        self._settle()

    @precondition(lambda self: self.run is not None)
    @rule()
    @recorded
    def preempt(self) -> None:
        """SIGTERM: checkpoint, then stop with exit 75."""
        run = self._running()
        run.signal(signal.SIGTERM)
        self._exited(run.wait())

    @precondition(lambda self: self.run is not None)
    @rule()
    @recorded
    def kill_run(self) -> None:
        """SIGKILL of the run, as a cluster ends a job whose grace period ran out."""
        run = self._running()
        run.kill()
        self._exited(run.wait())

    @precondition(lambda self: self.run is not None and self.harness.faults.can_break_storage)
    @rule(victim=PICK, point=PICK, errno=st.sampled_from(STORAGE_FAILURES), stop=st.booleans())
    @recorded
    def failing_save(self, victim: int, point: int, errno: str, stop: bool) -> None:
        """A checkpoint (SIGTERM when `stop`, else SIGUSR1) whose save fails part-way: one participant's write
        meets a full or failing disk. `LATEST` and every checkpoint published before must be untouched; a stop must
        not exit 75; a request's run resumes and goes on."""
        run = self._running()
        name = self._victim(victim)
        self.harness.faults.break_storage(name, STORAGE_POINTS[point % len(STORAGE_POINTS)], errno)
        before = files.latest_id(self.checkpoints)
        sent_from = len(self.calls.events)
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

    @precondition(lambda self: self.run is not None and self.harness.faults.can_break_storage)
    @rule(victim=PICK, point=PICK)
    @recorded
    def second_sigterm(self, victim: int, point: int) -> None:
        """SIGTERM, and a second SIGTERM while the stop's checkpoint is being written (one participant's write
        stalls until the second has landed): the run must still publish it and exit 75."""
        self._sigterm_during_write(signal.SIGTERM, victim, point)

    @precondition(lambda self: self.run is not None and self.harness.faults.can_break_storage)
    @rule(victim=PICK, point=PICK)
    @recorded
    def sigterm_during_request(self, victim: int, point: int) -> None:
        """SIGUSR1, and SIGTERM while that checkpoint is being written (one participant's write stalls until the
        SIGTERM has landed): the requested checkpoint becomes the stop's, so the run must publish it and exit 75."""
        self._sigterm_during_write(signal.SIGUSR1, victim, point)

    @precondition(lambda self: self.run is not None and self.harness.can_crash)
    @rule()
    @recorded
    def crash_gym(self) -> None:
        """SIGKILL of every Gym server while the run waits on them, then fresh servers on the same ports (a node
        lost): the run's `/run`s fail, and each unfinished row must start over as its next attempt."""
        before = {index for _, index in self._waiting()}
        self.predicted = {rollout: attempt + 1 for rollout, attempt in self.predicted.items()}
        # Before the crash: no call of theirs can come sooner.
        self._executions({capture_key(rollout, attempt): 0 for rollout, attempt in self.predicted.items()})
        self._crash_gym()
        self._until(lambda: not before & {index for _, index in self._waiting()}, "the killed servers' calls dropped")
        self._settle()

    # -- the end ----------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
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
                raise HarnessError(f"rows {self._unfinished()} never finished in {self.runs} runs")
            self.audit.rows(self.output, ROWS, self.reward, self.finished_as)
            self._telemetry_tells_the_truth()
        finally:
            self.stop()

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

    # -- observing ---------------------------------------------------------------------------------------------

    def _predict(self) -> dict[str, int]:
        """The attempt each unfinished row must be sent as in the next run (module docstring)."""
        finished = {row.rollout_id for row in files.output_rows(self.output)}
        latest_id = files.latest_id(self.checkpoints)
        continued = {} if latest_id is None else _attempts(files.read_checkpoint(self.checkpoints, latest_id).continued)
        logged: dict[str, int] = {}
        for rollout, attempt in files.dispatched(self.checkpoints):
            logged[rollout] = max(attempt, logged.get(rollout, -1))
        predicted = {}
        starts: dict[str, int] = {}
        boundaries = self.delivered_at.get(latest_id, {}) if latest_id is not None else {}
        for rollout in ROWS:
            if rollout in finished:
                continue
            if rollout in continued:
                predicted[rollout] = continued[rollout] + 1
                exported = capture_key(rollout, continued[rollout])  # from where it started, plus what it delivered
                start = self.starts.get(exported, 0) + boundaries.get(exported, 0)
            else:
                predicted[rollout] = logged[rollout] + 1 if rollout in logged else 0
                start = 0
            starts[capture_key(rollout, predicted[rollout])] = start
        self._executions(starts)
        return predicted

    def _note_boundaries(self) -> None:
        """When a checkpoint first shows as `LATEST`: how many calls each attempt had delivered (the machine
        released none since it was taken, and every unfinished row waits on a held call), the boundary a
        continuation of it starts from."""
        latest_id = files.latest_id(self.checkpoints)
        if latest_id is None or latest_id in self.delivered_at:
            return
        delivered: dict[str, int] = {}
        made: dict[str, int] = {}
        for call in self._backend().calls():
            key = call.get("capture_key")
            if key is None:
                continue
            made[key] = made.get(key, 0) + 1
            this_execution = made[key] > self.made_before.get(key, 0)
            if this_execution and not call["waiting"] and not call["cancelled"]:
                delivered[key] = delivered.get(key, 0) + 1
        self.delivered_at[latest_id] = delivered

    def _calls_continue(self) -> None:
        """P4: each predicted attempt's backend calls so far are its script from where it starts (a continued
        attempt re-sends only what its checkpoint left: none is redone from scratch when it could continue).
        Attempts the machine did not predict are P25's to judge, from the rows they write."""
        observed, _ = backend_calls(self.harness)
        script = SCRIPTS[self.harness.spec.topology]
        expected = {key: tuple(script[start:]) for key, start in self.starts.items()}
        made = {key: calls[self.made_before.get(key, 0) :] for key, calls in observed.items() if key in expected}
        p4_calls(expected, made)

    def _executions(self, starts: dict[str, int]) -> None:
        """The predicted attempts (capture key: the script call each starts from) are sent now (P4); the calls their
        keys made before are other executions'."""
        made, _ = backend_calls(self.harness)
        self.starts.update(starts)
        self.made_before.update({key: len(made.get(key, ())) for key in starts})

    def _sigterm_during_write(self, first: signal.Signals, victim: int, point: int) -> None:
        run = self._running()
        name = self._victim(victim)
        stall_point = STALL_POINTS[point % len(STALL_POINTS)]
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

    def _note_finished(self) -> None:
        """Rows that replied since: each finished at the attempt predicted for this run."""
        for row in files.output_rows(self.output):
            if row.rollout_id in self.predicted:
                self.finished_as[row.rollout_id] = self.predicted.pop(row.rollout_id)

    def _exited(self, exit_code: int) -> None:
        run = self._running()
        self.run = None
        self._note_finished()
        self.audit.exited(exit_code, run.latest_at_start)
        self._note_boundaries()
        self.call_audit.check()
        if exit_code == 0:  # "collection done": every row must be in the output now, and the servers clean
            self.audit.rows(self.output, ROWS, self.reward, self.finished_as)
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
        """Poll `condition` (each poll reads the backend's calls and the collection's files) as the trainer's settle
        does (`quiescence.poll`); a state that never comes is a harness error naming `what`."""
        if not poll(condition, SETTLE_TIMEOUT_S):
            log = self.run.log()[-2000:] if self.run is not None else ""
            raise HarnessError(f"timed out after {SETTLE_TIMEOUT_S:g} s waiting for {what}\n{log}")

    def _running(self) -> CollectionRun:
        assert self.run is not None, "a rule's precondition says a run is running"
        return self.run

    def _backend(self) -> Any:
        assert self.harness.backend is not None
        return self.harness.backend


def collection_machine_for(harness: Harness, faults: tuple[str, ...] = ()) -> type[CollectionMachine]:
    """The machine bound to `harness` and the collector's planted `faults` (Hypothesis builds machines without
    arguments)."""
    bound = {"harness": harness, "collection_faults": faults, "examples": 0}
    return type("CollectionMachineBound", (CollectionMachine,), bound)


def enabled(machine: CollectionMachine, rule_name: str) -> bool:
    """Whether the machine would draw `rule_name` now (every precondition of the rule holds)."""
    rule_of = getattr(getattr(type(machine), rule_name, None), RULE_MARKER, None)
    if rule_of is None:
        raise HarnessError(f"{rule_name!r} is no rule of the collection machine")
    return all(precondition(machine) for precondition in rule_of.preconditions)


def _holds(verdict: Callable[[dict[str, Any]], None], statuses: dict[str, Any]) -> bool:
    try:
        verdict(statuses)
    except PropertyViolation:
        return False
    return True


def _attempts(episodes: Any) -> dict[str, int]:
    return {episode.rollout_id: episode.attempt for episode in episodes}
