"""The contract model on its own: pure values, no servers."""

from __future__ import annotations

import attrs
import pytest

from ckpt_model.model.contract import VERIFY, Model, Restarted
from ckpt_model.model.expectation import expect


def native() -> Model:
    return Model(topology="native")


def test_a_dispatched_rollout_waits_at_its_first_call() -> None:
    model, rollout = native().dispatch()
    expected = expect(model)
    assert rollout == "r0"
    assert expected.calls == {"r0": (2,)}
    assert expected.waiting == {"r0"}
    assert (expected.inflight, expected.episodes, expected.sessions) == (1, 1, 1)


def test_releasing_every_call_replies_after_the_script() -> None:
    model, _ = native().dispatch()
    model = model.release("r0")
    assert expect(model).calls == {"r0": (2, 4)}
    model = model.release("r0")
    assert model.current()["r0"].status == "replied"
    assert expect(model).waiting == frozenset()
    assert expect(model).inflight == 0


def test_a_release_while_prepared_is_held_and_delivered_at_resume() -> None:
    model, _ = native().dispatch()
    model, checkpoint_id = model.prepare()
    model = model.release("r0")
    assert checkpoint_id == "c1"
    assert expect(model).held == 1
    assert expect(model).waiting == frozenset()
    model = model.resume()
    assert expect(model).held == 0
    assert expect(model).calls == {"r0": (2, 4)}
    assert model.resumed == ("c1",)


def test_a_restored_attempt_continues_from_its_boundary() -> None:
    model, _ = native().dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    model, checkpoint = model.commit()
    assert checkpoint.exported == ("r0",)
    model = model.crash()
    assert model.current()["r0"].status == "dead"
    model, restore_id = model.restore("c1")
    assert restore_id == "c1-restore2"
    assert expect(model).restored_pending == ("r0-a1",)
    model = model.start_replacement("r0")
    assert expect(model).calls == {"r0": (2, 4), "r0-a1": (4,)}
    model = model.release("r0")
    assert model.current()["r0"].status == "replied"


def test_a_held_call_at_commit_is_made_again_after_restore() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model = model.release("r0")
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0")
    assert expect(model).calls == {"r0": (2,), "r0-a1": (2,)}


def test_restoring_an_earlier_checkpoint_rolls_the_controller_back() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    model = model.resume()
    model, _ = model.dispatch()
    model = model.crash()
    model, _ = model.restore("c1")
    assert sorted(model.current()) == ["r0"]
    assert model.current()["r0"].key == "r0-a1"
    assert expect(model).calls == {"r0": (2,), "r1": (2,)}, "the abandoned rollout's call stays on the backend"
    assert model.rollout_seq == 2, "rollout names are never reused"


def test_restoring_the_same_checkpoint_twice_reuses_the_attempt_and_keeps_the_dead_runs_calls() -> None:
    model, _ = native().dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0").crash()
    model, _ = model.restore("c1")
    model = model.start_replacement("r0")
    assert expect(model).calls["r0-a1"] == (4, 4)


def test_a_second_checkpoint_carries_restored_pending_attempts() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model, checkpoint_id = model.prepare()
    model, checkpoint = model.commit()
    assert checkpoint_id == "c3"
    assert checkpoint.exported == ("r0-a1",)
    assert expect(model).restored_pending == ("r0-a1",), "a commit keeps restored state its scope names"
    model, _ = model.crash().restore("c3")
    assert model.current()["r0"].key == "r0-a2"


def test_retire_marks_until_forget_and_crash() -> None:
    model, _ = native().dispatch()
    model = model.retire("r0")
    assert expect(model).retired_rollouts == 1
    assert expect(model).inflight == 0
    assert model.forget().retired_marks == ()
    assert model.crash().retired_marks == ()
    again = model.start_over("r0")
    assert again.current()["r0"].key == "r0-a1"
    assert expect(again).calls["r0-a1"] == (2,)


