"""Scale mode, Gym's scenario 13: thousands of rollouts checkpointed, crashed, restored and continued.

    python benchmarks/scale.py --rollouts 16000 [--finished-share 0.125]   # default 0: every rollout in flight
    python benchmarks/scale.py --pool 4000

With `--pool N`, it instead measures one hop of the stack on its own: the CPU a client spends to put N requests in
flight at a gated fake backend and to get them back, with the servers' peer client
(`fakes.gym.protocol.http.new_client`) and with an httpx client on httpx's own connection pool, which scans every
connection whenever a request starts or ends (quadratic in the requests in flight).

Runs `ckpt_model.modes.scale.run_scale` on the look-alike stack (native topology) and prints each stage as it ends,
then the stage table (dispatch, prepare, commit, crash, restore, resume, replacement), the records each
participant wrote and the contract verdicts. Exit status 0 when every verdict holds, 1 on a violated property,
2 when the run could not be judged (a harness error). The figures are wall clock on a shared machine: the load
average is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # run from a checkout without installing

from ckpt_model.errors import HarnessError, PropertyViolation  # noqa: E402 - after the path set-up above
from ckpt_model.interrupts import sigterm_unwinds  # noqa: E402
from ckpt_model.modes.scale import FINISHED_SHARE, raise_fd_limit, run_scale  # noqa: E402
from fakes.gym.protocol.http import new_client  # noqa: E402
from fakes.processes.ports import free_port  # noqa: E402

BACKEND_START_TIMEOUT_S = 30.0
CALLS_TIMEOUT_S = 600.0
POLL_S = 0.05


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


async def one_hop(backend_url: str, client: httpx.AsyncClient, requests: int) -> tuple[float, float]:
    """CPU seconds to put `requests` chat calls in flight at the gated backend, then to get every reply."""
    async with httpx.AsyncClient(trust_env=False) as control:
        await control.post(backend_url + "/_ctl/reset", json={})
        await control.post(backend_url + "/_ctl/gate", json={})
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        started_s = time.process_time()
        url = backend_url + "/v1/chat/completions"
        calls = [asyncio.ensure_future(client.post(url, json=body)) for _ in range(requests)]
        await wait_for_calls(control, backend_url, requests)
        in_flight_s = time.process_time()
        await control.post(backend_url + "/_ctl/release", json={})
        replies = await asyncio.gather(*calls)
        back_s = time.process_time()
    if any(reply.status_code != 200 for reply in replies):
        raise RuntimeError("a call through the pool failed")
    return in_flight_s - started_s, back_s - in_flight_s


async def wait_for_calls(control: httpx.AsyncClient, backend_url: str, count: int) -> None:
    """Poll the backend's call list until it holds `count` calls."""
    deadline = time.monotonic() + CALLS_TIMEOUT_S
    while True:
        if (await control.get(backend_url + "/_ctl/calls", params={"since": count - 1})).json():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the backend did not see {count} calls within {CALLS_TIMEOUT_S:g} s")
        await asyncio.sleep(POLL_S)


async def compare_pools(backend_url: str, requests: int) -> None:
    async with httpx.AsyncClient(trust_env=False) as probe:
        deadline = time.monotonic() + BACKEND_START_TIMEOUT_S
        while True:
            try:
                await probe.get(backend_url + "/v1/models")
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(POLL_S)
    clients = {
        "fakes peer client": new_client(),
        "httpx pool": httpx.AsyncClient(
            timeout=httpx.Timeout(600.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            trust_env=False,
        ),
    }
    for name, client in clients.items():
        async with client:
            in_flight_s, back_s = await one_hop(backend_url, client, requests)
        print(f"{name:<18} {requests} requests: in flight {in_flight_s:.2f} cpu s, back {back_s:.2f} cpu s", flush=True)


def pool_benchmark(requests: int) -> int:
    raise_fd_limit()
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, "-m", "fakes.backend", "--port", str(port), "--exit-with-stdin"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        print(f"one hop, {requests} requests in flight; {load()}", flush=True)
        asyncio.run(compare_pools(f"http://127.0.0.1:{port}", requests))
        print(load())
    finally:
        backend.terminate()
        backend.wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/scale.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts to dispatch (default 2000)")
    parser.add_argument(
        "--finished-share",
        type=float,
        default=FINISHED_SHARE,
        help=f"share finished before the checkpoint (default {FINISHED_SHARE}; more when file descriptors cap "
        "what can be in flight)",
    )
    parser.add_argument("--pool", type=int, metavar="N", help="compare the peer client and httpx's pool at N requests")
    args = parser.parse_args(argv)
    if args.pool:
        return pool_benchmark(args.pool)
    started = time.perf_counter()
    print(f"scale run of {args.rollouts} rollouts; {load()}", flush=True)

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - started:8.2f} s] {line}", flush=True)

    try:
        result = run_scale(args.rollouts, finished_share=args.finished_share, progress=progress)
    except PropertyViolation as violation:
        print(f"VIOLATION\n{violation}", flush=True)
        return 1
    except HarnessError as error:
        print(f"UNKNOWN (the run could not be judged)\n{error}", flush=True)
        return 2
    print(result.table())
    print(load())
    return 0


if __name__ == "__main__":
    with sigterm_unwinds():  # SIGTERM stops what the run started, as Ctrl-C does
        sys.exit(main())
