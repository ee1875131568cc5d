"""The look-alike deployment's topologies: which Gym servers each one runs, and whom each server calls.

Pure data and two pure functions; `fakes.stack` builds every server's configuration from them.
"""

from __future__ import annotations

from collections.abc import Mapping

# Server instance names as in Gym's suite, with the role each plays per topology.
TOPOLOGIES: dict[str, dict[str, str]] = {
    "native": {
        "environment": "environment",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
    },
    "legacy": {
        "environment": "legacy_relay",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
    },
    # legacy rows of Gym's counter example: the resources server exports each session's count (mode `exported`)
    "counter": {
        "environment": "legacy_relay",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
    },
    # native, with a verification that asks a judge model on the backend: it blocks until the checker releases it
    "slow": {
        "environment": "environment",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
    },
    # native, plus a second environment whose resources server is `restart_only`: its episodes become restarts
    "mixed": {
        "environment": "environment",
        "agent": "agent",
        "resources": "resources",
        "policy_model": "policy_model",
        "restart_resources": "resources",
        "restart_environment": "environment",
    },
}
KIND_OF_ROLE = {
    "environment": "environment",
    "legacy_relay": None,
    "agent": "agent",
    "resources": "resources",
    "policy_model": "model",
}
# The servers each role calls; environments and the agent are resolved per server name by `peer_names`.
PEERS = {
    "legacy_relay": ("agent",),
    "resources": (),
    "policy_model": (),
}
# Where a server's Gym `resources_server` ref is not `resources`, and resources servers not in the topology's mode.
RESOURCES_SERVER_OF = {"restart_environment": "restart_resources"}
RESOURCES_MODE_OF = {"restart_resources": "restart_only"}


def peer_names(roles: Mapping[str, str], name: str) -> tuple[str, ...]:
    """The servers `name` calls: an environment its agent and the resources server it is bound to; the agent the
    policy model and every resources server (each native session's seed names the one its tools live on)."""
    role = roles[name]
    if role == "environment":
        return ("agent", RESOURCES_SERVER_OF.get(name, "resources"))
    if role == "agent":
        return ("policy_model", *sorted(peer for peer, peer_role in roles.items() if peer_role == "resources"))
    return PEERS[role]


def resources_mode(topology: str, name: str) -> str:
    """Reference 8.1: the counter exports its sessions, `restart_resources` is restart-only, the rest stateless."""
    return RESOURCES_MODE_OF.get(name, "exported" if topology == "counter" else "stateless")