def test_preconditions_keep_runs_meaningful() -> None:
    model = Model(topology="legacy", rollouts_max=1)
    assert not model.can_restore()
    model, _ = model.dispatch()
    assert not model.can_dispatch()
    model = model.crash()
    assert not model.can_prepare(), "a rollout lost in a crash must be restored or started over first"
    assert expect(model.start_over("r0")).calls == {"r0": (1,), "r0-a1": (1,)}
    with pytest.raises(ValueError, match="waiting call"):
        model.release("r0")


def verifying(verify_mode: str) -> Model:
    """A slow-topology rollout whose two policy calls are done and whose judge call waits."""
    model, _ = Model(topology="slow", verify_mode=verify_mode).dispatch()  # type: ignore[arg-type]
    return model.release("r0").release("r0")


def test_a_wait_verification_blocks_prepare_and_holds_no_model_or_agent_state() -> None:
    model = verifying("wait")
    expected = expect(model)
    assert expected.calls == {"r0": (2, 4, VERIFY)}
    assert expected.waiting == {"r0"}
    assert (expected.inflight, expected.episodes, expected.sessions) == (0, 1, 0)
    assert model.blockers() == ["r0"]
    assert not model.can_prepare()
    assert model.can_prepare_blocked()


def test_a_blocked_prepare_uses_up_its_id_and_is_remembered_as_resumed() -> None:
    model, checkpoint_id = verifying("wait").prepare_blocked()
    assert checkpoint_id == "c1"
    assert model.resumed == ("c1",)
    assert (model.phase, model.open_checkpoint) == ("idle", None)
    assert model.prepare()[1] == "c2"


def test_a_replay_verification_does_not_block_and_runs_again_when_continued() -> None:
    model = verifying("replay")
    assert model.blockers() == []
    model, _ = model.prepare()
    assert model.releasable() == [], "a judge call is not released while a checkpoint is open"
    with pytest.raises(ValueError, match="not released while a checkpoint is open"):
        model.release("r0")
    model, checkpoint = model.commit()
    model = model.crash()
    model, _ = model.restore(checkpoint.checkpoint_id)
    continued = model.current()["r0"]
    assert (continued.key, continued.start_call, continued.next_call) == ("r0-a1", 2, VERIFY)
    assert expect(model).sessions == 0, "the agent exported no session: it had closed it before verification"
    model = model.start_replacement("r0").release("r0")
    assert expect(model).calls == {"r0": (2, 4, VERIFY), "r0-a1": (VERIFY,)}
    assert model.current()["r0"].status == "replied"


def test_release_to_verification_candidates_exclude_rollouts_already_verifying() -> None:
    model, _ = Model(topology="slow").dispatch()
    model, _ = model.dispatch()
    model = model.release("r1").release("r1")
    assert model.before_verification() == ["r0"]
    assert native().dispatch()[0].before_verification() == [], "no verification step outside the slow topology"


# -- retire marks, forget and restores of an earlier checkpoint -----------------------------------------------------


def committed_then_crashed() -> Model:
    """r0 exported in c1 (attempt 0), c1 resumed, then every process crashed: r0's attempt 0 is dead."""
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    return model.resume().crash()


def test_a_mark_on_the_continued_attempt_covers_a_restore_of_the_checkpoint_again() -> None:
    model, _ = committed_then_crashed().restore("c1")
    model = model.start_replacement("r0").crash()
    model = model.retire("r0")
    assert model.retired_marks == (("r0", 1),)
    assert model.can_restore()
    assert model.marks_covering("c1") == ["r0"], "restoring c1 again continues r0-a1, which the mark refuses"
    assert model.forget(("r0",)).marks_covering("c1") == []


def test_a_lower_mark_does_not_cover_the_continued_attempt() -> None:
    model = committed_then_crashed().retire("r0")
    assert model.retired_marks == (("r0", 0),)
    assert model.marks_covering("c1") == [], "c1 continues r0 as attempt 1, above the mark"


