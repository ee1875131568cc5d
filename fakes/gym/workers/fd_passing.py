"""Receiving a listening socket over a Unix socket pair (SCM_RIGHTS) inside an event loop: how a fork server's
standby and a multi-worker server's worker get the socket they serve on once it is theirs."""

from __future__ import annotations

import asyncio
import socket


async def receive_fds(channel: socket.socket, message_length: int) -> list[int]:
    """The descriptors of the next message on `channel` (none at end of stream), without blocking the loop."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(channel.fileno(), lambda: readable.done() or readable.set_result(None))
    try:
        await readable
    finally:
        loop.remove_reader(channel.fileno())
    _, fds, _, _ = socket.recv_fds(channel, message_length, 1)
    return list(fds)
