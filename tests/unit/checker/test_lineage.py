"""The checker's lineage bookkeeping and the P5 checks, on hand-built backend calls, manifests and records."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from ckpt_model.model.lineage import (
    CapturedCall,
    Lineage,
    P5Violation,
    P12Violation,
    next_key,
    p5_chain_carried,
    p5_exported,
    p5_manifest,
    p5_no_strays,
    p5_parent_links,
    p5_record_rows,
    p5_row_stamps,
    p5_staged,
    p12_continuations,
    p12_cut_of_undelivered_call,
    p12_cut_round,
    p12_exported_cuts,
    p12_one_cut_per_record,
    p12_tokens,
)
from ckpt_model.protocol.ledger import LedgerRow, Manifest, RetiredLedger


def call(index: int, key: str, model_call_id: str, parent: str | None, returned: bool = True) -> dict[str, Any]:
    """A backend call record as `/_ctl/calls` shows it."""
    admission = {"model_call_id": model_call_id, "parent_call_id": parent, "rollout_id": key}
    return {"index": index, "capture_key": key, "admission": admission, "returned": returned}


def manifest(*ids: str) -> Manifest:
    parents = (None, *ids[:-1])
    return Manifest(tuple(LedgerRow(i, p, f"k/{i}") for i, p in zip(ids, parents, strict=True)))


def record(rollout: str, attempt: int, *ids: str) -> dict[str, Any]:
    return {
        "episode_id": {"rollout_id": rollout, "attempt": attempt},
        "rows": [{"model_call_id": i} for i in ids],
        "generation_cuts": [],
    }


def crashed_after_one_delivered() -> Lineage:
    """r0 delivered call r0.0, its call r0.1 waits; committed as c1, then Gym crashed and c1 was restored."""
    lineage = Lineage().start("r0").learn([call(0, "r0", "r0.0", None), call(1, "r0", "r0.1", "r0.0", False)])
    return lineage.commit("c1", {"r0": 1}).model_died().restore("c1")


def test_a_fresh_attempt_holds_the_calls_that_returned() -> None:
    lineage = Lineage().start("r0").learn([call(0, "r0", "r0.0", None), call(1, "r0", "r0.1", "r0.0", False)])
    assert lineage.expected("r0") == ("r0.0",)
    assert lineage.learn([call(1, "r0", "r0.1", "r0.0", True)]).expected("r0") == ("r0.0", "r0.1")
    p5_parent_links(lineage.expected_parents())


def test_a_commit_exports_only_delivered_calls_and_a_restore_continues_them() -> None:
    lineage = crashed_after_one_delivered()
    assert lineage.chains["c1"] == {"r0": ("r0.0",)}
    assert lineage.expected("r0") is None, "the source attempt's ledger is retired"
    assert lineage.expected("r0-a1") == ("r0.0",)
    continued = lineage.start("r0-a1").learn([call(2, "r0-a1", "r0-a1.0", "r0.0")])
    assert continued.expected("r0-a1") == ("r0.0", "r0-a1.0")
    p5_parent_links(continued.expected_parents())


def test_the_first_call_after_a_restore_must_link_to_the_last_delivered_call() -> None:
    continued = crashed_after_one_delivered().start("r0-a1").learn([call(2, "r0-a1", "r0-a1.0", None)])
    with pytest.raises(P5Violation, match=r"parent_call_id 'r0\.0'"):
        p5_parent_links(continued.expected_parents())


def test_restoring_again_replaces_a_dead_executions_rows() -> None:
    dead = crashed_after_one_delivered().start("r0-a1").learn([call(2, "r0-a1", "r0-a1.0", "r0.0")])
    assert dead.expected("r0-a1") == ("r0.0", "r0-a1.0")
    again = dead.model_died().restore("c1")
    assert again.expected("r0-a1") == ("r0.0",)


def test_a_reply_that_reaches_a_dead_model_server_writes_no_row() -> None:
    lineage = Lineage().start("r0").learn([call(0, "r0", "r0.0", None, False)]).model_died()
    assert lineage.learn([call(0, "r0", "r0.0", None, True)]).expected("r0") == ()


def test_a_retire_retires_every_covered_attempt() -> None:
    lineage = crashed_after_one_delivered().start("r0-a1").retire("r0", 1)
    assert lineage.expected("r0") is None
    assert lineage.expected("r0-a1") is None
    assert next_key("r0") == "r0-a1"
    assert next_key("r0-a1") == "r0-a2"


def test_the_next_key_of_a_rollout_id_that_looks_like_an_attempt_is_its_own() -> None:
    """`x-a0`, `x-a01` and `x-a1b` are rollout IDs at attempt 0 (reference 5.1), not attempts of `x`."""
    assert next_key("x-a0") == "x-a0-a1"
    assert next_key("x-a01") == "x-a01-a1"
    assert next_key("x-a1b") == "x-a1b-a1"
    assert next_key("x-a0-a2") == "x-a0-a3"


def test_calls_of_an_attempt_nobody_runs_are_strays() -> None:
    lineage = Lineage().learn([call(0, "r9", "r9.0", None)])
    with pytest.raises(P5Violation, match="runs none"):
        p5_no_strays(lineage.strays)


def test_the_manifest_must_hold_exactly_the_expected_chain() -> None:
    p5_manifest("r0", ("r0.0", "r0.1"), manifest("r0.0", "r0.1"))
    with pytest.raises(P5Violation, match="not delivered, dead or duplicated"):
        p5_manifest("r0", ("r0.0",), manifest("r0.0", "r0.1"))
    with pytest.raises(P5Violation, match="missing"):
        p5_manifest("r0", ("r0.0", "r0.1"), manifest("r0.0"))
    broken = Manifest((LedgerRow("r0.0", None), LedgerRow("r0.1", None)))
    with pytest.raises(P5Violation, match="names parent None"):
        p5_manifest("r0", ("r0.0", "r0.1"), broken)
    failing = Manifest(manifest("r0.0").rows, failures=({"failure_reason": "x"},))
    with pytest.raises(P5Violation, match="failures"):
        p5_manifest("r0", ("r0.0",), failing)


def test_a_retired_ledger_answers_410_and_a_live_one_does_not() -> None:
    p5_manifest("r0", None, RetiredLedger("rollout ledger 'r0' is retired"))
    with pytest.raises(P5Violation, match="is retired"):
        p5_manifest("r0", None, manifest("r0.0"))
    with pytest.raises(P5Violation, match="answers 410"):
        p5_manifest("r0", ("r0.0",), RetiredLedger("rollout ledger 'r0' is retired"))


def test_an_exported_record_carries_exactly_the_delivered_chain() -> None:
    p5_exported("c1", {"r0": ("r0.0",), "r1": ()}, [record("r0", 0, "r0.0")])
    with pytest.raises(P5Violation, match="carries rows"):
        p5_exported("c1", {"r0": ("r0.0",)}, [record("r0", 0, "r0.0", "r0.1")])
    with pytest.raises(P5Violation, match="no model record"):
        p5_exported("c1", {"r0": ("r0.0",)}, [])
    with pytest.raises(P5Violation, match="r1"):
        p5_exported("c1", {"r0": ("r0.0",)}, [record("r0", 0, "r0.0"), record("r1", 0, "r1.0")])


def test_every_row_names_tokens_staged_for_it() -> None:
    rows = manifest("r0.0").rows
    p5_staged("r0", rows, {"k/r0.0": {"model_call_id": "r0.0", "tokens": [1]}})
    with pytest.raises(P5Violation, match="staged"):
        p5_staged("r0", rows, {})
    with pytest.raises(P5Violation, match="staged"):
        p5_staged("r0", rows, {"k/r0.0": {"model_call_id": "r1.0"}})


def test_a_call_without_a_capture_admission_is_not_captured() -> None:
    assert CapturedCall.from_wire({"index": 0, "admission": None, "returned": True}) is None


# -- P12: generation cuts -----------------------------------------------------------------------------------------


def waiting(index: int, key: str, model_call_id: str, parent: str | None) -> dict[str, Any]:
    return call(index, key, model_call_id, parent, returned=False) | {"waiting": True, "n_messages": 2}


def cut_and_restored(durable: bool = True) -> Lineage:
    """r0's first call generates when c1's prepare cuts it; c1 is committed, Gym crashes, c1 is restored."""
    lineage = Lineage().start("r0").learn([waiting(0, "r0", "r0.0", None)]).cut(durable)
    return lineage.commit("c1", {"r0": 0}).model_died().restore("c1")


def test_a_prepare_cuts_every_call_in_flight_and_the_restore_hands_the_cut_on() -> None:
    lineage = Lineage().start("r0").learn([waiting(0, "r0", "r0.0", None)])
    assert [c.model_call_id for c in lineage.in_flight()] == ["r0.0"]
    restored = cut_and_restored()
    assert restored.exported_cuts["c1"] == {"r0": "r0.0"}
    continued = restored.start("r0-a1").learn([waiting(1, "r0-a1", "r0-a1.0", None) | {"continued_from": "r0.0"}])
    assert continued.expected_continuations()[0][1] == "r0.0"
    p12_continuations(continued.expected_continuations())


def test_a_failed_cut_exports_nothing_and_the_continuation_starts_from_scratch() -> None:
    restored = cut_and_restored(durable=False)
    assert restored.exported_cuts["c1"] == {}
    regenerated = restored.start("r0-a1").learn([waiting(1, "r0-a1", "r0-a1.0", None)])
    p12_continuations(regenerated.expected_continuations())


def test_admission_opening_drops_the_open_cuts() -> None:
    lineage = Lineage().start("r0").learn([waiting(0, "r0", "r0.0", None)]).cut(True).opened()
    assert lineage.commit("c1", {"r0": 0}).exported_cuts["c1"] == {}


def test_a_restored_cut_not_yet_used_is_exported_again() -> None:
    assert cut_and_restored().commit("c2", {"r0-a1": 0}).exported_cuts["c2"] == {"r0-a1": "r0.0"}
    started = cut_and_restored().start("r0-a1").learn([waiting(1, "r0-a1", "r0-a1.0", None)])
    assert started.commit("c2", {"r0-a1": 0}).exported_cuts["c2"] == {"r0-a1": "r0.0"}


def test_a_continuation_that_regenerates_or_continues_the_wrong_call_fails() -> None:
    regenerated = cut_and_restored().start("r0-a1").learn([waiting(1, "r0-a1", "r0-a1.0", None)])
    with pytest.raises(P12Violation, match=r"continues the prefix of r0\.0"):
        p12_continuations(regenerated.expected_continuations())
    stray = Lineage().start("r0").learn([waiting(0, "r0", "r0.0", None) | {"continued_from": "r9.0"}])
    with pytest.raises(P12Violation, match="generates from scratch"):
        p12_continuations(stray.expected_continuations())


def test_the_backend_answers_one_round_cutting_each_call_in_flight() -> None:
    in_flight = Lineage().start("r0").learn([waiting(0, "r0", "r0.0", None)]).in_flight()
    p12_cut_round("c1", in_flight, [["r0.0"]])
    p12_cut_round("c1", (), [])
    with pytest.raises(P12Violation, match="rounds"):
        p12_cut_round("c1", in_flight, [["r0.0"], ["r0.0"]])
    with pytest.raises(P12Violation, match="rounds"):
        p12_cut_round("c1", (), [["r0.0"]])
    two = Lineage().start("r0").start("r1").learn([waiting(0, "r0", "r0.0", None), waiting(1, "r1", "r1.0", None)])
    p12_cut_round("c1", two.in_flight(), [["r1.0"], ["r0.0"]], workers=2)  # one round per worker
    with pytest.raises(P12Violation, match="at most 1 round"):
        p12_cut_round("c1", two.in_flight(), [["r1.0"], ["r0.0"]], workers=1)
    with pytest.raises(P12Violation, match="rounds"):
        p12_cut_round("c1", two.in_flight(), [["r1.0"], ["r0.0"], []], workers=2)


def test_a_record_carries_exactly_the_expected_cut() -> None:
    def with_cuts(*sources: str) -> dict[str, Any]:
        cuts = [{"model_call_id": s, "continuation": {"source_model_call_id": s}} for s in sources]
        return record("r0", 0) | {"generation_cuts": cuts}

    p12_exported_cuts("c1", {"r0": "r0.0"}, [with_cuts("r0.0")])
    p12_exported_cuts("c1", {}, [record("r0", 0, "x")])
    with pytest.raises(P12Violation, match="carries cuts"):
        p12_exported_cuts("c1", {"r0": "r0.0"}, [with_cuts("r0.0", "r0.0")])
    with pytest.raises(P12Violation, match="no model record"):
        p12_exported_cuts("c1", {"r0": "r0.0"}, [])


def test_a_continued_calls_tokens_hold_the_prefix_once() -> None:
    fresh = CapturedCall(0, "r1", "r1.0", None, True, n_messages=2)
    continued = CapturedCall(
        1, "r0-a1", "r0-a1.0", None, True, n_messages=2, continued_from="r0.0", reused_prefix_tokens=2
    )
    prefix_key = "__generation_cut__/r0/r0.0"
    staged = {
        "r1/r1.0": {"model_call_id": "r1.0", "tokens": [5, 6, 7]},
        prefix_key: {"tokens": [5, 6]},
        "r0-a1/r0-a1.0": {"model_call_id": "r0-a1.0", "tokens": [5, 6, 7], "prefix_staging_key": prefix_key},
    }
    p12_tokens([fresh, continued], staged)
    doubled = staged | {"r0-a1/r0-a1.0": staged["r0-a1/r0-a1.0"] | {"tokens": [5, 6, 5, 6, 7]}}
    with pytest.raises(P12Violation, match="generated from scratch"):
        p12_tokens([fresh, continued], doubled)
    with pytest.raises(P12Violation, match="reused_prefix_tokens"):
        p12_tokens([attrs.evolve(continued, reused_prefix_tokens=3)], staged)
    with pytest.raises(P12Violation, match="staged tokens"):
        p12_tokens([continued], {})


def test_a_deleted_ledger_is_live_and_empty_again() -> None:
    retired = Lineage().start("r0").learn([call(0, "r0", "r0.0", None)]).retire("r0", 0)
    assert retired.expected("r0") is None
    deleted = retired.delete("r0")
    assert deleted.expected("r0") == ()
    assert deleted.start("r0").learn([call(1, "r0", "r0.1", None)]).expected("r0") == ("r0.1",)


# A model share read on its own (`ckpt-model audit`): records with rows or a cut, each row once, one cut at most.


def model_record(rollout: str, calls: list[str], cuts: int = 0) -> dict[str, Any]:
    rows = [{"model_call_id": call, "staging_key": f"{rollout}/{call}"} for call in calls]
    cut = {"continuation": {"source_model_call_id": "held"}}
    return {"episode_id": {"rollout_id": rollout, "attempt": 0}, "rows": rows, "generation_cuts": [cut] * cuts}


def test_a_model_share_whose_records_carry_rows_or_one_cut_each_passes() -> None:
    records = [model_record("r0", ["c1", "c2"]), model_record("r1", [], cuts=1), model_record("r2", ["c3"], cuts=1)]
    p5_record_rows("ckpt-1", records)
    p12_one_cut_per_record("ckpt-1", records)
    p5_record_rows("ckpt-1", [])


def test_a_row_twice_or_an_empty_record_is_p5() -> None:
    with pytest.raises(P5Violation, match=r"rows of \['c1'\] more than once") as twice:
        p5_record_rows("ckpt-1", [model_record("r0", ["c1", "c2", "c1"])])
    assert twice.value.rollout == "r0"
    with pytest.raises(P5Violation, match=r"the records of \['r1'\] carry neither"):
        p5_record_rows("ckpt-1", [model_record("r0", ["c1"]), model_record("r1", [])])


def test_two_cuts_in_one_record_are_p12() -> None:
    with pytest.raises(P12Violation, match="it carries 2") as caught:
        p12_one_cut_per_record("ckpt-1", [model_record("r0", ["c1"], cuts=1), model_record("r1", [], cuts=2)])
    assert caught.value.rollout == "r1"


# --- chains read offline: stamps, cuts, and one published checkpoint to the next ------------------------------------


def chained(
    rollout: str, attempt: int, rows: list[tuple[str, str | None]], cut: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A model record of attempt `attempt`: rows as (model_call_id, stamp or None), and a cut as (source capture
    key, source call)."""
    cuts = [] if cut is None else [{"continuation": {"source_capture_key": cut[0], "source_model_call_id": cut[1]}}]
    return {
        "episode_id": {"rollout_id": rollout, "attempt": attempt},
        "rows": [{"model_call_id": call, **({"capture_key": stamp} if stamp else {})} for call, stamp in rows],
        "generation_cuts": cuts,
    }