def test_marks_cover_only_exported_attempts_of_the_checkpoint() -> None:
    model, _ = native().dispatch()
    model, _ = model.dispatch()
    model = model.release("r1").release("r1")
    model, _ = model.prepare()
    model, checkpoint = model.commit()
    assert checkpoint.exported == ("r0",)
    model = model.resume().crash()
    model = attrs.evolve(model, retired_marks=(("r0", 0), ("r1", 5)))
    assert model.marks_covering("c1") == [], "r1 replied before c1, so a restore continues nothing of it"
    with pytest.raises(KeyError, match="c9"):
        model.marks_covering("c9")


def test_a_crash_clears_every_mark_so_none_covers_a_restore() -> None:
    model, _ = committed_then_crashed().restore("c1")
    model = model.start_replacement("r0").retire("r0")
    assert model.marks_covering("c1") == ["r0"]
    assert model.crash().marks_covering("c1") == []


def test_forget_of_some_rollouts_keeps_the_other_marks() -> None:
    model, _ = native().dispatch()
    model, _ = model.dispatch()
    model, _ = model.dispatch()
    model = model.retire("r0").retire("r1").retire("r2")
    assert model.retired_marks == (("r0", 0), ("r1", 0), ("r2", 0))
    assert model.forget(("r1",)).retired_marks == (("r0", 0), ("r2", 0))
    assert model.forget(("r0", "r2", "r9")).retired_marks == (("r1", 0),)
    assert model.forget(()).retired_marks == model.retired_marks
    assert model.forget().retired_marks == ()
    assert expect(model.forget(("r1",))).retired_rollouts == 2
    assert model.forget(("r1",)).marked_rollouts() == ("r0", "r2")


def test_a_retire_mark_keeps_the_highest_attempt_retired() -> None:
    model, _ = native().dispatch()
    model = model.retire("r0")
    model = model.start_over("r0").retire("r0")
    assert model.retired_marks == (("r0", 1),), "a later attempt raises the mark"
    higher = attrs.evolve(model.start_over("r0"), retired_marks=(("r0", 5),))
    assert higher.retire("r0").retired_marks == (("r0", 5),), "retiring attempt 2 keeps the mark at 5"
    assert expect(higher.retire("r0")).retired_rollouts == 1


# -- what each participant writes at a commit -------------------------------------------------------------------


def test_native_exports_the_environment_writes_the_scope_and_the_agent_its_sessions() -> None:
    model, _ = native().dispatch()
    model, _ = model.dispatch()
    model, _ = model.dispatch()
    model = model.release("r2").release("r2")  # r2 replied: out of the scope
    model, _ = model.prepare()
    assert model.exports("environment") == ("r0", "r1")
    assert model.exports("agent") == ("r0", "r1")
    assert model.exports("model") == ()
    assert model.exports("resources") == ()


def test_legacy_exports_the_agent_owns_the_episodes_and_the_environment_writes_nothing() -> None:
    model, _ = Model(topology="legacy").dispatch()
    model, _ = model.dispatch()
    model = model.retire("r1")
    model, _ = model.prepare()
    assert model.episode_owner == "agent"
    assert model.exports("agent") == ("r0",)
    assert model.exports("environment") == ()
    assert (model.exports("model"), model.exports("resources")) == ((), ())


def test_slow_exports_the_agent_writes_no_session_for_an_attempt_in_verification() -> None:
    model = verifying("replay")
    model, _ = model.dispatch()
    model, _ = model.prepare()
    assert model.exports("environment") == ("r0", "r1")
    assert model.exports("agent") == ("r1",), "r0 is verifying: the agent closed its session"
    assert (model.exports("model"), model.exports("resources")) == ((), ())


def test_exports_include_restored_pending_attempts() -> None:
    model, _ = committed_then_crashed().restore("c1")
    model, _ = model.prepare()
    assert model.exports("environment") == ("r0-a1",)
    assert model.exports("agent") == ("r0-a1",), "it continues before verification, so the agent needs it"


# -- a prepare that waited for a verification, a lapsed lease, a refused dispatch -------------------------------


