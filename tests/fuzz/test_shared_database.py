"""`CKPT_MODEL_REDIS_URL` points every profile that keeps a database at one Redis server, and the throwaway server
the tests (and `python -m ckpt_model.search.fuzz redis`) start leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import redis

from ckpt_model.search import profiles
from ckpt_model.search.fuzz import redis_server
from tests.fuzz.conftest import require_redis_server

SHOW = "from ckpt_model.search import profiles; profiles.load(); print(profiles.describe())"


def described(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", profiles.PROFILE_ENV)} | env
    done = subprocess.run([sys.executable, "-c", SHOW], env=environment, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_every_profile_with_a_database_keeps_it_in_redis(redis_url: str) -> None:
    address = redis_url.removeprefix("redis://")
    assert described(CKPT_MODEL_REDIS_URL=redis_url) == f"default (random, example database Redis {address})"
    assert described(CKPT_MODEL_REDIS_URL=redis_url, CI="true", HYPOTHESIS_PROFILE="ci") == (
        f"ci (random, example database Redis {address})"
    )
    assert described(CKPT_MODEL_REDIS_URL=redis_url, CI="true") == "default (derandomized: CI, no example database)"


def test_examples_saved_through_one_process_are_read_by_another(redis_url: str) -> None:
    database = profiles.redis_database(redis_url)
    database.save(b"key", b"example")
    code = (
        "import sys; from ckpt_model.search import profiles; "
        "print(list(profiles.redis_database(sys.argv[1]).fetch(b'key')))"
    )
    done = subprocess.run([sys.executable, "-c", code, redis_url], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[b'example']"


def test_the_redis_server_is_gone_with_its_directory_afterwards() -> None:
    require_redis_server()
    with redis_server() as url:
        client = redis.Redis.from_url(url)
        assert client.ping()
        (server,) = [p for p in psutil.Process().children() if "redis-server" in p.name()]
        directory = Path(client.config_get("dir")["dir"])
        client.close()
        assert directory.is_dir()
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert not directory.exists()
