"""Our profile is the one in force, whatever CI says (Hypothesis would otherwise auto-load its own `ci`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckpt_model import profiles

SHOW = (
    "from ckpt_model import profiles; name = profiles.load(); from hypothesis import settings; "
    "s = settings.default; print(name, s.max_examples, s.stateful_step_count, s.database is not None, s.derandomize)"
)


def active(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", profiles.PROFILE_ENV)} | env
    done = subprocess.run([sys.executable, "-c", SHOW], env=environment, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_default_profile_is_loaded_under_ci_true() -> None:
    assert active(CI="true") == "default 8 14 True False"


def test_the_default_profile_is_loaded_without_ci() -> None:
    assert active() == "default 8 14 True False"


def test_our_ci_profile_is_the_nightly_one() -> None:
    assert active(CI="true", HYPOTHESIS_PROFILE="ci") == "ci 200 40 True False"


def test_an_unknown_profile_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(profiles.PROFILE_ENV, "fast")
    with pytest.raises(SystemExit, match="HYPOTHESIS_PROFILE must be one of"):
        profiles.load()
