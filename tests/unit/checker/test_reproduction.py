"""A failure's reproduction rate and the tries a candidate gets by it, on hand-built counts."""

from __future__ import annotations

import itertools

import pytest

from ckpt_model.results.reproduction import (
    ATTEMPTS_MAX,
    WRONGLY_REFUSED_CHANCE,
    Rate,
    attempts_for,
    measure,
    rate_of,
    record,
)


def test_a_rate_reads_as_the_property_and_its_count() -> None:
    assert Rate(label="P5", failing=3, replays=10).text == "P5 in 3 of 10 replays"
    assert Rate(label="P5", failing=10, replays=10).always
    assert not Rate(label="P5", failing=9, replays=10).always


def test_measure_counts_the_replays_that_failed() -> None:
    outcomes = itertools.cycle([True, False, False])
    assert measure("P9", 9, lambda: next(outcomes)) == Rate(label="P9", failing=3, replays=9)


@pytest.mark.parametrize(
    ("failing", "attempts"),
    [(10, 1), (9, 2), (5, 7), (3, 13), (1, ATTEMPTS_MAX), (0, ATTEMPTS_MAX)],
)
def test_a_candidate_gets_enough_tries_to_fail_as_often_as_the_failure_found(failing: int, attempts: int) -> None:
    rate = Rate(label="P5", failing=failing, replays=10)
    assert attempts_for(rate) == attempts
    if 0 < failing < 10 and attempts < ATTEMPTS_MAX:
        # a candidate failing at the measured share passes every try at most this often
        assert (1 - rate.share) ** attempts <= WRONGLY_REFUSED_CHANCE < (1 - rate.share) ** (attempts - 1)


def test_a_failure_not_measured_gets_one_try_per_candidate() -> None:
    assert attempts_for(None) == 1


def test_a_rate_rides_on_its_error_and_in_a_regression_file() -> None:
    error = AssertionError("P5")
    assert rate_of(error) is None
    rate = Rate(label="P5", failing=3, replays=10)
    record(error, rate)
    assert rate_of(error) == rate
    assert Rate.from_document(rate.document()) == rate
    assert rate.document()["text"] == "P5 in 3 of 10 replays"


@pytest.mark.parametrize("document", [None, {}, {"label": "P5", "failing": "3", "replays": 10}, {"replays": 0}])
def test_a_regression_file_without_a_rate_reads_as_none(document: object) -> None:
    assert Rate.from_document(document) is None
