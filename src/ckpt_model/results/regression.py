"""Regression files: a failing run as data (its deployment and rule calls), replayed without Hypothesis.

Hypothesis's database key depends on the test's source and its `@reproduce_failure` blob on its version, so
neither survives an edit of the checker. When a run fails, the machine writes the rules it called to a JSON file
named after the property, the deployment and a digest of those steps (`file_name`: distinct failures, distinct
names); Hypothesis runs the shrunk example last, so the file first holds the shrunk sequence, and the domain
minimiser (`ckpt_model.search.minimise`) rewrites it with the 1-minimal one, recording how (and the steps found)
under "minimised". A minimised file is never replaced by the steps found (`replaces`); where the copies go, the
replayable set and the run store, is `ckpt_model.results.runstore`'s. Replay it with `ckpt-model replay FILE`
(`ckpt_model.search.scenarios.replay`), minimise an existing one with `ckpt-model minimise FILE`, or keep it as a
fixed scenario. A file's name is never read: files named before the digest replay as ever.

A file's deployment is `DeploymentSpec.document()` (topology, verify mode, faults, and the options that differ from
their defaults) and reads back with `DeploymentSpec.from_document`, so a file written before an option existed
replays with that option at its default, as it ran. Beside it a file says which controller's machine ran the steps
(`Origin`: the trainer's, or rollout collection's with the collector's planted faults); a file written before it
said so is the trainer's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ckpt_model.model.spec import DeploymentSpec

REGRESSIONS_ENV = "CKPT_MODEL_REGRESSIONS"
DEFAULT_DIR = Path(".ckpt-model") / "regressions"
FORMAT_VERSION = 1
# Hex characters of the steps' digest in a file name: distinct failures of one property and deployment get
# distinct names.
DIGEST_CHARS = 8
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


def stem(spec: DeploymentSpec, error: BaseException, origin: Origin = DEFAULT_ORIGIN) -> str:
    """What a failure's file names begin with: its property (or class name), deployment and controller
    (`P9-native-resume_deletes_records`)."""
    label = getattr(error, "property_id", None) or type(error).__name__
    return "-".join((label, *spec.file_words, *origin.words))


def steps_digest(rule_calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """A short hash of the rule calls (their names and arguments, in order): distinct steps, distinct names."""
    text = json.dumps([[name, dict(arguments)] for name, arguments in rule_calls], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def file_name(stem: str, rule_calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """A failure's file name: its stem and the digest of the steps that first showed it
    (`P9-native-resume_deletes_records-1f0c2a9e.json`). The name stays the failure's when its file later holds
    the minimal steps."""
    return f"{stem}-{steps_digest(rule_calls)}.json"


def document(
    spec: DeploymentSpec,
    rule_calls: Sequence[tuple[str, Mapping[str, Any]]],
    error: BaseException,
    *,
    origin: Origin = DEFAULT_ORIGIN,
    minimised: dict[str, Any] | None = None,
    reproduction: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A failure's regression file as data. `minimised` records how the steps were minimised
    (`ckpt_model.search.minimise.provenance`), `reproduction` how often they failed the same way when replayed
    (`ckpt_model.results.reproduction.Rate.document`)."""
    written = {
        "format": FORMAT_VERSION,
        "failure": {"type": type(error).__name__, "property": getattr(error, "property_id", None)},
        **origin.document(),
        **spec.document(),
        "steps": [[name, dict(arguments)] for name, arguments in rule_calls],
    }
    if minimised is not None:
        written["minimised"] = minimised
    if reproduction is not None:
        written["reproduction"] = reproduction
    return written


def replaces(existing: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` may replace the file that holds `existing` (None: no file, or one that cannot be read): a
    minimised file is replaced only by a minimised one with no more steps, never by the steps found."""
    if existing is None or "minimised" not in existing:
        return True
    return "minimised" in new and len(new.get("steps", ())) <= len(existing.get("steps", ()))


def write_unless_better(path: Path, new: dict[str, Any]) -> bool:
    """Write `new` at `path` (atomically) unless the file there already holds better steps (`replaces`); returns
    whether it was written."""
    if not replaces(read_existing(path), new):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, new)
    return True


def read_existing(path: Path) -> dict[str, Any] | None:
    """The document at `path`, or None if there is none that reads as one."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def rewrite(
    path: Path,
    document: dict[str, Any],
    steps: list[tuple[str, dict[str, Any]]],
    minimised: dict[str, Any],
    reproduction: dict[str, Any] | None = None,
) -> None:
    """Rewrite an existing file with new steps (everything else kept), how they were minimised and how often they
    failed the same way. The steps first found stay recorded (`minimised.steps_found`), from the file's own record
    when it was minimised before."""
    found = document.get("minimised", {}).get("steps_found") or minimised.get("steps_found")
    minimised = {**minimised, **({"steps_found": found} if found is not None else {})}
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
