"""How one look-alike server learns who it is: a JSON object in the `CKPT_FAKES_SERVER` environment variable.

The launcher (`fakes.stack`) writes it; `fakes.gym.serve` reads it, builds the app for `role` and serves it.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Literal

import attrs

from fakes.faults import validate as validate_faults

CONFIG_ENV = "CKPT_FAKES_SERVER"
Role = Literal["environment", "legacy_relay", "agent", "resources", "policy_model"]
ROLES: tuple[str, ...] = ("environment", "legacy_relay", "agent", "resources", "policy_model")
# Reference 8.1; `restart_only` is Gym's default for resources servers nobody audited.
RESOURCES_MODES: tuple[str, ...] = ("stateless", "exported", "restart_only")
DEFAULT_LEASE_GRACE_S = 600.0
# Servers that can run several uvicorn workers behind their port (`fakes.gym.workers.coordinator_process`): the policy
# model (`fakes.gym.policy.model_workers`) and every other participant (`fakes.gym.servers.participant_workers`); the
# legacy relay, which keeps nothing, is one process.
MULTI_WORKER_ROLES: tuple[str, ...] = ("environment", "agent", "resources", "policy_model")
PARTICIPANT_WORKER_ROLES: tuple[str, ...] = ("environment", "agent", "resources")


def lease_grace(value: float) -> float:
    """A lease grace in seconds: finite and >= 0, or a ValueError that says so."""
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"'lease_grace_s' must be a finite number of seconds >= 0 (got {value!r})")
    return seconds


def check_capture(token_capture: bool, generation_cuts: bool) -> None:
    """Cuts need token capture: a cut's prefix is staged under, and continued by, a captured call."""
    if generation_cuts and not token_capture:
        raise ValueError("'generation_cuts' needs 'token_capture' on (got generation_cuts=True, token_capture=False)")


@attrs.frozen(kw_only=True)
class ServerConfig:
    """Everything one server process needs; `peers` maps instance names to base URLs."""

    name: str
    role: Role = attrs.field(validator=attrs.validators.in_(ROLES))
    host: str = "127.0.0.1"
    port: int
    token: str
    backend_url: str = ""
    # The model the policy model server names in every call it forwards (the `model` field), as Gym's model server
    # names its configured model: a real server (vLLM) serves only its own ids. "" forwards the agent's name as is.
    backend_model: str = ""
    peers: dict[str, str] = attrs.field(factory=dict)
    capture_dir: str = ""
    faults: tuple[str, ...] = attrs.field(default=(), converter=validate_faults)
    # Seconds a checkpoint's lease outlives the last call's deadline_ts (reference 2.7); short in lease tests.
    lease_grace_s: float = attrs.field(default=DEFAULT_LEASE_GRACE_S, converter=lease_grace)
    resources_mode: str = attrs.field(default="stateless", validator=attrs.validators.in_(RESOURCES_MODES))
    # Gym's `resources_server` ref: the instance name of the resources server this server seeds (environment) or
    # sends legacy sessions' tool calls to (agent). A native session's tool calls go where its seed names.
    resources_server: str = "resources"
    verify_mode: str = attrs.field(default="wait", validator=attrs.validators.in_(("wait", "replay")))
    verify_judge: bool = False
    # Where the store records every fsync (`fakes.gym.faults.power_cuts`), so a power cut can be applied; "" records
    # none.
    durability_journal: str = ""
    # The policy model's token capture (capture ledger under `capture_dir`, its control routes under the bearer
    # `capture_token`) and generation cuts (reference 7.2, 7.3); other roles ignore them.
    token_capture: bool = False
    generation_cuts: bool = False
    capture_token: str = ""
    # uvicorn worker processes behind the one port; more than one makes the server a coordinator (reference 1.4).
    workers: int = 1
    # Where each process that runs this server's control plane writes its spans and metrics
    # (`<telemetry_dir>/<name>-<pid>.jsonl`, `fakes.gym.control.telemetry`); "" records none.
    telemetry_dir: str = ""

    def __attrs_post_init__(self) -> None:
        check_capture(self.token_capture, self.generation_cuts)
        if self.token_capture and not (self.capture_token and self.capture_dir):
            raise ValueError(
                "token capture needs a non-empty 'capture_token' (the ledger routes' bearer) and 'capture_dir' "
                f"(got capture_token={self.capture_token!r}, capture_dir={self.capture_dir!r})"
            )
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"'workers' must be an integer >= 1 (got {self.workers!r})")
        if self.workers > 1 and self.role not in MULTI_WORKER_ROLES:
            raise ValueError(
                f"'workers' must be 1 for role {self.role!r} (got {self.workers}); only {list(MULTI_WORKER_ROLES)} "
                "servers run several workers"
            )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def peer(self, name: str) -> str:
        try:
            return self.peers[name]
        except KeyError:
            raise ValueError(f"server {self.name!r} has no peer {name!r} (peers: {sorted(self.peers)})") from None

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)

    @classmethod
    def from_env(cls) -> ServerConfig:
        text = os.environ.get(CONFIG_ENV)
        if not text:
            raise SystemExit(f"{CONFIG_ENV} is not set: start servers with `python -m fakes.stack`")
        return cls.from_json(text)
