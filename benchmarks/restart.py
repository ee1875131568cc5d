"""Crash-to-serving time of the Gym servers, cold start against the fork server (SPEC section 9).

    python benchmarks/restart.py --rounds 20 [--topology native] [--paths cold,fork,fork-b2b] [--requests 50]

For each path, one `Stack` (backend plus the four Gym servers) is started, then each round times `crash_gym()`,
`start_gym()` and the wait until every participant answers `GET /ng-control/v1/checkpoint/status` with 200.
After each restart (cold and fork paths, once the fork server is idle again) it also times `--requests` status
requests on one kept-alive client: a median near a millisecond shows there is no ~44 ms Nagle stall (SPEC 11).

Paths: `cold` starts each server with `python -m fakes.gym.serve`; `fork` starts them from the fork server's
standbys and, between rounds, waits until the next standbys are built, as when an example runs between two
restarts; `fork-b2b` restarts back to back, so each restart competes with the standbys the previous one asked
for, or forks its servers itself.

`harness` is the checker's own path, `ckpt_model.deployments.harness.Harness.crash()`: crash, start, and every
participant serving and known to the client (what the machine's `crash` rule waits for), with standbys built between
rounds as on `fork`; its second column adds the first status round the machine sends after it (`status_all`).
`harness-begin` is `Harness.begin_example()`, the start of every example: the same, plus the backend's reset and
a fresh checkpoint directory. The figures are wall clock on a shared machine: the load average is printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # run from a checkout without installing

from ckpt_model.deployments.harness import Harness  # noqa: E402 - after the path set-up above
from ckpt_model.interrupts import sigterm_unwinds  # noqa: E402
from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX  # noqa: E402
from fakes.deployment import EmbeddedDeployment  # noqa: E402
from fakes.stack.launcher import Stack  # noqa: E402

SERVING_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.001
PATHS = ("cold", "fork", "fork-b2b", "harness", "harness-begin")
HARNESS_PATHS = ("harness", "harness-begin")


@attrs.frozen
class PathResult:
    """One path's samples, in milliseconds."""

    path: str
    restart_ms: tuple[float, ...]
    crash_ms: tuple[float, ...]
    round_trip_ms: tuple[float, ...]


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was measured, with no interpolation."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def wait_participants_serving(http: httpx.Client, urls: Sequence[str], token: str) -> None:
    """Poll every participant's status route until each answers 200."""
    headers = {"Authorization": f"Bearer {token}"}
    deadline_s = time.monotonic() + SERVING_TIMEOUT_S
    pending = list(urls)
    while pending:
        try:
            if http.get(pending[0] + CHECKPOINT_ROUTE_PREFIX + "/status", headers=headers).status_code == 200:
                pending.pop(0)
                continue
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline_s:
            raise TimeoutError(f"{pending[0]} did not answer status 200 within {SERVING_TIMEOUT_S:.0f} s")
        time.sleep(POLL_INTERVAL_S)


def round_trips_ms(http: httpx.Client, urls: Sequence[str], token: str, requests: int) -> list[float]:
    """Status requests spread over the participants, on connections kept alive by `http`."""
    headers = {"Authorization": f"Bearer {token}"}
    samples = []
    for index in range(requests):
        started_s = time.perf_counter()
        http.get(urls[index % len(urls)] + CHECKPOINT_ROUTE_PREFIX + "/status", headers=headers).raise_for_status()
        samples.append((time.perf_counter() - started_s) * 1000)
    return samples


def measure_harness(path: str, topology: str, rounds: int) -> PathResult:
    """The checker's restart (`Harness.crash()`) or example start (`begin_example()`), then one status round.

    `crash_ms` holds the time until the first status round has answered too."""
    restart_ms: list[float] = []
    serving_ms: list[float] = []
    with Harness.embedded(topology) as harness:
        deployment = harness.deployment
        assert isinstance(deployment, EmbeddedDeployment), "the harness paths measure the look-alike stack"
        fork_server = deployment.stack.fork_server
        assert fork_server is not None
        harness.begin_example()
        restart = harness.crash if path == "harness" else harness.begin_example
        for _ in range(rounds):
            fork_server.wait_idle()
            started_s = time.perf_counter()
            restart()
            restarted_s = time.perf_counter()
            assert harness.control is not None
            harness.control.status_all()
            serving_s = time.perf_counter()
            restart_ms.append((restarted_s - started_s) * 1000)
            serving_ms.append((serving_s - started_s) * 1000)
    return PathResult(path, tuple(restart_ms), tuple(serving_ms), ())


