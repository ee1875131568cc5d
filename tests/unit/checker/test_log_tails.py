"""The server log tails of a report: a traceback of a failure the checker injected is labelled as injected (and cut
to its exception's line), never shown as a server bug; the look-alike marks its injected failures with the words
the checker reads."""

from __future__ import annotations

import pytest

from ckpt_model.results.log_tails import HEADING, INJECTED_MARK, label_injected
from fakes.gym.faults import blame
from fakes.gym.faults.hooks import HookFaults
from fakes.gym.faults.storage import StorageFaults

INJECTED = [
    "2026-12-06 10:50:06.808 ERROR checkpoint export failed on resources",
    "Traceback (most recent call last):",
    '  File "fakes/gym/control/work_runner.py", line 107, in run',
    "    return await operation()",
    "           ^^^^^^^^^^^^^^^^^",
    f"fakes.gym.faults.hooks.HookFailure: the participant's export hook failed ({INJECTED_MARK})",
    '2026-12-06 10:50:06.856 INFO 127.0.0.1:39078 "POST /ng-control/v1/checkpoint/forget HTTP/1.1" 200 OK',
]
BUG = [
    "Traceback (most recent call last):",
    '  File "server.py", line 3, in run',
    "KeyError: 'r0'",
]


def test_an_injected_traceback_is_cut_to_its_exception_and_labelled() -> None:
    text = label_injected("\n".join(["--- resources (resources.log)", *INJECTED, *BUG]))

    lines = text.splitlines()
    assert (
        lines[0] == "Server log tails (a failure the checker injected on purpose, marked [injected]; not server bugs):"
    )
    assert lines[2] == INJECTED[0]  # the server's own log line stays
    assert lines[3].startswith("  [injected: the checker asked for this failure, it is no server bug; 4 traceback")
    assert lines[4] == INJECTED[5]
    assert "return await operation()" not in text
    assert lines[-3:] == BUG  # a traceback without the mark is the server's: untouched


def test_a_tail_that_starts_inside_an_injected_traceback_is_labelled_too() -> None:
    text = label_injected("\n".join(["--- agent (agent.log)", *INJECTED[3:]]))

    assert text.splitlines()[2].startswith("  [injected: ")
    assert "2 traceback lines" in text


def test_tails_without_injected_failures_keep_the_plain_heading() -> None:
    assert label_injected("\n".join(BUG)) == "\n".join([HEADING, *BUG])
    marked_line = f"INFO reply detail: ... ({INJECTED_MARK})"
    assert label_injected(marked_line) == f"{HEADING}\n{marked_line}"  # no traceback above it: nothing to cut


def test_the_look_alike_marks_the_failures_it_injects_with_the_checker_s_words() -> None:
    hooks = HookFaults()
    hooks.arm("export")
    with pytest.raises(RuntimeError, match="export hook failed") as hook_failure:
        hooks.hit("export")
    storage = StorageFaults()
    storage.arm("records.write", "ENOSPC")
    with pytest.raises(OSError, match="ENOSPC") as write_failure:
        storage.hit("records.write")

    for raised in (hook_failure.value, write_failure.value):
        assert INJECTED_MARK in str(raised)
        assert blame(raised).startswith("a failure the checker injected on purpose, not a server bug")
    assert blame(KeyError("r0")) == "this is a server bug, see the server log"
