"""The launcher's per-server configuration, without starting anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes.deployment import EmbeddedDeployment
from fakes.gym.config import ServerConfig
from fakes.gym.policy.model import naming_model
from fakes.processes import ports
from fakes.stack import cli as stack_cli
from fakes.stack.launcher import Stack, policy_workers_count


def test_ports_are_chosen_once_and_kept_across_restarts(tmp_path: Path) -> None:
    """Every start asks for the configs; a port handed out per call would exhaust the range in a long run."""
    deployment = Stack("native", tmp_path, backend_url="http://127.0.0.1:1")
    handed_out = len(ports._handed_out)
    first = {name: config.port for name, config in deployment.configs().items()}
    for _ in range(50):
        assert {name: config.port for name, config in deployment.configs().items()} == first
    assert len(ports._handed_out) == handed_out + 4


def test_only_the_slow_topologys_resources_server_asks_a_judge(tmp_path: Path) -> None:
    slow = Stack("slow", tmp_path / "slow", backend_url="http://127.0.0.1:1", verify_mode="replay").configs()
    native = Stack("native", tmp_path / "native", backend_url="http://127.0.0.1:1").configs()
    assert {name for name, config in slow.items() if config.verify_judge} == {"resources"}
    assert {config.verify_mode for config in slow.values()} == {"replay"}
    assert not any(config.verify_judge for config in native.values())


def test_every_client_drops_an_idle_connection_long_before_a_server_closes_it() -> None:
    """A request sent on a keep-alive connection the server is closing fails with a transport error that no
    fault caused; clients (the servers' and the checker's) expire idle connections well before the servers."""
    from ckpt_model.protocol.http import KEEPALIVE_EXPIRY_S
    from fakes.gym.protocol.http import CLIENT_KEEPALIVE_EXPIRY_S, SERVER_KEEP_ALIVE_S

    assert 10 * max(CLIENT_KEEPALIVE_EXPIRY_S, KEEPALIVE_EXPIRY_S) < SERVER_KEEP_ALIVE_S


def test_the_mixed_topology_binds_its_second_environment_to_the_restart_only_resources_server(
    tmp_path: Path,
) -> None:
    configs = Stack("mixed", tmp_path, backend_url="http://127.0.0.1:1").configs()

    peers = {name: sorted(config.peers) for name, config in configs.items()}
    assert peers == {
        "environment": ["agent", "resources"],
        "restart_environment": ["agent", "restart_resources"],
        "agent": ["policy_model", "resources", "restart_resources"],
        "resources": [],
        "restart_resources": [],
        "policy_model": [],
    }
    environments = {name: config.resources_server for name, config in configs.items() if config.role == "environment"}
    assert environments == {"environment": "resources", "restart_environment": "restart_resources"}
    assert configs["agent"].resources_server == "resources", "legacy sessions keep the agent's own resources peer"
    modes = {name: config.resources_mode for name, config in configs.items() if config.role == "resources"}
    assert modes == {"resources": "stateless", "restart_resources": "restart_only"}


def test_only_the_mixed_topology_has_a_restart_run_url() -> None:
    native = EmbeddedDeployment("native")
    try:
        with pytest.raises(ValueError, match=r"topology 'native' has no restart_environment.*\['mixed'\]"):
            native.restart_run_url()
    finally:
        native.close()


def test_token_capture_reaches_only_the_policy_model_with_its_own_bearer(tmp_path: Path) -> None:
    deployment = Stack("native", tmp_path, backend_url="http://127.0.0.1:1", token_capture=True, generation_cuts=True)
    configs = deployment.configs()

    policy = configs["policy_model"]
    assert (policy.token_capture, policy.generation_cuts, policy.capture_token) == (
        True,
        True,
        deployment.capture_token,
    )
    assert policy.capture_dir == str(deployment.capture_dir)
    assert deployment.capture_token not in ("", deployment.token)
    others = [config for name, config in configs.items() if name != "policy_model"]
    assert not any(config.token_capture or config.generation_cuts or config.capture_token for config in others)
    described = deployment.describe()
    assert (described["token_capture"], described["generation_cuts"]) == (True, True)
    assert described["capture_token"] == deployment.capture_token
    assert (
        Stack("native", tmp_path / "off", backend_url="http://127.0.0.1:1").configs()["policy_model"].token_capture
        is False
    )


def test_cuts_need_token_capture_and_capture_needs_its_bearer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'generation_cuts' needs 'token_capture'"):
        Stack("native", tmp_path, generation_cuts=True)
    base = {"name": "policy_model", "role": "policy_model", "port": 1, "token": "t", "capture_dir": str(tmp_path)}
    with pytest.raises(ValueError, match="'generation_cuts' needs 'token_capture'"):
        ServerConfig(**base, generation_cuts=True)
    with pytest.raises(ValueError, match="non-empty 'capture_token'"):
        ServerConfig(**base, token_capture=True)
    with pytest.raises(SystemExit):
        stack_cli.main(["--state-dir", str(tmp_path), "--generation-cuts"])


def test_clear_capture_empties_the_capture_directory_only_while_gym_is_down(tmp_path: Path) -> None:
    deployment = EmbeddedDeployment("counter", root=tmp_path, token_capture=True)
    capture_dir = deployment.stack.capture_dir
    capture_dir.mkdir(parents=True)
    (capture_dir / "r0.lineage.jsonl").write_text("{}\n")

    deployment.clear_capture()

    assert capture_dir.is_dir()
    assert list(capture_dir.iterdir()) == []
    assert (deployment.token_capture, deployment.generation_cuts) == (True, False)
    assert deployment.capture_token == deployment.stack.capture_token
    deployment.stack.gym["policy_model"] = None  # type: ignore[assignment]  # only its presence matters here
    with pytest.raises(RuntimeError, match="running"):
        deployment.clear_capture()
    deployment.stack.gym.clear()


def test_the_stack_gives_its_worker_count_to_the_policy_model_only(tmp_path: Path) -> None:
    stack = Stack("mixed", tmp_path, policy_workers=2)
    assert {name: config.workers for name, config in stack.configs().items()} == {
        "environment": 1,
        "agent": 1,
        "resources": 1,
        "policy_model": 2,
        "restart_resources": 1,
        "restart_environment": 1,
    }
    assert stack.describe()["policy_workers"] == 2
    assert Stack("native", tmp_path).policy_workers == 1
    assert policy_workers_count(" 3") == 3
    for bad in (0, "0", "two", True):
        with pytest.raises(ValueError, match="'policy_workers' must be an integer >= 1"):
            policy_workers_count(bad)


def test_an_embedded_deployment_passes_its_policy_workers_to_its_stack() -> None:
    deployment = EmbeddedDeployment("native", policy_workers=2)
    try:
        assert (deployment.policy_workers, deployment.stack.configs()["policy_model"].workers) == (2, 2)
    finally:
        deployment.close()
    default = EmbeddedDeployment("native")
    try:
        assert default.policy_workers == 1
    finally:
        default.close()


def test_replanted_faults_go_into_every_next_config_and_unknown_ones_are_refused(tmp_path: Path) -> None:
    deployment = EmbeddedDeployment("native", root=tmp_path)
    try:
        assert {config.faults for config in deployment.stack.configs().values()} == {()}
        deployment.plant_faults(["resume_deletes_records"])
        assert deployment.faults == ("resume_deletes_records",)
        assert {config.faults for config in deployment.stack.configs().values()} == {("resume_deletes_records",)}
        with pytest.raises(ValueError, match=r"unknown fault\(s\) \['no_such_fault'\]"):
            deployment.plant_faults(["no_such_fault"])
        assert deployment.faults == ("resume_deletes_records",)
    finally:
        deployment.close()


def test_only_the_policy_model_names_the_real_models_served_model(tmp_path: Path) -> None:
    configs = Stack("native", tmp_path, backend_url="http://gpu:8000", backend_model="org/served").configs()
    assert {name: config.backend_model for name, config in configs.items() if config.backend_model} == {
        "policy_model": "org/served"
    }
    assert {config.backend_url for config in configs.values()} == {"http://gpu:8000"}


def test_a_deployment_on_a_real_model_starts_no_backend(tmp_path: Path) -> None:
    deployment = EmbeddedDeployment("native", root=tmp_path, model_url="http://gpu:8000", model_name="org/served")
    try:
        assert deployment.start_backend() is None
        assert deployment.stack.backend is None
    finally:
        deployment.close()


def test_the_policy_model_names_the_served_model_in_what_it_forwards() -> None:
    body = json.dumps({"model": "fake-model", "messages": [], "tools": []}).encode()
    assert json.loads(naming_model(body, "org/served")) == {"model": "org/served", "messages": [], "tools": []}
    assert naming_model(b"not json", "org/served") == b"not json"
    assert naming_model(b"[1]", "org/served") == b"[1]"
