"""The default profile idle and beside CPU hogs, paired deployment by deployment (issue 9: at most 2x idle).

    python benchmarks/under_load.py [--hogs 2] [--rounds 3] [--examples 12] [--deployments native,legacy]

Each round runs, for every deployment, the same derandomized examples twice back to back: once on the idle
machine, once beside `--hogs` busy-looping processes (started for that run only, killed after it), in an order that
alternates from round to round so drift in the machine's speed falls on both sides alike. Derandomized, both runs of
a pair draw the same rules, so the ratio compares like with like. Printed per deployment: s/example median and ms
per step of each side (medians over rounds), and the median of the per-round ratios of total time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from checker import ProfileFigures, measure_profile  # benchmarks/checker.py, beside this script
from hypothesis import settings

from ckpt_model.interrupts import sigterm_unwinds
from ckpt_model.model.spec import FAULT_FREE, DeploymentSpec
from ckpt_model.search import profiles

HOG = (sys.executable, "-c", "while True: pass")
RATIO_TARGET = 2.0


@contextmanager
def hogs(count: int) -> Iterator[None]:
    """`count` processes spinning on a core each, for the duration of the block (killed on any exit)."""
    spinning = [subprocess.Popen(HOG, start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
        for process in spinning:
            process.wait()


def pair(
    spec: DeploymentSpec, chosen: settings, hog_count: int, hogs_first: bool
) -> tuple[ProfileFigures, ProfileFigures]:
    """(idle, beside hogs) for one deployment, in the order given."""
    if hogs_first:
        with hogs(hog_count):
            loaded = measure_profile(spec, chosen)
        return measure_profile(spec, chosen), loaded
    idle = measure_profile(spec, chosen)
    with hogs(hog_count):
        return idle, measure_profile(spec, chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=2, help="busy-looping processes beside the loaded run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", type=int, default=12, help="examples per run (derandomized)")
    labels = [spec.label for spec in FAULT_FREE]
    parser.add_argument("--deployments", default=",".join(labels), help="comma-separated: " + ", ".join(labels))
    args = parser.parse_args(argv)
    chosen_labels = [label for label in args.deployments.split(",") if label]
    if set(chosen_labels) - set(labels) or args.rounds < 1 or args.examples < 1 or args.hogs < 1:
        parser.error(f"deployments must be among {labels}; hogs, rounds and examples must be >= 1")
    chosen = settings(profiles.DEFAULT, max_examples=args.examples, derandomize=True, database=None)
    deployments = [spec for spec in FAULT_FREE if spec.label in chosen_labels]
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; {args.hogs} hogs; "
        f"{args.rounds} rounds of {args.examples} derandomized examples per side",
        flush=True,
    )
    print(
        f"{'deployment':<11} {'idle s/ex':>9} {'hogs s/ex':>9} {'idle ms/step':>12} {'hogs ms/step':>12} {'ratio':>6}"
    )
    ratios: list[float] = []
    for spec in deployments:
        idle_runs: list[ProfileFigures] = []
        loaded_runs: list[ProfileFigures] = []
        for round_number in range(args.rounds):
            idle, loaded = pair(spec, chosen, args.hogs, hogs_first=round_number % 2 == 1)
            idle_runs.append(idle)
            loaded_runs.append(loaded)
        ratio = statistics.median(
            sum(loaded.seconds) / sum(idle.seconds) for idle, loaded in zip(idle_runs, loaded_runs, strict=True)
        )
        ratios.append(ratio)
        print(
            f"{spec.label:<11}"
            f" {statistics.median(statistics.median(r.seconds) for r in idle_runs):>9.2f}"
            f" {statistics.median(statistics.median(r.seconds) for r in loaded_runs):>9.2f}"
            f" {statistics.median(r.ms_per_step for r in idle_runs):>12.0f}"
            f" {statistics.median(r.ms_per_step for r in loaded_runs):>12.0f}"
            f" {ratio:>5.2f}x",
            flush=True,
        )
    print(
        f"ratio beside {args.hogs} hogs (median over deployments): {statistics.median(ratios):.2f}x, worst"
        f" {max(ratios):.2f}x (target: at most {RATIO_TARGET:.0f}x); load average {os.getloadavg()[0]:.2f} at the end",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    with sigterm_unwinds():  # SIGTERM stops what the run started, as Ctrl-C does
        raise SystemExit(main())
