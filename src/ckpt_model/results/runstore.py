"""The run store: every run that finds a failure keeps it in a directory of its own, never overwritten.

As Jepsen's `store/` keeps each test run under a timestamped directory with a `latest` link, a run that finds a
failure makes `.ckpt-model/runs/<UTC time>-<property>-<deployment>/` (or under `$CKPT_MODEL_RUNS`) at its first
failure and keeps there, for each failure, its regression file and timeline, then the printed report (`REPORT`)
and the `--json` result (`RESULT`); `runs/latest` links to the newest. The regression file also goes to the
replayable set (`ckpt_model.results.regression.directory()`, or `--keep-artifacts DIR`) under the same name.

A failure's file name is its property, deployment and a digest of the steps that first showed it
(`regression.file_name`), so distinct failures never share a name; in a run, Hypothesis's shrinks of a failure and
the minimiser's rewrite keep the name the run gave it first (`name_for`). No copy is replaced by a worse one: a
minimised file stays until a minimal sequence as short replaces it (`regression.replaces`). Every write goes to a
file beside, then is renamed over it; the `latest` link too.

Only a harness a command runs for a user has a store (`begin`): `check`, `replay`, `minimise`, the pytest
plugin's `ckpt_check`. A fault search's, a test's, and the minimiser's candidates' failures keep nothing here.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ckpt_model.results import regression

if TYPE_CHECKING:
    from ckpt_model.deployments.harness import Harness

RUNS_ENV = "CKPT_MODEL_RUNS"
DEFAULT_ROOT = Path(".ckpt-model") / "runs"
LATEST = "latest"
REPORT = "report.txt"
RESULT = "result.json"
STAMP = "%Y%m%dT%H%M%SZ"
# The attribute a failure carries once kept (`kept_of`).
KEPT = "_ckpt_kept"


def root() -> Path:
    """Where run directories go: `$CKPT_MODEL_RUNS`, or `.ckpt-model/runs` (git ignores `.ckpt-model/`)."""
    return Path(os.environ.get(RUNS_ENV) or DEFAULT_ROOT)


def begin(harness: Harness, store: Path | None = None) -> None:
    """A new run on `harness`: its failures are kept in the run store `store` (default `root()`), in a directory
    made at its first failure, under names of their own."""
    harness.run_store = Path(store if store is not None else root()).absolute()
    harness.run_dir = None
    harness.failure_files = {}


def run_name(started: datetime.datetime, stem: str) -> str:
    """A run directory's name: the UTC time of its first failure and that failure's stem."""
    return f"{started.astimezone(datetime.UTC).strftime(STAMP)}-{stem}"


def new_run_dir(store: Path, name: str) -> Path:
    """Claim `store/name` (`name-2`, `name-3`, ... when a run of the same second took it: a directory is made
    only if none is there) and point `latest` at it."""
    store.mkdir(parents=True, exist_ok=True)
    for number in range(1, 1000):
        candidate = store / (name if number == 1 else f"{name}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        point_latest(store, candidate)
        return candidate
    raise FileExistsError(f"{store / name}: a thousand runs of the same second already there")


def point_latest(store: Path, target: Path) -> bool:
    """Point `store/latest` at `target` (relative, so the store can move): a new link beside it, renamed over the
    old one, so a reader always finds one. False if it could not (a `latest` that is a directory of the user's)."""
    link = store / LATEST
    partial = store / f".{LATEST}.{os.getpid()}.partial"
    try:
        partial.unlink(missing_ok=True)
        os.symlink(target.name, partial)
        os.replace(partial, link)
    except OSError:
        partial.unlink(missing_ok=True)
        return False
    return True


def run_dir_of(harness: Harness, stem: str) -> Path | None:
    """This run's directory, made at its first failure (named after `stem`); None for a harness with no store."""
    if harness.run_store is None:
        return None
    if harness.run_dir is None:
        now = datetime.datetime.now(datetime.UTC)
        harness.run_dir = new_run_dir(harness.run_store, run_name(now, stem))
    return harness.run_dir


@attrs.frozen
class Kept:
    """Where one failure's regression file is: `shown`, the copy the report names (the replayable set's, or the run
    store's when the harness's own set is private); `written`, the copies the last write reached; `held`, the
    copies that already held better steps and were left as they were (`regression.replaces`); `failed`, each copy
    that could not be written, with why."""

    name: str
    shown: Path
    written: tuple[Path, ...] = ()
    held: tuple[Path, ...] = ()
    run_dir: Path | None = None
    failed: tuple[str, ...] = ()

    @property
    def timeline(self) -> Path:
        """The timeline picture beside the shown copy."""
        return self.shown.with_suffix(".html")


def kept_of(error: BaseException) -> Kept | None:
    """Where the failure `error` is kept (as `keep` last recorded it), or None if it was never written."""
    kept = getattr(error, KEPT, None)
    return kept if isinstance(kept, Kept) else None


def name_for(harness: Harness, error: BaseException, origin: regression.Origin, rule_calls: Sequence[Any]) -> str:
    """The file name of this failure: in a run a command began (`begin`: one search, where Hypothesis counts the
    failures of one property as one bug), the first name the run gave a failure of this property and deployment,
    so Hypothesis's shrinks of it rewrite one file; else (a harness that outlives many searches: a fuzz worker's, a
    test session's) a name of its own steps (`regression.file_name`)."""
    stem = regression.stem(harness.spec, error, origin)
    name = regression.file_name(stem, rule_calls)
    return harness.failure_files.setdefault(stem, name) if harness.run_store is not None else name


def keep(harness: Harness, error: BaseException, document: dict[str, Any], name: str) -> Kept:
    """Write the failure's regression file `document` as `name` to the replayable set and to this run's directory,
    each unless it already holds better steps; recorded on `error` (`kept_of`). A copy that cannot be written (nor
    its run directory made) is said in `failed`, never in the way of the other; OSError only if none was kept."""
    stem = regression.stem(harness.spec, error, regression.Origin.from_document(document))
    failed: list[str] = []
    try:
        run_dir = run_dir_of(harness, stem)
    except OSError as make_error:
        run_dir = None
        failed.append(f"no run directory in {harness.run_store}: {make_error}")
    replayable = (harness.regressions_dir or regression.directory()).absolute() / name
    written: list[Path] = []
    held: list[Path] = []
    for path in [replayable] + ([run_dir / name] if run_dir is not None else []):
        try:
            (written if regression.write_unless_better(path, document) else held).append(path)
        except OSError as write_error:
            failed.append(f"{path}: {write_error}")
    if not written and not held:
        raise OSError("; ".join(failed))
    user_set = harness.regressions_dir is None or harness.regressions_dir == harness.artifacts
    shown = replayable if user_set or run_dir is None else run_dir / name
    if shown not in written + held:
        shown = (written + held)[0]
    kept = Kept(name, shown, tuple(written), tuple(held), run_dir, tuple(failed))
    setattr(error, KEPT, kept)
    return kept


def copy_beside(source: Path, destinations: Sequence[Path]) -> None:
    """Copy `source` to each destination: to a file beside, then renamed over it."""
    for destination in destinations:
        if destination == source:
            continue
        partial = destination.with_name(f".{destination.name}.partial")
        try:
            shutil.copyfile(source, partial)
            os.replace(partial, destination)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise


def write_text(path: Path, text: str) -> None:
    """Write the file whole: to a file beside, then renamed over it."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def keep_text(run_dir: Path | None, file_name: str, text: str) -> Path | None:
    """Keep `text` (the `--json` result) in the run directory `run_dir`, if there is one; the path, or None when
    there is none or it could not be written (a copy of what was printed never changes the verdict)."""
    if run_dir is None:
        return None
    try:
        write_text(run_dir / file_name, text)
    except OSError:
        return None
    return run_dir / file_name


def keep_report(run_dir: Path | None, report: str) -> Path | None:
    """Keep the printed failure report in the run directory (`keep_text`)."""
    return keep_text(run_dir, REPORT, report.lstrip("\n") + "\n")


def kept_note(kept: Kept) -> str | None:
    """The report's note of the run store, when the failure is kept there."""
    if kept.run_dir is None:
        return None
    return (
        f"Kept in the run store (never overwritten; {kept.run_dir.parent / LATEST} links to the newest run): "
        f"{kept.run_dir}"
    )


def held_note(kept: Kept) -> str | None:
    """The report's note when a copy already held this failure with better steps and was left as it was, or could
    not be written."""
    lines = [f"Kept as it was (it already holds this failure's minimised steps): {path}" for path in kept.held]
    lines += [f"Not written: {why}" for why in kept.failed]
    return "\n".join(lines) or None


def interrupted_lines(harness: Harness | None) -> list[str]:
    """What an interrupted run kept, and where (`kept_lines`), or that it kept nothing."""
    return kept_lines(harness) or ["kept: nothing (no failure was found before the interrupt)"]


def kept_lines(harness: Harness | None) -> list[str]:
    """What the run kept, and where: each file of its run directory (a regression file with its steps and whether
    they are minimised) and its copies in the replayable set; none when it kept nothing."""
    if harness is None or harness.run_dir is None or not harness.run_dir.is_dir():
        return []
    files = sorted(path for path in harness.run_dir.iterdir() if not path.name.startswith("."))
    lines = [f"kept in {harness.run_dir} ({harness.run_dir.parent / LATEST} links to it):"]
    for path in files:
        lines.append(f"  {path.name}{describe_file(path)}")
    copies = sorted({replayable for replayable in replayable_copies(harness, files) if replayable.exists()}, key=str)
    lines += [f"and in the replayable set: {path}{describe_file(path)}" for path in copies]
    return lines


def replayable_copies(harness: Harness, files: Sequence[Path]) -> list[Path]:
    """The replayable set's copies of the regression files in `files` (the same names)."""
    directory = (harness.regressions_dir or regression.directory()).absolute()
    return [directory / path.name for path in files if path.suffix == ".json" and path.name != RESULT]


def describe_file(path: Path) -> str:
    """A regression file's steps, and whether they are minimised (an interrupted minimiser leaves the steps found)."""
    if path.suffix != ".json" or path.name == RESULT:
        return ""
    found = regression.read_existing(path)
    if found is None or not isinstance(found.get("steps"), list):
        return ""
    state = "minimised" if isinstance(found.get("minimised"), Mapping) else "as found, not minimised"
    return f": {len(found['steps'])} steps, {state}"
