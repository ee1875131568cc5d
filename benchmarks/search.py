"""How well the search spends its budget: what a time-bounded check reaches on each fault-free deployment, and how
soon each planted fault is found, this checkout beside an earlier one.

    python benchmarks/search.py coverage                      # every fault-free deployment, 60 s and 120 s each
    python benchmarks/search.py coverage --seconds 60 --deployments native,legacy
    python benchmarks/search.py coverage --seconds 120,600 --deployments native --aim both   # check --aim beside
    python benchmarks/search.py faults --before ../old        # the catalogue, this checkout and ../old in turn
    python benchmarks/search.py faults --faults resume_deletes_records,model_delivers_held
    python benchmarks/search.py faults --before ../old --no-after --record before.jsonl   # one side now ...
    python benchmarks/search.py table before.jsonl                  # ... and the table of what was recorded

`coverage` runs `ckpt-model check --seed 1 --max-time T --json` on each deployment (as `python -m ckpt_model`, in
this checkout) and prints, per deployment and time: examples, steps, milliseconds per step (the whole search's
time over its steps, the drains included), the share of the steps the protocol's own families took, the coverage
goals that apply and were reached, the model's explored transitions taken per depth (2 to 5), and every goal and
rule that applies and was never reached (`--aim both`: each time limit plain and with `check --aim`, in turn);
then each family's share of the steps and each rule's count. A run that did not pass keeps its output, its JSON
and its artefacts under `.ckpt-model/benchmarks/` (its path is printed on its row), so what it met is never lost.

`faults` searches for each catalogue fault as `benchmarks/checker.py --no-default --restart-rounds 0 --no-minimise`
does (derandomized, 200 examples of up to 24 steps, the search stopping at the first failure) and prints the
examples and seconds to the first failure and the property caught; with `--before DIR` it runs the same script of
the checkout DIR too, fault by fault in turn (so both see the same machine load), and sets the two side by side.
DIR is imported through PYTHONPATH with this interpreter, so it needs no install of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
# Where a coverage run that did not pass keeps what it met (git ignores `.ckpt-model/`).
KEPT = HERE / ".ckpt-model" / "benchmarks"
# The families of the protocol's own operations (`ckpt_model.steps.families`).
PROTOCOL_FAMILIES = ("rollouts", "calls", "checkpoints", "restores")
FAULT_TARGET_S = 120.0


def run_checkout(checkout: Path, arguments: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python ARGUMENTS` with `checkout`'s packages first on the path (its `src` and its `fakes`). Past
    `timeout_s` it gets SIGTERM, on which every command of the project stops the servers it started, and
    `TimeoutExpired` is raised once it has exited."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout / "src"), str(checkout)]))
    with subprocess.Popen(
        [sys.executable, *arguments], cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.communicate()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def keep(scratch: Path, label: str, limit_s: float, done: subprocess.CompletedProcess[str]) -> Path:
    """Move a run's `scratch` directory (its JSON and artefacts) under `KEPT` with its output beside them, in a new
    directory no earlier run used."""
    KEPT.mkdir(parents=True, exist_ok=True)
    kept = Path(tempfile.mkdtemp(prefix=f"coverage-{label.replace('/', '_')}-{limit_s:g}s-", dir=KEPT))
    for entry in scratch.iterdir():
        shutil.move(entry, kept / entry.name)
    (kept / "output.txt").write_text(f"exit {done.returncode}\n{done.stdout}\n--- stderr ---\n{done.stderr}")
    return kept


def spec_flags(label: str) -> list[str]:
    """The `check` flags of a fault-free deployment, from its spec."""
    from ckpt_model.model.spec import FAULT_FREE

    (spec,) = [spec for spec in FAULT_FREE if spec.label == label]
    flags = ["--topology", spec.topology, "--verify-mode", spec.verify_mode]
    flags += ["--token-capture"] if spec.token_capture else []
    flags += ["--generation-cuts"] if spec.generation_cuts else []
    flags += ["--policy-workers", str(spec.policy_workers)] if spec.policy_workers > 1 else []
    flags += ["--server-workers", str(spec.server_workers)] if spec.server_workers > 1 else []
    flags += ["--time-jumps"] if spec.time_jumps else []
    return flags


def family_of_rules() -> dict[str, str]:
    from ckpt_model.steps.draw import family_by_rule
    from ckpt_model.trainer.machine import CheckpointMachine

    return family_by_rule(CheckpointMachine)


def transitions_words(document: dict[str, Any]) -> str:
    """The share of the explored transitions taken, per depth: `d2 13/41 d3 32/463 ...`."""
    taken = document.get("transitions")
    if not taken:
        return "-"
    return " ".join(f"d{share['depth']} {share['taken']}/{share['explored']}" for share in taken["by_depth"][1:])


def coverage(labels: list[str], seconds: list[float], draws: tuple[str, ...] = ("plain",)) -> None:
    family_of = family_of_rules()
    rows: list[tuple[str, float, dict[str, Any]]] = []
    print(
        f"{'deployment':<40} {'draw':<5} {'time':>5} {'examples':>8} {'steps':>6} {'ms/step':>7} {'protocol':>8}"
        f" {'goals':>7}  {'transitions taken of explored, by depth':<44}  never reached"
    )
    for label in labels:
        for limit_s, draw in ((limit_s, draw) for limit_s in seconds for draw in draws):
            with tempfile.TemporaryDirectory() as scratch:
                result_path, artefacts = Path(scratch) / "result.json", Path(scratch) / "artefacts"
                flags = [*spec_flags(label), "--seed", "1", "--max-time", f"{limit_s:g}", "--json", str(result_path)]
                flags += ["--keep-artifacts", str(artefacts)] + (["--aim"] if draw == "aim" else [])
                done = run_checkout(HERE, ["-m", "ckpt_model", "check", *flags], limit_s * 4 + 300)
                document = json.loads(result_path.read_text()) if result_path.exists() else None
                kept = "" if done.returncode == 0 else f"  kept in {keep(Path(scratch), label, limit_s, done)}"
                if document is None:
                    print(f"{label:<40} {limit_s:>4.0f}s  no result (exit {done.returncode}){kept}")
                    continue
            statistics_ = document["statistics"]
            rows.append((label, limit_s, statistics_))
            steps = statistics_["steps"]
            drawn = Counter(statistics_["rules_drawn"])
            protocol = sum(n for rule, n in drawn.items() if family_of.get(rule) in PROTOCOL_FAMILIES)
            total_drawn = sum(drawn.values()) or 1
            search_s = document["timings_s"]["search"] or 0.0
            unmet = statistics_["unmet"]
            goals_unmet = [entry for entry in unmet if not entry.startswith("rule ")]
            reached = len(statistics_["goals"]) - sum(1 for count in statistics_["goals"].values() if not count)
            per_step = 1000 * search_s / steps if steps else float("nan")
            print(
                f"{label:<40} {draw:<5} {limit_s:>4.0f}s {statistics_['examples_finished']:>8} {steps:>6}"
                f" {per_step:>7.0f} {100 * protocol / total_drawn:>7.0f}% {reached:>3}/{reached + len(goals_unmet):<3}"
                f"  {transitions_words(document):<44}  {'; '.join(unmet) or '-'}  [{document['verdict']}]{kept}",
                flush=True,
            )
    print("\neach family's share of the steps drawn:")
    families = list(dict.fromkeys(family_of.values()))
    print(f"{'deployment':<40} {'time':>5} " + " ".join(f"{name[:11]:>11}" for name in families))
    for label, limit_s, statistics_ in rows:
        drawn = Counter(statistics_["rules_drawn"])
        total = sum(drawn.values()) or 1
        shares = Counter({family: 0 for family in families})
        for rule, count in drawn.items():
            shares[family_of[rule]] += count
        cells = " ".join(f"{100 * shares[name] / total:>10.0f}%" for name in families)
        print(f"{label:<40} {limit_s:>4.0f}s {cells}")
    print("\neach rule's draws (and milliseconds per draw):")
    for label, limit_s, statistics_ in rows:
        seconds_of = statistics_["rule_seconds"]
        cells = [
            f"{rule} {count} ({1000 * seconds_of.get(rule, 0.0) / count:.0f})"
            for rule, count in sorted(statistics_["rules_drawn"].items(), key=lambda item: -item[1])
        ]
        print(f"{label} {limit_s:g}s: " + ", ".join(cells))


def fault_line(output: str, fault: str) -> dict[str, Any]:
    """The figures `benchmarks/checker.py` printed for `fault` (name, draw, caught, the first failure and the
    search as "12.3 s" or "-", the total as "12.3 s", then the examples): caught, seconds, examples."""
    for line in output.splitlines():
        parts = line.split()
        if parts[:1] != [fault] or len(parts) < 8:
            continue
        at, seconds = 3, []
        for _ in range(3):  # first failure, search, total
            timed = parts[at + 1 : at + 2] == ["s"]
            seconds.append(float(parts[at]) if timed else None)
            at += 2 if timed else 1
        return {"caught": parts[2], "first_s": seconds[0], "examples": int(parts[at])}
    return {"caught": "ERROR", "first_s": None, "examples": 0}


def faults(names: list[str], checkouts: list[tuple[str, Path]], timeout_s: float, record: Path | None) -> None:
    """Each fault searched in each checkout in turn; with `record`, each result also appended as a JSON line, so
    runs made apart (the earlier checkout first, say) can be set side by side later (`table`)."""
    found: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    for name in names:
        for which, checkout in checkouts:
            arguments = ["benchmarks/checker.py", "--no-default", "--restart-rounds", "0", "--no-minimise"]
            # No replays for the failure's rate where the checkout can skip them: they cost the settle timeout each
            # on a fault judged on a count, which a time limit would then count against the search.
            if "--replays" in (checkout / "benchmarks" / "checker.py").read_text():
                arguments += ["--replays", "0"]
            try:
                done = run_checkout(checkout, [*arguments, "--faults", name], timeout_s)
                figures = fault_line(done.stdout, name)
            except subprocess.TimeoutExpired:
                figures = {"caught": f">{timeout_s:.0f}s", "first_s": None, "examples": 0}
            found[name][which] = figures
            if record is not None:
                with record.open("a") as lines:
                    lines.write(json.dumps({"fault": name, "which": which, **figures}) + "\n")
            print(f"{name:<40} {which:<7} {figures}", flush=True)
    print(table(found, [which for which, _ in checkouts]))


def table(found: dict[str, dict[str, dict[str, Any]]], columns: list[str]) -> str:
    """Examples and seconds to the first failure per fault, a column per checkout, then each one's summary."""
    lines = [f"{'fault':<40}" + "".join(f" {which + ': examples, first failure, caught':>44}" for which in columns)]
    for name, by_checkout in found.items():
        cells = ""
        for which in columns:
            figures = by_checkout.get(which, {"examples": 0, "first_s": None, "caught": "-"})
            first = "-" if figures["first_s"] is None else f"{figures['first_s']:.1f} s"
            cells += f" {figures['examples']:>20} {first:>10} {figures['caught']:>12}"
        lines.append(f"{name:<40}{cells}")
    for which in columns:
        seconds = [by.get(which, {}).get("first_s") for by in found.values()]
        times = [t if t is not None else float("inf") for t in seconds]
        examples = [by.get(which, {}).get("examples", 0) for by in found.values()]
        lines.append(
            f"{which}: median first failure {statistics.median(times):.1f} s, max {max(times):.1f} s, over "
            f"{FAULT_TARGET_S:.0f} s: {sum(t > FAULT_TARGET_S for t in times)}, not found: "
            f"{sum(t is None for t in seconds)}, of {len(times)}; examples to the first failures "
            f"{sum(examples)} (median {statistics.median(examples)})"
        )
    return "\n".join(lines)