def test_rows_stamped_with_earlier_attempts_and_cuts_of_undelivered_calls_pass() -> None:
    records = [
        chained("r0", 2, [("r0.0", "r0"), ("r0-a1.0", "r0-a1"), ("r0-a2.0", None)], cut=("r0-a2", "r0-a2.1")),
        chained("r1", 1, [], cut=("r1", "r1.0")),  # a restored cut not yet used
    ]
    p5_row_stamps("ckpt-1", records)
    p12_cut_of_undelivered_call("ckpt-1", records)


@pytest.mark.parametrize("stamp", ["r0-a1", "r1", "r0-a3"])
def test_a_row_stamped_with_its_own_a_later_or_another_rollouts_attempt_is_p5(stamp: str) -> None:
    with pytest.raises(P5Violation, match=rf"rows stamped \['{stamp}'\]") as caught:
        p5_row_stamps("ckpt-1", [chained("r0", 1, [("x.0", stamp)])])
    assert caught.value.rollout == "r0-a1"


@pytest.mark.parametrize(
    ("cut", "shown"),
    [(("r0", "r0.0"), "a call whose row the record carries"), (("r9", "r9.0"), "of 'r9'"), (("r0-a2", "x"), "r0-a2")],
)
def test_a_cut_of_a_delivered_call_or_of_another_attempt_is_p12(cut: tuple[str, str], shown: str) -> None:
    with pytest.raises(P12Violation, match=shown):
        p12_cut_of_undelivered_call("ckpt-1", [chained("r0", 1, [("r0.0", "r0")], cut=cut)])


