"""The deployment seam (Jepsen's db and nemesis split) and the harness the state machine drives through it.

Two small protocols say what the checker needs of a system under test:

- `Deployment`: start the backend once (None: there is no gated backend), start fresh Gym servers, crash every
  Gym process group, say where `/run` goes, show log tails, close. Failures to start are `OSError` or
  `RuntimeError` naming the server (a `HarnessError` of the deployment's own, such as a real Gym's
  `PreflightError`, passes through as it is). A deployment that may not be crashed says `crashes = False`
  (`Harness.can_crash`).
- `Gate`: the backend's control routes (Gym's fake backend, reference section 11): the call list, release chosen
  calls, reset, gate every call, pin the policy's script; with token capture also the token store (`staged`), the
  cut rounds (`cuts`) and a hung cut endpoint (`stall_cuts`). `BackendGate` speaks them over HTTP.

What a deployment can do beyond that is a capability of its own, a runtime-checkable protocol the harness checks
with `isinstance`; without one the machine never draws the rules that need it:

- `RestartsOne`: `restart_server(name)` crashes one server alone and starts it again (returns every server's URL,
  like `start_gym`); without it the machine never crashes one participant alone.
- `Failpoints`: `arm_failpoint(name, point)` and `failpoint_reached(name, point)` stop one server's work at a named
  point until it is killed (`FAILPOINT_BETWEEN_FILES`: inside a commit, between the participant's records file
  and its manifest; `FAILPOINT_BEFORE_INSTALL`: inside a restore, just before the participant installs); without
  them a crash inside a commit only lands between participants, and no participant dies in its restore.
- `JumpsClocks`: `jump_clock(name, offset_s)` moves one server's wall and monotonic clocks forward together: time
  passes for it. The harness moves every server at once and its own clock with them (`Harness.pass_time`, read with
  `Harness.now()`), and moves a fresh server to the time that passed; without it no episode's budget sees time pass.
- Owned time: a deployment that skews clocks (`SkewsClocks`) or jumps them owns its servers' time, and every wait
  for a deadline or a lease becomes a jump of every clock to it (`Harness.jump_to`): the wall clocks alone on a
  skewing deployment (each server's offset is the time that passed plus its skew), wall and monotonic on a jumping
  one; without either, such waits are real waits.
- `LosesUnsynced`: `lose_unsynced()`, after `crash_gym`, cuts the power: the checkpoint directories keep only what
  the writers made durable (fsynced); without it the machine never cuts the power.
- `RestartEnvironment`: `restart_run_url()`, where the `/run`s of restarts go (a topology with a restart
  environment: `mixed`'s second environment, bound to a `restart_only` resources server).
- `CapturesTokens`: `token_capture` (the policy model keeps capture ledgers, read with `capture_token` over the
  token-capture control routes), `generation_cuts` (closing admission cuts in-flight generations) and
  `clear_capture()`, which empties the capture directory while no Gym server runs (each example starts with no
  ledger); without them the machine checks neither P5 nor P12.
- `PolicyWorkers`: `policy_workers`, how many worker processes serve the policy model behind its one port (the
  checker treats them as one participant).
- `ServerWorkers`: `server_workers`, how many worker processes serve each environment, agent and resources server
  behind its port (each is still one participant).
- `PlacesCalls`: `place_calls(placement)`, with several workers: every request of capture key K (a generation
  call, an episode's or a session's) is served by worker `placement[K]` (an index, modulo the server's workers),
  whichever worker accepts it (`ckpt_model.trainer.placement`); without it the worker race is only observed, where the
  backend's call list names the worker.
- `KillsWorkers`: `kill_worker(name, index)`, SIGKILL one worker of a multi-worker server alone.

Which deployment to start is a `ckpt_model.model.spec.DeploymentSpec`: `Harness.embedded(spec)` hands its keywords to
the embedded system's deployment factory, and `harness.spec` is what everything else reads.

`src/` imports nothing from `fakes/`. The look-alike stack is found through the entry point group
`ckpt_model.systems` (name `embedded`), which hands over a deployment factory and its planted-fault catalogue;
`ckpt_model.deployments.gym` is a second implementation that drives a real Gym from its head server.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs
import httpx

from ckpt_model import timing
from ckpt_model.deployments.artifacts import CHECKPOINTS, LOGS, copy_logs
from ckpt_model.deployments.collection_run import CollectionRun
from ckpt_model.errors import CoordinationError, HarnessError, ServerStartError
from ckpt_model.model.spec import DeploymentSpec, FaultNeeds
from ckpt_model.protocol.client import BASE_TIMEOUT_S, ControlClient, new_http_client
from ckpt_model.protocol.get_round import GetRound
from ckpt_model.protocol.ledger import LedgerClient
from ckpt_model.protocol.wire import BackendCutStallWire

log = logging.getLogger(__name__)

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
# A jump of the clocks to a deadline or a lease takes them this far past it: beyond the millisecond an offset is
# rounded to, so what falls due at that instant is due on every clock (`Harness.jump_to`).
CLOCK_STEP_S = 0.002
# Where the checker owns time, a deadline it jumps past instead of waiting for leaves at least this much room: never
# waited out, so it costs nothing, and a request on a loaded machine still arrives before it (`Harness.room`).
OWNED_ROOM_S = 5.0
# A commit can also meet a pause: its participant frozen (`Pauses`) until the commit's deadline passed.
PAUSE = "pause"
# The participant hooks a deployment can make fail once (`FailsHooks`): closing admission (after it closed), the
# export of a commit, the install of a restore (before it installed anything).
HOOKS = ("close", "export", "install")
# A commit can meet its export hook failing (`FailsHooks`), as it meets a storage fault.
EXPORT_HOOK = "export"
# The operations whose reply a deployment can lose after the participant ran them (`LosesReplies`).
LOSABLE_OPERATIONS = ("prepare", "commit", "resume")

SYSTEMS_GROUP = "ckpt_model.systems"
EMBEDDED = "embedded"


class Deployment(Protocol):
    """A deployment of Gym participants the checker can start, crash and read."""

    topology: str
    verify_mode: str
    faults: tuple[str, ...]
    lease_grace_s: float

    @property
    def token(self) -> str: ...

    @property
    def logs_dir(self) -> Path: ...

    def start_backend(self) -> str | None: ...

    def start_gym(self) -> dict[str, str]: ...

    def crash_gym(self) -> None: ...

    def run_url(self) -> str: ...

    def log_tails(self, lines: int = 15) -> str: ...

    def close(self) -> None: ...


@runtime_checkable
class RestartsOne(Protocol):
    """Crash one Gym server alone and start it again; returns every server's URL, as `start_gym` does."""

    def restart_server(self, name: str) -> dict[str, str]: ...


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


