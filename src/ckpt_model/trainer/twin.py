"""The twin: the same task and script run once with no checkpoint, crash or fault, the second oracle's baseline (P14).

Every rollout that completes in an example must end with the outcome of an uninterrupted run of its task
(`ckpt_model.model.outcome`). The twin is that run, made on the example's own harness with a fresh rollout ID (`twin`,
which the model never names) and its model calls released as soon as they wait at the backend. It is made once
per harness, per task and script (a restart environment's task is another task), right after the first example's
start, and then the harness starts that example again: the twin's backend calls, ledger and finished episode are
gone before the example's first step, so the model's predictions (the backend's call log, the ledgers, P13's clean
end) never see it. A twin that does not complete with HTTP 200 (a planted fault that breaks every run) judges
nothing: P3 and P4 judge such runs.
"""

from __future__ import annotations

import json
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs
import httpx

from ckpt_model import timing
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import poll
from ckpt_model.model.outcome import Identity, Outcome, ledger_chain, normalised
from ckpt_model.properties.continuation import p3_run_reply_shape
from ckpt_model.protocol.ledger import Manifest
from ckpt_model.trainer.quiescence import SETTLE_TIMEOUT_S

TWIN_ROLLOUT = "twin"
TWIN = Identity(rollout=TWIN_ROLLOUT, attempt=0, key=TWIN_ROLLOUT)
# Per harness, per (restart, task, script): the twin's outcome, or None when it did not complete.
_CACHE: weakref.WeakKeyDictionary[Harness, dict[tuple[bool, str], Outcome | None]] = weakref.WeakKeyDictionary()


@attrs.frozen
class Twins:
    """The uninterrupted outcome of the harness's task, and of its restart environment's task if it has one."""

    episode: Outcome | None
    restart: Outcome | None = None

    def of(self, restart: bool) -> Outcome | None:
        return self.restart if restart else self.episode


def begin_example(harness: Harness) -> Twins:
    """Start the example (`Harness.begin_example`), making the harness's twins first if they are not cached."""
    harness.begin_example()
    kinds = (False, True) if harness.spec.traits.restart_environment else (False,)
    cache = _CACHE.setdefault(harness, {})
    missing = [kind for kind in kinds if _cache_key(harness, kind) not in cache]
    if missing:
        with timing.span("twin"):
            for restart in missing:
                cache[_cache_key(harness, restart)] = run_twin(harness, restart)
            harness.begin_example()
    return Twins(*(cache[_cache_key(harness, kind)] for kind in kinds))


def _cache_key(harness: Harness, restart: bool) -> tuple[bool, str]:
    traits = harness.spec.traits
    task = json.dumps([traits.run_body(TWIN.rollout, TWIN.attempt), traits.script], sort_keys=True)
    return restart, task


def run_twin(harness: Harness, restart: bool, timeout_s: float = SETTLE_TIMEOUT_S) -> Outcome | None:
    """The task's `/run` once, every model call released as it waits; its normalised outcome (None: it did not
    reply 200 within `timeout_s`, or the deployment has no gate to release calls through)."""
    if harness.backend is None:
        return None
    url = harness.restart_run_url if restart else harness.run_url
    body = harness.spec.traits.run_body(TWIN.rollout, TWIN.attempt)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twin")
    try:
        reply = pool.submit(harness.run_http.post, url, json=body)
        if not _released_until_done(harness, reply, timeout_s) or reply.exception() is not None:
            return None
        response = reply.result()
    finally:
        # A `/run` still open ends when the caller's next start kills the servers.
        pool.shutdown(wait=False)
    if response.status_code != httpx.codes.OK:
        return None
    body = response.json()
    if harness.spec.traits.native_run:
        p3_run_reply_shape(TWIN.key, response.status_code, body)
    return Outcome(normalised(body, TWIN), _chain(harness))


def _released_until_done(harness: Harness, reply: Future[httpx.Response], timeout_s: float) -> bool:
    """Release every call of the twin as it waits until its `/run` ends; False if it did not end in time."""
    gate = harness.backend
    assert gate is not None
    deadline = time.monotonic() + timeout_s
    waiting: list[int] = []

    def ready() -> bool:
        waiting[:] = [c["index"] for c in gate.calls() if c.get("capture_key") == TWIN.key and c.get("waiting")]
        return reply.done() or bool(waiting)

    while not reply.done():
        if not poll(ready, max(deadline - time.monotonic(), 0.0)):
            return False
        if waiting and not reply.done():
            gate.release(waiting)
    return True


def _chain(harness: Harness) -> list[dict[str, Any]] | None:
    """With token capture, the twin's ledger chain (what the trainer reads); None without."""
    if not harness.spec.token_capture or harness.backend is None:
        return None
    manifest = harness.ledger.manifest(TWIN.key)
    if not isinstance(manifest, Manifest):
        return None
    return ledger_chain(manifest.rows, harness.backend.staged())
