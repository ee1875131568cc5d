"""Our profile is the one in force, whatever CI says, and the pull-request run is derandomized.

`load()` changes Hypothesis's global settings, so each case loads it in a fresh interpreter: nothing leaks into the
rest of the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import Phase

from ckpt_model.search import profiles

SHOW = (
    "from ckpt_model.search import profiles; name = profiles.load(); from hypothesis import settings; "
    "s = settings.default; "
    "print(name, s.max_examples, s.stateful_step_count, s.derandomize, getattr(s.database, 'path', None)); "
    "print(profiles.describe())"
)


def active(**env: str) -> list[str]:
    """The loaded profile (name, examples, steps, derandomize, database path) and its description."""
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", profiles.PROFILE_ENV)} | env
    done = subprocess.run([sys.executable, "-c", SHOW], env=environment, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()


def test_under_ci_true_the_default_profile_is_derandomized_without_a_database() -> None:
    assert active(CI="true") == [
        "default 8 14 True None",
        "default (derandomized: CI, no example database)",
    ]


def test_without_ci_the_default_profile_explores_randomly_with_its_database() -> None:
    assert active() == [
        "default 8 14 False .hypothesis/examples",
        "default (random, example database .hypothesis/examples)",
    ]


@pytest.mark.parametrize("value", ["", "0", "false", "FALSE", "no", " off "])
def test_a_ci_variable_that_says_no_is_a_developer_run(value: str) -> None:
    assert active(CI=value)[0] == "default 8 14 False .hypothesis/examples"


@pytest.mark.parametrize("value", ["true", "1", "yes", "True", "github"])
def test_any_other_ci_value_is_a_ci_run(value: str) -> None:
    assert profiles.in_ci({"CI": value})


def test_no_ci_variable_is_a_developer_run() -> None:
    assert not profiles.in_ci({})


def test_our_ci_profile_is_the_nightly_one_random_with_its_database_under_ci_true() -> None:
    assert active(CI="true", HYPOTHESIS_PROFILE="ci") == [
        "ci 200 40 False .hypothesis/examples",
        "ci (random, example database .hypothesis/examples)",
    ]


def test_the_debug_profile_is_unchanged_under_ci_true() -> None:
    assert active(CI="true", HYPOTHESIS_PROFILE="debug")[0] == "debug 1 14 False .hypothesis/examples"


def test_an_empty_profile_variable_means_the_default_profile() -> None:
    assert active(HYPOTHESIS_PROFILE="")[0] == "default 8 14 False .hypothesis/examples"


def test_an_unknown_profile_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # load() checks the name before it registers or loads anything, so this runs in-process without side effects.
    monkeypatch.setenv(profiles.PROFILE_ENV, "fast")
    with pytest.raises(SystemExit, match=r"HYPOTHESIS_PROFILE must be one of \['ci', 'debug', 'default'\]"):
        profiles.load()


def test_an_unknown_profile_ends_the_run_with_the_message_under_ci_true() -> None:
    environment = {k: v for k, v in os.environ.items() if k != profiles.PROFILE_ENV} | {
        "CI": "true",
        profiles.PROFILE_ENV: "fast",
    }
    done = subprocess.run([sys.executable, "-c", SHOW], env=environment, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "HYPOTHESIS_PROFILE must be one of ['ci', 'debug', 'default'] (got 'fast')" in done.stderr


# --- the shared database: CKPT_MODEL_REDIS_URL --------------------------------------------------------------

CLOSED_PORT_URL = "redis://127.0.0.1:9/0"  # the discard port, never listened on here


def test_the_pull_request_run_keeps_no_database_even_with_a_redis_url() -> None:
    """The URL is not even contacted: the derandomized default under CI has no database to replace."""
    chosen = profiles.profile_for("default", ci=True, environ={profiles.REDIS_ENV: CLOSED_PORT_URL})
    assert chosen.database is None
    assert chosen.derandomize


def test_without_a_redis_url_every_profile_keeps_its_own_database() -> None:
    assert profiles.redis_url({}) is None
    assert profiles.redis_url({profiles.REDIS_ENV: "  "}) is None
    assert profiles.profile_for("ci", ci=True, environ={}) is profiles.CI


def test_a_redis_url_nobody_answers_ends_the_run_saying_what_to_do() -> None:
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", profiles.PROFILE_ENV)} | {
        profiles.REDIS_ENV: CLOSED_PORT_URL
    }
    done = subprocess.run([sys.executable, "-c", SHOW], env=environment, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert f"CKPT_MODEL_REDIS_URL must name a Redis server that answers (got '{CLOSED_PORT_URL}'" in done.stderr


def test_a_redis_database_is_described_by_its_address() -> None:
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase

    database = RedisExampleDatabase(redis.Redis.from_url("redis://127.0.0.1:6390/2"))
    assert profiles.database_label(database) == "example database Redis 127.0.0.1:6390/2"
    assert profiles.database_label(None) == "no example database"


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_no_profile_runs_hypothesis_targeting_phase(name: str) -> None:
    """Its hill-climb on near-copies of one example left more goals and rules unreached (docs/how-it-works.md)."""
    assert Phase.target not in profiles.PROFILES[name].phases
    assert Phase.generate in profiles.PROFILES[name].phases