def test_a_prepare_that_waited_finishes_the_verification_at_its_return_boundary() -> None:
    model, checkpoint_id = verifying("wait").prepare_waited()
    attempt = model.current()["r0"]
    expected = expect(model)
    assert checkpoint_id == "c1"
    assert (model.phase, model.open_checkpoint) == ("prepared", "c1")
    assert (attempt.status, attempt.at_return, attempt.verifying) == ("running", True, False)
    assert expected.calls == {"r0": (2, 4, VERIFY)}, "the judge call is not made again"
    assert (expected.waiting, expected.held, expected.inflight) == (frozenset(), 0, 0)
    assert (expected.episodes, expected.resources_sessions, expected.accepting) == (1, 0, False)
    model, checkpoint = model.commit()
    assert checkpoint.exported == ("r0",), "an episode waiting at its return boundary is exported"
    resumed = model.resume()
    assert resumed.current()["r0"].status == "replied", "it replies at the resume"
    assert expect(resumed).calls == {"r0": (2, 4, VERIFY)}


def test_a_replacement_restored_at_its_return_boundary_replies_without_a_call() -> None:
    model, _ = verifying("wait").prepare_waited()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    continued = model.current()["r0"]
    assert (continued.key, continued.start_call, continued.finished_script) == ("r0-a1", 3, True)
    assert not continued.needs_agent
    model = model.start_replacement("r0")
    assert model.current()["r0"].status == "replied"
    assert expect(model).calls == {"r0": (2, 4, VERIFY)}, "no call of r0-a1"
    assert model.restored_pending_reported == ()


def test_a_prepare_that_waited_leaves_policy_calls_alone() -> None:
    model, _ = Model(topology="slow").dispatch()
    model = model.release("r0")
    model, _ = model.prepare_waited()
    assert model.current()["r0"] == Model(topology="slow").dispatch()[0].release("r0").current()["r0"]
    assert expect(model).waiting == {"r0"}


def test_an_attempt_at_its_return_boundary_holds_no_agent_session() -> None:
    model, _ = verifying("wait").prepare_waited()
    assert expect(model).sessions == 0
    assert model.exports("agent") == ()


def test_a_lapsed_lease_re_opens_and_remembers_the_id_as_resumed() -> None:
    model, _ = native().dispatch()
    model, checkpoint_id = model.lease_expired()
    assert checkpoint_id == "c1"
    assert (model.phase, model.open_checkpoint, model.resumed) == ("idle", None, ("c1",))
    assert model.committed == ()
    assert expect(model).accepting
    assert model.prepare()[1] == "c2"


def test_a_refused_dispatch_uses_up_its_name_and_changes_nothing_else() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    refused, attempt = model.refused_dispatch()
    assert (attempt.key, attempt.run) == ("r1", 1)
    tried = attrs.evolve(model.tried, run_while_open_in="c1")
    assert refused == attrs.evolve(model, rollout_seq=2, runs_sent=2, tried=tried)
    assert expect(refused) == expect(model)
    later, name = refused.resume().dispatch()
    assert name == "r2"
    assert "r1" not in later.current()


# -- expect(): resources sessions and admission ---------------------------------------------------------------------


def test_every_fresh_running_attempt_holds_a_resources_session() -> None:
    model, _ = native().dispatch()
    model, _ = model.dispatch()
    assert expect(model).resources_sessions == 2
    model = model.release("r1")
    assert expect(model).resources_sessions == 2
    model = model.release("r1").retire("r0")
    assert expect(model).resources_sessions == 0, "replied and retired attempts hold none"
    slow = verifying("wait")
    assert expect(slow).resources_sessions == 1, "a fresh attempt keeps its session through verification"


def test_a_native_continuation_from_call_0_binds_a_session_with_its_tool_round() -> None:
    model, _ = committed_then_crashed().restore("c1")
    assert expect(model).resources_sessions == 0, "pending: not running"
    model = model.start_replacement("r0")
    assert expect(model).resources_sessions == 0, "its first policy call has not returned"
    model = model.release("r0")
    assert model.current()["r0"].status == "running"
    assert expect(model).resources_sessions == 1, "the tool round seeds the resources session again"


