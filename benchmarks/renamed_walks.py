"""Random walks of the move table, each taken twice, to hold the abstraction to what names cannot change.

    python benchmarks/renamed_walks.py [--walks 400] [--steps 14] [--depth 4] [--seed 0] [--deployments native,...]

Each walk draws enabled rules and their outcomes from a fresh example's model, once with the rollouts named
`r<seq>` and once with names drawn to sort in no particular order (as the drawn rollout IDs do). Printed per
deployment: the walks whose two models' abstract states parted (a rule that picks by name, or an abstraction that
names by it), and the transitions taken from a state the explorer expanded that it did not predict (what a run's
transition coverage would count as unpredicted). Both must be 0; `tests/unit/checker/test_explore.py` holds a few
walks of three deployments to it in every test run. Exits 1 when either is not.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

from ckpt_model.model import contract
from ckpt_model.model.abstract import state_digest
from ckpt_model.model.contract import Model
from ckpt_model.model.spec import FAULT_FREE, DeploymentSpec
from ckpt_model.search.explore import explore, start_model
from ckpt_model.steps.checkable import Capabilities
from ckpt_model.steps.steplog import gates
from ckpt_model.trainer.machine import CheckpointMachine
from ckpt_model.trainer.moves import MOVES
from ckpt_model.trainer.stand_in import stand_in

Naming = Callable[[str | None, int], str]
PLAIN_NAMING: Naming = contract.rollout_name


def shuffled_naming(randomness: random.Random) -> Naming:
    """Names that keep the model's number (so they stay apart) but sort by a drawn prefix."""
    drawn: dict[int, str] = {}

    def name(_drawn: str | None, seq: int) -> str:
        return drawn.setdefault(seq, f"{randomness.choice('abxz')}{randomness.randrange(1000)}q{seq}")

    return name


def moved(spec: DeploymentSpec, capabilities: Capabilities, model: Model, rule: str, naming: Naming) -> list[Model]:
    """Every outcome of `rule` from `model`, its new rollouts named by `naming`."""
    contract.rollout_name = naming
    try:
        return [after for _, after in MOVES[rule](stand_in(capabilities, model, spec.server_workers))]
    finally:
        contract.rollout_name = PLAIN_NAMING


def walk_deployment(spec: DeploymentSpec, walks: int, steps: int, depth: int, seed: int) -> tuple[int, int]:
    """(walks whose namings parted, unpredicted transitions) on `spec`."""
    capabilities = Capabilities.of_look_alike(spec)
    found = explore(spec, depth)
    predicted: dict[tuple[str, str], set[str]] = {}
    for transition in found.transitions:
        predicted.setdefault((transition.source, transition.rule), set()).add(transition.target)
    expanded = {state for state, reached in found.depths.items() if reached < depth}
    rule_gates = gates(CheckpointMachine)
    randomness = random.Random(seed)
    parted = unpredicted = 0
    for _ in range(walks):
        naming = shuffled_naming(randomness)
        plain = renamed = start_model(spec)
        for _ in range(steps):
            machine = stand_in(capabilities, plain, spec.server_workers)
            rules = [rule for rule, gate in rule_gates.items() if gate(machine)]
            if not rules:
                break
            rule = randomness.choice(rules)
            outcomes = moved(spec, capabilities, plain, rule, PLAIN_NAMING)
            renamed_outcomes = moved(spec, capabilities, renamed, rule, naming)
            choice = randomness.randrange(len(outcomes))
            source = state_digest(renamed)
            plain, renamed = outcomes[choice], renamed_outcomes[choice]
            if state_digest(plain) != state_digest(renamed):
                parted += 1
                break
            if source in expanded and state_digest(renamed) not in predicted.get((source, rule), set()):
                unpredicted += 1
    return parted, unpredicted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walks", type=int, default=400)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--depth", type=int, default=4, help="the explored depth unpredicted transitions are judged to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deployments", default="", help="comma-separated labels (default: every fault-free one)")
    args = parser.parse_args()
    chosen = [label for label in args.deployments.split(",") if label]
    specs = [spec for spec in FAULT_FREE if not chosen or spec.label in chosen]
    if chosen and len(specs) != len(chosen):
        parser.error(f"unknown deployment in {chosen}; fault-free ones: {[spec.label for spec in FAULT_FREE]}")
    failed = False
    print(f"{'deployment':40} {'walks':>6} {'parted':>7} {'unpredicted':>12} {'seconds':>8}")
    for spec in specs:
        began = time.monotonic()
        parted, unpredicted = walk_deployment(spec, args.walks, args.steps, args.depth, args.seed)
        failed |= bool(parted or unpredicted)
        seconds = time.monotonic() - began
        print(f"{spec.label:40} {args.walks:>6} {parted:>7} {unpredicted:>12} {seconds:>8.1f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
