"""Faults the checker arms at run time, each through a `/_ctl` route of the server it acts in: failpoints, hooks
that raise, storage faults, lost replies, timeouts that follow a moved wall clock, and the journal a power cut
reads. The planted bugs a deployment starts with are another catalogue (`fakes.faults`).

A failure raised on the checker's request carries `INJECTED_MARK` in its message, so the server's log and its reply
say it was injected, not a bug of the server (the checker's report reads the same words in the log).
"""

INJECTED_MARK = "injected by the checker"


def blame(exc: BaseException) -> str:
    """Whose failure an unexpected exception is, as a 500's detail says it: one the checker asked for (its message
    carries `INJECTED_MARK`), or a bug of the server."""
    if INJECTED_MARK in str(exc):
        return "a failure the checker injected on purpose, not a server bug; see the server log"
    return "this is a server bug, see the server log"
