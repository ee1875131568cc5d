"""The faults role: what a deployment can do to one server besides killing it, each a capability of its own.

- `Failpoints`: `arm_failpoint(name, point)` and `failpoint_reached(name, point)` stop one server's work at a named
  point until it is killed (`FAILPOINT_BETWEEN_FILES`: inside a commit, between the participant's records file
  and its manifest; `FAILPOINT_BEFORE_INSTALL`: inside a restore, just before the participant installs); without
  them a crash inside a commit only lands between participants, and no participant dies in its restore.
- `BreaksStorage`: one server's next checkpoint write fails or stalls at a named point (`STORAGE_POINTS`).
- `Pauses`: one server frozen (SIGSTOP) and let go (SIGCONT); the clocks role hears of it, since a frozen server
  takes no jump of its clock until it goes on.
- `FailsHooks`: one server's next call of a participant hook raises.
- `LosesReplies`: one server runs its next call of an operation in full and the reply is lost on the wire.

Without a capability the machine never draws the rules that need it (`Faults.can_*`). A capability that fails is a
`ControlCallFailed` naming the call (`ckpt_model.protocol.http.control_call`). The harness composes one `Faults`
(`harness.faults`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ckpt_model.deployments.clocks import Clocks
from ckpt_model.deployments.seam import Deployment, lacks
from ckpt_model.errors import HarnessError
from ckpt_model.protocol.http import control_call

# A deployment's failpoint inside a commit: between a participant's records file and its manifest.
FAILPOINT_BETWEEN_FILES = "commit.between_files"
# ... and inside a restore: admission closed, the records read and validated, nothing installed yet.
FAILPOINT_BEFORE_INSTALL = "restore.before_install"
# A deployment's storage faults (`BreaksStorage`): the named points of a participant's write, in the order it
# passes them (the records lines, their fsync, the manifest's temporary file, the manifest's link once the
# records carry their digest name), and how the write meets its fault there: the disk full or failing for that
# one write, or stalled until released. A stall never stands at the link, where a resume must wait for it.
STORAGE_POINTS = ("records.write", "records.fsync", "manifest.write", "manifest.link")
STALL_POINTS = STORAGE_POINTS[:3]
STORAGE_FAILURES = ("ENOSPC", "EIO")
STALL = "stall"
# A commit can also meet a pause: its participant frozen (`Pauses`) until the commit's deadline passed.
PAUSE = "pause"
# The participant hooks a deployment can make fail once (`FailsHooks`): closing admission (after it closed), the
# export of a commit, the install of a restore (before it installed anything).
HOOKS = ("close", "export", "install")
# A commit can meet its export hook failing (`FailsHooks`), as it meets a storage fault.
EXPORT_HOOK = "export"
# The operations whose reply a deployment can lose after the participant ran them (`LosesReplies`).
LOSABLE_OPERATIONS = ("prepare", "commit", "resume")


@runtime_checkable
class Failpoints(Protocol):
    """Stop one server's work at a named point until it is killed, and say whether it got there."""

    def arm_failpoint(self, name: str, point: str) -> None: ...

    def failpoint_reached(self, name: str, point: str) -> bool: ...


@runtime_checkable
class BreaksStorage(Protocol):
    """Fail (ENOSPC, EIO: once) or stall one server's next checkpoint write at a named point; say what is armed,
    where a write stalled and how many writes run; let a stalled write go on."""

    def break_storage(self, name: str, point: str, how: str) -> None: ...

    def storage_state(self, name: str) -> dict[str, Any]: ...

    def release_storage(self, name: str) -> None: ...


@runtime_checkable
class Pauses(Protocol):
    """Freeze one server (SIGSTOP its processes: a GC pause, a frozen VM) and let it go on (SIGCONT); each returns
    once the signal landed on every process of it."""

    def pause_server(self, name: str) -> None: ...

    def continue_server(self, name: str) -> None: ...


@runtime_checkable
class LosesReplies(Protocol):
    """Let one server run its next call of an operation in full and lose the reply on the wire; say how many
    replies it lost."""

    def lose_reply(self, name: str, operation: str) -> None: ...

    def lost_replies(self, name: str) -> int: ...


@runtime_checkable
class FailsHooks(Protocol):
    """Make one server's next call of a hook (close, export, install) raise; say how many failed."""

    def fail_hook(self, name: str, hook: str) -> None: ...

    def failed_hooks(self, name: str) -> int: ...


