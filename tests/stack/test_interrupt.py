"""Ctrl-C or SIGTERM in the middle of a checker run leaves nothing behind: no process, no listening port, no
directory.

A whole pytest run is started in its own process group, as a terminal starts a foreground job; its test starts a
harness (backend, fork server, four Gym servers and their four standbys), writes down what it started, and waits.
Ctrl-C is SIGINT to that process group, and a CI job's timeout or `kill` sends SIGTERM to it: the servers each lead
their own group, so only pytest sees it, and its cleanup must reach them. SIGTERM unwinds only with the plugin
`ckpt_model.interrupts`, which this project's pytest configuration loads (and the inner run here names).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.stack.conftest import process_gone, wait_until
from tests.stacks_dump import default_sigint, stacks_of

INTERRUPTED_RUN_TIMEOUT_S = 60

pytestmark = pytest.mark.processes

INNER_TEST = textwrap.dedent(
    """
    import json, os, threading
    from pathlib import Path

    from ckpt_model.deployments.harness import Harness


    def test_started_then_interrupted():
        harness = Harness.embedded("native")
        harness.begin_example()
        stack = harness.deployment.stack
        stack.fork_server.wait_idle()  # its standby servers for the next start are forked and built
        children = []
        for entry in Path("/proc").iterdir():
            try:  # a process may exit between the listing and the read
                parent = (entry / "stat").read_text().rpartition(")")[2].split()[1]
            except OSError:
                continue
            if entry.name.isdigit() and parent == str(stack.fork_server.pid):
                children.append(int(entry.name))
        assert len(children) == 8, children  # four servers, four standbys
        started = {
            "pids": [stack.backend.pid, stack.fork_server.pid, *children],
            "ports": [int(url.rsplit(":", 1)[1]) for url in [stack.backend_url, *(s.url for s in stack.gym.values())]],
            "root": str(harness.root),
            "deployment_root": str(harness.deployment.root),
        }
        # Written beside and renamed: the outer test reads it as soon as the name exists.
        partial = Path(os.environ["STARTED_FILE"] + ".partial")
        partial.write_text(json.dumps(started))
        partial.rename(os.environ["STARTED_FILE"])
        threading.Event().wait()  # until Ctrl-C
    """
)


def interrupt(run: subprocess.Popen[bytes], started_file: Path, signum: int) -> str:
    """Send `signum` to the inner run's group once its harness is up; its output (it must end; a hang shows its
    stacks)."""
    try:
        wait_until(lambda: started_file.exists() or run.poll() is not None, "the inner run to start its harness")
        assert started_file.exists(), run.communicate()[0].decode(errors="replace")
        started = json.loads(started_file.read_text())
        assert not any(process_gone(pid) for pid in started["pids"])
        assert Path(started["root"]).is_dir()
        assert Path(started["deployment_root"]).is_dir()
        os.killpg(run.pid, signum)
        try:
            return run.communicate(timeout=INTERRUPTED_RUN_TIMEOUT_S)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            name = signal.Signals(signum).name
            pytest.fail(f"the inner run did not stop after {name}; its stacks:\n{stacks_of(run.pid)}")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def port_free(port: int) -> bool:
    """Nothing listens on it. SO_REUSEADDR, as every server here binds: closed connections in TIME_WAIT may
    outlive their process for a minute, and do not keep a server from binding the port again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_during_a_run_leaves_no_process_port_or_directory(tmp_path: Path, signum: int) -> None:
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(INNER_TEST)
    started_file = tmp_path / "started.json"
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    env = {**os.environ, "STARTED_FILE": str(started_file), "TMPDIR": str(temp_root)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(test_file)]
    argv += ["-p", "ckpt_model.interrupts"]
    with subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    ) as run:
        output = interrupt(run, started_file, signum)
        started = json.loads(started_file.read_text())

    assert "KeyboardInterrupt" in output or "Interrupted" in output, output
    wait_until(lambda: all(process_gone(pid) for pid in started["pids"]), "every started process to be gone", 10)
    assert all(port_free(port) for port in started["ports"]), started["ports"]
    assert not Path(started["root"]).exists()
    assert not Path(started["deployment_root"]).exists()
    assert list(temp_root.iterdir()) == [], "the run left files in its temporary directory"
