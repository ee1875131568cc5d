"""Stateful suite: our Hypothesis profile loaded explicitly, and one harness per topology per session.

`CKPT_MODEL_EXAMPLES=N` runs N examples per machine test instead of the profile's number, with everything else of
the profile: how the nightly's search is sized to a time budget, and how its throughput is measured
(docs/parallel.md). Under pytest-xdist each worker process builds its own harnesses; the example database is shared.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from ckpt_model import profiles
from ckpt_model.deployment import Harness

EXAMPLES_ENV = "CKPT_MODEL_EXAMPLES"


def examples_override() -> int | None:
    """`CKPT_MODEL_EXAMPLES` as a positive number of examples; None if unset or empty; anything else ends the run."""
    text = os.environ.get(EXAMPLES_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"{EXAMPLES_ENV} must be a positive integer (got {text!r}); unset it for the profile's")
    return int(text)


ACTIVE_PROFILE = profiles.load()
EXAMPLES = examples_override()
# What the state machine tests pass explicitly: the profile loaded above, as it is in force here (CI or not).
ACTIVE_SETTINGS = profiles.profile_for(ACTIVE_PROFILE, profiles.in_ci())
if EXAMPLES is not None:
    ACTIVE_SETTINGS = settings(ACTIVE_SETTINGS, max_examples=EXAMPLES)


def pytest_report_header() -> str:
    examples = "" if EXAMPLES is None else f"; {EXAMPLES} examples per machine test ({EXAMPLES_ENV})"
    return f"ckpt-model: Hypothesis profile {profiles.describe()}{examples}"


@pytest.fixture(scope="session")
def native_harness() -> Iterator[Harness]:
    with Harness.embedded("native") as harness:
        yield harness


@pytest.fixture(scope="session")
def legacy_harness() -> Iterator[Harness]:
    with Harness.embedded("legacy") as harness:
        yield harness


@pytest.fixture(scope="session")
def counter_harness() -> Iterator[Harness]:
    with Harness.embedded("counter") as harness:
        yield harness


@pytest.fixture(scope="session")
def counter_capture_harness() -> Iterator[Harness]:
    """Gym's lineage scenarios' deployment: the counter topology with token capture."""
    with Harness.embedded("counter", token_capture=True) as harness:
        yield harness


@pytest.fixture(scope="session")
def native_cuts_harness() -> Iterator[Harness]:
    """Gym's cut scenario's deployment: the native topology with token capture and generation cuts."""
    with Harness.embedded("native", token_capture=True, generation_cuts=True) as harness:
        yield harness


@pytest.fixture(scope="session")
def counter_capture_two_workers_harness() -> Iterator[Harness]:
    """The lineage scenarios' deployment with two policy-model workers behind one port (Gym runs them with 1 and 2)."""
    with Harness.embedded("counter", token_capture=True, policy_workers=2) as harness:
        yield harness


@pytest.fixture(scope="session")
def native_cuts_two_workers_harness() -> Iterator[Harness]:
    """The cut scenario's deployment with two policy-model workers behind one port."""
    with Harness.embedded("native", token_capture=True, generation_cuts=True, policy_workers=2) as harness:
        yield harness


@pytest.fixture(scope="session")
def slow_wait_harness() -> Iterator[Harness]:
    with Harness.embedded("slow", verify_mode="wait") as harness:
        yield harness


@pytest.fixture(scope="session")
def slow_replay_harness() -> Iterator[Harness]:
    with Harness.embedded("slow", verify_mode="replay") as harness:
        yield harness


@pytest.fixture(scope="session")
def mixed_harness() -> Iterator[Harness]:
    with Harness.embedded("mixed") as harness:
        yield harness
