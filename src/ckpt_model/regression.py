"""Regression files: a failing run as data (topology, verify mode, faults, rule calls), replayed without Hypothesis.

Hypothesis's database key depends on the test's source and its `@reproduce_failure` blob on its version, so
neither survives an edit of the checker. When a run fails, the machine writes the rules it called to a JSON file
named after the property and the deployment; Hypothesis runs the shrunk example last, so the file first holds
the shrunk sequence, and the domain minimiser (`ckpt_model.minimise`) rewrites it with the 1-minimal one, recording
how under "minimised". Replay it with `ckpt-model replay FILE` (`ckpt_model.scenarios.replay`), minimise an
existing one with `ckpt-model minimise FILE`, or keep it as a fixed scenario.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REGRESSIONS_ENV = "CKPT_MODEL_REGRESSIONS"
DEFAULT_DIR = Path(".ckpt-model") / "regressions"
FORMAT_VERSION = 1


def directory() -> Path:
    """Where regression files go: `$CKPT_MODEL_REGRESSIONS`, or `.ckpt-model/regressions` (git ignores it)."""
    return Path(os.environ.get(REGRESSIONS_ENV) or DEFAULT_DIR)


def write(
    harness: Any,
    rule_calls: list[tuple[str, dict[str, Any]]],
    error: BaseException,
    *,
    minimised: dict[str, Any] | None = None,
) -> Path:
    """Write (overwrite) the file for this failure's property and deployment; returns its path. `minimised`
    records how the steps were minimised (`ckpt_model.minimise.provenance`)."""
    label = getattr(error, "property_id", None) or type(error).__name__
    deployment = [harness.topology]
    if harness.topology == "slow":
        deployment.append(harness.verify_mode)
    deployment.extend(harness.faults)
    options = deployment_options(harness)
    deployment.extend(option_words(options))
    target_dir = harness.regressions_dir or directory()
    path = target_dir / f"{label}-{'-'.join(deployment)}.json"
    document = {
        "format": FORMAT_VERSION,
        "failure": {"type": type(error).__name__, "property": getattr(error, "property_id", None)},
        "topology": harness.topology,
        "verify_mode": harness.verify_mode,
        "faults": list(harness.faults),
        **{name: value for name, value in options.items() if value != DEFAULT_OPTIONS[name]},
        "steps": [[name, arguments] for name, arguments in rule_calls],
    }
    if minimised is not None:
        document["minimised"] = minimised
    target_dir.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, document)
    return path


# A deployment's options beyond topology, verify mode and faults, with their defaults (`Harness.embedded` takes them).
DEFAULT_OPTIONS: dict[str, Any] = {"token_capture": False, "generation_cuts": False, "policy_workers": 1}


def deployment_options(source: Any) -> dict[str, Any]:
    """The options of a harness or a regression file (absent ones at their defaults)."""
    if isinstance(source, dict):
        return {name: source.get(name, default) for name, default in DEFAULT_OPTIONS.items()}
    return {name: getattr(source, name, default) for name, default in DEFAULT_OPTIONS.items()}


def options_of_words(words: Any) -> dict[str, Any]:
    """The keywords `option_words` wrote (`capture`, `cuts`, `workersN`); a ValueError names an unknown word."""
    options: dict[str, Any] = {}
    for word in words:
        if word in ("capture", "cuts"):
            options["token_capture"] = True
            options["generation_cuts"] = options.get("generation_cuts", False) or word == "cuts"
        elif word.startswith("workers") and word[len("workers") :].isdigit() and int(word[len("workers") :]) > 0:
            options["policy_workers"] = int(word[len("workers") :])
        else:
            raise ValueError(f"unknown deployment option {word!r}: use capture, cuts or workersN")
    return options


def option_words(options: dict[str, Any]) -> list[str]:
    """The options that differ from the defaults, as words for file names and keys (`capture`, `cuts`,
    `workers2`)."""
    words = [word for word, name in (("capture", "token_capture"), ("cuts", "generation_cuts")) if options.get(name)]
    if options.get("policy_workers", 1) != 1:
        words.append(f"workers{options['policy_workers']}")
    return words


def rewrite(
    path: Path, document: dict[str, Any], steps: list[tuple[str, dict[str, Any]]], minimised: dict[str, Any]
) -> None:
    """Rewrite an existing file with new steps (everything else kept) and how they were minimised."""
    replace_atomically(
        path, {**document, "steps": [[name, arguments] for name, arguments in steps], "minimised": minimised}
    )


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
    faults = f" with {', '.join(document['faults'])}" if document["faults"] else ""
    return f"{document['topology']}{faults}: " + "; ".join(calls)
