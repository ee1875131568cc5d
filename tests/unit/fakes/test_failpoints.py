"""Failpoints stop a server's work where the checker asked, and say so."""

from __future__ import annotations

import threading

import pytest

from fakes.gym.faults import failpoints
from fakes.gym.faults.failpoints import BEFORE_INSTALL, BETWEEN_FILES, Failpoints


def test_an_unarmed_point_returns_at_once() -> None:
    points = Failpoints()
    points.hit(BETWEEN_FILES)
    assert points.state() == {"armed": [], "reached": []}


def test_an_armed_point_is_reached_and_holds_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "HOLD_S", 30.0)
    points = Failpoints()
    points.arm(BETWEEN_FILES)
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            points.hit(BETWEEN_FILES)
        except RuntimeError as error:
            outcome.append(error)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    for _ in range(10_000):  # bounded: about 10 s at most
        if points.state()["reached"] == [BETWEEN_FILES]:
            break
        worker.join(0.001)
    assert points.state()["reached"] == [BETWEEN_FILES]
    assert worker.is_alive()  # held there, as for a crash at that very point
    points._never.set()  # let the test's thread go instead of a SIGKILL
    worker.join()
    assert len(outcome) == 1


def test_a_point_held_too_long_fails_its_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "HOLD_S", 0.0)
    points = Failpoints()
    points.arm(BETWEEN_FILES)
    with pytest.raises(RuntimeError, match="nobody crashed the server"):
        points.hit(BETWEEN_FILES)


def test_an_unknown_point_cannot_be_armed() -> None:
    with pytest.raises(ValueError, match=r"no failpoint 'commit\.nowhere'"):
        Failpoints().arm("commit.nowhere")


def test_armed_says_which_points_work_would_stop_at() -> None:
    points = Failpoints()
    points.arm(BEFORE_INSTALL)
    assert points.armed(BEFORE_INSTALL)
    assert not points.armed(BETWEEN_FILES)
