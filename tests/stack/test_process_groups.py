"""`fakes.processes.process_groups`: a killed group is waited for until it is gone, zombie leader included."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.processes import process_groups
from fakes.processes.server_processes import ServerProcess, kill_groups
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


@processes
def test_kill_groups__a_crash_of_several_groups_stops_every_one_before_it_kills_any(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A server killed first closes its sockets; a peer still running would answer its clients about that death.
    Stopped first, no group runs between the first kill and the last."""
    leaders = [subprocess.Popen(SLEEPER, start_new_session=True) for _ in range(3)]
    servers = [
        ServerProcess(
            name=f"s{index}", url="", kind=None, pid=leader.pid, log_path=tmp_path / f"s{index}.log", process=leader
        )
        for index, leader in enumerate(leaders)
    ]
    sent: list[tuple[int, int]] = []
    real_kill = process_groups.kill

    def recorded_kill(pgid: int, sig: int = signal.SIGKILL) -> None:
        sent.append((pgid, sig))
        real_kill(pgid, sig)

    monkeypatch.setattr(process_groups, "kill", recorded_kill)
    try:
        kill_groups(servers)
    finally:
        for leader in leaders:
            leader.kill()
            leader.wait()
    pgids = [leader.pid for leader in leaders]
    assert sent == [(pgid, signal.SIGSTOP) for pgid in pgids] + [(pgid, signal.SIGKILL) for pgid in pgids]
    assert [leader.returncode for leader in leaders] == [-signal.SIGKILL] * 3


@processes
def test_kill_groups__a_polite_stop_is_not_frozen_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SIGTERM lets a server shut down cleanly; a stopped one could not act on it."""
    leader = subprocess.Popen(SLEEPER, start_new_session=True)
    other = subprocess.Popen(SLEEPER, start_new_session=True)
    servers = [
        ServerProcess(name=name, url="", kind=None, pid=process.pid, log_path=tmp_path / f"{name}.log", process=process)
        for name, process in (("a", leader), ("b", other))
    ]
    sent: list[int] = []
    real_kill = process_groups.kill

    def recorded_kill(pgid: int, sig: int = signal.SIGKILL) -> None:
        sent.append(sig)
        real_kill(pgid, sig)

    monkeypatch.setattr(process_groups, "kill", recorded_kill)
    try:
        kill_groups(servers, signal.SIGTERM)
    finally:
        for process in (leader, other):
            process.kill()
            process.wait()
    assert sent == [signal.SIGTERM, signal.SIGTERM]
