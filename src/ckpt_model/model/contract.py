"""The abstract model of the controller contract: a pure, frozen value and one function per rule.

No I/O lives here: no sockets, clocks, threads or randomness. Every rule is a function from one `Model` to the
next; the machine applies it after the real operation succeeded and then waits until the system shows what
`expect(model)` derives from the new value (each attempt's backend calls, each participant's phase and counts:
`ckpt_model.model.expectation`).

Vocabulary. A *rollout* (`r0`, `r1`, ..., or a drawn rollout ID: `ckpt_model.model.rollout_names`) is a task
the controller wants done; each try at it is an *attempt*
(`EpisodeId(rollout, attempt)`, named by its capture key). Gating makes every attempt stop at a backend call (a
policy call, or the slow topology's judge call): at quiescence a running attempt has exactly one call
outstanding, waiting at the backend or, once a policy call is released while a checkpoint is open, held by the
model server. A checkpoint's *snapshot* is the controller's own state published
with it; restoring the checkpoint rolls the controller back to that snapshot (work dispatched later is abandoned)
and continues every exported attempt as attempt + 1 from its boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from ckpt_model.model.checkpoint_names import checkpoint_name, restore_name
from ckpt_model.model.rollout_names import rollout_name
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.protocol.gym_tasks import TaskName
from ckpt_model.protocol.wire import rollout_key

Topology = Literal["native", "legacy", "counter", "slow", "mixed"]
VerifyMode = Literal["wait", "replay"]
Status = Literal["running", "pending", "replied", "dead", "retired"]
Phase = Literal["idle", "prepared", "committed"]

# A script entry is a policy call's message count, or VERIFY: the slow topology's judge call, made by the
# verification step after the agent has finished. Both wait at the backend until the checker releases them.
VERIFY = "verify"
ScriptCall = int | str
# What an uninterrupted episode calls, in order (reference 9.4): weather, and the counter row's two increments.
SCRIPTS: dict[str, tuple[ScriptCall, ...]] = {
    "native": (2, 4),
    "legacy": (1, 3),
    "counter": (1, 3, 5),
    "slow": (2, 4, VERIFY),
    "mixed": (2, 4),
}
# The mixed topology's second environment and its `restart_only` resources server (Gym's e2e names): every
# episode there is a restart, which starts over after a crash instead of continuing.
RESTART_ENVIRONMENT = "restart_environment"
RESTART_RESOURCES = "restart_resources"
RESTART_SERVERS = (RESTART_ENVIRONMENT, RESTART_RESOURCES)
# `/run`s with a rejected rollout ID an example sends at most.
REJECTED_IDS_MAX = 3


def capture_key(rollout: str, attempt: int) -> str:
    """The capture key of `attempt` of `rollout` (Gym's derivation: `ckpt_model.protocol.wire.rollout_key`)."""
    return rollout_key(rollout, attempt)


@attrs.frozen
class Attempt:
    """One attempt of a rollout and where it stands in its script.

    `start_call` is the boundary it continues from (0 for a fresh start), `calls_made` how many model calls it
    sent, `delivered` how many responses reached the agent. `held`: its outstanding call returned at the backend
    while a checkpoint was open and the model server holds the response.
    """

    rollout: str
    attempt: int
    status: Status
    script: tuple[ScriptCall, ...]
    start_call: int = 0
    calls_made: int = 0
    delivered: int = 0
    held: bool = False
    continued: bool = False
    # Run on the mixed topology's restart environment: reported in `restarts`, never exported, started over.
    restart: bool = False
    # The task its native `/run` names, drawn when the rollout was dispatched and kept by every later attempt (None:
    # the topology's own task name; a legacy row names none).
    task: TaskName | None = None
    # Which `/run` carries it (numbered by the model as they are sent; -1: not sent yet). Restoring a checkpoint
    # again reuses capture keys, so an outcome belongs to a `/run`, not to a key.
    run: int = -1

    @property
    def key(self) -> str:
        return capture_key(self.rollout, self.attempt)

    @property
    def next_call(self) -> ScriptCall:
        """The call it sends next (P4: a continued attempt re-sends only what is left)."""
        return self.script[self.start_call + self.calls_made]

    @property
    def outstanding(self) -> ScriptCall | None:
        """The call it made and has no result of yet, if any."""
        if self.calls_made <= self.delivered:
            return None
        return self.script[self.start_call + self.calls_made - 1]

    @property
    def verifying(self) -> bool:
        """Running and in its verification step (its judge call is outstanding)."""
        return self.status == "running" and self.outstanding == VERIFY

    @property
    def needs_agent(self) -> bool:
        """The agent holds a session for it: it runs or would continue before its verification step."""
        if self.status == "running":
            return not self.verifying and not self.at_return
        index = self.start_call + self.calls_made
        return self.status == "pending" and index < len(self.script) and self.script[index] != VERIFY

    @property
    def boundary(self) -> int:
        """Index in the script of the call it would make next if continued from a checkpoint now."""
        return self.start_call + self.delivered

    @property
    def waiting(self) -> bool:
        """Its outstanding call waits at the backend for a release."""
        return self.status == "running" and self.calls_made > self.delivered and not self.held

    @property
    def finished_script(self) -> bool:
        return self.boundary >= len(self.script)

    @property
    def at_return(self) -> bool:
        """Running with every call delivered: its episode finished while a checkpoint was open and waits at its
        `return` boundary, replying at the resume (Gym's scenario 10: finished during prepare)."""
        return self.status == "running" and self.finished_script

    @property
    def tool_rounds(self) -> int:
        """Tool rounds its episode ran up to its boundary: every delivered policy response but the last is a tool
        call."""
        policy_calls = sum(1 for call in self.script if call != VERIFY)
        return min(self.boundary, policy_calls - 1)

    def holds_resources_session(self, topology: Topology) -> bool:
        """The resources server tracks a session for it: from its seed until its verification ends. A continued
        attempt was seeded before the checkpoint. The stateless weather server restores no session, and binds
        one again with the continuation's first request to it: the tool round (continued from call 0) or a
        replayed verification. The counter server restores each exported session with the checkpoint, bound to
        the next attempt, which holds it from the restore on."""
        if TOPOLOGIES[topology].resources_exported:
            return self.status in ("running", "pending") and not self.at_return
        if self.status != "running" or self.at_return:
            return False
        if not self.continued:
            return True
        return (self.start_call == 0 and self.delivered >= 1) or self.verifying

    def deliver(self, *, admission_open: bool = True) -> Attempt:
        """The outstanding call's response reaches the agent; with the script done, the attempt replies (or, while a
        checkpoint is open, waits at its `return` boundary)."""
        delivered = attrs.evolve(self, delivered=self.delivered + 1, held=False)
        if delivered.finished_script and admission_open:
            return attrs.evolve(delivered, status="replied")
        return delivered


@attrs.frozen
class Restarted:
    """A participant restarted alone since every process last crashed: its memory started empty then.

    Retire marks and remembered resumed IDs live in each process's memory (reference sections 2.6 and 10), so
    this one holds only the marks set since (`marks`) and the resumed IDs from `remembers_from` on."""

    kind: str
    marks: tuple[tuple[str, int], ...] = ()
    remembers_from: int = 0


@attrs.frozen
class Checkpoint:
    """A committed checkpoint: the exported attempts' keys and the controller snapshot published with it. For one
    whose commit a crash cut short, `shares` names the participants that published their share before it."""

    checkpoint_id: str
    exported: tuple[str, ...]
    snapshot: tuple[Attempt, ...]
    shares: frozenset[str] = frozenset()


@attrs.frozen
class Tried:
    """The paths of a misbehaving controller, each run once per occasion: a rule that is always enabled and
    changes nothing is drawn over and over (Hypothesis favours argument-free rules) and crowds out `release`."""

    # The quiet controller's lapsed lease (once per example).
    lease_lapse: bool = False
    # The checkpoints a `/run` was refused during, and ledger removal was refused during (one of each per ID).
    run_while_open_in: str | None = None
    ledger_removal_in: str | None = None
    # The resumed IDs late calls were probed for (again only once another ID was resumed).
    late_calls_for: tuple[str, ...] = ()
    # One participant crashed alone (once per example).
    crash_alone: bool = False
    # One worker of a multi-worker server killed alone (once per example).
    kill_worker: bool = False
    # One participant's clock skewed across a checkpoint (once per example: each waits out a lease).
    clock_skew: bool = False
    # A checkpoint held open while more time passed than an episode's whole budget (once per example).
    time_passed: bool = False
    # One participant frozen across its lease (once per example: each waits out a lease).
    pause_lapse: bool = False
    # `/run`s sent with a rollout ID Gym's rules reject (a few per example).
    rejected_ids: int = 0
    # Control calls sent with a checkpoint ID Gym's rules reject (a few per example).
    rejected_checkpoint_ids: int = 0


@attrs.frozen
class Model:
    """The whole controller-visible state of one run."""

    topology: Topology
    verify_mode: VerifyMode = "wait"
    rollouts_max: int = 3
    attempts: tuple[Attempt, ...] = ()
    phase: Phase = "idle"
    open_checkpoint: str | None = None
    checkpoint_seq: int = 0
    # The stem the example's checkpoints are named with since a rule drew it (`checkpoint_names`; None: `c<seq>`).
    checkpoint_stem: str | None = None
    # Each restore's ID and the checkpoint it named, in order.
    restores: tuple[tuple[str, str], ...] = ()
    rollout_seq: int = 0
    committed: tuple[Checkpoint, ...] = ()
    # Checkpoints whose commit a crash cut short: some participants' shares are on disk, the controller never
    # published them (reference section 4: publish only after every commit succeeded).
    incomplete: tuple[Checkpoint, ...] = ()
    sent: tuple[tuple[str, ScriptCall], ...] = ()
    resumed: tuple[str, ...] = ()
    # Per rollout, the highest retired attempt the participants refuse (`stale_attempt`) until forget.
    retired_marks: tuple[tuple[str, int], ...] = ()
    runs_sent: int = 0
    fresh: bool = True
    restored_pending_reported: tuple[str, ...] = ()
    restarted: tuple[Restarted, ...] = ()
    # The IDs of retires and forgets (`retire3`, `forget4`): one sequence for both.
    control_seq: int = 0
    # Per rollout, the attempt it had when retired (a late `/run` re-sends it); a crash or a forget ends it.
    retired_attempts: tuple[Attempt, ...] = ()
    tried: Tried = Tried()

    # -- views ------------------------------------------------------------------------------------------------

    @property
    def script(self) -> tuple[ScriptCall, ...]:
        return SCRIPTS[self.topology]

    @property
    def episode_owner(self) -> str:
        """The server that holds episodes and lists them in its commit reply: the agent for legacy `/run` (the
        counter rows are legacy rows)."""
        return TOPOLOGIES[self.topology].episode_owner

    def current(self) -> dict[str, Attempt]:
        """The latest attempt of each rollout."""
        latest: dict[str, Attempt] = {}
        for attempt in self.attempts:
            latest[attempt.rollout] = attempt
        return latest

    def with_status(self, *statuses: Status) -> list[Attempt]:
        return [a for a in self.current().values() if a.status in statuses]

    def rollouts_with_status(self, *statuses: Status) -> list[str]:
        """The rollouts whose latest attempt has one of `statuses`, in the order the model holds them (first
        dispatched first): the order a rule's `pick` counts in. It is the abstraction's order too
        (`ckpt_model.model.abstract`), whatever the rollouts are named: drawn rollout IDs sort apart from the
        order they were dispatched in, and a pick by name would choose a different rollout in two models the
        abstraction counts as one state."""
        return [a.rollout for a in self.with_status(*statuses)]

    def waiting(self) -> list[str]:
        """Rollouts with a model call held at the gate, in the order the model holds them (as a pick counts)."""
        return [a.rollout for a in self.current().values() if a.waiting]

    def releasable(self) -> list[str]:
        """Waiting calls a release may let go. A judge call is not released while a checkpoint is open: when
        the episode would record its next boundary against the commit is a race the checker cannot observe."""
        current = self.current()
        return [r for r in self.waiting() if not (self.checkpoint_open and current[r].verifying)]

    def before_verification(self) -> list[str]:
        """Rollouts whose policy calls can all be released now, up to their verification step (slow topology)."""
        if self.checkpoint_open or VERIFY not in self.script:
            return []
        return [a.rollout for a in self.current().values() if a.waiting and not a.verifying]

    def blockers(self) -> list[str]:
        """Capture keys that keep a prepare from becoming ready: attempts in a `wait` verification step."""
        current = self.current()
        return sorted(current[rollout].key for rollout in self.blocking_rollouts())

    def blocking_rollouts(self) -> list[str]:
        """The rollouts of the blockers, in the order the model holds them: the order the controller retires
        them in (as a pick counts: `rollouts_with_status`)."""
        if self.verify_mode != "wait":
            return []
        return [a.rollout for a in self.current().values() if a.verifying]

    def live(self) -> list[Attempt]:
        return self.with_status("running", "pending", "dead")

    def live_rollouts(self) -> list[str]:
        """The live rollouts in the order the model holds them (as a pick counts: `rollouts_with_status`)."""
        return [a.rollout for a in self.live()]

    def scope(self) -> list[Attempt]:
        """What a commit continues: every unfinished dispatched attempt (running), plus restored-pending ones,
        except restarts (Gym's `PrepareResult.continued`: they start over instead)."""
        return [a for a in self.with_status("running", "pending") if not a.restart]

    def restarts(self) -> list[str]:
        """Capture keys of the running restarts: what a prepare reports in `restarts` (every one has seeded)."""
        return sorted(a.key for a in self.with_status("running") if a.restart)

    @property
    def checkpoint_open(self) -> bool:
        return self.phase != "idle"

    def can_dispatch(self) -> bool:
        return not self.checkpoint_open and len(self.live()) < self.rollouts_max

    def can_dispatch_restart(self) -> bool:
        return TOPOLOGIES[self.topology].restart_environment and self.can_dispatch()

    def can_restore(self) -> bool:
        """Restore needs processes that have served nothing since they started, and a committed checkpoint."""
        return self.fresh and not self.checkpoint_open and bool(self.committed)

    def can_prepare(self) -> bool:
        return not self.checkpoint_open and not self.with_status("dead") and not self.blockers()

    def can_prepare_blocked(self) -> bool:
        return not self.checkpoint_open and not self.with_status("dead") and bool(self.blockers())

    def marks_of(self, kind: str) -> tuple[tuple[str, int], ...]:
        """The retire marks a participant of `kind` holds: all of them unless it restarted alone since."""
        for restarted in self.restarted:
            if restarted.kind == kind:
                return restarted.marks
        return self.retired_marks

    def remembers(self, kind: str, checkpoint_id: str) -> bool:
        """A participant of `kind` still refuses `checkpoint_id` as resumed (it did not restart since)."""
        start = next((r.remembers_from for r in self.restarted if r.kind == kind), 0)
        return checkpoint_id in self.resumed[start:]

    def refuses_late_run(self, rollout: str, attempt: int) -> bool:
        """A late `/run` of a retired attempt is refused (`stale_attempt`) before it leaves anything anywhere: its
        first stop holds a mark covering it, or (environment `/run`) the resources server, whose seed comes first,
        does and the environment relays the refusal, once no checkpoint is open. A participant restarted alone lost
        its marks."""

        if self.holds_mark(self.episode_owner, rollout, attempt):
            return True
        # The environment checks its own marks first, then admission: while a checkpoint is open it refuses the
        # /run with admission_closed before the seed could reach the resources server's mark.
        return (
            self.episode_owner == "environment"
            and self.holds_mark("resources", rollout, attempt)
            and not self.checkpoint_open
        )

    def holds_mark(self, kind: str, rollout: str, attempt: int) -> bool:
        """A participant of `kind` holds a retire mark covering `attempt` of `rollout`: it refuses that attempt's
        work with `stale_attempt` (a participant restarted alone lost its marks)."""
        return dict(self.marks_of(kind)).get(rollout, -1) >= attempt

    def ends_alone(self, kind: str) -> list[Attempt]:
        """Running attempts whose `/run` ends by itself when the participant of `kind` crashes alone: the owner's
        `/run`s are cut; the others fail where the episode waits on the dead server: the agent while it runs the
        loop, the policy model while a policy call is outstanding, the resources server while it verifies."""

        def ends(attempt: Attempt) -> bool:
            if kind == self.episode_owner:
                return True
            if kind in ("agent", "model"):
                return not attempt.verifying
            return kind == "resources" and attempt.verifying

        return [a for a in self.with_status("running") if ends(a)]

    def can_crash_participant(self, kind: str) -> bool:
        """One participant may crash alone between operations with no checkpoint open, unless it holds a restored
        episode waiting for its replacement (that would need the controller to restore again): the owner, the
        agent, and the counter's resources server."""
        if self.checkpoint_open or TOPOLOGIES[self.topology].restart_environment:
            # Mixed runs two participants of a kind; what one of them forgets alone is not modelled.
            return False
        exported = TOPOLOGIES[self.topology].resources_exported
        holds_restored = kind in (self.episode_owner, "agent") or (kind == "resources" and exported)
        return not (holds_restored and self.with_status("pending"))

    @property
    def opened(self) -> str:
        """The open checkpoint's ID (only asked while one is open)."""
        assert self.open_checkpoint is not None, "no checkpoint is open"
        return self.open_checkpoint

    def interruptible(self) -> list[str]:
        """The operations a crash can land inside now: a restore, a retire of a lost attempt, a forget."""
        available = {
            "restore": self.can_restore(),
            "retire": not self.checkpoint_open and bool(self.with_status("dead", "pending")),
            "forget": not self.checkpoint_open and bool(self.retired_marks),
        }
        return [operation for operation, possible in available.items() if possible]

    def worth_killing_a_worker(self) -> bool:
        """One worker of a multi-worker server is killed once per example, between operations with no checkpoint
        open, while something runs that it may take with it."""
        return not (self.tried.kill_worker or self.checkpoint_open) and bool(self.with_status("running"))

    def worth_crashing_alone(self) -> bool:
        """One participant crashing alone is drawn once, when there is something to lose: marks, resumed IDs or
        running work."""
        return not self.tried.crash_alone and bool(self.retired_marks or self.resumed or self.with_status("running"))

    def may_run_while_open(self) -> bool:
        return self.checkpoint_open and self.tried.run_while_open_in != self.open_checkpoint

    def may_send_rejected_id(self) -> bool:
        """A `/run` with a rejected rollout ID, with no checkpoint open, a few times an example: each changes nothing,
        and a rule drawn over and over crowds out the rest."""
        return not self.checkpoint_open and self.tried.rejected_ids < REJECTED_IDS_MAX

    def may_send_rejected_checkpoint_id(self) -> bool:
        """A control call with a rejected checkpoint ID, in any phase, a few times an example: each changes nothing,
        and a rule drawn over and over crowds out the rest."""
        return self.tried.rejected_checkpoint_ids < REJECTED_IDS_MAX

    def may_remove_ledgers_while_open(self) -> bool:
        return self.checkpoint_open and self.tried.ledger_removal_in != self.open_checkpoint

    def may_call_late(self) -> bool:
        return bool(self.resumed) and self.tried.late_calls_for != self.resumed

    def late_runs(self) -> list[str]:
        """Retired rollouts whose late `/run` must be refused now, in the order they were retired (as a pick
        counts, whatever their names)."""
        return [a.rollout for a in self.retired_attempts if self.refuses_late_run(a.rollout, a.attempt)]

    def retired_attempt(self, rollout: str) -> Attempt:
        return next(a for a in self.retired_attempts if a.rollout == rollout)

    def restore_id(self, checkpoint_id: str) -> str:
        """The ID the next restore of `checkpoint_id` runs under."""
        return restore_name(checkpoint_id, self.checkpoint_seq + 1)

    def next_checkpoint_id(self) -> str:
        """The ID the next checkpoint is prepared under (`checkpoint_names`)."""
        return checkpoint_name(self.checkpoint_stem, self.checkpoint_seq + 1)

    def last_restored(self) -> int | None:
        """The place in `committed` of the checkpoint the latest restore since the processes started named (done,
        refused or died in), while it is still committed: what a second restore of the same checkpoint picks."""
        restored_by = dict(self.restores)
        for resumed in reversed(self.resumed):
            if resumed in restored_by:
                ids = [c.checkpoint_id for c in self.committed]
                restored = restored_by[resumed]
                return ids.index(restored) if restored in ids else None
        return None

    def marked_rollouts(self) -> tuple[str, ...]:
        return tuple(rollout for rollout, _ in self.retired_marks)

    def marks_covering(self, checkpoint_id: str, incomplete: bool = False) -> list[str]:
        """Rollouts whose retire mark would refuse the attempts a restore of the checkpoint continues.

        Marks outlive a restore (reference section 10: only forget removes them), and restoring a checkpoint again
        reuses its attempt numbers, so a controller that retired a continuation must forget the rollout before it
        restores the same checkpoint again."""
        marks = dict(self.retired_marks)
        checkpoint = self.checkpoint(checkpoint_id, incomplete)
        continued = [a for a in checkpoint.snapshot if a.key in checkpoint.exported]
        return sorted(a.rollout for a in continued if a.rollout in marks and a.attempt + 1 <= marks[a.rollout])

    def exports(self, kind: str, instance: str = "") -> tuple[str, ...]:
        """The capture keys a participant of `kind` (named `instance`) writes at a commit of the current scope (P1,
        exactly).

        The episode owner writes every scoped episode; the agent of a native episode writes the sessions of the
        scoped attempts that still need it; the counter's resources server the sessions of the scoped attempts;
        the weather resources server is stateless, the restart servers never export a restart, and the policy
        model exports ledger rows only with token capture on, so these write nothing here."""
        if instance in RESTART_SERVERS:
            return ()
        scope = self.scope()
        if kind == self.episode_owner:
            return tuple(sorted(a.key for a in scope))
        if kind == "agent":
            return tuple(sorted(a.key for a in scope if a.needs_agent))
        if kind == "resources" and TOPOLOGIES[self.topology].resources_exported:
            return tuple(sorted(a.key for a in scope if a.holds_resources_session(self.topology)))
        return ()

    def may_also_export(self, kind: str) -> tuple[str, ...]:
        """Capture keys a participant of `kind` may write beside `exports`, or not: the agent's sessions of running
        restarts. Gym's agent leaves restarts out (reference 9.1); how it learns one is not in the reference, and
        the look-alike agent, which does not learn it, writes them. Restoring never installs them (out of scope)."""
        if kind != "agent":
            return ()
        return tuple(sorted(a.key for a in self.with_status("running") if a.restart and a.needs_agent))

    # -- rules --------------------------------------------------------------------------------------------------

    def refused_dispatch(self) -> tuple[Model, Attempt]:
        """A new `/run` while a checkpoint is open is refused (`admission_closed`) and owns nothing; its name and
        its `/run` number are used up, so that neither names anything later."""
        attempt = Attempt(
            rollout=f"r{self.rollout_seq}", attempt=0, status="running", script=self.script, run=self.runs_sent
        )
        tried = attrs.evolve(self.tried, run_while_open_in=self.open_checkpoint)
        return attrs.evolve(self, rollout_seq=self.rollout_seq + 1, runs_sent=self.runs_sent + 1, tried=tried), attempt

    def rejected_dispatch(self, rollout_id: str) -> tuple[Model, Attempt]:
        """A `/run` naming `rollout_id`, which Gym's rules reject: it is refused and owns nothing; only its `/run`
        number is used up. The attempt returned is what the `/run` names, never one the model holds."""
        attempt = Attempt(rollout=rollout_id, attempt=0, status="running", script=self.script, run=self.runs_sent)
        tried = attrs.evolve(self.tried, rejected_ids=self.tried.rejected_ids + 1)
        return attrs.evolve(self, runs_sent=self.runs_sent + 1, tried=tried), attempt

    def reserved_name_of(self, pick: int) -> str:
        """A name that ends in the `-a<N>` capture keys reserve: the key the next attempt of a rollout the model
        holds (picked by `pick`) would have, else `x-a1`. On a server that skips the reservation, its `/run` at
        attempt 0 and that next attempt would share one capture key."""
        latest = self.current()
        if not latest:
            return capture_key("x", 1)
        attempt = list(latest.values())[pick % len(latest)]
        return capture_key(attempt.rollout, attempt.attempt + 1)

    def issue_id(self, operation: str) -> tuple[Model, str]:
        """A fresh ID for a retire or a forget."""
        return attrs.evolve(self, control_seq=self.control_seq + 1), f"{operation}{self.control_seq + 1}"

    def having_tried(self, **tried: Any) -> Model:
        """The same model, with a misbehaving controller's path marked as run (`Tried`)."""
        return attrs.evolve(self, tried=attrs.evolve(self.tried, **tried))

    def dispatch(
        self, restart: bool = False, drawn: str | None = None, task: TaskName | None = None
    ) -> tuple[Model, str]:
        """A new rollout starts as attempt 0 (on the restart environment: a restart) and stops at its first model
        call. Its name is its rollout ID on the wire: `drawn` numbered apart (`rollout_names`), else `r<seq>`; its
        native `/run` names `task` (None: the topology's own), as every later attempt of it does."""
        rollout = rollout_name(drawn, self.rollout_seq)
        attempt = Attempt(
            rollout=rollout,
            attempt=0,
            status="running",
            script=self.script,
            run=self.runs_sent,
            restart=restart,
            task=task,
        )
        model = attrs.evolve(
            self,
            attempts=(*self.attempts, attempt),
            rollout_seq=self.rollout_seq + 1,
            fresh=False,
            runs_sent=self.runs_sent + 1,
        )
        return model._send(attempt), rollout

    def release(self, rollout: str) -> Model:
        """The rollout's waiting call returns: delivered when admission is open, held by the model otherwise."""
        attempt = self._current(rollout)
        if not attempt.waiting:
            raise ValueError(f"release needs a waiting call; {attempt.key} is {attempt.status}")
        if self.checkpoint_open and attempt.verifying:
            raise ValueError(f"{attempt.key}'s judge call is not released while a checkpoint is open")
        if self.checkpoint_open:
            return self._replace(attrs.evolve(attempt, held=True))
        return self._deliver(attempt)

    def prepare(self, drawn: str | None = None) -> tuple[Model, str]:
        """A new checkpoint is prepared everywhere. Its ID is the next of the sequence, named with `drawn` (which
        names the example's later checkpoints too) or else the stem drawn last (`checkpoint_names`)."""
        named = self if drawn is None else attrs.evolve(self, checkpoint_stem=drawn)
        checkpoint_id = named.next_checkpoint_id()
        model = attrs.evolve(
            named, phase="prepared", open_checkpoint=checkpoint_id, checkpoint_seq=self.checkpoint_seq + 1
        )
        return model, checkpoint_id

    def prepare_waited(self) -> tuple[Model, str]:
        """A prepare that waited for `wait` verifications while the controller released their judge calls: each
        episode finished during the prepare and waits at its `return` boundary, so the prepare succeeds."""
        model, checkpoint_id = self.prepare()
        for attempt in model.current().values():
            if attempt.verifying:
                model = model._replace(attempt.deliver(admission_open=False))
        return model, checkpoint_id

    def lease_expired(self, *, time_passed: bool = False) -> tuple[Model, str]:
        """A prepare after which the controller went quiet (`time_passed`: while more time passed than an episode's
        whole budget): the lease expires and every participant re-opens as a resume would, remembering the ID. The
        episodes parked meanwhile go on with the time they had left."""
        tried = {"time_passed": True} if time_passed else {"lease_lapse": True}
        model, checkpoint_id = self.having_tried(**tried).prepare()
        return model.resume(), checkpoint_id

    def prepare_blocked(self) -> tuple[Model, str]:
        """A prepare that ran out of its deadline on blockers, and the controller's resume of it: the ID is used
        up and remembered as resumed; nothing else changes (the controller retires the blockers next)."""
        checkpoint_id = self.next_checkpoint_id()
        model = attrs.evolve(self, checkpoint_seq=self.checkpoint_seq + 1, resumed=(*self.resumed, checkpoint_id))
        return model, checkpoint_id

    def commit(self) -> tuple[Model, Checkpoint]:
        assert self.open_checkpoint is not None, "commit needs an open checkpoint"
        assert self.phase == "prepared", "commit needs a prepared checkpoint"
        checkpoint = Checkpoint(
            checkpoint_id=self.open_checkpoint,
            exported=tuple(sorted(a.key for a in self.scope())),
            snapshot=tuple(self.current().values()),
        )
        model = attrs.evolve(self, phase="committed", committed=(*self.committed, checkpoint))
        return model, checkpoint

    def crash_in_commit(self, shares: frozenset[str] = frozenset()) -> Model:
        """Every Gym process dies while the open checkpoint's commit is under way: as `crash`, and the checkpoint
        is incomplete (never published); `shares` names the participants that published their share before."""
        _, checkpoint = self.commit()
        incomplete = attrs.evolve(checkpoint, shares=shares)
        return attrs.evolve(self.crash(), incomplete=(*self.incomplete, incomplete))

    def commit_failed(self, shares: frozenset[str] = frozenset()) -> Model:
        """A commit some participant could not write, which the controller gave up on: it resumes, and the
        checkpoint is incomplete (never published); `shares` names the participants that published their share."""
        _, checkpoint = self.commit()
        incomplete = attrs.evolve(checkpoint, shares=shares)
        return attrs.evolve(self.resume(), incomplete=(*self.incomplete, incomplete))

    def can_restore_incomplete(self) -> bool:
        return self.fresh and not self.checkpoint_open and bool(self.incomplete)

    def resume(self) -> Model:
        """Admission re-opens everywhere and every held response is delivered."""
        assert self.open_checkpoint is not None
        model = attrs.evolve(self, phase="idle", open_checkpoint=None, resumed=(*self.resumed, self.open_checkpoint))
        for attempt in model.with_status("running"):
            if attempt.held:
                model = model._deliver(attempt)
            elif attempt.at_return:
                model = model._replace(attrs.evolve(attempt, status="replied"))
        return model

    def crash(self) -> Model:
        """Every Gym process dies: running attempts are lost; so are restored state, marks and remembered IDs."""
        model = attrs.evolve(
            self,
            phase="idle",
            open_checkpoint=None,
            retired_marks=(),
            resumed=(),
            fresh=True,
            restored_pending_reported=(),
            restarted=(),
            retired_attempts=(),
        )
        for attempt in model.with_status("running", "pending"):
            model = model._replace(attrs.evolve(attempt, status="dead", held=False))
        return model

    def crash_participant(self, kind: str) -> Model:
        """The participant of `kind` is SIGKILLed and started again alone: it forgets its marks and resumed IDs;
        the others keep theirs. Work in flight lost a server it needed, so the controller retires every running
        attempt everywhere (the restarted participant marks them too): what its orphans still hold elsewhere is
        stopped and freed, and none of them replies as if complete."""
        if not self.can_crash_participant(kind):
            raise ValueError(f"{kind} cannot crash alone: a checkpoint is open or it holds restored state")
        model = self._restarted_alone(kind).having_tried(crash_alone=True)
        for attempt in self.with_status("running"):
            model = model.retire(attempt.rollout)
        return model

    def kill_worker(self, lost: Sequence[str]) -> Model:
        """One worker of a multi-worker server is SIGKILLed alone: the running attempts placed on it (`lost`, by
        rollout) lost what it held, so the controller retires them everywhere; every other attempt runs on, and the
        server, short a worker, restores nothing until it starts again (its coordinator refuses)."""
        if self.checkpoint_open:
            raise ValueError("a worker is killed alone only with no checkpoint open")
        running = {attempt.rollout for attempt in self.with_status("running")}
        if not set(lost) <= running:
            raise ValueError(f"only running attempts are lost with a worker (got {sorted(set(lost) - running)})")
        model = attrs.evolve(self, fresh=False).having_tried(kill_worker=True)
        for rollout in lost:
            model = model.retire(rollout)
        return model

    def restore(self, checkpoint_id: str) -> tuple[Model, str]:
        """Roll the controller back to the checkpoint's snapshot; exported attempts continue as attempt + 1."""
        checkpoint = self.checkpoint(checkpoint_id)
        restore_id = self.restore_id(checkpoint_id)
        # Each continued attempt comes back as its next one, pending; the rest as they were, but a restart running
        # then is not in the checkpoint: it died in the crash and starts over. The rollouts keep the order they were
        # dispatched in (the snapshot's), which a rule's pick counts in (`rollouts_with_status`).
        restored = [
            (
                Attempt(
                    rollout=a.rollout,
                    attempt=a.attempt + 1,
                    status="pending",
                    script=a.script,
                    start_call=a.boundary,
                    continued=True,
                    task=a.task,
                )
                if a.key in checkpoint.exported
                else attrs.evolve(a, status="dead", held=False)
                if a.status == "running"
                else a
            )
            for a in checkpoint.snapshot
        ]
        pending = [a for a, was in zip(restored, checkpoint.snapshot, strict=True) if was.key in checkpoint.exported]
        model = attrs.evolve(
            self,
            attempts=tuple(restored),
            fresh=False,
            checkpoint_seq=self.checkpoint_seq + 1,
            resumed=(*self.resumed, restore_id),
            restores=(*self.restores, (restore_id, checkpoint_id)),
            restored_pending_reported=tuple(sorted(a.key for a in pending)),
        )
        return model, restore_id

    def failed_restore(self, checkpoint_id: str) -> tuple[Model, str]:
        """A restore of a committed or an incomplete checkpoint that some participant refused: the controller
        retired, everywhere, the next attempts it would have continued, then resumed its ID (Gym's
        `coordination.restore`). Nothing of it stays: each such attempt is marked and never runs, so its rollout,
        dead since the crash, starts over after it; and the processes have now served a restore, so another one
        needs a crash first."""
        incomplete = any(c.checkpoint_id == checkpoint_id for c in self.incomplete)
        checkpoint = self.checkpoint(checkpoint_id, incomplete)
        restore_id = self.restore_id(checkpoint_id)
        model = attrs.evolve(
            self,
            fresh=False,
            checkpoint_seq=self.checkpoint_seq + 1,
            resumed=(*self.resumed, restore_id),
            restores=(*self.restores, (restore_id, checkpoint_id)),
        )
        for exported in (a for a in checkpoint.snapshot if a.key in checkpoint.exported):
            burned = exported.attempt + 1
            # None: a restore of an earlier checkpoint abandoned the rollout since; only the marks remain of it.
            latest = model.current().get(exported.rollout)
            if latest is not None and latest.status == "dead" and latest.attempt < burned:
                never_run = Attempt(
                    rollout=exported.rollout, attempt=burned, status="dead", script=model.script, task=latest.task
                )
                model = attrs.evolve(model, attempts=(*model.attempts, never_run))
            restarted = tuple(
                attrs.evolve(r, marks=_marked(r.marks, exported.rollout, burned)) for r in model.restarted
            )
            model = attrs.evolve(
                model, retired_marks=_marked(model.retired_marks, exported.rollout, burned), restarted=restarted
            )
        return model, restore_id

    def died_in_restore(self, checkpoint_id: str, kind: str) -> tuple[Model, str]:
        """A restore during which the participant of `kind` died before installing and was started again alone:
        it forgot its marks and resumed IDs (as `crash_participant`), then the controller's cleanup reached it
        with the others, so the restore ends as `failed_restore` everywhere."""
        return self._restarted_alone(kind).failed_restore(checkpoint_id)

    def start_replacement(self, rollout: str) -> Model:
        """Send the restored-pending attempt's `/run`: it continues from its boundary (an episode restored at its
        `return` boundary replies without another call)."""
        attempt = attrs.evolve(self._current(rollout), run=self.runs_sent)
        assert attempt.status == "pending"
        sent = attrs.evolve(self, runs_sent=self.runs_sent + 1)
        if attempt.finished_script:
            model = sent._replace(attrs.evolve(attempt, status="replied"))
        else:
            model = sent._send(attrs.evolve(attempt, status="running"))
        pending = tuple(k for k in model.restored_pending_reported if k != attempt.key)
        return attrs.evolve(model, restored_pending_reported=pending)

    def start_over(self, rollout: str) -> Model:
        """Dispatch attempt + 1 of a rollout from the beginning of its script (after a crash or a retire)."""
        attempt = self._current(rollout)
        fresh_attempt = Attempt(
            rollout=rollout,
            attempt=attempt.attempt + 1,
            status="running",
            script=self.script,
            run=self.runs_sent,
            restart=attempt.restart,
            task=attempt.task,
        )
        model = attrs.evolve(self, attempts=(*self.attempts, fresh_attempt), fresh=False, runs_sent=self.runs_sent + 1)
        return model._send(fresh_attempt)

    def retire(self, rollout: str) -> Model:
        attempt = self._current(rollout)
        model = self._replace(attrs.evolve(attempt, status="retired", held=False))
        pending = tuple(k for k in model.restored_pending_reported if k != attempt.key)
        restarted = tuple(attrs.evolve(r, marks=_marked(r.marks, rollout, attempt.attempt)) for r in self.restarted)
        retired = (*(a for a in self.retired_attempts if a.rollout != rollout), attempt)
        return attrs.evolve(
            model,
            retired_marks=_marked(self.retired_marks, rollout, attempt.attempt),
            restored_pending_reported=pending,
            restarted=restarted,
            retired_attempts=retired,
        )

    def forget(self, rollouts: tuple[str, ...] | None = None) -> Model:
        """Drop the marks of `rollouts` (every mark when None)."""

        def kept(marks: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
            return () if rollouts is None else tuple(m for m in marks if m[0] not in rollouts)

        restarted = tuple(attrs.evolve(r, marks=kept(r.marks)) for r in self.restarted)
        retired = () if rollouts is None else tuple(a for a in self.retired_attempts if a.rollout not in rollouts)
        return attrs.evolve(self, retired_marks=kept(self.retired_marks), restarted=restarted, retired_attempts=retired)

    # -- helpers ----------------------------------------------------------------------------------------------

    def checkpoint(self, checkpoint_id: str, incomplete: bool = False) -> Checkpoint:
        """A committed checkpoint, or (`incomplete`) one whose commit a crash cut short."""
        for checkpoint in self.incomplete if incomplete else self.committed:
            if checkpoint.checkpoint_id == checkpoint_id:
                return checkpoint
        raise KeyError(f"no {'incomplete' if incomplete else 'committed'} checkpoint {checkpoint_id!r}")

    def attempt(self, key: str) -> Attempt:
        for attempt in self.attempts:
            if attempt.key == key:
                return attempt
        raise KeyError(key)

    def _current(self, rollout: str) -> Attempt:
        try:
            return self.current()[rollout]
        except KeyError:
            raise ValueError(f"no rollout {rollout!r}") from None

    def _restarted_alone(self, kind: str) -> Model:
        """The participant of `kind` started again alone now: no marks, and only the resumed IDs from here on."""
        others = tuple(r for r in self.restarted if r.kind != kind)
        return attrs.evolve(self, restarted=(*others, Restarted(kind, remembers_from=len(self.resumed))))

    def _replace(self, updated: Attempt) -> Model:
        attempts = tuple(updated if a.key == updated.key else a for a in self.attempts)
        return attrs.evolve(self, attempts=attempts)

    def _send(self, attempt: Attempt) -> Model:
        """The attempt sends its next model call; the backend records it under the attempt's capture key."""
        sent = (*self.sent, (attempt.key, attempt.next_call))
        return attrs.evolve(self._replace(attrs.evolve(attempt, calls_made=attempt.calls_made + 1)), sent=sent)

    def _deliver(self, attempt: Attempt) -> Model:
        delivered = attempt.deliver()
        model = self._replace(delivered)
        return model if delivered.status == "replied" else model._send(delivered)


def _marked(marks: tuple[tuple[str, int], ...], rollout: str, attempt: int) -> tuple[tuple[str, int], ...]:
    """`marks` after retiring `attempt` of `rollout`: one mark per rollout, the highest retired attempt."""
    table = dict(marks)
    table[rollout] = max(table.get(rollout, -1), attempt)
    return tuple(sorted(table.items()))
