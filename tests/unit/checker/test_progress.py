"""`progress`: the run's progress, redrawn in place on a terminal, a plain line at a steady interval without one."""

from __future__ import annotations

import io

import pytest

from ckpt_model.errors import PropertyViolation
from ckpt_model.results.progress import (
    ERASE_LINE,
    MEASURING,
    MEASURING_MINIMAL,
    MINIMISING,
    FailureWork,
    Heartbeat,
    Progress,
    progress_text,
)
from ckpt_model.results.stats import SearchStats


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stats_after(examples: int, steps_each: int, started_s: float = 100.0) -> SearchStats:
    """Examples of `steps_each` rules drawn, each making two model steps more (a nested rule, a drain step)."""
    stats = SearchStats(started_s=started_s)
    for _ in range(examples):
        stats.example_started()
        stats.example_finished(steps=steps_each + 2, crashes=0, seconds=1.0, drawn=steps_each)
    return stats


class Clock:
    """A fake monotonic clock a test moves by hand."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def test_the_line_counts_examples_steps_drawn_failures_and_the_rate() -> None:
    stats = stats_after(examples=4, steps_each=10)
    stats.failed(PropertyViolation(rollout=None, expected="x", observed="y"))

    line = progress_text(stats, examples_asked=8, doing="searching", now_s=108.0)

    # The steps `--steps` bounds (rules drawn), not the model steps (48) the examples made.
    assert line == "  searching · example 4 of 8 · 40 steps · 1 failure · 0.50 examples/s · 8 s"


def test_the_line_counts_the_goals_reached_of_those_that_apply() -> None:
    stats = stats_after(examples=2, steps_each=3)
    stats.example_covered({"held_reply_across_commit": 2, "crash_inside_commit": 0}, (), {})

    line = progress_text(stats, examples_asked=8, doing="searching", now_s=104.0, goals_total=30)

    assert "· 0 failures · goals 1 of 30 · 0.50 examples/s ·" in line


def test_a_search_bounded_by_time_alone_counts_examples_without_a_count_asked() -> None:
    line = progress_text(stats_after(3, 1), examples_asked=None, doing="searching", now_s=110.0)

    assert "searching · example 3 (until the time limit) · 3 steps ·" in line


def test_past_the_examples_asked_the_count_goes_on_and_names_the_count_asked() -> None:
    stats = stats_after(examples=11, steps_each=1)

    assert "example 11 (8 asked) · 11 steps" in progress_text(stats, examples_asked=8, doing="searching", now_s=101.0)
    assert "example 8 of 8 ·" in progress_text(stats_after(8, 1), examples_asked=8, doing="searching", now_s=101.0)


def test_nothing_is_drawn_in_place_when_the_stream_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.StringIO()
    with Progress(stats_after(1, 1), 8, stream=stream, every_s=None) as progress:
        progress.now_doing("minimising P9")

    assert stream.getvalue() == ""
    assert capsys.readouterr().out == ""


def test_without_a_terminal_a_plain_line_is_printed_at_each_interval(capsys: pytest.CaptureFixture[str]) -> None:
    """Piped output (a CI log) gets whole lines, no carriage return, every `every_s` seconds of the clock."""
    clock = Clock(100.0)
    stats = stats_after(0, 0)
    progress = Progress(stats, 8, stream=io.StringIO(), every_s=10.0, goals_total=5, clock=clock)
    heartbeat = progress.heartbeat
    assert heartbeat is not None

    said = []
    for now_s, examples in ((109.9, 0), (110.0, 1), (115.0, 2), (120.0, 3), (141.0, 4), (145.0, 4)):
        clock.now_s = now_s
        while stats.examples < examples:
            stats.example_started()
        said.append(heartbeat.tick())

    assert said == [False, True, False, True, True, False]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "progress: searching · example 1 of 8 · 0 steps · 0 failures · goals 0 of 5 · 0.00 examples/s · 10 s",
        "progress: searching · example 3 of 8 · 0 steps · 0 failures · goals 0 of 5 · 0.00 examples/s · 20 s",
        "progress: searching · example 4 of 8 · 0 steps · 0 failures · goals 0 of 5 · 0.00 examples/s · 41 s",
    ]
    assert "\r" not in "".join(lines)


def test_a_heartbeat_late_by_more_than_its_interval_says_once_and_keeps_its_pace() -> None:
    clock = Clock(0.0)
    said: list[str] = []
    heartbeat = Heartbeat(lambda: f"at {clock.now_s:g}", every_s=10.0, say=said.append, clock=clock)

    for now_s in (10.0, 35.0, 35.5, 45.0, 54.0, 55.0):
        clock.now_s = now_s
        heartbeat.tick()

    assert said == ["at 10", "at 35", "at 45", "at 55"]


def test_a_heartbeat_says_nothing_once_stopped() -> None:
    clock = Clock(0.0)
    said: list[str] = []
    with Heartbeat(lambda: "beat", every_s=1000.0, say=said.append, clock=clock) as heartbeat:
        pass
    clock.now_s = 2000.0

    assert heartbeat.tick() is False
    assert said == []


def test_on_a_terminal_the_line_is_drawn_then_erased() -> None:
    stream = Terminal()
    with Progress(stats_after(2, 3), 8, stream=stream, clock=lambda: 104.0) as progress:
        progress.now_doing("minimising P9")

    written = stream.getvalue()
    assert ERASE_LINE + "  minimising P9 · example 2 of 8 · 6 steps · 0 failures" in written
    assert written.endswith(ERASE_LINE)  # the last thing written leaves a clean line


def test_a_line_said_during_the_run_goes_to_the_output_on_a_clean_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An aimed round's announcement (`checking.search`) is printed whether or not a progress line is drawn."""
    for on_a_terminal in (True, False):
        stream = io.StringIO()
        progress = Progress(SearchStats(), 8, stream=stream, enabled=on_a_terminal)
        progress.say("round 2: aimed at 1 left")
        assert capsys.readouterr().out == "round 2: aimed at 1 left\n"
        drawn = stream.getvalue()
        assert drawn.startswith(ERASE_LINE) if on_a_terminal else drawn == ""