@runtime_checkable
class ExportsTelemetry(Protocol):
    """Every Gym server process writes its spans and metrics as JSON lines into `telemetry_dir` (docs/protocol.md;
    None: this start writes none); `clear_telemetry` removes them while no Gym server runs."""

    @property
    def telemetry_dir(self) -> Path | None: ...

    def clear_telemetry(self) -> None: ...


@runtime_checkable
class LosesUnsynced(Protocol):
    """After `crash_gym`, a power cut: the checkpoint directories keep only what was fsynced."""

    def lose_unsynced(self) -> None: ...


@runtime_checkable
class RestartEnvironment(Protocol):
    """Where the `/run`s of restarts go: the environment bound to a `restart_only` resources server."""

    def restart_run_url(self) -> str: ...


@runtime_checkable
class CapturesTokens(Protocol):
    """The policy model's capture ledgers (P5) and generation cuts (P12)."""

    token_capture: bool
    generation_cuts: bool

    @property
    def capture_token(self) -> str: ...

    def clear_capture(self) -> None: ...


@runtime_checkable
class PolicyWorkers(Protocol):
    """How many worker processes serve the policy model behind its one port."""

    policy_workers: int


@runtime_checkable
class ServerWorkers(Protocol):
    """How many worker processes serve each environment, agent and resources server behind its port."""

    server_workers: int


@runtime_checkable
class KillsWorkers(Protocol):
    """SIGKILL one worker of a multi-worker server (by index), leaving its siblings and coordinator running."""

    def kill_worker(self, name: str, index: int) -> int: ...


@runtime_checkable
class PlacesCalls(Protocol):
    """Serve each capture key's generation calls on a chosen policy worker (the whole placement, replacing the
    last; kept across restarts of the servers)."""

    def place_calls(self, placement: Mapping[str, int]) -> None: ...


@runtime_checkable
class PlantsFaults(Protocol):
    """Start the next servers with another set of planted faults (the running ones keep theirs): how one stack
    serves the scenario of each fault its deployment shows, without starting anew (`Harness.replant`)."""

    def plant_faults(self, faults: Sequence[str]) -> None: ...


@runtime_checkable
class CollectsRollouts(Protocol):
    """Rollout collection against the running servers (reference Appendix C): the argv of the system's collection
    program, to which the checker appends one argument, its config file (docs/collection.md)."""

    def collection_command(self) -> list[str]: ...


def spec_of(deployment: Deployment) -> DeploymentSpec:
    """The spec of a deployment built elsewhere (a real Gym's): its own fields, and the options its capabilities
    declare (a deployment without `CapturesTokens` captures nothing)."""
    options: dict[str, Any] = {}
    if isinstance(deployment, CapturesTokens):
        options.update(token_capture=deployment.token_capture, generation_cuts=deployment.generation_cuts)
    if isinstance(deployment, PolicyWorkers):
        options.update(policy_workers=deployment.policy_workers)
    if isinstance(deployment, ServerWorkers):
        options.update(server_workers=deployment.server_workers)
    return DeploymentSpec(
        deployment.topology,
        deployment.verify_mode,
        tuple(deployment.faults),
        lease_grace_s=deployment.lease_grace_s,
        **options,
    )


