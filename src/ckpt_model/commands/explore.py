"""`ckpt-model explore`: the contract model explored breadth first to a depth, its invariants checked on every
state (`ckpt_model.search.explore`); a table per depth, then each invariant broken with its shortest path."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ckpt_model.model.invariants import INVARIANTS
from ckpt_model.results.verdicts import Exit
from ckpt_model.search.explore import Exploration, Level, explore
from ckpt_model.search.targets import chosen_spec


def run_explore(args: argparse.Namespace) -> int:
    """Explore; exit 1 when an invariant of the model breaks, else 0."""
    from ckpt_model.commands.check import outputs_writable, write_output

    outputs_writable({"--json": args.json})
    spec = chosen_spec(args, ())
    limit = None if args.max_time is None else max(args.max_time - (time.monotonic() - args.started_s), 0.0)
    print(
        f"exploring the contract model of {spec.label}: to depth {args.depth}, at most {args.rollouts} rollouts "
        f"live, the look-alike stack's rules"
        + (f", for at most {args.max_time:g} s" if args.max_time is not None else ""),
        flush=True,
    )
    print(f"  {'depth':>5}  {'new states':>10}  {'transitions':>11}  {'seconds':>8}", flush=True)

    def printed(level: Level) -> None:
        print(f"  {level.depth:>5}  {level.states:>10}  {level.transitions:>11}  {level.seconds:>8.1f}", flush=True)

    found = explore(spec, args.depth, rollouts_max=args.rollouts, time_limit_s=limit, on_level=printed)
    print(summary(found))
    if args.json is not None:
        write_output(args.json, json.dumps(document(found), indent=2) + "\n")
    return Exit.VIOLATION if found.violations else Exit.PASSED


def summary(found: Exploration) -> str:
    """The totals, how far the exploration went, and each invariant: held, or broken with its shortest path."""
    reach = (
        f"stopped by the time limit inside depth {len(found.levels)}"
        if found.timed_out
        else f"every state within depth {found.depth}"
        if found.bounded
        else f"the whole state space (no new state after depth {len(found.levels) - 1})"
    )
    lines = [
        f"{found.states} states, {len(found.transitions)} transitions in {found.seconds:.1f} s: {reach}",
        f"invariants checked on every state ({len(found.invariants)}): {', '.join(found.invariants)}",
    ]
    if found.rules_without_a_move:
        lines.append(f"rules not explored (no model transition): {', '.join(found.rules_without_a_move)}")
    if not found.violations:
        lines.append("PASSED: every invariant held on every state reached")
        return "\n".join(lines)
    lines.append(f"FAILED: {len(found.violations)} invariant(s) broken")
    lines += [violation.words() for violation in found.violations]
    return "\n".join(lines)


def document(found: Exploration) -> dict[str, Any]:
    """The `--json` document: the levels, the totals, and every violation with its path of rule calls."""
    return {
        "deployment": found.label,
        "depth": found.depth,
        "states": found.states,
        "transitions": len(found.transitions),
        "seconds": round(found.seconds, 3),
        "timed_out": found.timed_out,
        "complete": not found.bounded and not found.timed_out,
        "levels": [
            {"depth": level.depth, "states": level.states, "transitions": level.transitions, "seconds": level.seconds}
            for level in found.levels
        ],
        "transitions_by_rule": found.by_rule(),
        "invariants": {name: INVARIANTS[name].__doc__ for name in found.invariants if name in INVARIANTS},
        "violations": [
            {
                "invariant": violation.invariant,
                "problems": list(violation.problems),
                "path": [{"rule": call.rule, "arguments": dict(call.arguments)} for call in violation.path],
            }
            for violation in found.violations
        ],
    }
