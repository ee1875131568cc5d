"""A look-alike of Gym's head server: the one route a controller reads to find the deployment's servers.

Gym's head server answers `GET /global_config_dict_yaml` with the global config as YAML text, JSON-encoded as a
string (reference section 1.3 and `coordination.discover`). The launcher serves it from a thread when asked
(`python -m fakes.stack --head-port PORT`), so a controller can find our stack exactly as it finds a real Gym.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

GLOBAL_CONFIG_ROUTE = "/global_config_dict_yaml"
# The server-type key of each role's entry in Gym's global config (reference 1.3).
SERVER_TYPES: dict[str, str] = {
    "environment": "environment_servers",
    "agent": "responses_api_agents",
    "resources": "resources_servers",
    "policy_model": "responses_api_models",
}


def global_config(servers: Mapping[str, str]) -> dict[str, Any]:
    """The global config's server entries for servers {name: base URL} (host and port per implementation)."""
    config: dict[str, Any] = {}
    for name, url in servers.items():
        host, _, port = url.removeprefix("http://").partition(":")
        server_type = SERVER_TYPES.get(name, "environment_servers")
        config[name] = {server_type: {name: {"entrypoint": "app.py", "host": host, "port": int(port)}}}
    return config


def serve_head(host: str, port: int, servers: Callable[[], Mapping[str, str]]) -> ThreadingHTTPServer:
    """Serve the head route on a daemon thread until `shutdown()`; `servers` is read on every request."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != GLOBAL_CONFIG_ROUTE:
                self.send_error(404)
                return
            body = json.dumps(yaml.safe_dump(global_config(servers()))).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="head-server", daemon=True).start()
    return server
