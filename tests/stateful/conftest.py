"""Stateful suite: our Hypothesis profile loaded explicitly, and one harness per topology per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckpt_model import profiles
from ckpt_model.deployment import Harness

ACTIVE_PROFILE = profiles.load()
# What the state machine tests pass explicitly: the profile loaded above, as it is in force here (CI or not).
ACTIVE_SETTINGS = profiles.profile_for(ACTIVE_PROFILE, profiles.in_ci())


def pytest_report_header() -> str:
    return f"ckpt-model: Hypothesis profile {profiles.describe()}"


@pytest.fixture(scope="session")
def native_harness() -> Iterator[Harness]:
    with Harness.embedded("native") as harness:
        yield harness


@pytest.fixture(scope="session")
def legacy_harness() -> Iterator[Harness]:
    with Harness.embedded("legacy") as harness:
        yield harness


@pytest.fixture(scope="session")
def slow_wait_harness() -> Iterator[Harness]:
    with Harness.embedded("slow", verify_mode="wait") as harness:
        yield harness


@pytest.fixture(scope="session")
def slow_replay_harness() -> Iterator[Harness]:
    with Harness.embedded("slow", verify_mode="replay") as harness:
        yield harness
