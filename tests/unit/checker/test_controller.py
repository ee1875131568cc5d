"""The controller and the nemesis's kills without processes: what they journal, what they remember for a retry, and what
they hand the watchers.

A scripted control client stands in for the participants (it answers each call and records it), and a recording
watcher takes every event. Three tests replay past false alarms, each of which was one rule forgetting one piece of
bookkeeping the controller now does for every rule: a retry after a refused restore (`6f0af76`), a power cut that
left a prepared interval open in the history (`c77d59a`), and a crash inside a restore after it reached the policy
model (`61659e9`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.errors import CoordinationError, HarnessError, ParticipantFailure
from ckpt_model.model.contract import Attempt
from ckpt_model.model.lineage import Lineage
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.properties.fencing import P10Violation
from ckpt_model.protocol.client import Participant, Participants, PrepareResult
from ckpt_model.protocol.history import History
from ckpt_model.protocol.wire import EpisodeId
from ckpt_model.trainer.controller import CONTROL_DEADLINE_S, PAST_DEADLINE_S, Controller, Operation
from ckpt_model.trainer.kills import Nemesis
from ckpt_model.trainer.ledger_watch import LedgerWatch
from ckpt_model.trainer.nemeses.crashes import Crashes

MEMBERS = Participants(
    members=(
        Participant(name="env", kind="environment", url="http://env"),
        Participant(name="policy", kind="model", url="http://policy"),
        Participant(name="agent", kind="agent", url="http://agent"),
        Participant(name="weather", kind="resources", url="http://weather"),
    )
)
LEASE_GRACE_S = 0.25
RUNNING = Attempt(rollout="r0", attempt=0, status="running", script=(2, 4), calls_made=2, delivered=1, run=0)


class ScriptedControl:
    """Answers every control call with `{"phase": ...}` per participant (prepare, resume, renew, retire and forget
    with the fields their checks read) and records what it was asked."""

    def __init__(self) -> None:
        self.participants = MEMBERS
        self.calls: list[tuple[str, Any]] = []
        self.refuse: set[str] = set()
        self.refused_with = "invalid_checkpoint_state"

    def _replies(self, operation: str, names: Any = None) -> dict[str, Any]:
        self.calls.append((operation, names))
        if operation in self.refuse:
            failure = ParticipantFailure("weather", 409, self.refused_with, "refused")
            raise CoordinationError(operation, {"weather": failure})
        chosen = [m.name for m in MEMBERS if names is None or m.name in names]
        return {name: {"phase": operation} for name in sorted(chosen)}

    def prepare(self, checkpoint_id: str, deadline_ts: float) -> PrepareResult:
        replies = self._replies("prepare")
        report = {"ready": True, "blockers": [], "blocker_count": 0, "counts": {}, "restarts": []}
        return PrepareResult(prepared=True, replies={n: {"phase": "prepared", "report": report} for n in replies})

    def commit(self, checkpoint_id: str, directory: str, episodes: Any, deadline_ts: float) -> dict[str, Any]:
        return self._replies("commit")

    def resume(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Any]:
        return {name: {"phase": "idle", "idempotent": False} for name in self._replies("resume")}

    def renew(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Any]:
        return {name: {"lease_expires_at": deadline_ts + LEASE_GRACE_S} for name in self._replies("renew")}

    def restore(self, checkpoint_id: str, directory: str, episodes: Any, deadline_ts: float) -> dict[str, Any]:
        return self._replies("restore")

    def retire(self, checkpoint_id: str, episodes: Any, deadline_ts: float) -> dict[str, Any]:
        keys = [episode.capture_key for episode in episodes]
        return {name: {"retired": keys} for name in self._replies("retire")}

    def forget(self, checkpoint_id: str, rollouts: Any, deadline_ts: float) -> dict[str, Any]:
        return {name: {"forgotten": sorted(set(rollouts))} for name in self._replies("forget")}

    def post_each(self, operation: str, body: Any, deadline_ts: float, names: Any = None) -> dict[str, Any]:
        return self._replies(f"post_each {operation}", names)


class FakeRuns:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.refused_stale: dict[int, str] = {}
        self.refused_closed: dict[int, str] = {}

    def send(self, attempt: Attempt) -> None:
        self.sent.append(attempt.key)

    def submit(self, call: Any, *args: Any) -> Any:
        from concurrent.futures import Future

        future: Future[Any] = Future()
        future.set_result(call(*args))
        return future

    def wait_ended(self, *args: Any) -> None:
        pass


class TrueClocks:
    """Clocks the checker does not move: the controller's clock is the true time."""

    def now(self) -> float:
        return time.time()