class Faults:
    """The faults one deployment can make, each refused with a `HarnessError` where the deployment lacks it (the
    machine only asks where `can_*` said yes). `label` names the deployment in that error; `clocks` hears which
    servers are frozen."""

    def __init__(self, deployment: Deployment, clocks: Clocks, label: Callable[[], str]) -> None:
        self.deployment = deployment
        self.clocks = clocks
        self._label = label

    @property
    def can_stop_inside_commit(self) -> bool:
        return isinstance(self.deployment, Failpoints)

    def arm_failpoint(self, name: str, point: str) -> None:
        failpoints = self._failpoints()
        with control_call(f"arming failpoint {point} in {name}", capability=f"arm_failpoint({name!r}, {point!r})"):
            failpoints.arm_failpoint(name, point)

    def failpoint_reached(self, name: str, point: str) -> bool:
        failpoints = self._failpoints()
        doing = f"asking {name} whether its work reached failpoint {point}"
        with control_call(doing, capability=f"failpoint_reached({name!r}, {point!r})"):
            return bool(failpoints.failpoint_reached(name, point))

    @property
    def can_break_storage(self) -> bool:
        return isinstance(self.deployment, BreaksStorage)

    def break_storage(self, name: str, point: str, how: str) -> None:
        storage = self._storage()
        doing = f"breaking {name}'s next checkpoint write at {point} ({how})"
        with control_call(doing, capability=f"break_storage({name!r}, {point!r}, {how!r})"):
            storage.break_storage(name, point, how)

    def storage_state(self, name: str) -> dict[str, Any]:
        storage = self._storage()
        with control_call(f"reading {name}'s storage faults", capability=f"storage_state({name!r})"):
            return dict(storage.storage_state(name))

    def release_storage(self, name: str) -> None:
        storage = self._storage()
        with control_call(f"releasing {name}'s stalled write", capability=f"release_storage({name!r})"):
            storage.release_storage(name)

    @property
    def can_pause(self) -> bool:
        return isinstance(self.deployment, Pauses)

    def pause_server(self, name: str) -> None:
        pausing = self._pausing()
        with control_call(f"freezing {name} (SIGSTOP)", capability=f"pause_server({name!r})"):
            pausing.pause_server(name)
        self.clocks.freeze(name)

    def continue_server(self, name: str) -> None:
        """SIGCONT `name`; if time jumped while it was frozen, its clock jumps too before this returns, and its
        timers fall due as after a real pause that long (`Clocks.jump_to`)."""
        pausing = self._pausing()
        with control_call(f"letting {name} go on (SIGCONT)", capability=f"continue_server({name!r})"):
            pausing.continue_server(name)
        self.clocks.thaw(name)

    @property
    def can_lose_replies(self) -> bool:
        return isinstance(self.deployment, LosesReplies)

    def lose_reply(self, name: str, operation: str) -> None:
        losing = self._losing_replies()
        doing = f"arming a lost reply to {name}'s next {operation}"
        with control_call(doing, capability=f"lose_reply({name!r}, {operation!r})"):
            losing.lose_reply(name, operation)

    def lost_replies(self, name: str) -> int:
        losing = self._losing_replies()
        with control_call(f"reading how many replies {name} lost", capability=f"lost_replies({name!r})"):
            return int(losing.lost_replies(name))

    @property
    def can_fail_hooks(self) -> bool:
        return isinstance(self.deployment, FailsHooks)

    def fail_hook(self, name: str, hook: str) -> None:
        failing = self._failing_hooks()
        with control_call(f"arming {name}'s {hook} hook to fail", capability=f"fail_hook({name!r}, {hook!r})"):
            failing.fail_hook(name, hook)

    def failed_hooks(self, name: str) -> int:
        failing = self._failing_hooks()
        with control_call(f"reading how many hooks of {name} failed", capability=f"failed_hooks({name!r})"):
            return int(failing.failed_hooks(name))

    def _lacks(self, what: str) -> HarnessError:
        return HarnessError(lacks(self._label(), what))

    def _failpoints(self) -> Failpoints:
        deployment = self.deployment
        if not isinstance(deployment, Failpoints):
            raise self._lacks("arm_failpoint(name, point) and failpoint_reached(name, point)")
        return deployment

    def _storage(self) -> BreaksStorage:
        deployment = self.deployment
        if not isinstance(deployment, BreaksStorage):
            raise self._lacks("break_storage(name, point, how), storage_state(name), release_storage(name)")
        return deployment

    def _pausing(self) -> Pauses:
        deployment = self.deployment
        if not isinstance(deployment, Pauses):
            raise self._lacks("pause_server(name) and continue_server(name)")
        return deployment

    def _failing_hooks(self) -> FailsHooks:
        deployment = self.deployment
        if not isinstance(deployment, FailsHooks):
            raise self._lacks("fail_hook(name, hook) and failed_hooks(name)")
        return deployment

    def _losing_replies(self) -> LosesReplies:
        deployment = self.deployment
        if not isinstance(deployment, LosesReplies):
            raise self._lacks("lose_reply(name, operation) and lost_replies(name)")
        return deployment