def recorded(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The results `faults --record` appended, by fault and checkout (a later line for the same pair wins)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        found.setdefault(entry.pop("fault"), {})[entry.pop("which")] = entry
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cover = commands.add_parser("coverage", help="what a time-bounded check reaches on each fault-free deployment")
    cover.add_argument("--seconds", default="60,120", help="comma-separated time limits (default 60,120)")
    cover.add_argument("--deployments", default="", help="comma-separated deployment labels (default: all)")
    cover.add_argument(
        "--aim",
        choices=("off", "on", "both"),
        default="off",
        help="run `check` plainly (off), with --aim (on), or both, side by side at each time limit (default off)",
    )
    find = commands.add_parser("faults", help="examples and seconds to each planted fault's first failure")
    find.add_argument("--faults", default="", help="comma-separated fault names (default: the whole catalogue)")
    find.add_argument("--before", type=Path, help="an earlier checkout to run beside this one, fault by fault")
    find.add_argument("--no-after", action="store_true", help="run only the --before checkout")
    find.add_argument("--timeout", type=float, default=600.0, help="seconds one fault's search may take (600)")
    find.add_argument("--record", type=Path, help="append each result to this file as a JSON line")
    show = commands.add_parser("table", help="the side-by-side table of results faults --record appended")
    show.add_argument("record", type=Path)
    args = parser.parse_args(argv)
    if args.command == "table":
        found = recorded(args.record)
        columns = list(dict.fromkeys(which for by in found.values() for which in by))
        print(table(found, columns))
        return 0
    if args.command == "coverage":
        from ckpt_model.model.spec import FAULT_FREE

        labels = [label for label in args.deployments.split(",") if label] or [spec.label for spec in FAULT_FREE]
        draws = {"off": ("plain",), "on": ("aim",), "both": ("plain", "aim")}[args.aim]
        coverage(labels, [float(part) for part in args.seconds.split(",")], draws)
        return 0
    from ckpt_model.deployments.catalogue import fault_catalogue

    names = [name for name in args.faults.split(",") if name] or [fault.name for fault in fault_catalogue()]
    checkouts = [] if args.no_after else [("after", HERE)]
    checkouts += [("before", args.before.resolve())] if args.before is not None else []
    faults(names, checkouts, args.timeout, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