class FakeHarness:
    def __init__(self, root: Path) -> None:
        self.control = ScriptedControl()
        self.checkpoint_dir = root
        self.backend = None
        self.crashes: list[str] = []
        self.places_calls = False  # one policy worker: nothing to place
        self.spec = DeploymentSpec("native", lease_grace_s=LEASE_GRACE_S)
        self.clocks = TrueClocks()

    def crash(self, power_loss: bool = False) -> None:
        self.crashes.append("power loss" if power_loss else "crash")

    def restart_server(self, name: str) -> None:
        self.crashes.append(name)


class Quiet:
    timeout_s = 1.0


class Recorder:
    def __init__(self) -> None:
        self.events: list[Operation] = []

    def observe(self, operation: Operation) -> None:
        self.events.append(operation)

    def of(self, f: str, type_: str) -> list[Operation]:
        return [e for e in self.events if (e.f, e.type) == (f, type_)]


@pytest.fixture
def parts(tmp_path: Path) -> tuple[Controller, FakeHarness, History, Recorder]:
    harness, history, recorder = FakeHarness(tmp_path), History(), Recorder()
    controller = Controller(harness, history, FakeRuns(), Quiet(), watchers=[recorder])  # type: ignore[arg-type]
    return controller, harness, history, recorder


def test_every_control_call_is_journaled_once_as_invoke_then_ok(parts: Any) -> None:
    controller, _, history, _ = parts
    controller.commit("c1", [RUNNING])
    assert [(e.process, e.f, e.type) for e in history.events] == [
        ("controller", "commit", "invoke"),
        ("controller", "commit", "ok"),
    ]
    assert history.events[1].invoke_index == history.events[0].index


def test_a_refused_call_is_journaled_as_failed_and_raised(parts: Any) -> None:
    controller, harness, history, recorder = parts
    harness.control.refuse.add("forget")
    with pytest.raises(CoordinationError):
        controller.forget("forget1", ["r0"])
    assert [e.type for e in history.events] == ["invoke", "fail"]
    assert "invalid_checkpoint_state" in history.events[1].value
    assert recorder.of("forget", "fail")


def test_a_resume_refused_with_a_code_no_resume_gets_is_p10_and_journaled(parts: Any) -> None:
    """The protocol accepts a resume in every phase (idle: idempotent, the ID remembered); `invalid_phase` there is
    the participant's bug, judged, not an outcome the checker cannot judge."""
    controller, harness, history, _ = parts
    harness.control.refuse.add("resume")
    harness.control.refused_with = "invalid_phase"
    with pytest.raises(P10Violation, match=r"weather: HTTP 409 invalid_phase refused"):
        controller.resume("c3")
    assert [e.type for e in history.events] == ["invoke", "fail"]


def test_a_resume_refused_otherwise_is_raised_for_the_caller(parts: Any) -> None:
    controller, harness, _, _ = parts
    harness.control.refuse.add("resume")
    with pytest.raises(CoordinationError):
        controller.resume("c3")


def test_the_watchers_get_the_commit_as_one_event_with_its_scope(parts: Any, tmp_path: Path) -> None:
    controller, _, _, recorder = parts
    controller.commit("c1", [RUNNING])
    (event,) = recorder.of("commit", "ok")
    assert event.checkpoint_id == "c1"
    assert event.episodes == (EpisodeId(rollout_id="r0", attempt=0),)
    assert event.delivered == {"r0": 1}
    assert event.directory == tmp_path / "c1"
    assert {m.name for m in event.reached} == {"env", "policy", "agent", "weather"}


def test_only_an_operation_that_names_a_checkpoint_hands_the_watchers_one(parts: Any) -> None:
    """A nemesis's value (`agent: worker 1`) is no checkpoint ID (before, any string value was taken for one)."""
    controller, _, _, recorder = parts
    for f, value, named in (("kill worker", "agent: worker 1", None), ("commit", "c1", "c1")):
        invocation = controller.invoke(f, value, checkpoint_id=named)
        controller.complete(invocation, "ok")
    assert [(e.f, e.type, e.checkpoint_id) for e in recorder.events if e.f in ("kill worker", "commit")] == [
        ("kill worker", "invoke", None),
        ("kill worker", "ok", None),
        ("commit", "invoke", "c1"),
        ("commit", "ok", "c1"),
    ]


