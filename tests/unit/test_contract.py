"""The contract model on its own: pure values, no servers."""

from __future__ import annotations

import pytest

from ckpt_model.contract import VERIFY, Model, expect


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
