"""A Redis server of the test's own for the shared-database tests: a free port, its own directory, gone after."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from ckpt_model.search import profiles
from ckpt_model.search.fuzz import redis_server


def require_redis_server() -> None:
    """Without `redis-server` a developer's run skips (pip cannot install it); a CI run goes on and fails, since
    `.ci/run` installs it."""
    if shutil.which("redis-server") is None and not profiles.in_ci():
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A fresh, empty Redis server's URL."""
    require_redis_server()
    with redis_server() as url:
        yield url
