"""The deployment seam (Jepsen's db and nemesis split): what the checker needs of a system under test.

A system under test hands the checker a `Deployment`: start the backend once (None: there is no gated backend),
start fresh Gym servers, crash every Gym process group, say where `/run` goes, show log tails, close. Failures to
start are `OSError` or `RuntimeError` naming the server (a `HarnessError` of the deployment's own, such as a real
Gym's `PreflightError`, passes through as it is). A deployment that may not be crashed says `crashes = False`.

What a deployment can do beyond that is a capability of its own, a runtime-checkable protocol the harness checks
with `isinstance`; without one the machine never draws the rules that need it. Each capability lives with the role
of the harness that uses it:

- here, the options a deployment declares (`CapturesTokens`, `PolicyWorkers`, `ServerWorkers`; `spec_of` reads
  them) and where the `/run`s of restarts go (`RestartEnvironment`);
- `ckpt_model.deployments.lifecycle`: start and crash (one server alone, one worker, a power cut, other planted
  faults, a collection run, where each worker serves);
- `ckpt_model.deployments.observe`: what the checker reads of the running system (its telemetry files);
- `ckpt_model.deployments.gate`: the gated backend, which holds every model call until the checker releases it;
- `ckpt_model.deployments.clocks`: the servers' clocks, skewed or moved forward;
- `ckpt_model.deployments.faults`: failpoints, storage faults, pauses, failing hooks, lost replies.

`ckpt_model.deployments.harness.Harness` composes them around one deployment. Which deployment to start is a
`ckpt_model.model.spec.DeploymentSpec`: `Harness.embedded(spec)` hands its keywords to the embedded system's
deployment factory, and `harness.spec` is what everything else reads.

`src/` imports nothing from `fakes/`. The look-alike stack is found through the entry point group
`ckpt_model.systems` (name `embedded`), which hands over a deployment factory and its planted-fault catalogue
(`ckpt_model.deployments.catalogue`); `ckpt_model.deployments.gym` is a second implementation that drives a real
Gym from its head server.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ckpt_model.model.spec import DeploymentSpec

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
class CapturesTokens(Protocol):
    """The policy model's capture ledgers (P5) and generation cuts (P12): `token_capture` (the policy model keeps
    capture ledgers, read with `capture_token` over the token-capture control routes), `generation_cuts` (closing
    admission cuts in-flight generations) and `clear_capture()`, which empties the capture directory while no Gym
    server runs (each example starts with no ledger); without them the machine checks neither P5 nor P12."""

    token_capture: bool
    generation_cuts: bool

    @property
    def capture_token(self) -> str: ...

    def clear_capture(self) -> None: ...


@runtime_checkable
class PolicyWorkers(Protocol):
    """How many worker processes serve the policy model behind its one port (the checker treats them as one
    participant)."""

    policy_workers: int


@runtime_checkable
class ServerWorkers(Protocol):
    """How many worker processes serve each environment, agent and resources server behind its port (each is still
    one participant)."""

    server_workers: int


@runtime_checkable
class RestartEnvironment(Protocol):
    """Where the `/run`s of restarts go: the environment bound to a `restart_only` resources server (a topology with
    a restart environment: `mixed`'s second environment)."""

    def restart_run_url(self) -> str: ...


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


def lacks(label: str, what: str) -> str:
    """Why the harness refuses a capability the `label` deployment lacks: the machine asked although it had none."""
    return f"the {label} deployment cannot do this: it has no {what} (the machine should not ask)"


def system(name: str = EMBEDDED) -> Any:
    """The system under test registered under `name` in the entry point group `ckpt_model.systems`."""
    found = entry_points(group=SYSTEMS_GROUP, name=name)
    if not found:
        raise LookupError(
            f"no system under test named {name!r} in entry point group {SYSTEMS_GROUP!r}; "
            "install the project (pip install -e .) so that its look-alike stack registers itself"
        )
    return next(iter(found)).load()