# --- measuring and minimising a failure --------------------------------------------------------------------------


def test_measuring_says_which_replay_of_how_many_is_under_way() -> None:
    work = FailureWork("P9", started_s=100.0)
    work.begin(MEASURING, replays_asked=10, steps_found=12)
    for failed in (True, False, True):
        work.replayed(failed)
    assert work.text(112.4) == "measuring P9: replay 4 of 10 (2 failing), 12 steps, 12 s"
    for _ in range(7):
        work.replayed(True)
    assert work.text(130.0) == "measuring P9: replay 10 of 10 (9 failing), 12 steps, 30 s"


def test_minimising_counts_the_candidates_replayed_and_the_sequence_it_shortened() -> None:
    work = FailureWork("P9", started_s=100.0)
    work.begin(MINIMISING, steps_found=12)
    assert work.text(100.0) == "minimising P9: 0 candidates replayed (0 failing), 12 steps, 0 s"
    for failed in (False, True, False):
        work.replayed(failed)
    work.shortened(5)
    assert work.text(131.0) == "minimising P9: 3 candidates replayed (1 failing), 12 -> 5 steps, 31 s"
    work.begin(MEASURING_MINIMAL, replays_asked=10)  # the sequence stays the minimal one's
    work.replayed(True)
    assert work.text(140.0) == "measuring the minimal sequence of P9: replay 2 of 10 (1 failing), 12 -> 5 steps, 40 s"


def test_while_a_failure_is_worked_on_the_plain_line_says_how_far_that_got(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock(100.0)
    progress = Progress(stats_after(3, 4), 8, stream=io.StringIO(), every_s=10.0, clock=clock)
    heartbeat = progress.heartbeat
    assert heartbeat is not None
    work = FailureWork("P9", started_s=100.0)
    work.begin(MINIMISING, steps_found=12)
    work.shortened(5)
    for _ in range(14):
        work.replayed(True)
    progress.now_working_on(work)

    clock.now_s = 131.0
    heartbeat.next_s = 131.0
    assert heartbeat.tick()
    progress.now_doing("searching")  # the work is over: the search's line again
    heartbeat.next_s = 131.0
    assert heartbeat.tick()
    assert capsys.readouterr().out.splitlines() == [
        "progress: minimising P9: 14 candidates replayed (14 failing), 12 -> 5 steps, 31 s",
        "progress: searching · example 3 of 8 · 12 steps · 0 failures · 0.10 examples/s · 31 s",
    ]
