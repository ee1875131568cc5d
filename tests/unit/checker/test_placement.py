"""The placement audit on hand-built backend call lists: which calls it reads, and a placed call served elsewhere."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_model.errors import HarnessError
from ckpt_model.trainer.placement import PlacementMismatch, placement_mismatches, served_calls


def call(index: int, key: str | None, worker: int | None, kind: str = "policy") -> dict[str, Any]:
    return {"index": index, "capture_key": key, "worker": worker, "kind": kind}


def test_only_new_tagged_policy_calls_that_name_a_worker_are_read() -> None:
    records = [
        call(0, "r0#0", 0),
        call(1, None, 1),  # untagged: no episode to place
        call(2, "r1#0", 1, kind="judge"),
        {"index": 3, "capture_key": "r2#0", "kind": "policy"},  # a backend that does not name workers
        call(4, "r1#0", 1),
    ]
    assert served_calls(records, 0) == [(0, "r0#0", 0), (4, "r1#0", 1)]
    assert served_calls(records, 1) == [(4, "r1#0", 1)]


def test_a_placed_call_served_by_another_worker_is_a_mismatch() -> None:
    served = [(0, "r0#0", 0), (1, "r1#0", 0), (2, "r2#0", 1), (3, "r1#0", None)]
    chosen = {"r0#0": 0, "r1#0": 1}
    assert placement_mismatches(served, chosen) == [("r1#0", 1, 1, 0), ("r1#0", 3, 1, None)]
    assert placement_mismatches(served, {}) == [], "an unplaced call is only observed"


def test_a_mismatch_is_a_harness_error_naming_the_call_and_both_workers() -> None:
    with pytest.raises(HarnessError, match=r"call 1 of r1#0 was placed on policy worker 1 but served by worker 0"):
        raise PlacementMismatch("r1#0", 1, 1, 0)
