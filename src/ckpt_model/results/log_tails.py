"""The server log tails of a failure report, with the tracebacks of failures the checker injected labelled so.

A fault rule asks a participant to fail on purpose (a hook that raises, a write that fails with ENOSPC); the server
logs the traceback of that exception as it would log any, and a reader of the tails would take it for the bug. The
system under test marks the failures it raises on the checker's request with `INJECTED_MARK` in the exception's
message (the look-alike's own words, in `fakes/gym/faults`: the two sides agree on the log's text, never on shared
code). Each traceback ending in a marked exception is cut to its last line and labelled; nothing else changes.
"""

from __future__ import annotations

INJECTED_MARK = "injected by the checker"
HEADING = "Server log tails:"
INJECTED_LABEL = (
    "  [injected: the checker asked for this failure, it is no server bug; {lines} traceback lines left out, the full "
    "log has them]"
)


def label_injected(tails: str) -> str:
    """The tails under their heading, each traceback of an injected failure (`INJECTED_MARK`) replaced by the label
    and its exception's line; the heading says how many there were."""
    lines = tails.splitlines()
    shown: list[str] = []
    injected = 0
    for line in lines:
        if INJECTED_MARK in line and not line[:1].isspace():
            start = _traceback_start(shown)
            if start < len(shown):
                injected += 1
                left_out = len(shown) - start
                del shown[start:]
                shown.append(INJECTED_LABEL.format(lines=left_out))
        shown.append(line)
    heading = HEADING
    if injected:
        failures = "a failure" if injected == 1 else f"{injected} failures"
        heading = f"Server log tails ({failures} the checker injected on purpose, marked [injected]; not server bugs):"
    return "\n".join([heading, *shown])


def _traceback_start(lines: list[str]) -> int:
    """Where the traceback that ends after `lines` begins: back over its indented frame lines to its
    `Traceback (most recent call last):` line (or the tail's start, when the tail begins inside it)."""
    start = len(lines)
    while start > 0 and (lines[start - 1][:1].isspace() or lines[start - 1].startswith("Traceback (")):
        start -= 1
        if lines[start].startswith("Traceback ("):
            break
    return start
