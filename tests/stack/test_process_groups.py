"""`fakes.process_groups`: a killed group is waited for until it is gone, zombie leader included."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from fakes import process_groups
from tests.stack.conftest import wait_until

processes = pytest.mark.processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@processes
def test_wait_gone__a_zombie_leader_keeps_the_group_until_reaped() -> None:
    leader = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        process_groups.kill(leader.pid)
        wait_until(lambda: process_groups.process_state(leader.pid) == "Z", "the killed leader to be a zombie")
        assert not process_groups.wait_gone(leader.pid, lambda: None, timeout_s=0.05)  # SPEC 11: a zombie counts
        assert process_groups.wait_gone(leader.pid, leader.poll, timeout_s=10.0)
        assert leader.returncode == -signal.SIGKILL
        assert process_groups.process_state(leader.pid) is None
    finally:
        leader.kill()
        leader.wait()


@processes
def test_members__names_who_is_left_in_a_stuck_group() -> None:
    leader = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        assert f"pid {leader.pid} state " in process_groups.members(leader.pid)
    finally:
        process_groups.kill(leader.pid)
        leader.wait()
    assert process_groups.members(leader.pid) == "no members visible"
    process_groups.kill(leader.pid)  # a group that is gone already is no error
