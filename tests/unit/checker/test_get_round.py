"""`GetRound` against small local HTTP/1.1 servers (the standard library's): one round asks every server, kept
connections are reused, a connection the server dropped or a restarted server is asked again afresh, a server that
is down is a transport error; and the control client's status round and the backend gate's call list read through
it."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ckpt_model.deployments.gate import BackendGate
from ckpt_model.errors import ControlCallFailed, CoordinationError
from ckpt_model.protocol import get_round
from ckpt_model.protocol.client import ControlClient, Participant, Participants
from ckpt_model.protocol.get_round import GetRound


class Server:
    """An HTTP/1.1 server on 127.0.0.1 answering every GET with `reply` (status, JSON body); counts the
    connections it accepted. `stop` closes it and every connection it holds; `start` serves the same port again."""

    def __init__(self, reply: tuple[int, Any] = (200, {"ok": True}), port: int = 0) -> None:
        self.reply = reply
        self.connections = 0
        self.paths: list[str] = []
        self.sockets: list[socket.socket] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                owner.connections += 1
                owner.sockets.append(self.request)
                super().setup()

            def do_GET(self) -> None:
                owner.paths.append(self.path)
                status, body = owner.reply
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.handler = Handler
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        # A connection `stop` cut mid-request is what the tests make happen, not an error to print.
        self.server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        for held in self.sockets:  # as a killed server's: every connection it held is gone too
            with contextlib.suppress(OSError):
                held.shutdown(socket.SHUT_RDWR)


STATUS = {
    "kind": "agent",
    "instance": "alpha",
    "phase": "idle",
    "report": {"ready": True, "blockers": [], "blocker_count": 0, "counts": {}, "restarts": []},
}


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started = [Server((200, STATUS)), Server((401, {"error": {"code": "unauthorized", "detail": "no token"}}))]
    yield started
    for server in started:
        server.stop()


def statuses(answers: list[Any] | None) -> list[Any]:
    assert answers is not None
    return [answer.status_code if not isinstance(answer, Exception) else type(answer) for answer in answers]


def test_one_round_asks_every_server_and_the_next_reuses_the_connections(servers: list[Server]) -> None:
    round_ = GetRound(timeout_s=5.0)
    urls = [f"{server.url}/status?x=1" for server in servers]

    first = round_.get_all(urls, {"authorization": "Bearer t"})
    second = round_.get_all(urls, {"authorization": "Bearer t"})
    round_.close()

    assert statuses(first) == statuses(second) == [200, 401]
    assert first is not None
    assert first[0].json() == STATUS
    assert [server.paths for server in servers] == [["/status?x=1"] * 2] * 2
    assert [server.connections for server in servers] == [1, 1]


def test_a_restarted_server_is_asked_again_on_a_fresh_connection(servers: list[Server]) -> None:
    round_ = GetRound(timeout_s=5.0)
    round_.get_all([servers[0].url], {})
    port = servers[0].port
    servers[0].stop()
    servers[0] = Server(port=port)  # the kept connection now leads nowhere

    answers = round_.get_all([servers[0].url], {})
    round_.close()

    assert statuses(answers) == [200]
    assert servers[0].connections == 1


def test_an_idle_connection_is_dropped_before_the_server_may_drop_it(
    servers: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(get_round, "KEEPALIVE_EXPIRY_S", 0.0)
    round_ = GetRound(timeout_s=5.0)

    round_.get_all([servers[0].url], {})
    round_.get_all([servers[0].url], {})
    round_.close()

    assert servers[0].connections == 2


def test_a_server_that_is_down_is_a_transport_error_and_the_others_still_answer(servers: list[Server]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"  # bound, not listening: refused
        round_ = GetRound(timeout_s=5.0)
        answers = round_.get_all([down, servers[0].url], {})
        round_.close()

    assert statuses(answers) == [ConnectionRefusedError, 200]


def test_a_round_under_way_in_another_thread_leaves_the_caller_to_ask_its_own_way(servers: list[Server]) -> None:
    round_ = GetRound(timeout_s=5.0)
    with round_._lock:
        assert round_.get_all([servers[0].url], {}) is None
    assert servers[0].paths == []


def test_only_plain_http_urls_are_served() -> None:
    assert GetRound.serves("http://127.0.0.1:8000/status")
    assert not GetRound.serves("https://gym.example:443/status")
    assert not GetRound.serves("http:///status")


def test_the_status_round_of_the_control_client_reads_replies_and_failures(servers: list[Server]) -> None:
    members = [Participant("alpha", "agent", servers[0].url), Participant("beta", "environment", servers[1].url)]
    status_round = GetRound(timeout_s=5.0)
    client = ControlClient("t", Participants(members), status_round=status_round)

    with pytest.raises(CoordinationError) as raised:
        client.status_all()
    status_round.close()
    client.close()

    failure = raised.value.failures["beta"]
    assert (failure.http_status, failure.code) == (401, "unauthorized")
    assert raised.value.replies == {"alpha": STATUS}
    assert servers[0].paths == ["/ng-control/v1/checkpoint/status"]


def test_the_backend_gate_reads_its_call_list_through_the_round() -> None:
    backend = Server((200, [{"index": 0, "capture_key": "r0", "waiting": True}]))
    calls_round = GetRound(timeout_s=5.0)
    with httpx.Client() as http:
        gate = BackendGate(backend.url, http, calls_round)
        listed = gate.calls()
        backend.stop()
        with pytest.raises(ControlCallFailed) as failed:
            gate.calls()
    calls_round.close()

    assert failed.value.call == f"GET {backend.url}/_ctl/calls"
    assert failed.value.status is None
    assert failed.value.doing == "reading the backend's calls"

    assert listed == [{"index": 0, "capture_key": "r0", "waiting": True}]
    assert backend.paths == ["/_ctl/calls"]
