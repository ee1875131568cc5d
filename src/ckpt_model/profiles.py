"""The Hypothesis settings profiles, registered once, here.

Hypothesis loads a built-in profile named `ci` by itself whenever a CI environment variable is set (CI sets
`CI=true`): derandomized, no example database. Our `ci` profile (the nightly deep search) replaces that
definition, and `load()` always loads a profile explicitly, `default` unless `HYPOTHESIS_PROFILE` names another,
so the default test run is the same fast run on a laptop and in CI.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILE_ENV = "HYPOTHESIS_PROFILE"
SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# No `explain` phase: it re-runs the shrunk example many times over (each run starts processes) to print which
# lines only failing runs reached, which our own failure report already says more plainly.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)

# Shared by every profile: examples start processes, so no deadline and no speed health checks. The database and
# derandomize are explicit because a settings object inherits the profile in force when it is built, and under
# CI=true that is Hypothesis's own `ci` (no database, derandomized), already loaded when hypothesis is imported.
BASE = settings(
    deadline=None,
    phases=PHASES,
    suppress_health_check=SLOW_CHECKS,
    print_blob=True,
    derandomize=False,
    database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
)
# Each example starts real processes, so a few examples of a dozen steps keep the default run to a few minutes.
DEFAULT = settings(BASE, max_examples=8, stateful_step_count=14)
CI = settings(BASE, max_examples=200, stateful_step_count=40)
DEBUG = settings(BASE, max_examples=1, stateful_step_count=14, verbosity=Verbosity.verbose)
PROFILES = {"default": DEFAULT, "ci": CI, "debug": DEBUG}


def register() -> None:
    for name, profile in PROFILES.items():
        settings.register_profile(name, profile)


def load() -> str:
    """Register our profiles and load the chosen one explicitly; return its name."""
    register()
    name = os.environ.get(PROFILE_ENV, "default")
    if name not in PROFILES:
        raise SystemExit(f"{PROFILE_ENV} must be one of {sorted(PROFILES)} (got {name!r})")
    settings.load_profile(name)
    return name