def measure(path: str, topology: str, rounds: int, requests: int, root: Path) -> PathResult:
    if path in HARNESS_PATHS:
        return measure_harness(path, topology, rounds)
    restart_ms: list[float] = []
    crash_ms: list[float] = []
    round_trip_ms: list[float] = []
    # One client for the whole run: building one costs ~42 ms, and a kept-alive connection is what is measured.
    stack = Stack(topology, root / path, fork_server=path != "cold")
    with stack, httpx.Client(trust_env=False) as http:
        stack.start_backend()
        stack.start_gym()
        urls = [server.url for server in stack.gym.values() if server.kind is not None]
        for _ in range(rounds):
            if path == "fork":
                assert stack.fork_server is not None
                stack.fork_server.wait_idle()
            started_s = time.perf_counter()
            stack.crash_gym()
            crashed_s = time.perf_counter()
            stack.start_gym()
            wait_participants_serving(http, urls, stack.token)
            serving_s = time.perf_counter()
            crash_ms.append((crashed_s - started_s) * 1000)
            restart_ms.append((serving_s - started_s) * 1000)
            if path == "fork-b2b":
                continue
            if stack.fork_server is not None:
                # The servers' round trip, not the CPU the next start's standbys spend building their apps meanwhile.
                stack.fork_server.wait_idle()
            round_trip_ms.extend(round_trips_ms(http, urls, stack.token, requests))
    return PathResult(path, tuple(restart_ms), tuple(crash_ms), tuple(round_trip_ms))


def report(results: Sequence[PathResult], topology: str, rounds: int, requests: int) -> str:
    load_1m, _, _ = os.getloadavg()
    lines = [
        f"restart (stack paths: crash_gym() -> every participant answers status 200); {topology}, {rounds} rounds, "
        f"{os.cpu_count()} CPUs, load average {load_1m:.2f} at the end",
        f"{'path':<13} {'median_ms':>10} {'p90_ms':>8} {'min_ms':>8} {'crash_median_ms':>16}"
        f" {'+status_median_ms':>18} {'+status_p90_ms':>15}",
    ]
    for result in results:
        line = (
            f"{result.path:<13} {statistics.median(result.restart_ms):>10.1f}"
            f" {percentile(result.restart_ms, 0.9):>8.1f} {min(result.restart_ms):>8.1f}"
        )
        if result.path in HARNESS_PATHS:
            # `crash_ms` of a harness path: until the first status round answered as well.
            line += f" {'-':>16} {statistics.median(result.crash_ms):>18.1f} {percentile(result.crash_ms, 0.9):>15.1f}"
        else:
            line += f" {statistics.median(result.crash_ms):>16.1f}"
        lines.append(line)
    by_path = {result.path: result for result in results}
    for fork_path in ("fork", "fork-b2b"):
        if {"cold", fork_path} <= by_path.keys():
            ratio = statistics.median(by_path["cold"].restart_ms) / statistics.median(by_path[fork_path].restart_ms)
            lines.append(f"ratio cold/{fork_path} (medians): {ratio:.1f}x")
    lines.append(f"round trip after restart: {requests} status requests per round on one kept-alive client")
    lines.append(f"{'path':<13} {'median_ms':>10} {'p99_ms':>8} {'max_ms':>8}")
    for result in results:
        samples = result.round_trip_ms
        if not samples:
            continue  # fork-b2b: measuring would let the fork server go idle between restarts; harness: not measured
        lines.append(
            f"{result.path:<13} {statistics.median(samples):>10.2f} {percentile(samples, 0.99):>8.2f}"
            f" {max(samples):>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--topology", choices=("native", "legacy"), default="native")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: " + ", ".join(PATHS))
    parser.add_argument("--requests", type=int, default=50, help="status requests per round for the round trip")
    args = parser.parse_args(argv)
    paths = [path for path in args.paths.split(",") if path]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or args.rounds < 1 or args.requests < 1:
        parser.error(f"'--paths' must be among {PATHS} (got {unknown}); rounds and requests must be >= 1")
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-restart-") as root:
        results = [measure(path, args.topology, args.rounds, args.requests, Path(root)) for path in paths]
    print(report(results, args.topology, args.rounds, args.requests))
    return 0


if __name__ == "__main__":
    with sigterm_unwinds():  # SIGTERM stops what the run started, as Ctrl-C does
        raise SystemExit(main())
