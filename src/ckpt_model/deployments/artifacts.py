"""`--keep-artifacts DIR`: what a run keeps after it exits, so that the paths its failure report names stay valid.

Without it every checkpoint directory and server log lives in temporary directories removed when the run exits.
With it the harness keeps its checkpoint directories under DIR (`CHECKPOINTS`; the failing example's are kept, the
others removed as usual), writes the regression file and its timeline to DIR, writes the failing example's history
as JSON lines (`HISTORY`) and copies every server's full log to DIR (`LOGS`) when it closes. DIR must be new or
empty: nothing of the user's is ever overwritten or deleted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import attrs

from ckpt_model.protocol.history import Event

CHECKPOINTS = "checkpoints"
LOGS = "logs"
HISTORY = "history.jsonl"
OPTION = "--keep-artifacts DIR"


class ArtifactsError(ValueError):
    """DIR cannot hold a run's artefacts (it is not empty, or cannot be created): a usage error."""


def prepare(directory: Path) -> Path:
    """DIR made ready before anything starts: created if missing, refused if it holds anything; its absolute path
    (the report's paths must stay valid wherever the user reads them from)."""
    path = Path(directory).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ArtifactsError(f"{path} exists and is not a directory; name a new or empty directory")
    if path.is_dir() and any(path.iterdir()):
        raise ArtifactsError(
            f"{path} is not empty; name a new or empty directory (a run never overwrites or deletes what is there)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ArtifactsError(f"{path} cannot be created: {error.strerror or error}") from None
    return path


def write_history(path: Path, events: Iterable[Event]) -> None:
    """One JSON object per event, in order; a value JSON cannot hold is written as its repr."""
    lines = (json.dumps(attrs.asdict(event), default=repr) for event in events)
    path.write_text("".join(f"{line}\n" for line in lines))


def copy_logs(source: Path, directory: Path) -> None:
    """Every log under `source` copied whole into `directory` (a deployment that wrote none leaves it empty)."""
    if source.is_dir():
        shutil.copytree(source, directory, dirs_exist_ok=True)
    else:
        directory.mkdir(parents=True, exist_ok=True)


def kept_note(directory: Path, example_dir: Path) -> str:
    """The report's note of what the run keeps in DIR."""
    return (
        f"Kept in {directory} (valid after the run): {HISTORY} (every event of the failing example), "
        f"{example_dir} (its checkpoint directories), {LOGS}/ (every server's full log, copied when the run ends), "
        "and the regression file with its timeline"
    )


def removed_note() -> str:
    """The report's note when nothing is kept."""
    return (
        "The checkpoint directories and server logs named above are temporary and removed when the run exits; "
        f"to keep them (and the history as JSON lines), rerun with `{OPTION}` (pytest: `--ckpt-keep-artifacts DIR`)"
    )
