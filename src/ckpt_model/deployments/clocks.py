"""The clocks role: the controller's clock, and the servers' clocks where the deployment lets the checker move them.

- `SkewsClocks`: `skew_clock(name, offset_s)` moves one server's wall clock from the true time (its deadlines and
  lease are judged on it).
- `JumpsClocks`: `jump_clock(name, offset_s)` moves one server's wall and monotonic clocks forward together: time
  passes for it. `Clocks.pass_time` moves every server at once and the controller's clock with them (read with
  `Clocks.now()`), and a fresh server is moved to the time that passed; without it no episode's budget sees time
  pass.
- Owned time: a deployment that skews clocks or jumps them owns its servers' time, and every wait for a deadline or
  a lease becomes a jump of every clock to it (`Clocks.jump_to`): the wall clocks alone on a skewing deployment
  (each server's offset is the time that passed plus its skew), wall and monotonic on a jumping one; without
  either, such waits are real waits.

The harness composes one `Clocks` (`harness.clocks`): it tells it when an example begins, which servers are fresh
processes and which participants started anew; the faults role tells it which servers are frozen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from ckpt_model.deployments.seam import Deployment, lacks
from ckpt_model.errors import HarnessError
from ckpt_model.protocol.http import control_call

# A jump of the clocks to a deadline or a lease takes them this far past it: beyond the millisecond an offset is
# rounded to, so what falls due at that instant is due on every clock (`Clocks.jump_to`).
CLOCK_STEP_S = 0.002
# Where the checker owns time, a deadline it jumps past instead of waiting for leaves at least this much room: never
# waited out, so it costs nothing, and a staged prepare on a loaded machine still reaches every participant before
# it (5 s did not, at load 11-15), so the rule takes the branch it is drawn for whatever the machine's speed. Half
# the controller's usual deadline (60 s), so a lease it lets lapse still lapses before one renewed to that
# (`Clocks.room`).
OWNED_ROOM_S = 30.0


@runtime_checkable
class SkewsClocks(Protocol):
    """Move one server's wall clock from the true time (its deadlines and lease are judged on it); `skews_clocks`
    says whether this deployment can (the look-alike needs Debian's libfaketime)."""

    @property
    def skews_clocks(self) -> bool: ...

    def skew_clock(self, name: str, offset_s: float) -> float: ...


@runtime_checkable
class JumpsClocks(Protocol):
    """Let time pass for one server: move its wall and monotonic clocks forward together to `offset_s` ahead of the
    true time (its timers due by then fire; an episode's budget sees the time); `jumps_clocks` says whether this
    deployment can (the look-alike with `time_jumps` and Debian's libfaketime). The harness moves every server at
    once, and its own clock with them."""

    @property
    def jumps_clocks(self) -> bool: ...

    def jump_clock(self, name: str, offset_s: float) -> float: ...


class Clocks:
    """The clocks of one deployment's servers, and the controller's, as the checker moves them in an example.

    `label` names the deployment in an error; `participants` gives the names of the participants the controller
    knows (None: no Gym is running), whose clocks `pass_time` moves."""

    def __init__(
        self,
        deployment: Deployment,
        label: Callable[[], str],
        participants: Callable[[], Sequence[str] | None],
    ) -> None:
        self.deployment = deployment
        self._label = label
        self._participants = participants
        # How far every clock of the system has moved ahead of the true time in this example (`pass_time`,
        # `jump_to`); each server's own skew from the controller's clock (`skew_clock`) comes on top.
        self.time_passed_s = 0.0
        self._skews: dict[str, float] = {}
        # Frozen servers (`freeze`), and those among them a jump passed by while they could not take it.
        self._frozen: set[str] = set()
        self._left_behind: set[str] = set()

    @property
    def can_skew_clocks(self) -> bool:
        deployment = self.deployment
        return isinstance(deployment, SkewsClocks) and bool(deployment.skews_clocks)

    def skew_clock(self, name: str, offset_s: float) -> float:
        """Move `name`'s clock `offset_s` from the controller's (`now`; 0 puts it back); the time its clock reads
        right after."""
        if not self.can_skew_clocks:
            raise HarnessError(lacks(self._label(), "skews_clocks and skew_clock(name, offset_s)"))
        self._skews[name] = offset_s
        return self._set_offset(name)

    @property
    def can_jump_clocks(self) -> bool:
        deployment = self.deployment
        return isinstance(deployment, JumpsClocks) and bool(deployment.jumps_clocks)

    def now(self) -> float:
        """The controller's wall clock: the true time plus the time that passed in this example (`pass_time`).
        Every deadline the checker sends is reckoned on it."""
        return time.time() + self.time_passed_s

    @property
    def owns_time(self) -> bool:
        """Whether the checker moves every clock of the system, so a wait for a deadline or a lease is a jump
        (`jump_to`), not a wait."""
        return self.can_skew_clocks or self.can_jump_clocks

    def pass_time(self, seconds: float) -> dict[str, float]:
        """Let `seconds` pass for the whole system at once: every server's clocks jump that far forward, and so does
        the controller's (`now`). Returns the wall time each server's clock reads right after (a frozen server's
        clock jumps once it goes on)."""
        if seconds <= 0:
            raise ValueError(f"time only passes forward (got {seconds!r} s)")
        participants = self._participants()
        if participants is None:
            raise HarnessError("no Gym is running: time can only pass for servers the controller knows")
        if not self.owns_time:
            raise HarnessError(lacks(self._label(), "jumps_clocks and jump_clock(name, offset_s)"))
        self.time_passed_s += seconds
        self._left_behind |= self._frozen
        return {name: self._set_offset(name) for name in participants if name not in self._frozen}

    def room(self, seconds: float, at_least_s: float = OWNED_ROOM_S) -> float:
        """The seconds a deadline that is to pass is placed ahead: `seconds` where waits are real (each one is
        waited out), at least `at_least_s` where the checker owns time (it jumps past it)."""
        return max(seconds, at_least_s) if self.owns_time else seconds

    def jump_to(self, when_ts: float) -> bool:
        """Where the checker owns time (`owns_time`), let it pass until the controller's clock is past `when_ts`
        (nothing passes if it already is), every server's clock with it: what was due by then falls due now (a
        lease lapses, a request's deadline passes; the servers time their timers again from their clocks), as after
        a real wait that long. Whether the clocks are owned: if not, the caller waits in real time."""
        if not self.owns_time:
            return False
        self.pass_until(self.passed_at(when_ts))
        return True

    def passed_at(self, when_ts: float) -> float:
        """The time passed (`time_passed_s`) at which the controller's clock is past `when_ts` (`jump_to`)."""
        return max(self.time_passed_s, when_ts + CLOCK_STEP_S - time.time())

    def jump_one(self, name: str, passed_s: float) -> None:
        """Give server `name` alone the clock it has once `passed_s` passed (`passed_at`), before the rest of the
        system (`pass_until`): a server about to freeze, so that it wakes to it (a frozen process reads no clock,
        so its clock moved before it froze is the clock it wakes to after a real pause that long)."""
        if not self.owns_time or passed_s < self.time_passed_s:
            raise HarnessError(f"{name}'s clock can only jump ahead of the time passed ({self.time_passed_s:g} s)")
        passed_before, self.time_passed_s = self.time_passed_s, passed_s
        try:
            self._set_offset(name)
        finally:
            self.time_passed_s = passed_before

    def pass_until(self, passed_s: float) -> None:
        """Let time pass until `passed_s` passed in this example (`passed_at`); nothing if it already has."""
        if passed_s > self.time_passed_s:
            self.pass_time(passed_s - self.time_passed_s)

    # -- what the harness and the faults role tell the clocks ------------------------------------------------------

    def begin_example(self) -> None:
        """Fresh servers: the new example starts on the true time, with no clock skewed."""
        self.time_passed_s = 0.0
        self._skews.clear()

    def fresh(self, names: Iterable[str]) -> None:
        """Fresh processes of `names`: none is frozen or skewed any more."""
        for name in names:
            self._skews.pop(name, None)
            self._frozen.discard(name)
            self._left_behind.discard(name)

    def catch_up(self, participants: Iterable[str]) -> None:
        """Move freshly started `participants` to the time that passed in this example (a new process starts on the
        true time). Only participants, whose clocks `pass_time` moves: a server that is none (a relay) may have no
        clock to move."""
        if self.time_passed_s:
            for name in participants:
                self._set_offset(name)

    def freeze(self, name: str) -> None:
        """`name` is frozen (SIGSTOP): a jump passes it by until it goes on (`thaw`)."""
        self._frozen.add(name)

    def thaw(self, name: str) -> None:
        """`name` goes on (SIGCONT); if time jumped while it was frozen, its clock jumps too, and its timers fall due
        as after a real pause that long (`jump_to`)."""
        self._frozen.discard(name)
        if name in self._left_behind:
            self._left_behind.discard(name)
            self._set_offset(name)

    def _set_offset(self, name: str) -> float:
        """Give `name` its clock: the time that passed plus its skew, ahead of the true time. The time it reads."""
        deployment = self.deployment
        skew_s = self._skews.get(name, 0.0)
        offset_s = self.time_passed_s + skew_s
        doing = f"moving {name}'s clock {offset_s:+g} s from the true time ({self.time_passed_s:g} s passed"
        doing += f", skewed {skew_s:+g} s)" if skew_s else ")"
        if isinstance(deployment, JumpsClocks) and deployment.jumps_clocks:
            with control_call(doing, capability=f"jump_clock({name!r}, {offset_s:+g})"):
                return float(deployment.jump_clock(name, offset_s))
        if isinstance(deployment, SkewsClocks) and deployment.skews_clocks:
            with control_call(doing, capability=f"skew_clock({name!r}, {offset_s:+g})"):
                return float(deployment.skew_clock(name, offset_s))
        raise HarnessError(
            lacks(self._label(), "skews_clocks and skew_clock(name, offset_s), or jump_clock(name, offset_s)")
        )