def test_a_native_continuation_after_its_tool_round_holds_no_session() -> None:
    model, _ = native().dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0")
    assert model.current()["r0"].start_call == 1
    assert expect(model).resources_sessions == 0


def test_a_replayed_verification_binds_a_session_again() -> None:
    model, _ = verifying("replay").prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0")
    assert model.current()["r0"].verifying
    assert expect(model).resources_sessions == 1


def test_a_legacy_continuation_holds_no_resources_session() -> None:
    model, _ = Model(topology="legacy").dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0")
    assert expect(model).resources_sessions == 0
    fresh = Model(topology="legacy").dispatch()[0]
    assert expect(fresh).resources_sessions == 1


def test_a_legacy_continuation_from_its_first_call_binds_its_resources_session_at_the_tool_round() -> None:
    model, _ = Model(topology="legacy").dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0")
    assert expect(model).resources_sessions == 0
    assert expect(model.release("r0")).resources_sessions == 1


def counter_restored() -> Model:
    """A counter row checkpointed after its first increment (one tool round), crashed and restored."""
    model, _ = Model(topology="counter").dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    return model


def test_a_counter_row_makes_three_calls_and_runs_two_tool_rounds() -> None:
    model, _ = Model(topology="counter").dispatch()
    assert model.current()["r0"].tool_rounds == 0
    model = model.release("r0").release("r0")
    assert (model.current()["r0"].tool_rounds, model.current()["r0"].status) == (2, "running")
    model = model.release("r0")
    assert expect(model).calls == {"r0": (1, 3, 5)}
    assert model.current()["r0"].status == "replied"
    assert model.current()["r0"].tool_rounds == 2


def test_the_counter_resources_server_exports_every_scoped_session_and_holds_restored_ones() -> None:
    model, _ = Model(topology="counter").dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    assert model.exports("resources") == ("r0",)
    assert model.exports("agent") == ("r0",)
    restored = counter_restored()
    pending = restored.current()["r0"]
    assert (pending.key, pending.status, pending.tool_rounds) == ("r0-a1", "pending", 1)
    assert expect(restored).resources_sessions == 1, "the restore installs the session before the replacement"
    assert expect(restored.start_replacement("r0")).resources_sessions == 1
    assert not restored.can_crash_participant("resources"), "it holds a restored session"
    assert Model(topology="native").dispatch()[0].exports("resources") == ()


def test_admission_is_closed_while_a_checkpoint_is_open() -> None:
    model, _ = native().dispatch()
    assert expect(model).accepting
    model, _ = model.prepare()
    assert not expect(model).accepting
    model, _ = model.commit()
    assert not expect(model).accepting, "committed is still open until the resume"
    assert expect(model.resume()).accepting
    assert expect(model.crash()).accepting


def test_every_run_gets_its_own_number_and_a_restore_keeps_the_snapshots() -> None:
    """Restoring a checkpoint again re-sends a capture key; each `/run` keeps its own number, so a snapshot's
    replied attempt still names the `/run` that replied."""
    model, _ = native().dispatch()
    model = model.release("r0")
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    model = model.start_replacement("r0")
    first = model.current()["r0"]
    model = model.release("r0")
    assert (first.key, first.run, model.current()["r0"].status) == ("r0-a1", 1, "replied")
    model, later = model.prepare()
    model, _ = model.commit()
    model, _ = model.resume().crash().restore("c1")
    model = model.start_replacement("r0")
    assert (model.current()["r0"].key, model.current()["r0"].run) == ("r0-a1", 2)
    model, _ = model.crash().restore(later)
    assert (model.current()["r0"].status, model.current()["r0"].run) == ("replied", 1)


def retired_and_idle() -> Model:
    """r0 retired (marked everywhere), c1 resumed, nothing running: a participant may crash alone."""
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model = model.resume().retire("r0")
    assert model.can_crash_participant("environment")
    return model


