"""The channel between the fork server (`fakes.processes.zygote`) and its owner
(`fakes.processes.zygote_client.ForkServer`).

The owner writes one JSON object per line to the fork server's stdin and reads one JSON reply per line from its
stdout:

    started                                     -> {"ready": true, "pid": P, "warm_up_ms": W}  (or "ready": false)
    {"op": "spawn", "servers": [{"name", "config", "log_path"}, ...]}  -> {"ok": true, "pids": {name: pid},
                                                   "serving": [name, ...]}: every pid leads its own process
                                                   group; the servers in "serving" (promoted standbys that said
                                                   so over their socket pair) already accept connections
    {"op": "exit_status", "pid": P}             -> {"ok": true, "exit_status": int | null}
    {"op": "prebuild", "servers": [{"name", "config", "log_path"}, ...]}  -> {"ok": true} once it has forked a
                                                   standby child per server, which builds its app and waits
    {"op": "ping"}                              -> {"ok": true} once every standby is built and waiting
    end of stdin (the owner closed it or died)  -> every child's group is killed and reaped, then it exits

A refused request gets {"ok": false, "error": "..."}. Requests are answered one at a time, in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any


def write_message(stream: IO[bytes], message: Mapping[str, Any]) -> None:
    """Send `message` as one JSON line, flushed at once: the other side is waiting for it."""
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()
