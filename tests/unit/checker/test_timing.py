"""The timing hook: records nothing while off, nests spans by path, keeps other threads' spans apart."""

from __future__ import annotations

import threading

from ckpt_model import timing


def test_off__spans_and_counts_record_nothing_and_share_one_no_op() -> None:
    assert timing.span("a") is timing.span("b")
    with timing.span("a"):
        timing.count("polls")
    collector = timing.Timings()
    assert collector.snapshot() == {"seconds": {}, "spans": {}, "counts": {}}


def test_on__nested_spans_are_recorded_under_their_parent() -> None:
    collector = timing.Timings()
    with timing.collecting(collector):
        with timing.span("crash"):
            with timing.span("restart.kill"):
                pass
            with timing.span("restart.start"):
                timing.count("polls", 2)
        with timing.span("restart.kill"):
            pass
    recorded = collector.snapshot()
    assert recorded["spans"] == {"crash": 1, "crash/restart.kill": 1, "crash/restart.start": 1, "restart.kill": 1}
    assert recorded["counts"] == {"polls": 2}
    assert recorded["seconds"]["crash"] >= recorded["seconds"]["crash/restart.kill"]
    with timing.span("after"):
        pass
    assert "after" not in collector.snapshot()["spans"], "off again once the block ends"


def test_on__another_thread_s_spans_go_under_background() -> None:
    collector = timing.Timings()

    def run() -> None:
        with timing.span("run"):
            pass

    with timing.collecting(collector), timing.span("settle"):
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    assert collector.snapshot()["spans"] == {"settle": 1, f"{timing.BACKGROUND}/run": 1}
