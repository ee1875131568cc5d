"""The failure report's notes, each tagged with what it says, so the printer can put them in a person's order.

A failure's report rides on its exception as notes (`add_note`), where Hypothesis and pytest print them in the
order they were added: the run's own steps and history first, the minimal sequence last, Hypothesis's unminimised
example and blob in between. Each note the checker adds is also recorded here with its `Kind`, and
`ckpt_model.results.failure_text` prints them minimal failure first, details after, the unminimised example only
when asked. A note nobody tagged is Hypothesis's (its example, its `@reproduce_failure` blob) or someone else's.
"""

from __future__ import annotations

import enum

TAGS = "_ckpt_note_kinds"
MINIMAL_RUN = "_ckpt_minimal_run"


class Kind(enum.Enum):
    """What a note says. The run's own notes (`report.annotate`) are about the run that raised; the minimiser's are
    about the minimal sequence it found for that run."""

    STEPS = "steps"  # the run's steps, each with the rule that did it and its effect in the model's names
    HISTORY = "history"
    BACKEND_CALLS = "backend calls"
    LOG_TAILS = "log tails"
    HYPOTHESIS_REPLAY = "hypothesis replay"  # how Hypothesis and pytest replay it (only under Hypothesis)
    REPLAY = "replay"  # the regression file and the command that replays it
    TIMELINE = "timeline"
    RUN_STORE = "run store"  # the run's directory that keeps its files, and a copy kept as it was (`runstore`)
    ARTIFACTS = "artifacts"  # what --keep-artifacts kept, or that the paths above are temporary
    INTERMITTENT = "intermittent"  # a failure Hypothesis reported as flaky
    FOUND_RATE = "found rate"  # how often the run the search found failed again
    MINIMAL = "minimal"  # the minimal sequence, in Hypothesis's form (`verdicts.shrunk_steps` reads it)
    MINIMAL_STEPS = "minimal steps"  # the minimal run's steps in the model's names
    MINIMAL_REPLAY = "minimal replay"
    MINIMAL_TIMELINE = "minimal timeline"
    NOT_MINIMISED = "not minimised"  # why the sequence reported is not a minimal one


def add(error: BaseException, kind: Kind, text: str) -> None:
    """Add `text` as a note of `error`, tagged `kind` (by its place among the notes: two notes may read alike)."""
    error.add_note(text)
    tags: dict[int, Kind] = getattr(error, TAGS, None) or {}
    tags[len(error.__notes__) - 1] = kind
    setattr(error, TAGS, tags)


def tagged(error: BaseException) -> list[tuple[Kind | None, str]]:
    """Every note of `error` with the kind it was tagged with; None for a note the checker did not add
    (Hypothesis's)."""
    tags: dict[int, Kind] = getattr(error, TAGS, None) or {}
    return [(tags.get(index), str(note)) for index, note in enumerate(getattr(error, "__notes__", ()))]


def of_kind(error: BaseException | None, kind: Kind) -> list[str]:
    """The notes of `error` tagged `kind`, in the order they were added."""
    if error is None:
        return []
    return [note for found, note in tagged(error) if found is kind]


def keep_minimal_run(error: BaseException, minimal_run: BaseException | None) -> None:
    """Keep the exception the minimal sequence raised on its final replays beside the failure it minimises: the
    report shows what that run expected and saw, and its steps, history and logs."""
    setattr(error, MINIMAL_RUN, minimal_run)


def minimal_run_of(error: BaseException) -> BaseException | None:
    found = getattr(error, MINIMAL_RUN, None)
    return found if isinstance(found, BaseException) else None