def test_a_chain_that_grew_or_was_carried_whole_passes() -> None:
    earlier = [
        chained("r0", 0, [("r0.0", None)]),
        chained("r1", 0, [("r1.0", None)]),
        chained("r2", 0, [("r2.0", None)]),
    ]
    later = [
        chained("r0", 0, [("r0.0", None), ("r0.1", None)]),  # the same attempt, one more row
        chained("r1", 1, [("r1.0", "r1"), ("r1-a1.0", None)]),  # restored, then a row of its own
        chained("r2", 1, [("r2-a1.0", None)]),  # started over: nothing carried
        chained("r3", 0, [("r3.0", None)]),  # new
    ]
    p5_chain_carried("ckpt-1", earlier, "ckpt-2", later)


@pytest.mark.parametrize(
    "later",
    [
        chained("r0", 0, [("r0.1", None)]),  # a row of the same attempt gone
        chained("r0", 1, [("r0.1", "r0")]),  # carried, but not the rows it had
        chained("r0", 1, [("r0.0", "r0"), ("r0.9", "r0")]),  # carried with a row it never had
    ],
)
def test_a_chain_that_lost_or_gained_a_carried_row_is_p5(later: dict[str, Any]) -> None:
    with pytest.raises(P5Violation, match="lost or added"):
        p5_chain_carried("ckpt-1", [chained("r0", 0, [("r0.0", None)])], "ckpt-2", [later])
