"""Where an example's time goes: the default profile per topology against the fault-free stack, broken down.

    python benchmarks/example_profile.py [--examples 8] [--deployments native,slow/replay,counter+capture]
                                         [--seed 1 | --derandomize]

For each deployment (by label; default: every fault-free one, `ckpt_model.model.spec.FAULT_FREE`) it runs the default
profile's machine (`--examples` examples, explored randomly from `--seed`, so two runs of one commit, or of two
commits with the same rules, play the same examples; Hypothesis's derandomized draws start with the shortest
examples, most of them empty) with a `ckpt_model.timing.Timings` collector active, and prints seconds per
example (median, p90; from the start of an example's fresh processes to the end of its teardown), milliseconds
per step, and the parts: starts and restarts
(`begin_example`, `crash`, `crash_participant`, each split into kill, start and discovery), control calls and
probes, settling (its polls, and how much of it was sleeping), checkpoint fingerprints (at commit, and the P9
re-reads after every step), releases, the `/run` pool, and the teardown drain (whose own parts are listed under
it). `other` is the examples' time outside every marked part: Hypothesis, the model, the checks. `/run`s run on
the pool's threads, overlapping all of this, so their time is listed apart. Steps count rules as
`benchmarks/checker.py` does (nested parts of `checkpoint` and `recover` each count, the drain's too).

The figures are wall clock on a shared machine; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # run from a checkout without installing

from ckpt_model import timing  # noqa: E402 - after the path set-up above
from ckpt_model.deployments.harness import Harness  # noqa: E402
from ckpt_model.interrupts import sigterm_unwinds  # noqa: E402
from ckpt_model.model.spec import FAULT_FREE  # noqa: E402
from ckpt_model.results.stats import SearchStats  # noqa: E402
from ckpt_model.search import profiles  # noqa: E402
from ckpt_model.search.checking import seeded  # noqa: E402
from ckpt_model.trainer.machine import machine_for  # noqa: E402

DEPLOYMENTS = {spec.label: spec for spec in FAULT_FREE}
# Counts per step worth reading next to the times.
COUNTS = ("settle.polls",)


@attrs.define
class ExampleClock(SearchStats):
    """`SearchStats` that times each example from before its fresh processes start to the end of its teardown.

    (The machine's own clock starts once its processes serve; here the start is part of the example.)"""

    example_seconds: list[float] = attrs.field(factory=list)
    _started_at_s: float = 0.0

    def example_started(self) -> None:
        super().example_started()
        self._started_at_s = time.perf_counter()

    def example_finished(self, steps: int, crashes: int, seconds: float, crashes_inside: int = 0) -> None:
        super().example_finished(steps, crashes, seconds, crashes_inside)
        self.example_seconds.append(time.perf_counter() - self._started_at_s)


@attrs.frozen
class Profile:
    label: str
    steps: tuple[int, ...]
    example_s: tuple[float, ...]
    wall_s: float
    seconds: Mapping[str, float]
    spans: Mapping[str, int]
    counts: Mapping[str, int]


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was measured, with no interpolation."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def measure(label: str, examples: int, seed: int | None) -> Profile:
    """`seed` None: derandomized."""
    chosen = settings(profiles.DEFAULT, max_examples=examples, derandomize=seed is None, database=None)
    clock = ExampleClock()
    timings = timing.Timings()
    with Harness.embedded(DEPLOYMENTS[label]) as harness:
        # The fork server's warm-up (seconds, once per deployment) belongs to no example.
        harness.begin_example()
        started_s = time.perf_counter()
        factory = machine_for(harness, clock)
        with timing.collecting(timings):
            run_state_machine_as_test(factory if seed is None else seeded(factory, seed), settings=chosen)
        wall_s = time.perf_counter() - started_s
    recorded = timings.snapshot()
    return Profile(
        label=label,
        steps=tuple(example.steps for example in clock.finished),
        example_s=tuple(clock.example_seconds),
        wall_s=wall_s,
        seconds=recorded["seconds"],
        spans=recorded["spans"],
        counts=recorded["counts"],
    )


def report(profile: Profile) -> str:
    runs = len(profile.example_s)
    examples_s = sum(profile.example_s)
    steps = sum(profile.steps)
    median_s = statistics.median(profile.example_s)
    lines = [
        f"{profile.label}: {runs} machine runs, steps/example median {statistics.median(profile.steps):.1f}"
        f" mean {statistics.mean(profile.steps):.1f};"
        f" s/example median {median_s:.3f} p90 {percentile(profile.example_s, 0.9):.3f};"
        f" ms/step {1000 * examples_s / max(steps, 1):.1f} (all time / all steps),"
        f" {1000 * median_s / max(statistics.median(profile.steps), 1):.1f} (median s / median steps);"
        f" wall {profile.wall_s:.1f} s",
        f"  {'part':<34} {'ms/example':>10} {'share':>6} {'ms each':>8} {'count':>6}",
    ]
    top = {path: s for path, s in profile.seconds.items() if "/" not in path}
    marked_s = sum(top.values())
    for path in sorted(profile.seconds, key=lambda p: _sort_key(p, profile.seconds)):
        if path.startswith(timing.BACKGROUND):
            continue
        lines.append(_row(path, profile, runs, examples_s))
    lines.append(
        f"  {'other (Hypothesis, model, checks)':<34} {1000 * (examples_s - marked_s) / runs:>10.1f}"
        f" {(examples_s - marked_s) / examples_s:>6.0%}"
    )
    for path in sorted(p for p in profile.seconds if p.startswith(timing.BACKGROUND)):
        lines.append(_row(path, profile, runs, examples_s) + "  (threads, overlapping)")
    for name in COUNTS:
        found = profile.counts.get(name, 0)
        lines.append(f"  {name}: {found / runs:.1f} per example, {found / max(steps, 1):.2f} per step")
    return "\n".join(lines)


def _row(path: str, profile: Profile, runs: int, examples_s: float) -> str:
    depth = path.count("/")
    name = "  " * depth + path.rsplit("/", 1)[-1]
    seconds = profile.seconds[path]
    spans = profile.spans[path]
    return (
        f"  {name:<34} {1000 * seconds / runs:>10.1f} {seconds / examples_s:>6.0%}"
        f" {1000 * seconds / spans:>8.2f} {spans:>6}"
    )


def _sort_key(path: str, seconds: Mapping[str, float]) -> tuple[tuple[float, str], ...]:
    """Depth first, each level by time spent, largest first."""
    parts = path.split("/")
    return tuple((-seconds.get("/".join(parts[: i + 1]), 0.0), parts[i]) for i in range(len(parts)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=profiles.DEFAULT.max_examples, help="per deployment")
    parser.add_argument(
        "--deployments", default=",".join(DEPLOYMENTS), help="comma-separated: " + ", ".join(DEPLOYMENTS)
    )
    parser.add_argument("--seed", type=int, default=1, help="random exploration from this seed (default 1)")
    parser.add_argument("--derandomize", action="store_true", help="Hypothesis's derandomized draws instead")
    args = parser.parse_args(argv)
    labels = [label for label in args.deployments.split(",") if label]
    unknown = sorted(set(labels) - set(DEPLOYMENTS))
    if unknown or args.examples < 1:
        parser.error(f"'--deployments' must be among {list(DEPLOYMENTS)} (got {unknown}); examples >= 1")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    for label in labels:
        print(report(measure(label, args.examples, None if args.derandomize else args.seed)), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    with sigterm_unwinds():  # SIGTERM stops what the run started, as Ctrl-C does
        raise SystemExit(main())