def test_a_run_is_announced_to_the_watchers_before_it_is_sent(parts: Any) -> None:
    controller, _, _, recorder = parts
    controller.run(RUNNING)
    assert [(e.f, e.type, e.key) for e in recorder.events] == [("run", "invoke", "r0")]
    assert controller.runs.sent == ["r0"]


def test_the_retry_memory_holds_the_last_call_with_its_arguments_and_a_retry_uses_it_once(parts: Any) -> None:
    controller, harness, history, _ = parts
    controller.commit("c1", [RUNNING])
    assert controller.can_retry
    last, outcomes = controller.retry()
    assert (last.operation, last.checkpoint_id) == ("commit", "c1")
    assert last.arguments["episode_ids"] == (EpisodeId(rollout_id="r0", attempt=0),)
    assert harness.control.calls[-1] == ("post_each commit", None)
    assert set(outcomes) == {"env", "policy", "agent", "weather"}
    assert not controller.can_retry
    assert history.events[-2].f == "retry commit"


def test_a_prepare_is_remembered_and_noted_as_prepared(parts: Any) -> None:
    controller, _, history, _ = parts
    outcome = controller.prepare("c1")
    assert outcome.prepared
    assert [e.f for e in history.events] == ["prepare", "prepare", "prepared"]
    assert controller.last_call.operation == "prepare"


def test_a_renew_a_send_to_some_and_a_cleanup_retire_are_never_remembered(parts: Any) -> None:
    controller, _, _, _ = parts
    controller.renew("c1")
    controller.commit_on(["env"], "c1", [RUNNING])
    controller.retire_lost("retire1", [RUNNING])
    assert controller.last_call is None


def test_a_routine_retire_is_remembered_and_its_running_run_must_be_refused(parts: Any) -> None:
    controller, _, _, _ = parts
    controller.retire("retire1", [RUNNING])
    assert controller.last_call.operation == "retire"
    assert controller.runs.refused_stale == {0: "r0"}


def test_a_crash_keeps_only_a_commit_for_its_retry_and_a_server_restarted_alone_keeps_nothing(parts: Any) -> None:
    controller, harness, _, _ = parts
    nemesis = Nemesis(harness, controller)  # type: ignore[arg-type]
    controller.commit("c1", [RUNNING])
    nemesis.crash()
    assert controller.last_call.after_crash
    assert controller.can_retry
    controller.resume("c1")
    nemesis.crash()
    assert controller.last_call is None
    controller.resume("c1")
    nemesis.restart(MEMBERS.members[0])
    assert controller.last_call is None


def test_false_alarm_6f0af76_no_retry_across_a_refused_restore(parts: Any) -> None:
    """A forget sent again after a refused restore would drop the marks the restore's cleanup set."""
    controller, harness, _, recorder = parts
    controller.forget("forget1", ["r0"])
    harness.control.refuse.add("restore")
    with pytest.raises(CoordinationError):
        controller.restore("c1-restore2", "c1", ["r0"])
    assert not controller.can_retry
    (refused,) = recorder.of("restore", "fail")
    assert refused.source == "c1"
    assert refused.episodes == (EpisodeId(rollout_id="r0", attempt=0),)


def test_false_alarm_c77d59a_a_power_cut_ends_a_prepared_interval_as_a_crash_does(parts: Any) -> None:
    """P2 reads `prepared` to the next resume or crash: a power cut that was not journaled as a crash left the
    interval open, and a later reply read as one while prepared."""
    controller, harness, history, _ = parts
    nemesis = Nemesis(harness, controller)  # type: ignore[arg-type]
    controller.prepare("c1")
    nemesis.crash(power_loss=True)
    ((start_s, end_s),) = history.intervals("prepared", ("resume", "crash"))
    assert start_s < end_s < float("inf")
    assert harness.crashes == ["power loss"]


