"""The Hypothesis settings profiles, registered once, here.

Hypothesis loads a built-in profile named `ci` by itself whenever a CI environment variable is set (CI sets
`CI=true`): derandomized, no example database. Our `ci` profile (the nightly deep search) replaces that
definition, and `load()` always loads a profile explicitly, `default` unless `HYPOTHESIS_PROFILE` names another.

Which run gets what:

    run                                   profile   exploration                         example database
    developer (`CI` unset, empty, 0, ...)  default   random                              .hypothesis/examples
    pull request (`CI=true`)              default   derandomized: same commit, same     none
                                                    examples, same verdict
    nightly (`HYPOTHESIS_PROFILE=ci`)     ci        random, deep                        .hypothesis/examples (kept)
    `HYPOTHESIS_PROFILE=debug`            debug     random, one verbose example         .hypothesis/examples

With `CKPT_MODEL_REDIS_URL` set (`redis://host:port/db`, `unix:///path`), every profile that keeps a database keeps
it in that Redis server instead (`hypothesis.extra.redis.RedisExampleDatabase`), so pytest-xdist workers, HypoFuzz
workers and `ckpt-model check` on many machines share one database (docs/parallel.md). The pull-request run keeps
none, Redis or not: its verdict depends on the commit only.

The CI rule (`in_ci`): the `CI` environment variable, stripped and lower-cased, is anything but "", "0", "false",
"no" or "off". Only `CI` counts (every CI service we run on sets it); Hypothesis's own wider test (any value of
`CI`, or `GITHUB_ACTIONS`, `TF_BUILD`, ...) does not matter here because we never let its `ci` profile stand.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

PROFILE_ENV = "HYPOTHESIS_PROFILE"
CI_ENV = "CI"
REDIS_ENV = "CKPT_MODEL_REDIS_URL"
CI_OFF_VALUES = frozenset({"", "0", "false", "no", "off"})
DATABASE_DIR = ".hypothesis/examples"
SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# No `explain` phase: it re-runs the shrunk example many times over (each run starts processes) to print which
# lines only failing runs reached, which our own failure report already says more plainly. No `target` phase: its
# hill-climb spends a third of a short search on near-copies of one example, and left more goals and rules never
# reached (docs/how-it-works.md, "Aiming").
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)

# Shared by every profile: examples start processes, so no deadline and no speed health checks. The database and
# derandomize are explicit because a settings object inherits the profile in force when it is built, and under
# CI=true that is Hypothesis's own `ci` (no database, derandomized), already loaded when hypothesis is imported.
BASE = settings(
    deadline=None,
    phases=PHASES,
    suppress_health_check=SLOW_CHECKS,
    print_blob=True,
    derandomize=False,
    database=DirectoryBasedExampleDatabase(DATABASE_DIR),
)
# Each example starts real processes, so a few examples of a dozen steps keep the default run to a few minutes.
DEFAULT = settings(BASE, max_examples=8, stateful_step_count=14)
# The pull-request run: the same examples on every run of a commit, and no database, so a verdict depends on the
# commit only (a database would replay whatever failed on that machine before).
DEFAULT_UNDER_CI = settings(DEFAULT, derandomize=True, database=None)
CI = settings(BASE, max_examples=200, stateful_step_count=40)
DEBUG = settings(BASE, max_examples=1, stateful_step_count=14, verbosity=Verbosity.verbose)
PROFILES = {"default": DEFAULT, "ci": CI, "debug": DEBUG}

_loaded: str | None = None


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run is a CI run: `CI` is set to anything but "", "0", "false", "no" or "off" (any case)."""
    return environ.get(CI_ENV, "").strip().lower() not in CI_OFF_VALUES


def chosen_name(environ: Mapping[str, str] = os.environ) -> str:
    """The profile `HYPOTHESIS_PROFILE` names, `default` if unset or empty; an unknown name ends the run."""
    name = environ.get(PROFILE_ENV) or "default"
    if name not in PROFILES:
        raise SystemExit(
            f"{PROFILE_ENV} must be one of {sorted(PROFILES)} (got {name!r}); unset it for the default run"
        )
    return name


def profile_for(name: str, ci: bool, environ: Mapping[str, str] = os.environ) -> settings:
    """The settings of profile `name`; under CI the `default` profile is derandomized and has no database.

    A profile that keeps a database keeps it in the Redis server `CKPT_MODEL_REDIS_URL` names, if it names one."""
    chosen = DEFAULT_UNDER_CI if name == "default" and ci else PROFILES[name]
    url = redis_url(environ)
    if chosen.database is None or url is None:
        return chosen
    return settings(chosen, database=redis_database(url))


def redis_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """The shared database's URL, `CKPT_MODEL_REDIS_URL`; None if unset or empty."""
    return environ.get(REDIS_ENV, "").strip() or None


@functools.cache
def redis_database(url: str) -> ExampleDatabase:
    """The Redis example database at `url`, one object per URL and process (HypoFuzz fuzzes only the tests whose
    database equals the default profile's); a server that does not answer ends the run with what to do."""
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as error:
        raise SystemExit(f"{REDIS_ENV} needs the Redis client: pip install -e '.[fuzz]' ({error})") from error
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as error:
        raise SystemExit(
            f"{REDIS_ENV} must name a Redis server that answers (got {url!r}: {error}); start one "
            "(`python -m ckpt_model.search.fuzz redis`) or unset it for the local database"
        ) from error
    return RedisExampleDatabase(client)


def register(environ: Mapping[str, str] = os.environ) -> None:
    ci = in_ci(environ)
    for name in PROFILES:
        settings.register_profile(name, profile_for(name, ci, environ))


def load() -> str:
    """Register our profiles and load the chosen one explicitly (`HYPOTHESIS_PROFILE`, else `default`).

    Returns its name; `describe()` says how it explores."""
    global _loaded
    name = chosen_name()
    register()
    settings.load_profile(name)
    _loaded = name
    return name


def describe() -> str:
    """The loaded profile and how it explores, for a report header.

    For example "default (derandomized: CI, no example database)",
    "ci (random, example database .hypothesis/examples)" or "ci (random, example database Redis 127.0.0.1:6379/0)".
    The name is the one `load()` loaded; exploration and database are read from the settings in force."""
    current = settings.default
    assert current is not None, "Hypothesis always has a profile in force"
    name = _loaded if _loaded is not None else "(not loaded: Hypothesis's own)"
    if current.derandomize:
        reason = f": {CI_ENV}" if _loaded == "default" and in_ci() else ""
        exploration = f"derandomized{reason}"
    else:
        exploration = "random"
    return f"{name} ({exploration}, {database_label(current.database)})"


def database_label(database: ExampleDatabase | None) -> str:
    """Where examples are kept, for a header: "example database .hypothesis/examples", "example database Redis
    127.0.0.1:6379/0" or "no example database"."""
    if database is None:
        return "no example database"
    client = getattr(database, "redis", None)
    if client is None:
        return f"example database {getattr(database, 'path', database)}"
    where = client.connection_pool.connection_kwargs
    address = where.get("path") or f"{where.get('host')}:{where.get('port')}/{where.get('db', 0)}"
    return f"example database Redis {address}"
