"""The failure report as a person reads it: the minimal failure first, the details after, the unminimised example and
Hypothesis's blob only with --verbose; on hand-built exceptions and notes, without a search."""

from __future__ import annotations

from ckpt_model.properties.durability import P9Violation
from ckpt_model.results import notes
from ckpt_model.results.failure_text import BLOB_HINT, VERBOSE_HINT, failure_text
from ckpt_model.results.notes import Kind
from ckpt_model.results.reproduction import Rate, record
from ckpt_model.results.verdicts import failure_report, quiet_line

REPLAY = "Replay without Hypothesis (survives code edits): ckpt-model replay regressions/P9-native.json"
EXAMPLE = "Failing test case: <state machine>\nstate = M()\nstate.dispatch(worker=0)\nstate.a()\nstate.teardown()"
BLOB = "\nYou can reproduce this test case by temporarily adding @reproduce_failure('6.1', b'AX') as a decorator"


def run(observed: str, steps: str, history: str) -> P9Violation:
    """A failing run's exception with the notes `report.annotate` tags."""
    error = P9Violation(rollout=None, expected="c1 verifies", observed=observed)
    notes.add(error, Kind.STEPS, f"Steps (model names):\n{steps}")
    notes.add(error, Kind.HISTORY, f"History (last events):\n{history}")
    notes.add(error, Kind.BACKEND_CALLS, "Backend calls (message counts per capture key): {}")
    notes.add(error, Kind.LOG_TAILS, "Server log tails:\n--- agent (agent.log)")
    notes.add(error, Kind.HYPOTHESIS_REPLAY, "Under Hypothesis: rerunning the test ...")
    notes.add(error, Kind.REPLAY, REPLAY)
    notes.add(error, Kind.TIMELINE, "Timeline of the failing history (open in a browser): P9-native.html")
    notes.add(error, Kind.ARTIFACTS, "The checkpoint directories and server logs named above are temporary")
    return error


def found_then_minimised() -> P9Violation:
    """The run the search found (with Hypothesis's example and blob), then minimised as `minimise_error` does."""
    found = run("found-observed", "  1. dispatch() -> r0\n  ...\n  12. prepare() -> c2", "#40 found-history")
    found.add_note(EXAMPLE)
    found.add_note(BLOB)
    notes.add(found, Kind.FOUND_RATE, "Reproduction: P9 in 10 of 10 replays of the run the search found")
    minimal = run("minimal-observed", "  1. dispatch() -> r0\n  2. unreachable(victim=0): prepare() -> c1", "#3 mini")
    notes.keep_minimal_run(found, minimal)
    notes.add(
        found, Kind.MINIMAL, "Minimal failing sequence (12 -> 2 steps):\nstate = M()\nstate.a()\nstate.teardown()"
    )
    notes.add(found, Kind.MINIMAL_STEPS, notes.of_kind(minimal, Kind.STEPS)[0].replace("Steps", "Minimal steps", 1))
    notes.add(found, Kind.MINIMAL_REPLAY, REPLAY)  # the same file, rewritten: the same words as the run's note
    notes.add(found, Kind.MINIMAL_TIMELINE, "Timeline of the minimal run (open in a browser): P9-native.html")
    record(found, Rate("P9", 10, 10))
    return found


def positions(text: str, *parts: str) -> list[int]:
    return [text.index(part) for part in parts]


def test_the_minimal_failure_comes_first_then_the_details_and_no_unminimised_example() -> None:
    text = failure_text(found_then_minimised())

    order = positions(
        text,
        "P9Violation: P9",
        "observed: minimal-observed",
        "Minimal failing sequence",
        "Minimal steps (model names):\n  1. dispatch() -> r0\n  2. unreachable(victim=0)",
        "Reproduction: P9 in 10 of 10",
        REPLAY,
        "Timeline of the minimal run",
        "Details:",
        "#3 mini",
        "Server log tails:",
        "are temporary",
        "Under Hypothesis",
        VERBOSE_HINT,
    )
    assert order == sorted(order)
    assert text.count(REPLAY) == 1  # the run's own note names the same file: printed once
    for unminimised in ("found-observed", "#40 found-history", "Failing test case", "12. prepare()", "@reproduce_fai"):
        assert unminimised not in text.replace(VERBOSE_HINT, "")


def test_verbose_adds_the_example_the_search_found_and_the_blob_after_the_details() -> None:
    text = failure_text(found_then_minimised(), verbose=True)

    order = positions(
        text,
        "observed: minimal-observed",
        "Minimal steps",
        "Details:",
        "The example the search found, before minimising:",
        "observed: found-observed",
        "Failing test case",
        "12. prepare() -> c2",
        "#40 found-history",
        "@reproduce_failure('6.1'",
    )
    assert order == sorted(order)
    assert VERBOSE_HINT not in text


def test_without_a_minimiser_hypothesis_example_is_the_failing_example_and_the_blob_is_verbose_only() -> None:
    error = run("seen", "  1. dispatch() -> r0", "#1 history")
    error.add_note(EXAMPLE)
    error.add_note(BLOB)

    text = failure_text(error)

    order = positions(text, "observed: seen", "Failing test case", "Steps (model names)", REPLAY, "Details:")
    assert order == sorted(order)
    assert "@reproduce_failure" not in text.replace(BLOB_HINT, "")
    assert text.endswith(BLOB_HINT)
    assert failure_text(error, verbose=True).endswith(BLOB.strip())


def test_a_replay_names_the_file_it_replayed_and_an_untagged_note_is_kept_with_the_details() -> None:
    error = run("seen", "  1. dispatch() -> r0", "#1 history")
    error.add_note("Some note nobody tagged")

    text = failure_text(error, replay_command="ckpt-model replay my.json")

    assert "Replay it again: ckpt-model replay my.json" in text
    assert REPLAY not in text
    assert text.index("Details:") < text.index("Some note nobody tagged")


def test_the_whole_report_says_the_minimal_failure_under_its_rate() -> None:
    code, text = failure_report(found_then_minimised())

    assert code == 1
    assert "=== property violation 1 of 1: P9 in 10 of 10 replays ===\n" in text
    assert "found-observed" not in text
    assert "found-observed" in failure_report(found_then_minimised(), verbose=True)[1]


def test_quiet_says_one_failure_in_one_line_with_its_replay_command() -> None:
    line = quiet_line(found_then_minimised(), "native with resume_deletes_records", "regressions/P9-native.json")

    assert line == (
        "FAILED P9 native with resume_deletes_records: checkpoints are durable and immutable: every committed "
        "checkpoint verifies and never changes (P9 in 10 of 10 replays, 1 step) "
        "replay: ckpt-model replay regressions/P9-native.json"
    )
    assert "\n" not in quiet_line(RuntimeError("a\nb"), "native")
    assert quiet_line(RuntimeError("a\nb"), "native").startswith("COULD NOT JUDGE RuntimeError native: a (")