def test_false_alarm_61659e9_a_restore_cut_short_after_it_reached_the_policy_model_is_watched(parts: Any) -> None:
    """What a restore that a crash cut short did to the policy model's ledgers is on disk and outlives the crash:
    the watchers hear of every stage it reached, with what it restored."""
    controller, harness, _, recorder = parts
    crashes = object.__new__(Crashes)  # the crashes family's rules, nothing else built
    crashes.controller = controller
    crashes.nemesis = Nemesis(harness, controller)  # type: ignore[arg-type]
    reached = crashes._restore_cut_by_crash("c1-restore2", "c1", ["r0"], reached=3)
    assert reached == ["agent", "env", "policy"]
    restores = recorder.of("restore", "ok")
    assert [[m.name for m in e.reached] for e in restores] == [["agent"], ["env"], ["policy"]]
    assert all(e.source == "c1" for e in restores)
    assert recorder.of("crash", "ok")[0].reached == MEMBERS.members


def test_the_ledger_watch_moves_the_lineage_for_each_event_it_is_handed(tmp_path: Path) -> None:
    moved: list[Any] = []

    class Watch(LedgerWatch):
        def started(self, key: str, continues: bool = False) -> None:
            moved.append(("started", key, continues))

        def restored(self, checkpoint_id: str) -> None:
            moved.append(("restored", checkpoint_id))

        def retired(self, episodes: Any) -> None:
            moved.append(("retired", list(episodes)))

        def model_died(self) -> None:
            moved.append(("model died",))

        def committed(self, checkpoint_id: str, delivered: Any, directory: Path) -> None:
            moved.append(("committed", checkpoint_id))

    harness = FakeHarness(tmp_path)
    harness.spec, harness.backend = DeploymentSpec("native", token_capture=True), object()  # type: ignore[assignment]
    watch = Watch(harness)  # type: ignore[arg-type]
    policy, env = MEMBERS.of_kind("model"), MEMBERS.of_kind("environment")
    episode = EpisodeId(rollout_id="r0", attempt=0)
    for event in (
        Operation("run", "invoke", key="r0"),
        Operation("run", "invoke", key="r0-a1", continues=True),
        Operation("restore", "ok", reached=env, source="c1"),  # not the policy model: nothing on its disk
        Operation("restore", "ok", reached=policy, source="c1"),
        Operation("retire", "ok", reached=env, episodes=(episode,)),
        Operation("retire", "ok", reached=policy, episodes=(episode,)),
        Operation("crash", "ok", reached=env),
        Operation("crash", "ok", reached=policy),
        Operation("restore", "fail", source="c1", episodes=(episode,)),  # the client's cleanup burned r0-a1
        # A commit the policy model wrote, whether or not another participant refused it; one it did not take.
        Operation("commit", "ok", reached=policy, checkpoint_id="c2", directory=tmp_path / "c2", delivered={}),
        Operation("commit", "fail", reached=policy, checkpoint_id="c3", directory=tmp_path / "c3", delivered={}),
        Operation("commit", "fail", reached=env, checkpoint_id="c4", directory=tmp_path / "c4", delivered={}),
        Operation("commit", "info", reached=policy, checkpoint_id="c5", directory=tmp_path / "c5", delivered={}),
    ):
        watch.observe(event)
    assert moved == [
        ("started", "r0", False),
        ("started", "r0-a1", True),
        ("restored", "c1"),
        ("retired", [episode]),
        ("model died",),
        ("retired", [EpisodeId(rollout_id="r0", attempt=1)]),
        ("committed", "c2"),
        ("committed", "c3"),
    ]


def test_a_commit_on_some_that_one_refuses_is_journaled_as_failed_so_no_watcher_learns_it_done(parts: Any) -> None:
    controller, harness, history, recorder = parts
    refusal = ParticipantFailure("policy", 422, "invalid_checkpoint_state", "ENOSPC")
    harness.control.post_each = lambda operation, body, deadline_ts, names=None: {"policy": refusal}

    with pytest.raises(CoordinationError):
        controller.commit_on(["policy"], "c1", [RUNNING], deadline_s=1.0)

    assert [(e.f, e.type) for e in history.events] == [("commit", "invoke"), ("commit", "fail")]
    assert not recorder.of("commit", "ok")
    assert recorder.of("commit", "fail")[0].reached == ()  # the policy model refused it: it took nothing


