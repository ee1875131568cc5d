"""The nemesis's kills: every Gym process group SIGKILLed (with a power cut that keeps only what was fsynced), one
server killed and started again alone, one worker of a server killed alone.

Every rule that kills processes kills them here: the crashes' and the restarts' (`ckpt_model.trainer.nemeses.crashes`),
and, through the `crash` rule, each rule that restores into fresh processes. Each kill is journaled through the
controller, so the watchers hear of every process that died, and ends where the model can predict it: every `/run`
a crash cut off has ended, and the calls it left waiting at the backend are released. Every other effect belongs
to the one family that causes it and lives in its module of `ckpt_model.trainer.nemeses` (a commit held between its
files, a write that fails or stalls, a participant frozen past a deadline, a hook that raises, a damaged copy, ...).
"""

from __future__ import annotations

from ckpt_model.deployments.lifecycle import Lifecycle
from ckpt_model.protocol.client import Participant
from ckpt_model.trainer.controller import Controller


class Nemesis:
    """The kills, journaled through the controller; counts the crashes for the search statistics."""

    def __init__(self, harness: Lifecycle, controller: Controller) -> None:
        self.harness = harness
        self.controller = controller
        self.crashes = 0
        self.crashes_inside = 0

    @property
    def timeout_s(self) -> float:
        return self.controller.quiescence.timeout_s

    def crash(self, *, inside: bool = False, power_loss: bool = False) -> None:
        """SIGKILL every Gym process group and start fresh processes (the backend and the disk survive)."""
        invocation = self.controller.invoke("crash", "power loss" if power_loss else None)
        self.crashes += 1
        self.crashes_inside += inside
        self.harness.crash(power_loss)
        self.controller.crashed(tuple(self.controller.control.participants), invocation)
        self.controller.runs.wait_ended(self.timeout_s)
        self.controller.release_stale()

    def restart(self, member: Participant) -> None:
        """SIGKILL one participant alone and start it again: it comes back idle and empty."""
        invocation = self.controller.invoke("crash", member.name)
        self.harness.restart_server(member.name)
        self.controller.crashed((member,), invocation)

    def kill_worker(self, member: Participant, index: int) -> None:
        """SIGKILL worker `index` of `member`'s server alone: its coordinator and the other workers run on, and
        remember the marks and resumed IDs (the coordinator keeps them)."""
        invocation = self.controller.invoke("kill worker", f"{member.name}: worker {index}")
        self.harness.kill_worker(member.name, index)
        self.controller.complete(invocation, "ok")
