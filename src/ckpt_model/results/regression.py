"""Regression files: a failing run as data (its deployment and rule calls), replayed without Hypothesis.

Hypothesis's database key depends on the test's source and its `@reproduce_failure` blob on its version, so
neither survives an edit of the checker. When a run fails, the machine writes the rules it called to a JSON file
named after the property and the deployment; Hypothesis runs the shrunk example last, so the file first holds
the shrunk sequence, and the domain minimiser (`ckpt_model.search.minimise`) rewrites it with the 1-minimal one,
recording how under "minimised". Replay it with `ckpt-model replay FILE` (`ckpt_model.search.scenarios.replay`),
minimise an existing one with `ckpt-model minimise FILE`, or keep it as a fixed scenario.

A file's deployment is `DeploymentSpec.document()` (topology, verify mode, faults, and the options that differ from
their defaults) and reads back with `DeploymentSpec.from_document`, so a file written before an option existed
replays with that option at its default, as it ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_model.model.spec import DeploymentSpec

if TYPE_CHECKING:
    from ckpt_model.deployments.harness import Harness

REGRESSIONS_ENV = "CKPT_MODEL_REGRESSIONS"
DEFAULT_DIR = Path(".ckpt-model") / "regressions"
FORMAT_VERSION = 1


def directory() -> Path:
    """Where regression files go: `$CKPT_MODEL_REGRESSIONS`, or `.ckpt-model/regressions` (git ignores it)."""
    return Path(os.environ.get(REGRESSIONS_ENV) or DEFAULT_DIR)


def path_for(harness: Harness, error: BaseException) -> Path:
    """Where the file for this failure's property and deployment goes (`write` writes it there)."""
    label = getattr(error, "property_id", None) or type(error).__name__
    return (harness.regressions_dir or directory()) / f"{label}-{'-'.join(harness.spec.file_words)}.json"


def write(
    harness: Harness,
    rule_calls: list[tuple[str, dict[str, Any]]],
    error: BaseException,
    *,
    minimised: dict[str, Any] | None = None,
    reproduction: dict[str, Any] | None = None,
) -> Path:
    """Write (overwrite) the file for this failure's property and deployment; returns its path. `minimised`
    records how the steps were minimised (`ckpt_model.search.minimise.provenance`), `reproduction` how often they failed
    the same way when replayed (`ckpt_model.results.reproduction.Rate.document`)."""
    path = path_for(harness, error)
    spec = harness.spec
    document = {
        "format": FORMAT_VERSION,
        "failure": {"type": type(error).__name__, "property": getattr(error, "property_id", None)},
        **spec.document(),
        "steps": [[name, arguments] for name, arguments in rule_calls],
    }
    if minimised is not None:
        document["minimised"] = minimised
    if reproduction is not None:
        document["reproduction"] = reproduction
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, document)
    return path


def rewrite(
    path: Path,
    document: dict[str, Any],
    steps: list[tuple[str, dict[str, Any]]],
    minimised: dict[str, Any],
    reproduction: dict[str, Any] | None = None,
) -> None:
    """Rewrite an existing file with new steps (everything else kept), how they were minimised and how often they
    failed the same way."""
    rewritten = {**document, "steps": [[name, arguments] for name, arguments in steps], "minimised": minimised}
    if reproduction is not None:
        rewritten["reproduction"] = reproduction
    replace_atomically(path, rewritten)


def replace_atomically(path: Path, document: dict[str, Any]) -> None:
    """Write beside the file, then rename over it: an interrupted write never leaves half a file."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """Read a regression file; a malformed one gets an error that says what is wrong."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable regression file ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: 'format' must be {FORMAT_VERSION}")
    steps = document.get("steps")
    if not isinstance(steps, list) or not all(
        isinstance(step, list) and len(step) == 2 and isinstance(step[0], str) and isinstance(step[1], dict)
        for step in steps
    ):
        raise ValueError(f"{path}: 'steps' must be a list of [rule name, {{arguments}}]")
    return document


def describe(document: dict[str, Any]) -> str:
    """One line: the deployment and the rule calls, as a person would type them."""
    calls = [
        f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
        for name, arguments in document["steps"]
    ]
    return f"{DeploymentSpec.from_document(document).label}: " + "; ".join(calls)
