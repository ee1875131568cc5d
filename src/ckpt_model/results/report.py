"""The failure report: what a violation or harness error carries besides its own message.

Notes on the exception, each tagged with what it says (`ckpt_model.results.notes`; `failure_text` prints them in a
reader's order): the steps, each with the rule that did it and its effect in the model's names, the history of the
rollout and the controller, the backend's calls, the server log tails (a traceback of a failure the checker injected
labelled so: `log_tails`), how Hypothesis replays it (only under Hypothesis), the regression file written for it,
the timeline picture of the whole history beside it (`ckpt_model.results.timeline`), the run store's directory that
keeps both (`ckpt_model.results.runstore`), and what `--keep-artifacts` kept (or that those paths are temporary). A
path inside the harness's own root is removed when the run ends: its note says so.
The rule calls themselves ride on the exception too (`rule_calls_of`), so whoever catches it after Hypothesis
(`ckpt_model.search.faultsearch`, `ckpt-model check`) can minimise that very run (`ckpt_model.search.minimise`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ckpt_model.deployments import artifacts
from ckpt_model.deployments.harness import Harness
from ckpt_model.protocol.history import Event, History
from ckpt_model.results import regression, runstore, timeline
from ckpt_model.results.log_tails import label_injected
from ckpt_model.results.notes import Kind, add

HISTORY_EVENTS_SHOWN = 30
ANNOTATED = "_ckpt_annotated"
RULE_CALLS = "_ckpt_rule_calls"
HISTORY = "_ckpt_history"
TIMELINE_NOTE = "Timeline of the failing history (open in a browser):"


def rule_calls_of(error: BaseException) -> list[tuple[str, dict[str, Any]]] | None:
    """The outermost rule calls of the run that raised `error` (as `annotate` attached them); None if none."""
    calls = getattr(error, RULE_CALLS, None)
    return [(name, dict(arguments)) for name, arguments in calls] if calls is not None else None


def annotate(
    error: BaseException,
    *,
    harness: Harness,
    steps: Sequence[str],
    history: History,
    rule_calls: list[tuple[str, dict[str, Any]]],
    backend_calls: Callable[[], Any],
    origin: regression.Origin = regression.DEFAULT_ORIGIN,
    under_hypothesis: bool = False,
) -> bool:
    """Attach the report to `error` once; returns False if it already carried one. `steps`: one line per rule drawn
    (`ckpt_model.steps.steplog.model_steps`); `origin`: the controller whose machine ran, as the regression file
    records it; `under_hypothesis`: the run is Hypothesis's (a search's, not a replay's), so its example database
    and blob apply."""
    if getattr(error, ANNOTATED, False):
        return False
    setattr(error, ANNOTATED, True)
    setattr(error, RULE_CALLS, [(name, dict(arguments)) for name, arguments in rule_calls])
    setattr(error, HISTORY, tuple(history.events))
    add(error, Kind.STEPS, "Steps (model names):\n" + "\n".join(f"  {i}. {s}" for i, s in enumerate(steps, 1)))
    rollout = getattr(error, "rollout", None)
    events: list[Event] = list(history.events)
    if rollout:
        events = [e for e in events if e.process in (rollout, "controller")]
    add(error, Kind.HISTORY, "History (last events):\n" + history.format(events, last=HISTORY_EVENTS_SHOWN))
    try:
        calls = backend_calls()
    except Exception as observe_error:
        calls = {"unavailable": str(observe_error)}
    add(error, Kind.BACKEND_CALLS, f"Backend calls (message counts per capture key): {calls}")
    add(error, Kind.LOG_TAILS, label_injected(harness.log_tails()))
    if under_hypothesis:
        add(error, Kind.HYPOTHESIS_REPLAY, HYPOTHESIS_REPLAY)
    kept: runstore.Kept | None = None
    try:
        name = runstore.name_for(harness, error, origin, rule_calls)
        document = regression.document(harness.spec, rule_calls, error, origin=origin)
        kept = runstore.keep(harness, error, document, name)
    except OSError as write_error:
        add(error, Kind.REPLAY, f"Replay file not written: {write_error}")
    else:
        temporary = temporary_note(harness, kept.shown)
        replay = f"Replay without Hypothesis (survives code edits): ckpt-model replay {kept.shown}{temporary}"
        add(error, Kind.REPLAY, replay)
        picture = draw_timelines(error, harness, kept)
        add(error, Kind.TIMELINE, picture + (temporary if picture.startswith(TIMELINE_NOTE) else ""))
        for note in (runstore.held_note(kept), runstore.kept_note(kept)):
            if note is not None:
                add(error, Kind.RUN_STORE, note)
    kept_artifacts = keep_artifacts(harness, history.events, kept.shown if kept is not None else None)
    if kept_artifacts is not None:
        add(error, Kind.ARTIFACTS, kept_artifacts)
    return True


HYPOTHESIS_REPLAY = (
    "Under Hypothesis: rerunning the test under pytest replays this example first when the profile keeps an "
    "example database (not under CI=true); Hypothesis's @reproduce_failure(...) line (shown with --verbose) replays "
    "it exactly, with this Hypothesis version and this checker's code."
)


def temporary_note(harness: Harness, path: Path) -> str:
    """What the report adds to a path the run wrote inside the harness's own root, removed when the run ends (a
    replay's regression file and timeline, a minimiser's candidate's): that it is temporary. Empty for a path that
    outlives the run."""
    root = getattr(harness, "root", None)
    if root is None or not Path(path).is_relative_to(root):
        return ""
    return " (temporary: removed when the command exits; `--keep-artifacts DIR` keeps it)"


def keep_artifacts(harness: Harness, events: Sequence[Event], regression_path: Path | None) -> str | None:
    """With `--keep-artifacts`, keep the failing example's checkpoints and history: the note that says where. A
    failure whose regression file went elsewhere (a minimiser's candidate, a replay for the rate) keeps nothing and
    says nothing. Without it, the note that the paths above are temporary."""
    if harness.artifacts is None:
        return artifacts.removed_note()
    if regression_path is None or regression_path.parent != harness.artifacts:
        return None
    example_dir = harness.keep_example()
    try:
        artifacts.write_history(harness.artifacts / artifacts.HISTORY, events)
    except OSError as write_error:
        return f"History not kept: {write_error}"
    return artifacts.kept_note(harness.artifacts, example_dir)


def draw_timelines(error: BaseException, harness: Harness, kept: runstore.Kept) -> str:
    """Draw the timeline of the history `error` came from beside each copy of its regression file just written
    (`kept.written`; never beside one kept as it was, whose picture shows its own steps); the note that names the
    one beside the copy the report names, or says why there is none."""
    if not kept.written:
        return "Timeline not redrawn: every copy of the regression file already held better steps"
    drawn = draw_timeline(error, harness, kept.written[0])
    if not drawn.startswith(TIMELINE_NOTE):
        return drawn
    pictures = [timeline.path_beside(path) for path in kept.written]
    try:
        runstore.copy_beside(pictures[0], pictures[1:])
    except OSError as copy_error:
        return f"Timeline not copied beside every regression file: {copy_error}"
    shown = kept.timeline if kept.shown in kept.written else pictures[-1]
    return f"{TIMELINE_NOTE} {shown}"


def draw_timeline(error: BaseException, harness: Harness, regression_path: Path) -> str:
    """Write the timeline of the history `error` came from beside its regression file; the note that says where,
    or why not (a picture of the failure must never hide the failure itself)."""
    events = getattr(error, HISTORY, None)
    if events is None:
        return "Timeline not written: the failure carries no history"
    try:
        picture = timeline.path_beside(regression_path)
        timeline.write_timeline(picture, events, timeline.failure_of(error), harness.spec.label, regression_path)
    except Exception as draw_error:  # any: see the docstring
        return f"Timeline not written: {type(draw_error).__name__}: {draw_error}"
    return f"{TIMELINE_NOTE} {picture}"
