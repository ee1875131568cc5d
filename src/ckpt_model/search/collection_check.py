"""`ckpt-model check --controller collection`: the collection machine (`ckpt_model.collection.machine`) run for a
user against the embedded stack's collection program, with the collector's planted faults if asked.

It searches until the first failure and makes it 1-minimal with the domain minimiser
(`ckpt_model.search.collection_search`), then reports the property, the minimal steps and the command that repeats the
search. The trainer's check has more around it (reproduction rates, regression files, `--json`, `--junit`, swarm);
options only it has are usage errors, said before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from hypothesis import settings

from ckpt_model.deployments.catalogue import CollectorFault, UnknownFaults, collection_fault_catalogue, named_in
from ckpt_model.deployments.harness import Harness
from ckpt_model.errors import UsageError
from ckpt_model.model.spec import OPTIONS, DeploymentSpec
from ckpt_model.results.verdicts import Exit, failure_report
from ckpt_model.search.collection_search import search

# Options of the trainer's check that mean nothing to the collection machine.
TRAINER_ONLY = {
    "deployment": "--deployment (a real Gym's deployment file cannot name a collection program yet)",
    "swarm": "--swarm",
    "json": "--json",
    "junit": "--junit",
    "verify_mode": "--verify-mode",
    "keep_artifacts": "--keep-artifacts",
    "weights": "--weights (the collection machine draws as Hypothesis does)",
    "max_time": "--max-time",
}
PROPERTIES = "P22 LATEST, P23 stops and saves, P24 continued, P25 every row once"
# The servers' properties judged on the collection runs' own calls (`ckpt_model.properties.collection_calls`,
# docs/collection.md).
SERVER_PROPERTIES = "P1, P2, P3, P4, P9, P10, P13 and P15 on the runs' own calls"


def collector_faults(text: str) -> tuple[CollectorFault, ...]:
    """The collector faults a comma-separated list names, each once; a usage error naming every known one."""
    try:
        return named_in(text, collection_fault_catalogue())
    except UnknownFaults as error:
        raise UsageError(
            f"--faults: unknown collector fault(s) {', '.join(map(repr, error.unknown))}; the collector's: "
            + ", ".join(error.known)
        ) from None


def checked_options(args: argparse.Namespace) -> tuple[CollectorFault, ...]:
    """The collector faults asked for, once the options are known to suit the collection machine (else a usage
    error naming what does not)."""
    asked = [flag for field, flag in TRAINER_ONLY.items() if getattr(args, field, None) not in (None, False)]
    asked += [option.flag() for option in OPTIONS if getattr(args, option.name, None) not in (None, False)]
    if not args.minimise:
        asked.append("--no-minimise (the collection machine always shrinks with Hypothesis)")
    if asked:
        raise UsageError(f"--controller collection does not take {', '.join(asked)}")
    return collector_faults(args.faults)


def replay_command(topology: str, faults: Sequence[CollectorFault], chosen: settings, seed: int | None) -> str:
    """The command that runs the same search again (the same examples, with the seed or derandomized)."""
    parts = ["ckpt-model check --controller collection", f"--topology {topology}"]
    parts.append(f"--examples {chosen.max_examples} --steps {chosen.stateful_step_count}")
    if faults:
        parts.append("--faults " + ",".join(fault.name for fault in faults))
    if seed is not None:
        parts.append(f"--seed {seed}")
    return " ".join(parts)


def run(topology: str, faults: Sequence[CollectorFault], chosen: settings, seed: int | None) -> int:
    """Search with `chosen` (and `seed`, if any) until the first failure, minimise it; print the banner, then
    PASSED or the failure with its minimal steps and replay command; the exit code."""
    print(
        f"ckpt-model check: the collection controller on the embedded stack's {topology} topology\n"
        f"  collector faults: {', '.join(fault.name for fault in faults) or 'none'}\n"
        f"  examples: {chosen.max_examples}, steps at most {chosen.stateful_step_count}; "
        + ("derandomized" if seed is None else f"seed {seed}")
        + f"\n  properties: {PROPERTIES}; {SERVER_PROPERTIES}",
        flush=True,
    )
    harness = Harness.embedded(DeploymentSpec(topology))
    try:
        finding = search(harness, [fault.name for fault in faults], chosen, seed)
    finally:
        harness.close()
    if finding.error is None:
        print(
            f"PASSED: {finding.examples} examples in {finding.search_s:.1f} s, no collection property violated "
            f"({PROPERTIES}) and no server property ({SERVER_PROPERTIES})",
            flush=True,
        )
        return Exit.PASSED
    code, text = failure_report(finding.violation or finding.error)
    report, _, verdict = text.rpartition("\n")
    print(report.rstrip("\n"), flush=True)
    if finding.minimal is not None:
        minimal = finding.minimal
        print(
            f"\nfound after {finding.examples} examples in {finding.search_s:.1f} s as {len(finding.found)} steps; "
            f"minimised to {len(minimal.steps)} in {finding.minimise_s:.1f} s ({minimal.replayed} candidates "
            f"replayed{'' if minimal.reproduced else '; the minimal steps did NOT fail again'}):",
            flush=True,
        )
        for line in minimal.code:
            print(f"  {line}", flush=True)
    print(verdict, flush=True)
    if code == Exit.VIOLATION:
        print(f"replay: {replay_command(topology, faults, chosen, seed)}", flush=True)
    return code
