"""CPU of the fork server and of its children when each start plants other faults, as the planted-fault scenarios do.

    python benchmarks/replant.py [--rounds 40] [--topology native]

One `Stack` is started; then each round plants the next fault of the catalogue, crashes the Gym servers, starts
them again (a new config for every server) and waits until the fork server has forked the next standbys. Printed:
the fork server's own CPU and its reaped children's (user + sys, from /proc) over the rounds, per round, and the
fork server's resident memory every tenth round (a fork copies its page tables, so memory that grows with every
new config makes every later fork dearer). A second pass restarts as often with the same faults, for comparison.
The figures are CPU time (psutil's reading of the kernel's accounting), so they hold on a busy machine better than
wall clock; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # run from a checkout without installing

from fakes.faults import CATALOGUE  # noqa: E402 - after the path set-up above
from fakes.stack.launcher import Stack  # noqa: E402

STANDBYS_TIMEOUT_S = 30.0
MIB = 1024 * 1024


def cpu_seconds(process: psutil.Process) -> tuple[float, float]:
    """(own user + sys, reaped children's user + sys) of a live process."""
    times = process.cpu_times()
    return times.user + times.system, times.children_user + times.children_system


def run_rounds(stack: Stack, faults_per_round: Sequence[tuple[str, ...]], label: str) -> None:
    assert stack.fork_server is not None
    fork_server = psutil.Process(stack.fork_server.pid)
    own_before, children_before = cpu_seconds(fork_server)
    memory = []
    for index, faults in enumerate(faults_per_round, 1):
        stack.plant_faults(faults)
        stack.crash_gym()
        stack.start_gym()
        stack.fork_server.wait_idle(STANDBYS_TIMEOUT_S)
        if index % 10 == 0:
            memory.append(fork_server.memory_info().rss // MIB)
    own_after, children_after = cpu_seconds(fork_server)
    rounds = len(faults_per_round)
    own, children = own_after - own_before, children_after - children_before
    print(
        f"{label:<12} {rounds} rounds: fork server {own:.2f} s ({own / rounds * 1000:.0f} ms/round), "
        f"children {children:.2f} s ({children / rounds * 1000:.0f} ms/round); fork server MiB every 10: {memory}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--topology", default="native")
    options = parser.parse_args()
    faults = [fault.name for fault in CATALOGUE]
    replants = [(faults[index % len(faults)],) for index in range(options.rounds)]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-bench-replant-") as root,
        Stack(options.topology, Path(root)) as stack,
    ):
        stack.start_backend()
        stack.start_gym()
        run_rounds(stack, replants, "new faults")
        run_rounds(stack, [replants[-1]] * options.rounds, "same faults")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