def test_a_participant_restarted_alone_forgets_its_marks_and_resumed_ids_the_others_keep_theirs() -> None:
    model = retired_and_idle().crash_participant("environment")
    assert model.marks_of("environment") == ()
    assert model.marks_of("agent") == (("r0", 0),)
    assert not model.remembers("environment", "c1")
    assert model.remembers("agent", "c1")
    assert dict(expect(model).retired_by_kind) == {"environment": 0}
    assert expect(model).retired_for("environment") == 0
    assert expect(model).retired_for("resources") == 1


def test_a_participant_restarted_alone_learns_later_marks_and_resumed_ids() -> None:
    model = retired_and_idle().crash_participant("environment")
    model, checkpoint_id = model.dispatch()[0].prepare()
    model = model.resume()
    assert model.remembers("environment", checkpoint_id)
    model = model.retire("r1")
    assert model.marks_of("environment") == (("r1", 0),)
    assert model.forget(("r1",)).marks_of("environment") == ()
    assert model.forget().marks_of("agent") == ()


def test_a_crash_of_every_process_ends_every_restart_alone() -> None:
    model = retired_and_idle().crash_participant("agent")
    assert model.crash().restarted == ()


def test_a_late_run_is_refused_by_the_first_stop_or_by_the_resources_seed_after_it() -> None:
    model = retired_and_idle()
    assert model.refuses_late_run("r0", 0)
    assert not model.refuses_late_run("r0", 1)
    alone = model.crash_participant("environment")
    assert alone.refuses_late_run("r0", 0)
    assert not alone.crash_participant("resources").refuses_late_run("r0", 0)
    # While a checkpoint is open the environment refuses with admission_closed before the seed reaches the mark.
    prepared, _ = alone.dispatch()[0].prepare()
    assert not prepared.refuses_late_run("r0", 0)


def test_a_participant_crashes_alone_only_with_no_checkpoint_open_and_not_holding_restored_state() -> None:
    running, _ = native().dispatch()
    assert running.can_crash_participant("agent")
    prepared, _ = retired_and_idle().prepare()
    assert not prepared.can_crash_participant("resources")
    committed, _ = running.prepare()
    committed, _ = committed.commit()
    restored, _ = committed.crash().restore("c1")
    assert restored.with_status("pending")
    assert not restored.can_crash_participant("environment")
    assert not restored.can_crash_participant("agent")
    assert restored.can_crash_participant("model")
    with pytest.raises(ValueError, match="cannot crash alone"):
        prepared.crash_participant("agent")


def test_work_running_when_a_participant_crashes_alone_is_retired_everywhere() -> None:
    model, _ = native().dispatch()
    model, _ = model.dispatch()
    model = model.release("r0")
    crashed = model.crash_participant("model")
    assert {a.status for a in crashed.current().values()} == {"retired"}
    assert crashed.retired_marks == (("r0", 0), ("r1", 0))
    assert crashed.marks_of("model") == (("r0", 0), ("r1", 0))
    expected = expect(crashed)
    assert (expected.inflight, expected.sessions, expected.episodes, expected.resources_sessions) == (0, 0, 0, 0)
    assert expected.calls == {"r0": (2, 4), "r1": (2,)}


def test_what_ends_by_itself_when_one_participant_crashes_alone() -> None:
    model, _ = native().dispatch()
    assert [a.key for a in model.ends_alone("environment")] == ["r0"]
    assert [a.key for a in model.ends_alone("agent")] == ["r0"]
    assert [a.key for a in model.ends_alone("model")] == ["r0"]
    assert model.ends_alone("resources") == []
    slow = Model(topology="slow")
    slow, _ = slow.dispatch()
    slow = slow.release("r0").release("r0")
    assert slow.current()["r0"].verifying
    assert [a.key for a in slow.ends_alone("resources")] == ["r0"]
    assert slow.ends_alone("model") == []
    assert slow.ends_alone("agent") == []