class Gate(Protocol):
    """The gated backend: nothing a model call does happens until the checker releases it."""

    def calls(self) -> list[dict[str, Any]]: ...

    def release(self, indices: list[int]) -> Any: ...

    def reset(self) -> None: ...

    def gate(self) -> None: ...

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any: ...

    def staged(self) -> dict[str, Any]: ...

    def cuts(self) -> list[list[str]]: ...

    def stall_cuts(self, stall: bool) -> Any: ...

    def hanging_cuts(self) -> int: ...


class PlantedFault(FaultNeeds, Protocol):
    """A catalogued fault of a system under test, as the checker reads it: what it is, which property catches it,
    and (`FaultNeeds`) the deployment it shows in."""

    @property
    def server(self) -> str: ...

    @property
    def caught_by(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def shows_as(self) -> tuple[str, ...]: ...


class BackendGate:
    """Gym's fake backend's control routes over HTTP: gate, release chosen calls, call list, reset, script."""

    def __init__(self, url: str, http: httpx.Client, calls_round: GetRound | None = None) -> None:
        self.url = url
        self._http = http
        # The settle polls the call list several times a step: over a kept-alive connection of its own where given.
        self._calls_round = calls_round if calls_round is not None and GetRound.serves(url) else None

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._http.post(self.url + path, json=body or {})
        response.raise_for_status()
        return response.json()

    def calls(self) -> list[dict[str, Any]]:
        url = self.url + "/_ctl/calls"
        answers = self._calls_round.get_all([url], {}) if self._calls_round is not None else None
        answer = answers[0] if answers is not None else self._http.get(url)
        if isinstance(answer, Exception):
            raise httpx.TransportError(f"GET {url}: {type(answer).__name__}: {answer}") from answer
        answer.raise_for_status()
        return answer.json()

    def gate(self) -> None:
        self._post("/_ctl/gate")

    def reset(self) -> None:
        self._post("/_ctl/reset")

    def release(self, indices: list[int]) -> Any:
        return self._post("/_ctl/step", {"indices": indices})

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any:
        """Pin the policy's tool calls, so the checker knows what an uninterrupted episode earns (P3)."""
        return self._post("/_ctl/script", {"tool_calls": [dict(call) for call in tool_calls]})

    def staged(self) -> dict[str, Any]:
        """The token store: staging key -> the tokens and lineage the trainer reads (P5, P12)."""
        response = self._http.get(self.url + "/_ctl/staged")
        response.raise_for_status()
        return response.json()

    def cuts(self) -> list[list[str]]:
        """Every generation-cut round the backend answered: the model call IDs it cut durably in each."""
        response = self._http.get(self.url + "/_ctl/cuts")
        response.raise_for_status()
        return response.json()

    def stall_cuts(self, stall: bool) -> Any:
        """While on, a cut request hangs until its sender gives up (a hung cut must not eat a prepare)."""
        return self._post("/_ctl/cut_stall", {"stall": stall})

    def hanging_cuts(self) -> int:
        """How many cut requests hang at the stalled endpoint now (each ends when its sender gives up)."""
        response = self._http.get(self.url + "/_ctl/cut_stall")
        response.raise_for_status()
        return BackendCutStallWire.model_validate_json(response.content).hanging


def system(name: str = EMBEDDED) -> Any:
    """The system under test registered under `name` in the entry point group `ckpt_model.systems`."""
    found = entry_points(group=SYSTEMS_GROUP, name=name)
    if not found:
        raise LookupError(
            f"no system under test named {name!r} in entry point group {SYSTEMS_GROUP!r}; "
            "install the project (pip install -e .) so that its look-alike stack registers itself"
        )
    return next(iter(found)).load()


def fault_catalogue() -> tuple[PlantedFault, ...]:
    """The embedded stack's planted faults."""
    return tuple(system().catalogue)


class CollectorFault(Protocol):
    """A catalogued fault of a system's rollout collection program, and the property that catches it (a collection
    property, or a server property judged on the collection's own calls)."""

    @property
    def name(self) -> str: ...

    @property
    def caught_by(self) -> str: ...

    @property
    def description(self) -> str: ...


def collection_fault_catalogue() -> tuple[CollectorFault, ...]:
    """The embedded stack's planted collector faults (none if its system offers no collection program)."""
    return tuple(getattr(system(), "collection_catalogue", ()))


def planted(name: str) -> PlantedFault:
    (fault,) = faults_named(name)
    return fault


class UnknownFaults(LookupError):
    """Fault names the catalogue does not hold; the message names them and every known one."""

    def __init__(self, unknown: Sequence[str], known: Sequence[str]) -> None:
        self.unknown, self.known = tuple(unknown), tuple(known)
        super().__init__(f"unknown fault(s) {', '.join(map(repr, unknown))}; known faults: {', '.join(known)}")


def faults_named(text: str) -> tuple[PlantedFault, ...]:
    """The planted faults a comma-separated list names, each once, in the order named; `UnknownFaults` if the
    catalogue lacks any."""
    return named_in(text, fault_catalogue())


class HasName(Protocol):
    @property
    def name(self) -> str: ...


Named = TypeVar("Named", bound=HasName)


def named_in(text: str, catalogue: Sequence[Named]) -> tuple[Named, ...]:
    """The entries of `catalogue` a comma-separated list names, each once, in the order named; `UnknownFaults` if
    the catalogue lacks any."""
    by_name = {entry.name: entry for entry in catalogue}
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise UnknownFaults(unknown, list(by_name))
    return tuple(by_name[name] for name in names)


class Harness:
    """A deployment as scoped resources for the machine: gate and client built once, Gym fresh per example.

    Every example gets fresh Gym processes, a reset and gated backend, the pinned script and an empty checkpoint
    directory under the harness's own root (the controller's directory, visible to the servers).

    A restart that brings every server back on the URL it had skips discovery: the same servers on the same ports
    are the same participants. The first status round after it (`statuses()`, which every settle starts with)
    verifies that each still answers as the kind it was discovered as, and discovers anew if one does not; any
    other use of `control` before that verifies first."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        spec: DeploymentSpec | None = None,
        root: Path | None = None,
        artifacts: Path | None = None,
    ) -> None:
        self.deployment = deployment
        # What the deployment is; without `spec`, what it says it is (a real Gym's, `spec_of`).
        self.spec = spec if spec is not None else spec_of(deployment)
        if self.spec.token_capture and not isinstance(deployment, CapturesTokens):
            raise HarnessError(
                f"the {self.spec.label} deployment asks for token capture, but the system has no capture ledgers "
                "(token_capture, generation_cuts, capture_token, clear_capture())"
            )
        # `--keep-artifacts`: a directory `artifacts.prepare` made ready, where the run's artefacts stay after it.
        self.artifacts = artifacts
        self._own_root = root is None
        self.root = Path(root) if root is not None else self._new_root()
        self.http = new_http_client(httpx.Timeout(30.0, read=None))
        # `/run`s get connections of their own. A `/run` the server ends with an unhandled exception leaves its
        # connection looking idle for the milliseconds uvicorn spends logging before it closes it (no
        # `connection: close` on Starlette's 500); a control call that picked it up then would be reset. Each
        # client costs ~42 ms to build, so both are built once.
        self.run_http = new_http_client(httpx.Timeout(30.0, read=None))
        # The settle's status rounds, over kept-alive connections of their own (`ckpt_model.protocol.get_round`),
        # waiting for a reply as long as the control client's own status call does.
        self.status_round = GetRound(timeout_s=BASE_TIMEOUT_S)
        # The backend's call list, which the settle polls several times a step, the same way.
        self.calls_round = GetRound(timeout_s=BASE_TIMEOUT_S)
        # Where a failing run writes its regression file (None: `ckpt_model.results.regression.directory()`).
        self.regressions_dir: Path | None = artifacts
        # Per server name, the worker index killed alone (`kill_worker`) since the server last started.
        self.dead_workers: dict[str, int] = {}
        # The example directory kept for the artefacts (`keep_example`): neither the next example nor close removes it.
        self.kept_example: Path | None = None
        self._control: ControlClient | None = None
        # The servers the client last discovered, and whether a restart since kept them without verifying.
        self._discovered: dict[str, str] | None = None
        self._unverified = False
        # Backend resets and removing the last example's directory run here, beside the next start.
        self._chores: ThreadPoolExecutor | None = None
        self.backend: Gate | None = None
        self._ledger: LedgerClient | None = None
        self.example = 0
        # How far every clock of the system has moved ahead of the true time in this example (`pass_time`,
        # `jump_to`); each server's own skew from the controller's clock (`skew_clock`) comes on top.
        self.time_passed_s = 0.0
        self._skews: dict[str, float] = {}
        # Frozen servers (`pause_server`), and those among them a jump passed by while they could not take it.
        self._frozen: set[str] = set()
        self._left_behind: set[str] = set()
        self.checkpoint_dir = self.root / "example-0" / "checkpoints"
        atexit.register(self.close)
        try:
            backend_url = self._started(deployment.start_backend)
        except BaseException:
            self.close()
            raise
        # Without a gated backend no model call can be held, so the machine runs only the rules that need none.
        self.backend = None if backend_url is None else BackendGate(backend_url, self.http, self.calls_round)

    @classmethod
    def embedded(cls, spec: DeploymentSpec | str, *, artifacts: Path | None = None) -> Harness:
        """A harness over the look-alike stack (the `embedded` system) in deployment `spec`; a topology's name
        stands for its plain deployment (`DeploymentSpec(name)`)."""
        chosen = DeploymentSpec(spec) if isinstance(spec, str) else spec
        deployment = system().deployment(chosen.topology, **chosen.system_keywords())
        try:
            return cls(deployment, spec=chosen, artifacts=artifacts)
        except BaseException:
            deployment.close()
            raise

    def replant(self, faults: Sequence[str]) -> None:
        """Run the next examples with `faults` planted instead of the spec's: every example starts the servers
        afresh, and they start with these; the backend and the fork server stay. Only faults this very deployment
        shows (`DeploymentSpec.for_faults` gives it back), so the spec stays one the faults would have chosen."""
        wanted = attrs.evolve(self.spec, faults=tuple(faults))
        needed = DeploymentSpec.for_faults([planted(name) for name in faults])
        if needed.key != wanted.key:
            named = ", ".join(faults)
            raise HarnessError(f"{named} show(s) in the {needed.label} deployment, not in {self.spec.label}")
        deployment = self.deployment
        if not isinstance(deployment, PlantsFaults):
            raise HarnessError(self._lacks("plant_faults(faults)"))
        deployment.plant_faults(wanted.faults)
        self.spec = wanted

    # -- what the machine and reports read (the spec's fields, and the deployment's capabilities) ---------------

    @property
    def topology(self) -> str:
        return self.spec.topology

    @property
    def verify_mode(self) -> str:
        return self.spec.verify_mode

    @property
    def faults(self) -> tuple[str, ...]:
        return self.spec.faults

    @property
    def lease_grace_s(self) -> float:
        return self.spec.lease_grace_s

    @property
    def token_capture(self) -> bool:
        return self.spec.token_capture

    @property
    def generation_cuts(self) -> bool:
        return self.spec.generation_cuts

    @property
    def policy_workers(self) -> int:
        """How many worker processes serve the policy model behind its one port."""
        return self.spec.policy_workers

    @property
    def server_workers(self) -> int:
        """How many worker processes serve each environment, agent and resources server behind its port."""
        return self.spec.server_workers

    @property
    def workers(self) -> int:
        """The most workers any server runs: a placement index is drawn below it (each server takes it modulo
        its own)."""
        return max(self.policy_workers, self.server_workers)

    @property
    def places_calls(self) -> bool:
        """The checker chooses which worker serves each attempt's requests (several workers, and `PlacesCalls`)."""
        return self.workers > 1 and isinstance(self.deployment, PlacesCalls)

    @property
    def can_kill_workers(self) -> bool:
        """One worker of a multi-worker environment, agent or resources server may be killed alone."""
        return self.server_workers > 1 and self.can_crash and isinstance(self.deployment, KillsWorkers)

    def kill_worker(self, name: str, index: int) -> None:
        """SIGKILL worker `index` of server `name` alone; until that server starts again, no attempt is placed on
        it (`dead_workers`, which `ckpt_model.trainer.placement` reads)."""
        deployment = self.deployment
        if not isinstance(deployment, KillsWorkers):
            raise HarnessError(self._lacks("kill_worker(name, index)"))
        with timing.span("kill_worker"):
            deployment.kill_worker(name, index)
        self.dead_workers[name] = index

    def place_calls(self, placement: Mapping[str, int]) -> None:
        deployment = self.deployment
        if not isinstance(deployment, PlacesCalls):
            raise HarnessError(self._lacks("place_calls(placement)"))
        with timing.span("place_calls"):
            deployment.place_calls(placement)

    @property
    def ledger(self) -> LedgerClient:
        """The checker's reader of the policy model's capture ledgers (token capture on)."""
        control = self.control
        assert control is not None, "start_gym comes first"
        models = [member for member in control.participants if member.kind == "model"]
        deployment = self.deployment
        if not self.token_capture or not models or not isinstance(deployment, CapturesTokens):
            raise HarnessError(f"the {self.spec.label} deployment has no policy model with token capture")
        url = models[0].url
        if self._ledger is None or self._ledger.url != url:
            self._ledger = LedgerClient(url, deployment.capture_token, self.http)
        return self._ledger

    @property
    def run_url(self) -> str:
        return self.deployment.run_url()

    @property
    def restart_run_url(self) -> str:
        """The restart environment's `/run` (a topology with a restart environment: `mixed`)."""
        deployment = self.deployment
        if not self.spec.traits.restart_environment or not isinstance(deployment, RestartEnvironment):
            raise HarnessError(
                f"the {self.spec.label} deployment has no restart environment: restarts need a topology with one "
                "(mixed) and a deployment with restart_run_url()"
            )
        return deployment.restart_run_url()

    @property
    def servers(self) -> dict[str, str]:
        """Every server of the deployment by name, with its URL (participants and relays alike)."""
        return dict(self._discovered or {})

    def start_collection(
        self, config: Mapping[str, Any], number: int, through: Mapping[str, str] | None = None
    ) -> CollectionRun:
        """Start the system's rollout collection program on this example's servers: `config` (the input, output
        and checkpoint paths and the run's options, docs/collection.md) completed with every server's URL (or the
        URL `through` gives for it: the checker's relay), the server whose `/run` the controller calls, the rows'
        format and the bearer; its config and log go in this example's directory."""
        deployment = self.deployment
        if not isinstance(deployment, CollectsRollouts):
            raise HarnessError(self._lacks("collection_command()"))
        servers = self._discovered or {}
        run_server = [name for name, url in servers.items() if url.rstrip("/") + "/run" == self.run_url]
        if len(run_server) != 1:
            raise HarnessError(f"no single server serves {self.run_url} among {sorted(servers)}")
        # Rows of a topology whose agent owns the episodes are legacy `/run` rows (reference 5.3).
        run_format = "legacy" if self.spec.traits.episode_owner == "agent" else "native"
        completed = {
            **config,
            "servers": {name: (through or {}).get(name, url) for name, url in servers.items()},
            "run_server": run_server[0],
            "run_format": run_format,
            "token": deployment.token,
        }
        return CollectionRun(deployment.collection_command(), completed, self.checkpoint_dir.parent, number)

    def log_tails(self, lines: int = 15) -> str:
        """The deployment's log tails; with artefacts kept, naming the copies `close` makes, which outlive the run."""
        tails = self.deployment.log_tails(lines)
        if self.artifacts is None:
            return tails
        return tails.replace(str(self.deployment.logs_dir), str(self.artifacts / LOGS))

    def keep_example(self) -> Path:
        """Keep this example's directory (its checkpoints) after the run, in place of the one kept before; returns
        it. Only with artefacts kept, whose directory holds the harness's root."""
        assert self.artifacts is not None, "only a harness that keeps artefacts keeps an example"
        example_dir = self.checkpoint_dir.parent
        if self.kept_example not in (None, example_dir):
            shutil.rmtree(self.kept_example, ignore_errors=True)
        self.kept_example = example_dir
        return example_dir

    @property
    def control(self) -> ControlClient | None:
        """The controller client; its participants are verified first if a restart kept them (see the class)."""
        if self._unverified:
            self._verified_statuses()
        return self._control

    def statuses(self) -> dict[str, Any]:
        """Every participant's status, one concurrent round; after a restart that kept the participants, this
        round verifies them too (no extra round when nothing changed)."""
        if self._unverified:
            return self._verified_statuses()
        assert self._control is not None, "start_gym comes first"
        return self._control.status_all()

    # -- lifecycle --------------------------------------------------------------------------------------------

    def begin_example(self) -> None:
        """Fresh Gym processes, a reset and gated backend with the pinned script, an empty checkpoint directory.

        The backend is reset once the old Gym processes are gone (none can call it after the reset), beside the
        new ones' start; the last example's directory is removed off this path."""
        with timing.span("begin_example"):
            with timing.span("restart.kill"):
                self.deployment.crash_gym()
            if self.token_capture:
                self._capturing().clear_capture()
            self._begin_traces()
            reset = self._chore(self._reset_backend) if self.backend is not None else None
            self.time_passed_s = 0.0  # fresh servers: the new example starts on the true time
            self._skews.clear()
            with timing.span("directories"):
                self.example += 1
                if self.checkpoint_dir.parent != self.kept_example:
                    self._chore(shutil.rmtree, self.checkpoint_dir.parent, ignore_errors=True)
                self.checkpoint_dir = self.root / f"example-{self.example}" / "checkpoints"
                self.checkpoint_dir.mkdir(parents=True)
            try:
                self.start_gym()
            finally:
                if reset is not None:
                    with timing.span("backend_reset"):
                        reset.result()

    @property
    def telemetry_dir(self) -> Path | None:
        """Where the deployment's servers write spans and metrics (P26), or None: it exports none."""
        deployment = self.deployment
        return deployment.telemetry_dir if isinstance(deployment, ExportsTelemetry) else None

    def _begin_traces(self) -> None:
        """A new example's telemetry: the last example's files removed (no Gym server runs), the controller's calls
        numbered from 0 again."""
        deployment = self.deployment
        if isinstance(deployment, ExportsTelemetry):
            deployment.clear_telemetry()
        if self._control is not None:
            self._control.begin_traces()

    def start_gym(self) -> None:
        with timing.span("restart.start"):
            servers = self._started(self.deployment.start_gym)
            self.dead_workers.clear()
            self._fresh(servers)
            self._catch_up(servers)
        self._learn(servers)

    def crash(self, power_loss: bool = False) -> None:
        """SIGKILL every Gym process group (`power_loss`: then cut the power, so only fsynced writes are left),
        then start fresh processes."""
        if not self.can_crash:
            raise HarnessError(self._lacks("crashes (it says crashes=False)"))
        with timing.span("crash"):
            with timing.span("restart.kill"):
                self.deployment.crash_gym()
            if power_loss:
                self._losing().lose_unsynced()
            self.start_gym()

    @property
    def can_crash(self) -> bool:
        """Whether Gym may be crashed and started afresh: a deployment attached to a Gym the checker may not restart
        says `crashes = False`, and then no rule crashes anything (and every example runs on the Gym as it is)."""
        return bool(getattr(self.deployment, "crashes", True))

    @property
    def can_lose_unsynced(self) -> bool:
        return isinstance(self.deployment, LosesUnsynced)

    @property
    def can_restart_one(self) -> bool:
        return isinstance(self.deployment, RestartsOne)

    def restart_server(self, name: str) -> None:
        """SIGKILL one Gym server alone and start it again; the client learns the servers anew."""
        deployment = self.deployment
        if not isinstance(deployment, RestartsOne):
            raise HarnessError(self._lacks("restart_server(name)"))
        with timing.span("crash_participant"):
            with timing.span("restart.one"):
                servers = self._started(lambda: deployment.restart_server(name))
                self.dead_workers.pop(name, None)
                self._fresh([name])
                self._catch_up({name: servers[name]})
            self._discover(servers)

    @property
    def can_stop_inside_commit(self) -> bool:
        return isinstance(self.deployment, Failpoints)

    def arm_failpoint(self, name: str, point: str) -> None:
        self._failpoints().arm_failpoint(name, point)

    def failpoint_reached(self, name: str, point: str) -> bool:
        return bool(self._failpoints().failpoint_reached(name, point))

    @property
    def can_break_storage(self) -> bool:
        return isinstance(self.deployment, BreaksStorage)

    def break_storage(self, name: str, point: str, how: str) -> None:
        self._storage().break_storage(name, point, how)

    def storage_state(self, name: str) -> dict[str, Any]:
        return dict(self._storage().storage_state(name))

    def release_storage(self, name: str) -> None:
        self._storage().release_storage(name)

    @property
    def can_pause(self) -> bool:
        return isinstance(self.deployment, Pauses)

    def pause_server(self, name: str) -> None:
        self._pausing().pause_server(name)
        self._frozen.add(name)

    def continue_server(self, name: str) -> None:
        """SIGCONT `name`; if time jumped while it was frozen, its clock jumps too before this returns, and its
        timers fall due as after a real pause that long (`jump_to`)."""
        self._pausing().continue_server(name)
        self._frozen.discard(name)
        if name in self._left_behind:
            self._left_behind.discard(name)
            self._set_offset(name)

    @property
    def can_lose_replies(self) -> bool:
        return isinstance(self.deployment, LosesReplies)

    def lose_reply(self, name: str, operation: str) -> None:
        self._losing_replies().lose_reply(name, operation)

    def lost_replies(self, name: str) -> int:
        return int(self._losing_replies().lost_replies(name))

    @property
    def can_skew_clocks(self) -> bool:
        deployment = self.deployment
        return isinstance(deployment, SkewsClocks) and bool(deployment.skews_clocks)

    def skew_clock(self, name: str, offset_s: float) -> float:
        """Move `name`'s clock `offset_s` from the controller's (`now`; 0 puts it back); the time its clock reads
        right after."""
        if not self.can_skew_clocks:
            raise HarnessError(self._lacks("skews_clocks and skew_clock(name, offset_s)"))
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
        control = self.control
        if control is None:
            raise HarnessError("no Gym is running: time can only pass for servers the controller knows")
        if not self.owns_time:
            raise HarnessError(self._lacks("jumps_clocks and jump_clock(name, offset_s)"))
        self.time_passed_s += seconds
        self._left_behind |= self._frozen
        return {m.name: self._set_offset(m.name) for m in control.participants if m.name not in self._frozen}

    def room(self, seconds: float) -> float:
        """The seconds a deadline that is to pass is placed ahead: `seconds` where waits are real (each one is
        waited out), at least `OWNED_ROOM_S` where the checker owns time (it jumps past it)."""
        return max(seconds, OWNED_ROOM_S) if self.owns_time else seconds

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

    def _catch_up(self, servers: Mapping[str, str]) -> None:
        """Move freshly started participants to the time that passed in this example (a new process starts on the
        true time). Only participants, whose clocks `pass_time` moves: a server that is none (a relay) may have no
        clock to move."""
        if self.time_passed_s and self._control is not None:
            participants = {member.name for member in self._control.participants}
            for name in servers:
                if name in participants:
                    self._set_offset(name)

    def _fresh(self, names: Iterable[str]) -> None:
        """Fresh processes of `names`: none is frozen or skewed any more."""
        for name in names:
            self._skews.pop(name, None)
            self._frozen.discard(name)
            self._left_behind.discard(name)

    def _set_offset(self, name: str) -> float:
        """Give `name` its clock: the time that passed plus its skew, ahead of the true time. The time it reads."""
        deployment = self.deployment
        offset_s = self.time_passed_s + self._skews.get(name, 0.0)
        if isinstance(deployment, JumpsClocks) and deployment.jumps_clocks:
            return float(deployment.jump_clock(name, offset_s))
        if isinstance(deployment, SkewsClocks) and deployment.skews_clocks:
            return float(deployment.skew_clock(name, offset_s))
        raise HarnessError(self._lacks("skews_clocks and skew_clock(name, offset_s), or jump_clock(name, offset_s)"))

    @property
    def can_fail_hooks(self) -> bool:
        return isinstance(self.deployment, FailsHooks)

    def fail_hook(self, name: str, hook: str) -> None:
        self._failing_hooks().fail_hook(name, hook)

    def failed_hooks(self, name: str) -> int:
        return int(self._failing_hooks().failed_hooks(name))

    def close(self) -> None:
        if self._chores is not None:
            self._chores.shutdown(wait=True)
            self._chores = None
        if self.artifacts is not None:
            try:
                copy_logs(self.deployment.logs_dir, self.artifacts / LOGS)
            except OSError as error:
                log.warning("could not keep the server logs in %s: %s", self.artifacts, error)
        with contextlib.suppress(Exception):
            self.deployment.close()
        with contextlib.suppress(Exception):
            self.http.close()
        with contextlib.suppress(Exception):
            self.run_http.close()
        self.status_round.close()
        self.calls_round.close()
        if self._own_root:
            self._remove_root()
        atexit.unregister(self.close)

    def _new_root(self) -> Path:
        """The harness's own root: under the artefacts' directory when kept, else a fresh temporary directory."""
        if self.artifacts is None:
            return Path(tempfile.mkdtemp(prefix=f"ckpt-model-checkpoints-{self.spec.topology}-"))
        root = self.artifacts / CHECKPOINTS
        root.mkdir(parents=True, exist_ok=True)
        return root

    def _remove_root(self) -> None:
        """Remove the root, or with artefacts kept everything in it but the kept example (and it, if empty)."""
        if self.artifacts is None:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        with contextlib.suppress(OSError):
            for child in self.root.iterdir():
                if child != self.kept_example:
                    shutil.rmtree(child, ignore_errors=True)
            if not any(self.root.iterdir()):
                self.root.rmdir()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the participants after a start --------------------------------------------------------------------------

    def _learn(self, servers: Mapping[str, str]) -> None:
        """Discover the participants among `servers`, unless every server is back on the URL it had (verified at
        the next status round instead)."""
        if self._control is not None and self._control.participants and servers == self._discovered:
            self._unverified = True
            return
        self._discover(servers)

    def _discover(self, servers: Mapping[str, str]) -> None:
        if self._control is None:
            self._control = ControlClient(
                self.deployment.token, http=self.http, clock=self.now, status_round=self.status_round
            )
        # Forgotten first: after a discovery that failed, the next start discovers again.
        self._unverified, self._discovered = False, None
        with timing.span("restart.discover"):
            self._control.discover_from_servers(servers)
        self._discovered = dict(servers)

    def _verified_statuses(self) -> dict[str, Any]:
        """One status round; if any participant fails it or names another kind, discover anew and ask again."""
        control, servers = self._control, self._discovered
        assert control is not None, "only a restart that kept the participants gets here"
        assert servers is not None, "only a restart that kept the participants gets here"
        self._unverified = False
        try:
            statuses = control.status_all()
        except CoordinationError:
            statuses = None
        if statuses is not None and all(statuses[m.name].get("kind") == m.kind for m in control.participants):
            return statuses
        self._discover(servers)
        return control.status_all()

    def _reset_backend(self) -> None:
        assert self.backend is not None
        self.backend.reset()
        self.backend.script(self.spec.traits.script)
        self.backend.gate()

    # -- capabilities the machine only uses where it checked for them ---------------------------------------------

    def _lacks(self, what: str) -> str:
        return f"the {self.spec.label} deployment cannot do this: it has no {what} (the machine should not ask)"

    def _capturing(self) -> CapturesTokens:
        deployment = self.deployment
        if not isinstance(deployment, CapturesTokens):
            raise HarnessError(self._lacks("clear_capture()"))
        return deployment

    def _losing(self) -> LosesUnsynced:
        deployment = self.deployment
        if not isinstance(deployment, LosesUnsynced):
            raise HarnessError(self._lacks("lose_unsynced()"))
        return deployment

    def _failpoints(self) -> Failpoints:
        deployment = self.deployment
        if not isinstance(deployment, Failpoints):
            raise HarnessError(self._lacks("arm_failpoint(name, point) and failpoint_reached(name, point)"))
        return deployment

    def _storage(self) -> BreaksStorage:
        deployment = self.deployment
        if not isinstance(deployment, BreaksStorage):
            raise HarnessError(
                self._lacks("break_storage(name, point, how), storage_state(name), release_storage(name)")
            )
        return deployment

    def _pausing(self) -> Pauses:
        deployment = self.deployment
        if not isinstance(deployment, Pauses):
            raise HarnessError(self._lacks("pause_server(name) and continue_server(name)"))
        return deployment

    def _failing_hooks(self) -> FailsHooks:
        deployment = self.deployment
        if not isinstance(deployment, FailsHooks):
            raise HarnessError(self._lacks("fail_hook(name, hook) and failed_hooks(name)"))
        return deployment

    def _losing_replies(self) -> LosesReplies:
        deployment = self.deployment
        if not isinstance(deployment, LosesReplies):
            raise HarnessError(self._lacks("lose_reply(name, operation) and lost_replies(name)"))
        return deployment

    def _chore(self, work: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._chores is None:
            self._chores = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-chores")
        return self._chores.submit(work, *args, **kwargs)

    def _started(self, start: Any) -> Any:
        try:
            return start()
        except (OSError, RuntimeError) as error:
            raise ServerStartError(
                name=self.spec.label, exit_status=None, log_tail=str(error), log_path=str(self.deployment.logs_dir)
            ) from error
