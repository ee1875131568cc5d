"""What `check` says of the examples and steps it asked for and ran (the banner's `examples:` line, the statistics
line, the PASSED line's note), from hand-built settings and statistics: the counts asked and run differ for reasons
each line names."""

from __future__ import annotations

from hypothesis import settings

from ckpt_model.cli import build_parser
from ckpt_model.commands.check import UNTIL_THE_TIME_LIMIT, asked_note, examples_line, skews_here
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.stats import SearchStats
from ckpt_model.search.checking import statistics_line
from ckpt_model.trainer.machine import CheckpointMachine


def test_the_banner_says_the_valid_examples_and_the_steps_drawn_asked_for() -> None:
    args = build_parser().parse_args(["check"])

    line = examples_line(args, settings(max_examples=8, stateful_step_count=14))

    assert line == "8 valid, each of up to 14 steps drawn"


def test_the_banner_of_a_search_bounded_by_time_says_it_stops_then_minimises() -> None:
    args = build_parser().parse_args(["check", "--max-time", "60s"])

    line = examples_line(args, settings(max_examples=UNTIL_THE_TIME_LIMIT, stateful_step_count=14))

    assert line == (
        "until the time limit, each of up to 14 steps drawn; no example begins that the median example so far would "
        "not end by 60 s (--max-time), none is cut short; then the search minimises what it found"
    )


def test_more_examples_than_asked_are_those_hypothesis_discarded_as_invalid() -> None:
    note = asked_note(ran=12, asked=8)

    assert note.startswith(" (8 asked: Hypothesis counts valid examples only, and ran 4 more it discarded as invalid")
    assert asked_note(ran=8, asked=8) == ""
    assert "its time ran out first" in asked_note(ran=3, asked=8, stopped_by_time=True)


def test_the_statistics_count_the_steps_drawn_apart_from_the_model_steps_they_made() -> None:
    """An example of 14 rules drawn makes 17 model steps when a rule played another inside it (a crash before a
    restore) and its teardown drained with two: the steps asked for bound the first count only."""
    stats = SearchStats(started_s=100.0)
    stats.example_started()
    stats.example_finished(steps=17, crashes=1, seconds=2.0, drawn=14)

    line = statistics_line(stats, clock=lambda: 102.0)

    assert line == (
        "statistics: 1 examples finished, 14 steps drawn, 17 model steps (with the rules a drawn one played and the "
        "teardowns' drains), 1 crashes (0 inside an operation), 0.50 examples/s, 118 ms/model step"
    )


def test_the_note_on_skewed_clocks_is_said_only_where_a_skewing_rule_applies() -> None:
    """A deployment whose time can pass never skews a clock whatever is installed: the note's advice (install
    faketime) would mislead there (it once said so on slow/replay+jumps with faketime installed)."""
    assert skews_here(CheckpointMachine, DeploymentSpec("slow", "replay"))
    assert skews_here(CheckpointMachine, DeploymentSpec("native"))
    assert not skews_here(CheckpointMachine, DeploymentSpec("slow", "replay", time_jumps=True))