def test_a_refused_restore_burns_the_attempt_it_would_have_continued() -> None:
    model, restore_id = committed_then_crashed().failed_restore("c1")
    assert restore_id == "c1-restore2"
    assert model.resumed[-1] == restore_id  # the cleanup resumed it, so it is fenced from now on
    assert model.retired_marks == (("r0", 1),)
    burned = model.current()["r0"]
    assert (burned.attempt, burned.status, burned.calls_made) == (1, "dead", 0)
    assert not model.can_restore()  # the processes served a restore: another needs a crash first
    expected = expect(model)
    assert (expected.restored_pending, expected.sessions, expected.retired_rollouts) == ((), 0, 1)
    assert expected.calls == {"r0": (2,)}
    model = model.start_over("r0")
    assert model.current()["r0"].attempt == 2


def test_a_refused_restore_marks_but_adds_nothing_for_a_rollout_already_past_it() -> None:
    model = committed_then_crashed().start_over("r0").crash()  # r0-a1 ran and died after c1
    model, _ = model.failed_restore("c1")
    assert model.retired_marks == (("r0", 1),)
    assert [a.key for a in model.attempts] == ["r0", "r0-a1"]


def test_a_refused_restore_marks_a_participant_restarted_alone_too() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    model = model.resume().crash()
    model = attrs.evolve(model, restarted=(Restarted("agent", remembers_from=0),))
    model, _ = model.failed_restore("c1")
    assert model.marks_of("agent") == (("r0", 1),)


def test_a_crash_inside_a_commit_leaves_the_checkpoint_incomplete_and_everything_lost() -> None:
    model, _ = native().dispatch()
    model, checkpoint_id = model.prepare()
    model = model.crash_in_commit()
    assert model.committed == ()
    assert [c.checkpoint_id for c in model.incomplete] == [checkpoint_id]
    assert model.incomplete[0].exported == ("r0",)
    assert model.current()["r0"].status == "dead"
    assert model.phase == "idle"
    assert not model.can_restore()
    assert model.can_restore_incomplete()


def test_a_commit_given_up_after_a_failed_write_resumes_and_leaves_the_checkpoint_incomplete() -> None:
    model, _ = native().dispatch()
    model, checkpoint_id = model.prepare()
    model = model.commit_failed(frozenset({"agent", "resources"}))
    assert model.committed == ()
    assert [(c.checkpoint_id, c.shares) for c in model.incomplete] == [
        (checkpoint_id, frozenset({"agent", "resources"}))
    ]
    assert (model.phase, model.open_checkpoint, model.resumed) == ("idle", None, (checkpoint_id,))
    assert model.current()["r0"].status == "running"  # nothing was lost: the rollout goes on
    assert not model.can_restore_incomplete()  # the processes live: a restore needs a crash first
    assert model.crash().can_restore_incomplete()


def test_a_refused_restore_of_an_incomplete_checkpoint_burns_its_attempts_too() -> None:
    model, _ = native().dispatch()
    model, checkpoint_id = model.prepare()
    model, _ = model.crash_in_commit().failed_restore(checkpoint_id)
    assert model.retired_marks == (("r0", 1),)
    assert model.current()["r0"].attempt == 1
    assert not model.can_restore_incomplete()  # the processes served it: another restore needs a crash first
    with pytest.raises(KeyError, match="no committed checkpoint"):
        model.checkpoint(checkpoint_id)


def test_a_participant_that_died_in_its_restore_forgets_earlier_marks_and_gets_the_cleanups() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.resume().dispatch()
    model = model.crash().retire("r1")  # r1 came after c1; marked everywhere after the crash, before the restore
    model, restore_id = model.died_in_restore("c1", "agent")
    assert model.marks_of("agent") == (("r0", 1),), "restarted alone: only the cleanup's mark"
    assert model.marks_of("environment") == (("r0", 1), ("r1", 0))
    assert model.remembers("agent", restore_id)
    assert model.remembers("environment", restore_id)
    assert model.current()["r0"].status == "dead"
    assert dict(expect(model).retired_by_kind) == {"agent": 1}


# -- the mixed topology's restarts --------------------------------------------------------------------------------


def mixed_with_a_restart() -> Model:
    """r0 continues (the checkpointable environment), r1 is a restart; both wait at their first call."""
    model, _ = Model(topology="mixed").dispatch()
    model, restart = model.dispatch(restart=True)
    assert restart == "r1"
    return model


