"""`--max-time`: when the search still begins an example (`another_fits`), and the factory that stops it
(`within`), on hand-made times and a fake clock."""

from __future__ import annotations

from typing import cast

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from ckpt_model.results.stats import SearchStats
from ckpt_model.search.checking import TimeLimitReached, another_fits, within


def test_the_first_example_begins_whenever_time_is_left() -> None:
    assert another_fits(0.0, 60.0, [])
    assert another_fits(59.9, 60.0, [])
    assert not another_fits(60.0, 60.0, [])


def test_an_example_begins_only_if_the_median_example_so_far_ends_by_the_limit() -> None:
    begun = [0.0, 10.0, 20.0]  # three examples of 10 s, the third ending at 30 s
    assert another_fits(30.0, 40.0, begun)
    assert not another_fits(30.0, 39.9, begun)


def test_one_long_example_does_not_stop_a_search_of_short_ones() -> None:
    begun = [0.0, 50.0, 55.0, 60.0]  # 50 s, then 5 s each: the median is 5 s
    assert another_fits(65.0, 75.0, begun)
    assert not another_fits(65.0, 69.0, begun)


class Made:
    """Stands for a machine: counts the machines made."""

    count = 0

    def __init__(self) -> None:
        Made.count += 1


MADE = cast("type[RuleBasedStateMachine]", Made)


def test_the_factory_stops_before_an_example_that_would_end_past_the_limit_and_rounds_share_the_lengths() -> None:
    now = [0.0]
    stats = SearchStats(started_s=0.0)
    begun: list[float] = []
    first_round = within(MADE, stats, 30.0, clock=lambda: now[0], begun_s=begun)
    Made.count = 0
    for at in (0.0, 12.0):
        now[0] = at
        first_round()
        stats.example_finished(steps=3, crashes=0, seconds=12.0)
    now[0] = 24.0  # two examples of 12 s: a third would end at 36 s
    with pytest.raises(TimeLimitReached):
        first_round()

    second_round = within(MADE, stats, 60.0, clock=lambda: now[0], begun_s=begun)
    second_round()  # judged by the first round's examples: 24 + 12 <= 60
    now[0] = 50.0  # an example of 26 s: the median of 12, 12, 26 is 12, and 62 > 60
    with pytest.raises(TimeLimitReached):
        second_round()
    assert Made.count == 3
    assert begun == [0.0, 12.0, 24.0]


def test_a_search_bounded_by_time_judges_one_example_however_late_it_begins() -> None:
    """On a loaded machine the deployment's start alone can outlast a limit of a second: the first example still
    runs, and the next does not."""
    stats = SearchStats(started_s=0.0)
    Made.count = 0
    factory = within(MADE, stats, 1.0, clock=lambda: 9.0)
    factory()  # nothing judged yet: it begins
    stats.example_finished(steps=3, crashes=0, seconds=1.0)
    with pytest.raises(TimeLimitReached):
        factory()
    assert Made.count == 1


def test_once_a_failure_was_seen_the_factory_never_stops_hypothesis_replaying_it() -> None:
    stats = SearchStats(started_s=0.0, first_failure_s=1.0)
    Made.count = 0
    within(MADE, stats, 30.0, clock=lambda: 100.0)()
    assert Made.count == 1


def test_the_command_s_clock_starts_with_its_process_not_with_its_imports() -> None:
    import subprocess
    import sys

    # A process that waits a second before it asks: its age includes that second (a lower bound, whatever the load).
    program = "import time; time.sleep(1.0); from ckpt_model.cli import process_age_s; print(process_age_s())"
    age_s = float(subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout)

    assert age_s >= 0.99
