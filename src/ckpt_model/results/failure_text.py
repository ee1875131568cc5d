"""One failure's report as a person reads it, top down: the minimal failure first, then the details.

First what failed (the property, what was expected and what was seen: the minimal run's own, once the minimiser
found one), the minimal steps (the rule calls, then each step with the rule that did it and its effect), how often
it fails, and the command that replays it; then the details (history, backend calls, server log tails, which
paths are temporary, how Hypothesis replays it). The example the search found before minimising, and Hypothesis's
`@reproduce_failure` blob, only when asked (`--verbose`): as in Hypothesis's own report, the minimal example is
*the* failing example. The order comes from the notes' tags (`ckpt_model.results.notes`), never from the order the
notes were added in.
"""

from __future__ import annotations

import traceback

from ckpt_model.results.notes import Kind, minimal_run_of, of_kind, tagged

# The first words of the notes Hypothesis adds with a failing example (the lines of a stateful example may come
# as one note or one note each), and of its blob.
EXAMPLE_STARTS = ("Falsifying example", "Failing test case", "state = ", "state.")
BLOB_STARTS = ("You can reproduce this test case", "@reproduce_failure(")
VERBOSE_HINT = (
    "(--verbose also shows the example the search found before minimising and Hypothesis's @reproduce_failure line)"
)
BLOB_HINT = "(--verbose also shows Hypothesis's @reproduce_failure line)"
DETAILS = "Details:"


def failure_text(
    error: BaseException,
    *,
    verbose: bool = False,
    with_traceback: bool = False,
    replay_command: str | None = None,
) -> str:
    """The report of one failure: `error`'s type and message, then its notes in the reader's order. `with_traceback`
    for a bug in the checker; `replay_command` replaces the regression file the run wrote where the failure came
    from a file already (`ckpt-model replay FILE`: replay it again with the same command)."""
    minimal = minimal_run_of(error)
    minimised = bool(of_kind(error, Kind.MINIMAL))
    shown = minimal if minimal is not None and minimised else error
    lines = [message_text(shown, with_traceback=with_traceback)]
    lines += of_kind(error, Kind.INTERMITTENT)
    if minimised:
        lines += of_kind(error, Kind.MINIMAL) + of_kind(error, Kind.MINIMAL_STEPS)
    else:
        lines += hypothesis_example(error) + of_kind(error, Kind.STEPS)
    lines += of_kind(error, Kind.NOT_MINIMISED) + of_kind(error, Kind.FOUND_RATE)
    if replay_command is not None:
        lines.append(f"Replay it again: {replay_command}")
    elif minimised:
        lines += of_kind(error, Kind.MINIMAL_REPLAY)
    else:
        lines += of_kind(error, Kind.REPLAY)
    lines += of_kind(error, Kind.MINIMAL_TIMELINE) if minimised else of_kind(error, Kind.TIMELINE)
    lines += of_kind(error, Kind.RUN_STORE)
    lines += details(shown, error)
    found_run = found_run_text(error) if minimised else []
    blob = hypothesis_blob(error)
    if verbose:
        lines += found_run + blob
    elif found_run:
        lines.append(VERBOSE_HINT)
    elif blob:
        lines.append(BLOB_HINT)
    return "\n".join(line for line in lines if line)


def details(shown: BaseException, error: BaseException) -> list[str]:
    """The run's history, backend calls and log tails (`shown`: the minimal run's when there is one), which paths
    are temporary, how Hypothesis replays it, and any note the checker did not tag."""
    found = [note for kind in (Kind.HISTORY, Kind.BACKEND_CALLS, Kind.LOG_TAILS) for note in of_kind(shown, kind)]
    found += of_kind(error, Kind.ARTIFACTS) or of_kind(shown, Kind.ARTIFACTS)
    found += of_kind(error, Kind.HYPOTHESIS_REPLAY) + untagged_others(error)
    return [DETAILS, *found] if found else []


def found_run_text(error: BaseException) -> list[str]:
    """The run the search found, before minimising (`--verbose`): its message, Hypothesis's example of it, its steps
    with the model's names, its history, backend calls and log tails."""
    lines = ["", "The example the search found, before minimising:", message_text(error)]
    lines += hypothesis_example(error) + of_kind(error, Kind.STEPS)
    for kind in (Kind.HISTORY, Kind.BACKEND_CALLS, Kind.LOG_TAILS):
        lines += of_kind(error, kind)
    return lines


def message_text(error: BaseException, *, with_traceback: bool = False) -> str:
    """The exception's type and message (its traceback too with `with_traceback`), without its notes."""
    described = traceback.TracebackException.from_exception(error)
    described.__notes__ = None  # the notes are printed in the report's own order
    lines = described.format() if with_traceback else described.format_exception_only()
    return "".join(lines).rstrip()


def _untagged(error: BaseException) -> list[str]:
    """The notes the checker did not add, without the blank lines Hypothesis puts before some."""
    return [note.strip("\n") for kind, note in tagged(error) if kind is None]


def hypothesis_example(error: BaseException) -> list[str]:
    """The failing example Hypothesis put on the error (the notes that hold it, in order)."""
    return [note for note in _untagged(error) if note.startswith(EXAMPLE_STARTS)]


def hypothesis_blob(error: BaseException) -> list[str]:
    """Hypothesis's `@reproduce_failure` line: tied to its version and the checker's code, so only with --verbose."""
    return [note for note in _untagged(error) if note.startswith(BLOB_STARTS)]


def untagged_others(error: BaseException) -> list[str]:
    """Notes neither the checker tagged nor Hypothesis's example and blob: printed with the details, never lost."""
    return [note for note in _untagged(error) if note and not note.startswith(EXAMPLE_STARTS + BLOB_STARTS)]
