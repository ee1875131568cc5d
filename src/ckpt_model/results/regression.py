"""Regression files: a failing run as data (its deployment and rule calls), replayed without Hypothesis.

Hypothesis's database key depends on the test's source and its `@reproduce_failure` blob on its version, so
neither survives an edit of the checker. When a run fails, the machine writes the rules it called to a JSON file
named after the property and the deployment; Hypothesis runs the shrunk example last, so the file first holds
the shrunk sequence, and the domain minimiser (`ckpt_model.search.minimise`) rewrites it with the 1-minimal one,
recording how under "minimised". Replay it with `ckpt-model replay FILE` (`ckpt_model.search.scenarios.replay`),
minimise an existing one with `ckpt-model minimise FILE`, or keep it as a fixed scenario.

A file's deployment is `DeploymentSpec.document()` (topology, verify mode, faults, and the options that differ from
their defaults) and reads back with `DeploymentSpec.from_document`, so a file written before an option existed
replays with that option at its default, as it ran. Beside it a file says which controller's machine ran the steps
(`Origin`: the trainer's, or rollout collection's with the collector's planted faults); a file written before it
said so is the trainer's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ckpt_model.model.spec import DeploymentSpec

if TYPE_CHECKING:
    from ckpt_model.deployments.harness import Harness

REGRESSIONS_ENV = "CKPT_MODEL_REGRESSIONS"
DEFAULT_DIR = Path(".ckpt-model") / "regressions"
FORMAT_VERSION = 1
# The controllers whose machines the checker plays, as a file names them; a file that names none is the trainer's
# (written before the collection machine wrote files of its own).
TRAINER_CONTROLLER = "trainer"
COLLECTION_CONTROLLER = "collection"
DEFAULT_CONTROLLER = TRAINER_CONTROLLER


@attrs.frozen
class Origin:
    """Which controller's state machine ran a failing run's steps, and the planted faults of that controller's own
    program (the look-alike collector's), as a regression file records them beside the deployment."""

    controller: str = DEFAULT_CONTROLLER
    faults: tuple[str, ...] = ()

    def document(self) -> dict[str, Any]:
        return {"controller": self.controller, **({"controller_faults": list(self.faults)} if self.faults else {})}

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Origin:
        """The origin a file records; the trainer's for a file that records none."""
        return cls(document.get("controller", DEFAULT_CONTROLLER), tuple(document.get("controller_faults", ())))

    @property
    def words(self) -> tuple[str, ...]:
        """What a file name adds for it: nothing for the default controller (its files keep the names they always
        had), else the controller and its faults."""
        return () if self.controller == DEFAULT_CONTROLLER else (self.controller, *self.faults)

    @property
    def label(self) -> str:
        """How `describe` names it after the deployment (nothing for the default controller)."""
        if self.controller == DEFAULT_CONTROLLER:
            return ""
        planted = f" with {', '.join(self.faults)}" if self.faults else ""
        return f", the {self.controller} controller{planted}"


# The origin of a file that records none, and of every failing run of the trainer's machine.
DEFAULT_ORIGIN = Origin()


def directory() -> Path:
    """Where regression files go: `$CKPT_MODEL_REGRESSIONS`, or `.ckpt-model/regressions` (git ignores it)."""
    return Path(os.environ.get(REGRESSIONS_ENV) or DEFAULT_DIR)


def path_for(harness: Harness, error: BaseException, origin: Origin = DEFAULT_ORIGIN) -> Path:
    """Where the file for this failure's property, deployment and controller goes (`write` writes it there)."""
    label = getattr(error, "property_id", None) or type(error).__name__
    words = (*harness.spec.file_words, *origin.words)
    return (harness.regressions_dir or directory()) / f"{label}-{'-'.join(words)}.json"


def write(
    harness: Harness,
    rule_calls: list[tuple[str, dict[str, Any]]],
    error: BaseException,
    *,
    origin: Origin = DEFAULT_ORIGIN,
    minimised: dict[str, Any] | None = None,
    reproduction: dict[str, Any] | None = None,
) -> Path:
    """Write (overwrite) the file for this failure's property, deployment and controller (`origin`); returns its
    path. `minimised` records how the steps were minimised (`ckpt_model.search.minimise.provenance`), `reproduction`
    how often they failed the same way when replayed (`ckpt_model.results.reproduction.Rate.document`)."""
    path = path_for(harness, error, origin)
    spec = harness.spec
    document = {
        "format": FORMAT_VERSION,
        "failure": {"type": type(error).__name__, "property": getattr(error, "property_id", None)},
        **origin.document(),
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
    controller, faults = document.get("controller", DEFAULT_CONTROLLER), document.get("controller_faults", [])
    if not isinstance(controller, str) or not (isinstance(faults, list) and all(isinstance(f, str) for f in faults)):
        raise ValueError(f"{path}: 'controller' must be a name and 'controller_faults' a list of fault names")
    return document


def describe(document: dict[str, Any]) -> str:
    """One line: the deployment and the rule calls, as a person would type them."""
    calls = [
        f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
        for name, arguments in document["steps"]
    ]
    label = DeploymentSpec.from_document(document).label + Origin.from_document(document).label
    return f"{label}: " + "; ".join(calls)