def test_a_failed_commit_reaches_the_watchers_with_exactly_those_that_answered_it(parts: Any) -> None:
    controller, harness, _, recorder = parts
    refusal = ParticipantFailure("env", 409, "stale_checkpoint", "lapsed")
    harness.control.post_each = lambda operation, body, deadline_ts, names=None: {"policy": {"ok": 1}, "env": refusal}

    with pytest.raises(CoordinationError):
        controller.commit_on(["env", "policy"], "c1", [RUNNING], deadline_s=1.0)

    failed = recorder.of("commit", "fail")[0]
    assert [m.name for m in failed.reached] == ["policy"]
    assert failed.checkpoint_id == "c1"
    assert failed.directory is not None


def test_a_probe_past_its_deadline_carries_a_passed_deadline_and_waits_as_any_call(parts: Any) -> None:
    controller, harness, _, _ = parts
    sent: list[tuple[float, float]] = []

    def post_each(operation: str, body: Any, deadline_ts: float, names: Any = None) -> dict[str, Any]:
        sent.append((body["deadline_ts"], deadline_ts))
        return {}

    harness.control.post_each = post_each
    before = time.time()
    controller.probe_past_deadline("prepare", "c1")

    ((body_deadline, transport_deadline),) = sent
    assert body_deadline <= before - PAST_DEADLINE_S + 0.5
    assert transport_deadline >= before + CONTROL_DEADLINE_S - 1.0


class LedgerClient:
    def __init__(self) -> None:
        self.deleted: list[list[str]] = []

    def delete(self, keys: list[str]) -> dict[str, Any]:
        self.deleted.append(list(keys))
        return {"deleted": keys}


@pytest.mark.parametrize(
    ("lineage", "continues", "deleted"),
    [
        (Lineage(), False, []),
        (Lineage(retired=frozenset({"r0-a2"})), True, [["r0-a2"]]),
        (Lineage(rows={"r0-a2": ("call-0",)}), False, [["r0-a2"]]),  # an abandoned restore's rows
        (Lineage(rows={"r0-a2": ("call-0",)}), True, []),  # the restore it continues: its rows are its base
    ],
)
def test_a_stale_ledger_is_deleted_before_its_key_runs(
    tmp_path: Path, lineage: Lineage, continues: bool, deleted: list[list[str]]
) -> None:
    harness = FakeHarness(tmp_path)
    harness.spec, harness.backend = DeploymentSpec("native", token_capture=True), object()  # type: ignore[assignment]
    harness.ledger = LedgerClient()  # type: ignore[attr-defined]
    watch = LedgerWatch(harness)  # type: ignore[arg-type]
    watch.lineage = lineage

    watch.started("r0-a2", continues)

    assert harness.ledger.deleted == deleted  # type: ignore[attr-defined]
    assert watch.lineage.writers["r0-a2"].base == (() if deleted else lineage.rows.get("r0-a2", ()))


class BlockedAtTheFirstStage(ScriptedControl):
    """A prepare that stops at its first stage, not prepared there, so it never reaches the later ones."""

    def prepare(self, checkpoint_id: str, deadline_ts: float) -> PrepareResult:
        self._replies("prepare")
        report = {"ready": False, "blockers": ["r1"], "blocker_count": 1, "counts": {}, "restarts": []}
        return PrepareResult(prepared=False, replies={"env": {"phase": "preparing", "report": report}})


@pytest.mark.parametrize("send", ["unanswered", "unreached"])
def test_a_prepare_that_never_reached_the_faulty_participant_is_judged_not_prepared(parts: Any, send: str) -> None:
    controller, harness, _, _ = parts
    harness.control = BlockedAtTheFirstStage()
    judged: list[Any] = []

    with pytest.raises(HarnessError, match="every participant's reply arrived"):
        getattr(controller, send)("prepare", "c1", judge=judged.append)

    assert [(outcome.prepared, outcome.blockers) for outcome in judged] == [(False, {"env": ["r1"]})]


@pytest.mark.parametrize("send", ["unanswered", "unreached"])
def test_a_prepare_prepared_everywhere_is_not_judged_and_stays_the_deployments_fault(parts: Any, send: str) -> None:
    controller, _, _, _ = parts
    judged: list[Any] = []

    with pytest.raises(HarnessError, match="every participant's reply arrived"):
        getattr(controller, send)("prepare", "c1", judge=judged.append)

    assert judged == []
