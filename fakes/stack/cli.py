"""Launch a look-alike Gym deployment: the fake backend plus the Gym servers, each in its own process group.

`python -m fakes.stack --topology native|legacy|counter|slow|mixed --state-dir DIR [--backend-url URL] [--faults
a,b] [--no-fork-server] [--verify-mode wait|replay] [--lease-grace-s S] [--token-capture [--generation-cuts]]
[--policy-workers N]` (or `ckpt-model stack ...`) starts everything, writes `DIR/deployment.json` and stays in the
foreground until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from fakes.gym.config import DEFAULT_LEASE_GRACE_S, lease_grace
from fakes.processes.server_processes import StackStartError
from fakes.stack.head import serve_head
from fakes.stack.launcher import VERIFY_MODES, Stack, policy_workers_count, server_workers_count
from fakes.stack.topologies import TOPOLOGIES


def main(argv: list[str] | None = None, prog: str = "python -m fakes.stack") -> int:
    """Run one deployment until SIGTERM or SIGINT: 0 once it stopped, 1 if it did not start (argparse exits 2).

    `prog` is the command its usage and errors name: the checker's `ckpt-model stack` passes its own."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="native")
    parser.add_argument("--state-dir", type=Path, required=True, help="logs, checkpoints, deployment.json")
    parser.add_argument("--backend-url", help="use a running backend (one that survived a crash) instead")
    parser.add_argument("--faults", default="", help="comma-separated fault names (see fakes.faults)")
    parser.add_argument("--token", help="control bearer token (default: a fresh random one)")
    parser.add_argument(
        "--head-port", type=int, help="also serve a look-alike of Gym's head server (its global config) on this port"
    )
    parser.add_argument(
        "--no-fork-server", action="store_true", help="cold-start every Gym server (slow restarts; the fallback)"
    )
    parser.add_argument(
        "--verify-mode", choices=VERIFY_MODES, default="wait", help="how a checkpoint treats verification in flight"
    )
    parser.add_argument(
        "--lease-grace-s",
        type=lease_grace,
        default=DEFAULT_LEASE_GRACE_S,
        help="seconds a checkpoint's lease outlives the last call's deadline (default %(default)s)",
    )
    parser.add_argument(
        "--token-capture", action="store_true", help="the policy model keeps a capture ledger (its own bearer token)"
    )
    parser.add_argument(
        "--generation-cuts", action="store_true", help="a prepare cuts generations in flight (needs --token-capture)"
    )
    parser.add_argument(
        "--policy-workers",
        type=policy_workers_count,
        default=1,
        help="uvicorn worker processes of the policy model server, behind its one port (default %(default)s)",
    )
    parser.add_argument(
        "--server-workers",
        type=server_workers_count,
        default=1,
        help="uvicorn worker processes of each environment, agent and resources server (default %(default)s)",
    )
    parser.add_argument(
        "--time-jumps",
        action="store_true",
        help="every server's monotonic clock follows its libfaketime offset too, so time can pass (no skews then)",
    )
    args = parser.parse_args(argv)
    if args.generation_cuts and not args.token_capture:
        parser.error("--generation-cuts needs --token-capture")
    faults = tuple(name for name in args.faults.split(",") if name)
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    stack = Stack(
        args.topology,
        args.state_dir,
        backend_url=args.backend_url,
        faults=faults,
        token=args.token,
        fork_server=not args.no_fork_server,
        verify_mode=args.verify_mode,
        lease_grace_s=args.lease_grace_s,
        token_capture=args.token_capture,
        generation_cuts=args.generation_cuts,
        policy_workers=args.policy_workers,
        server_workers=args.server_workers,
        time_jumps=args.time_jumps,
    )
    try:
        if args.backend_url is None:
            stack.start_backend()
        stack.start_gym()
        description = stack.describe()
        if args.head_port is not None:
            description["head"] = {"url": f"http://127.0.0.1:{args.head_port}"}
        description_path = stack.state_dir / "deployment.json"
        # Whole or not at all: whoever polls for the file (a checker, a script, the tests) never reads it half-written.
        written = description_path.with_name(description_path.name + ".tmp")
        written.write_text(json.dumps(description, indent=2) + "\n")
        written.replace(description_path)
        print(f"deployment ready: {description_path}", flush=True)
        # Block the stop signals only now: children inherit the mask, and they must stay killable. SIGCHLD too:
        # a server killed from outside must be reaped at once, or its process group never disappears.
        waited = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
        signal.pthread_sigmask(signal.SIG_BLOCK, waited)
        # Started after the mask, so its thread inherits it and every stop signal still reaches the sigwait.
        head = None
        if args.head_port is not None:
            head = serve_head("127.0.0.1", args.head_port, lambda: {n: s.url for n, s in stack.gym.items()})
        while not stop_requested and signal.sigwait(waited) == signal.SIGCHLD:
            stack.reap_exited()
        if head is not None:
            head.shutdown()
    except StackStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return 0
