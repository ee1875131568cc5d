"""The harness: one deployment as the scoped resources the machine drives, composed of the roles its callers need.

The seam a system under test implements is `ckpt_model.deployments.seam`; each role of the harness is a module of
its own, with the capabilities it uses: start and crash (`lifecycle`), observe (`observe`), the gated backend
(`gate`), the clocks (`clocks`) and the faults (`faults`). A caller depends on the role it uses; `Harness` plays
them all, over the embedded look-alike stack (`Harness.embedded`) or a deployment built elsewhere (a real Gym's,
attached or started: `ckpt_model.deployments.gym`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx

from ckpt_model import timing
from ckpt_model.deployments.artifacts import CHECKPOINTS, LOGS, copy_logs
from ckpt_model.deployments.catalogue import planted
from ckpt_model.deployments.clocks import Clocks
from ckpt_model.deployments.collection_run import CollectionRun
from ckpt_model.deployments.faults import Faults
from ckpt_model.deployments.gate import BackendGate, Gate
from ckpt_model.deployments.lifecycle import (
    CollectsRollouts,
    KillsWorkers,
    LosesUnsynced,
    PlacesCalls,
    PlantsFaults,
    RestartsOne,
)
from ckpt_model.deployments.observe import ExportsTelemetry
from ckpt_model.deployments.seam import CapturesTokens, Deployment, RestartEnvironment, lacks, spec_of, system
from ckpt_model.errors import CoordinationError, HarnessError, ServerStartError
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.protocol.client import BASE_TIMEOUT_S, ControlClient
from ckpt_model.protocol.get_round import GetRound
from ckpt_model.protocol.http import control_call, new_http_client
from ckpt_model.protocol.ledger import LedgerClient

log = logging.getLogger(__name__)


class Harness:
    """A deployment as scoped resources for the machine: gate and client built once, Gym fresh per example.

    It plays the start-and-crash role (`ckpt_model.deployments.lifecycle.Lifecycle`) and the observe role
    (`ckpt_model.deployments.observe.Observes`) itself, and composes the others: the gate (`backend`), the clocks
    (`clocks`) and the faults (`faults`).

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
        # The run store a command keeps this harness's failures in (`ckpt_model.results.runstore.begin`; None: a
        # private harness's, whose failures keep nothing there), this run's directory in it once its first failure
        # made it, and the file name the run gave each failure, by its property and deployment (Hypothesis's shrinks
        # and the minimiser's rewrite keep it).
        self.run_store: Path | None = None
        self.run_dir: Path | None = None
        self.failure_files: dict[str, str] = {}
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
        self.clocks = Clocks(deployment, lambda: self.spec.label, self._participant_names)
        self.faults = Faults(deployment, self.clocks, lambda: self.spec.label)
        # The root last, just before `close` is registered to remove it: an interrupt while the clients above are
        # built (a tenth of a second) must not leave it behind.
        self._own_root = root is None
        self.root = Path(root) if root is not None else self._new_root()
        atexit.register(self.close)
        self.checkpoint_dir = self.root / "example-0" / "checkpoints"
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

    # -- start and crash (`ckpt_model.deployments.lifecycle.Lifecycle`) ----------------------------------------------

    def begin_example(self) -> None:
        """Fresh Gym processes, a reset and gated backend with the pinned script, an empty checkpoint directory.

        The backend is reset once the old Gym processes are gone (none can call it after the reset), beside the
        new ones' start; the last example's directory is removed off this path."""
        with timing.span("begin_example"):
            with timing.span("restart.kill"), control_call("stopping the last example's Gym", capability="crash_gym()"):
                self.deployment.crash_gym()
            if self.spec.token_capture:
                capturing = self._capturing()
                with control_call("emptying the capture directory", capability="clear_capture()"):
                    capturing.clear_capture()
            self._begin_traces()
            reset = self._chore(self._reset_backend) if self.backend is not None else None
            self.clocks.begin_example()
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

    def start_gym(self) -> None:
        with timing.span("restart.start"):
            servers = self._started(self.deployment.start_gym)
            self.dead_workers.clear()
            self.clocks.fresh(servers)
            self._catch_up(servers)
        self._learn(servers)

    def crash(self, power_loss: bool = False) -> None:
        """SIGKILL every Gym process group (`power_loss`: then cut the power, so only fsynced writes are left),
        then start fresh processes."""
        if not self.can_crash:
            raise HarnessError(self._lacks("crashes (it says crashes=False)"))
        with timing.span("crash"):
            with timing.span("restart.kill"), control_call("crashing Gym (SIGKILL)", capability="crash_gym()"):
                self.deployment.crash_gym()
            if power_loss:
                losing = self._losing()
                with control_call("cutting the power after the crash", capability="lose_unsynced()"):
                    losing.lose_unsynced()
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
                self.clocks.fresh([name])
                self._catch_up({name: servers[name]})
            self._discover(servers)

    @property
    def workers(self) -> int:
        """The most workers any server runs: a placement index is drawn below it (each server takes it modulo
        its own)."""
        return max(self.spec.policy_workers, self.spec.server_workers)

    @property
    def places_calls(self) -> bool:
        """The checker chooses which worker serves each attempt's requests (several workers, and `PlacesCalls`)."""
        return self.workers > 1 and isinstance(self.deployment, PlacesCalls)

    @property
    def can_kill_workers(self) -> bool:
        """One worker of a multi-worker environment, agent or resources server may be killed alone."""
        return self.spec.server_workers > 1 and self.can_crash and isinstance(self.deployment, KillsWorkers)

    def kill_worker(self, name: str, index: int) -> None:
        """SIGKILL worker `index` of server `name` alone; until that server starts again, no attempt is placed on
        it (`dead_workers`, which `ckpt_model.trainer.placement` reads)."""
        deployment = self.deployment
        if not isinstance(deployment, KillsWorkers):
            raise HarnessError(self._lacks("kill_worker(name, index)"))
        doing = f"killing worker {index} of {name} (SIGKILL)"
        with timing.span("kill_worker"), control_call(doing, capability=f"kill_worker({name!r}, {index})"):
            deployment.kill_worker(name, index)
        self.dead_workers[name] = index

    def place_calls(self, placement: Mapping[str, int]) -> None:
        deployment = self.deployment
        if not isinstance(deployment, PlacesCalls):
            raise HarnessError(self._lacks("place_calls(placement)"))
        doing = f"placing each attempt's calls on a worker ({dict(placement)})"
        with timing.span("place_calls"), control_call(doing, capability="place_calls(placement)"):
            deployment.place_calls(placement)

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

    def keep_example(self) -> Path:
        """Keep this example's directory (its checkpoints) after the run, in place of the one kept before; returns
        it. Only with artefacts kept, whose directory holds the harness's root."""
        assert self.artifacts is not None, "only a harness that keeps artefacts keeps an example"
        example_dir = self.checkpoint_dir.parent
        if self.kept_example not in (None, example_dir):
            shutil.rmtree(self.kept_example, ignore_errors=True)
        self.kept_example = example_dir
        return example_dir

    # -- observe (`ckpt_model.deployments.observe.Observes`) ---------------------------------------------------------

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

    @property
    def servers(self) -> dict[str, str]:
        """Every server of the deployment by name, with its URL (participants and relays alike)."""
        return dict(self._discovered or {})

    @property
    def ledger(self) -> LedgerClient:
        """The checker's reader of the policy model's capture ledgers (token capture on)."""
        control = self.control
        assert control is not None, "start_gym comes first"
        models = [member for member in control.participants if member.kind == "model"]
        deployment = self.deployment
        if not self.spec.token_capture or not models or not isinstance(deployment, CapturesTokens):
            raise HarnessError(f"the {self.spec.label} deployment has no policy model with token capture")
        url = models[0].url
        if self._ledger is None or self._ledger.url != url:
            self._ledger = LedgerClient(url, deployment.capture_token, self.http)
        return self._ledger

    @property
    def telemetry_dir(self) -> Path | None:
        """Where the deployment's servers write spans and metrics (P26), or None: it exports none."""
        deployment = self.deployment
        return deployment.telemetry_dir if isinstance(deployment, ExportsTelemetry) else None

    def log_tails(self, lines: int = 15) -> str:
        """The deployment's log tails; with artefacts kept, naming the copies `close` makes, which outlive the run."""
        tails = self.deployment.log_tails(lines)
        if self.artifacts is None:
            return tails
        return tails.replace(str(self.deployment.logs_dir), str(self.artifacts / LOGS))

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

    # -- the harness's own resources ---------------------------------------------------------------------------------

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

    # -- what a start does: the example's traces and backend, the participants, the clocks of fresh ones -------------

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
                self.deployment.token, http=self.http, clock=self.clocks.now, status_round=self.status_round
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

    def _participant_names(self) -> list[str] | None:
        """The participants the controller knows (verified first, as `control` is), or None: no Gym is running."""
        control = self.control
        return None if control is None else [member.name for member in control.participants]

    def _catch_up(self, servers: Mapping[str, str]) -> None:
        """Move the participants among freshly started `servers` to the time that passed in this example."""
        if self._control is not None:
            participants = {member.name for member in self._control.participants}
            self.clocks.catch_up(name for name in servers if name in participants)

    def _begin_traces(self) -> None:
        """A new example's telemetry: the last example's files removed (no Gym server runs), the controller's calls
        numbered from 0 again."""
        deployment = self.deployment
        if isinstance(deployment, ExportsTelemetry):
            with control_call("removing the last example's telemetry files", capability="clear_telemetry()"):
                deployment.clear_telemetry()
        if self._control is not None:
            self._control.begin_traces()

    def _reset_backend(self) -> None:
        assert self.backend is not None
        self.backend.reset()
        self.backend.script(self.spec.traits.script)
        self.backend.gate()

    # -- capabilities the machine only uses where it checked for them ------------------------------------------------

    def _lacks(self, what: str) -> str:
        return lacks(self.spec.label, what)

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

    def _chore(self, work: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._chores is None:
            self._chores = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-chores")
        return self._chores.submit(work, *args, **kwargs)

    def _started(self, start: Any) -> Any:
        """What `start` returns; a server that does not start is a `ServerStartError`, a control route that fails
        meanwhile (the look-alike's placement of calls on workers) a `ControlCallFailed`."""
        try:
            with control_call("starting Gym servers"):
                return start()
        except (OSError, RuntimeError) as error:
            raise ServerStartError(
                name=self.spec.label, exit_status=None, log_tail=str(error), log_path=str(self.deployment.logs_dir)
            ) from error
