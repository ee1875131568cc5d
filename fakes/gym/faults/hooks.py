"""Hook failures: a participant's own hook raises once, where Gym's servers call code the checkpointing does not own.

The checker arms one hook (`POST /_ctl/hooks`, `{"hook": "close"}`, with the control bearer): `close` fails after
admission closed (Gym's simulations have a `FaultyEnvironment` whose close fails after closing, reference
Appendix D), `export` raises instead of returning the records (a resources server's `export_session_states`),
`install` raises before installing anything (a hook that validates all and installs all or none, section 8.1).
Each fails once, as an unexpected exception inside the control route, which Gym answers with 500
`checkpoint_error`; its message ends with `INJECTED_MARK`, the words by which the server's log and reply (and the
checker's report, which reads them) tell a failure injected on request from a bug of the server. `GET /_ctl/hooks`
says what is armed and how many hooks failed. Only the look-alike has the routes; on a real Gym the hook is the
server's own code.
"""

from __future__ import annotations

from typing import Literal, get_args

from fakes.gym.faults import INJECTED_MARK
from fakes.gym.faults.one_shots import OneShots

Hook = Literal["close", "export", "install"]
HOOKS: tuple[str, ...] = get_args(Hook)


class HookFailure(RuntimeError):
    """What a failing hook raises: an exception the control plane did not expect."""


class HookFaults(OneShots):
    """The hooks armed in one server and how many failed; `hit` is called where the control plane calls a hook."""

    def __init__(self) -> None:
        super().__init__(HOOKS, "hook", "failed")

    def hit(self, hook: str) -> None:
        """Return at once unless `hook` is armed; else disarm it and raise `HookFailure`."""
        if self.take(hook):
            raise HookFailure(f"the participant's {hook} hook failed ({INJECTED_MARK})")