def test_a_restart_is_reported_counted_on_the_restart_servers_and_left_out_of_the_scope() -> None:
    model, _ = mixed_with_a_restart().prepare()
    expected = expect(model)
    assert model.restarts() == ["r1"]
    assert [a.key for a in model.scope()] == ["r0"]
    assert (expected.episodes, expected.restart_episodes) == (1, 1)
    assert (expected.resources_sessions, expected.restart_sessions) == (1, 1)
    assert (expected.sessions, expected.inflight) == (2, 2), "the agent and the model serve both"


def test_a_restart_is_never_exported_by_the_restart_servers_and_the_agent_may_write_its_session() -> None:
    model, _ = mixed_with_a_restart().prepare()
    assert model.exports("environment", "environment") == ("r0",)
    assert model.exports("environment", "restart_environment") == ()
    assert model.exports("resources", "restart_resources") == ()
    assert (model.exports("agent", "agent"), model.may_also_export("agent")) == (("r0",), ("r1",))
    assert model.may_also_export("environment") == ()


def test_a_restart_starts_over_after_a_crash_and_a_restore_as_a_restart() -> None:
    model, _ = mixed_with_a_restart().prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    assert {a.rollout: a.status for a in model.current().values()} == {"r0": "pending", "r1": "dead"}
    model = model.start_over("r1")
    again = model.current()["r1"]
    assert (again.key, again.restart, again.start_call, again.status) == ("r1-a1", True, 0, "running")
    assert expect(model).calls["r1-a1"] == (2,)


def test_a_restart_that_replied_before_a_checkpoint_stays_replied_after_its_restore() -> None:
    model = mixed_with_a_restart().release("r1").release("r1")
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.crash().restore("c1")
    assert model.current()["r1"].status == "replied"


def test_restarts_need_the_mixed_topology_and_it_crashes_no_participant_alone() -> None:
    assert not native().can_dispatch_restart()
    model = mixed_with_a_restart()
    assert model.can_dispatch_restart()
    assert not any(model.can_crash_participant(kind) for kind in ("environment", "agent", "resources", "model"))


def test_a_refused_restore_only_marks_a_rollout_an_earlier_restore_abandoned() -> None:
    model, _ = native().dispatch()
    model, _ = model.prepare()
    model, _ = model.commit()
    model, _ = model.resume().dispatch()  # r1, after c1
    model, incomplete = model.prepare()
    model, _ = model.crash_in_commit().restore("c1")  # back to c1's snapshot: r1 is abandoned
    assert "r1" not in model.current()
    model, _ = model.crash().failed_restore(incomplete)
    assert dict(model.retired_marks) == {"r0": 1, "r1": 1}
    assert "r1" not in model.current()


def test_a_retire_mark_is_held_by_every_kind_until_one_restarts_alone() -> None:
    model, _ = native().dispatch()
    model = model.retire("r0")
    assert all(model.holds_mark(kind, "r0", 0) for kind in ("environment", "agent", "resources", "model"))
    assert not model.holds_mark("resources", "r0", 1)
    assert not model.holds_mark("resources", "r1", 0)
    alone = attrs.evolve(model, restarted=(Restarted("resources", remembers_from=0),))
    assert not alone.holds_mark("resources", "r0", 0)
    assert alone.holds_mark("agent", "r0", 0)


def test_the_last_restored_checkpoint_is_the_latest_restore_since_the_processes_started() -> None:
    model = committed_then_crashed()
    assert model.last_restored() is None, "nothing restored yet"
    restored, _ = model.restore("c1")
    assert restored.last_restored() == 0
    refused, _ = model.failed_restore("c1")
    assert refused.last_restored() == 0, "a refused restore names its checkpoint too"
    assert restored.crash().last_restored() is None, "a crash forgets what the processes restored"
    gone = attrs.evolve(restored, committed=())
    assert gone.last_restored() is None, "a checkpoint no longer committed cannot be restored again"
