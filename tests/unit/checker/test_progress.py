"""`progress`: the run's one-line progress, drawn only on a terminal."""

from __future__ import annotations

import io

import pytest

from ckpt_model.errors import PropertyViolation
from ckpt_model.results.progress import ERASE_LINE, Progress, progress_text
from ckpt_model.results.stats import SearchStats


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stats_after(examples: int, steps_each: int, started_s: float = 100.0) -> SearchStats:
    stats = SearchStats(started_s=started_s)
    for _ in range(examples):
        stats.example_started()
        stats.example_finished(steps=steps_each, crashes=0, seconds=1.0)
    return stats


def test_the_line_counts_examples_steps_failures_and_the_rate() -> None:
    stats = stats_after(examples=4, steps_each=10)
    stats.failed(PropertyViolation(rollout=None, expected="x", observed="y"))

    line = progress_text(stats, examples_asked=8, doing="searching", now_s=108.0)

    assert line == "  searching · example 4 of 8 · 40 steps · 1 failure · 0.50 examples/s · 8 s"


def test_past_the_examples_asked_the_count_goes_on_and_names_the_count_asked() -> None:
    stats = stats_after(examples=11, steps_each=1)

    assert "example 11 (8 asked) · 11 steps" in progress_text(stats, examples_asked=8, doing="searching", now_s=101.0)
    assert "example 8 of 8 ·" in progress_text(stats_after(8, 1), examples_asked=8, doing="searching", now_s=101.0)


def test_nothing_is_drawn_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(stats_after(1, 1), 8, stream=stream) as progress:
        progress.now_doing("minimising P9")

    assert stream.getvalue() == ""


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
