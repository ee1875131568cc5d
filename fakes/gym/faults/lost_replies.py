"""Lost replies: a control call the server performs in full, whose reply never reaches the caller.

The checker arms one operation (`POST /_ctl/lost-replies`, `{"operation": "commit"}`, with the control bearer); the
next call of it runs as usual, its result is recorded as usual, and then the reply is cut off on the wire: the status
line goes out, the body never does, and the connection closes. The caller sees a transport failure and cannot tell
whether the call took effect; Gym's client makes it an error and the controller recovers by retrying or resuming
(reference section 4). `GET /_ctl/lost-replies` says what is armed and how many replies were lost, so the checker
learns that the reply was lost there and not somewhere else. Only the look-alike has the routes; on a real Gym a
proxy in front of one participant does the same.
"""

from __future__ import annotations

from typing import Literal, get_args

from starlette.types import Receive, Scope, Send

from fakes.gym.faults.one_shots import OneShots

# The operations whose reply can be lost: those a controller retries or follows with a resume.
LosableOperation = Literal["prepare", "commit", "resume"]
LOSABLE: tuple[str, ...] = get_args(LosableOperation)


class LostReplies(OneShots):
    """The operations armed in one server and how many replies it lost; `take(operation)` is asked once per
    answered call and says whether its reply is to be lost."""

    def __init__(self) -> None:
        super().__init__(LOSABLE, "losable operation", "lost")


async def cut_off_reply(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI response that sends its status line and never its body: uvicorn then closes the connection (an
    application that returns mid-response), so the caller reads a reply that ends before it began."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
