"""Checkers running side by side never share a port: a port stays reserved while the process that took it lives,
even while nothing listens on it (a Gym server between a crash and its restart)."""

from __future__ import annotations

import subprocess
import sys

from fakes.processes.ports import PORT_RANGE, free_port

TAKEN_HERE = 50
# About a quarter of the range: without the reservation, some of ours would be handed out again (about 12 on
# average; none at all about once in 100,000 runs).
ASKED_ELSEWHERE = 3000
OTHER_PROCESS = "from fakes.processes.ports import free_port; print(*(free_port() for _ in range({})))"


def test_another_process_never_gets_a_port_this_one_holds() -> None:
    ours = {free_port() for _ in range(TAKEN_HERE)}
    assert len(ours) == TAKEN_HERE
    assert all(PORT_RANGE[0] <= port < PORT_RANGE[1] for port in ours)

    code = OTHER_PROCESS.format(ASKED_ELSEWHERE)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    theirs = {int(port) for port in done.stdout.split()}

    assert len(theirs) == ASKED_ELSEWHERE
    assert not theirs & ours


def test_a_port_is_free_again_once_the_process_that_held_it_ended() -> None:
    code = OTHER_PROCESS.format(ASKED_ELSEWHERE)
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(first.stdout.split()) & set(second.stdout.split()), "the first process's locks outlived it"
