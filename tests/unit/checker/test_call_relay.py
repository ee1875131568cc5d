"""The checker's relay (`ckpt_model.collection.relay`) against a real HTTP/1.1 server on loopback: it relays every
request and reply unchanged, journals control calls and `/run`s only, and passes on a dropped connection in both
directions without making up a reply."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from ckpt_model.collection.relay import CallRelay, operation_of
from ckpt_model.protocol.history import History
from tests.stack.conftest import wait_until

COMMIT = "/ng-control/v1/checkpoint/commit"
STATUS = "/ng-control/v1/checkpoint/status"


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[tuple[str, str, Any, int]] = []  # method, path, body, client port
        self.client_gone = threading.Event()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path, None, self.client_address[1]))
        self._reply({"phase": "idle"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(("POST", self.path, body, self.client_address[1]))
        if self.path == "/drop":
            self.close_connection = True  # no reply at all
        elif self.path == "/run" and body.get("hold"):
            if self.rfile.read(1) == b"":  # blocks until the relay closes this connection
                self.server.client_gone.set()
            self.close_connection = True
        elif self.path == "/run" and body.get("garbage"):
            self.wfile.write(b"HTTP/1.1 abc\r\nContent-Length: 0\r\n\r\n")  # a status that is not a number
            self.close_connection = True
        elif self.path == "/close-after":
            self._reply({"ok": True})
            self.close_connection = True  # closes the kept-alive connection after replying, unannounced
        else:
            self._reply({"echo": body})

    def _reply(self, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    thread = threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


def relay_to(url: str, observe: Callable[..., Any] | None = None) -> tuple[CallRelay, History, str]:
    history = History()
    relay = CallRelay({"agent": url}, history, observe)
    return relay, history, relay.start()["agent"]


def test_requests_and_replies_go_through_unchanged_and_control_calls_are_journaled(server: Server) -> None:
    seen: list[tuple[Any, ...]] = []

    def observe(*call: Any) -> dict[str, Any]:
        seen.append(call)
        return {"share": "read"}

    relay, history, url = relay_to(f"http://127.0.0.1:{server.server_port}", observe)
    try:
        with httpx.Client() as client:
            status = client.get(url + STATUS)
            commit = client.post(url + COMMIT, json={"checkpoint_id": "c1"})
    finally:
        relay.close()
    assert (status.status_code, status.json()) == (200, {"phase": "idle"})
    assert (commit.status_code, commit.json()) == (200, {"echo": {"checkpoint_id": "c1"}})
    assert [(method, path, body) for method, path, body, _ in server.requests] == [
        ("GET", STATUS, None),
        ("POST", COMMIT, {"checkpoint_id": "c1"}),
    ]
    assert len({port for *_, port in server.requests}) == 1  # one kept-alive connection to the server
    invoke, done = history.events  # the status poll is relayed without a record
    assert (invoke.process, invoke.f, invoke.type, invoke.value) == (
        "agent",
        "commit",
        "invoke",
        {"body": {"checkpoint_id": "c1"}},
    )
    assert (done.type, done.invoke_index) == ("ok", invoke.index)
    assert done.value == {"status": 200, "body": {"echo": {"checkpoint_id": "c1"}}, "share": "read"}
    assert seen == [("agent", "commit", {"checkpoint_id": "c1"}, 200, {"echo": {"checkpoint_id": "c1"}})]


def test_a_server_that_drops_the_call_drops_the_program_s_connection(server: Server) -> None:
    relay, history, url = relay_to(f"http://127.0.0.1:{server.server_port}")
    try:
        with httpx.Client() as client, pytest.raises(httpx.RemoteProtocolError):
            client.post(url + "/drop", json={})
    finally:
        relay.close()
    assert history.events == ()  # not a journaled route


def lost_run(upstream: str, body: Any) -> str:
    """A `/run` through a relay to `upstream` whose connection drops (the program sees a transport error): the
    call is journaled as invoked, then `info`; what the journal says of it."""
    relay, history, url = relay_to(upstream)
    try:
        with httpx.Client() as client, pytest.raises(httpx.TransportError):
            client.post(url + "/run", json=body)
    finally:
        relay.close()
    invoke, lost = history.events
    assert (invoke.f, lost.type, lost.invoke_index) == ("run", "info", invoke.index)
    return str(lost.value)


def test_a_server_that_does_not_listen_drops_the_connection_and_the_call_is_info() -> None:
    # discard: nothing listens on loopback
    said = lost_run("http://127.0.0.1:9", {"episode_id": {"rollout_id": "r", "attempt": 0}})
    assert "connection to the server failed" in said


def test_a_reply_the_relay_cannot_read_drops_the_connection_and_the_call_is_info(server: Server) -> None:
    said = lost_run(f"http://127.0.0.1:{server.server_port}", {"garbage": True})
    assert "the exchange broke off: ValueError" in said


def test_closing_the_relay_while_a_call_is_under_way_ends_it_and_journals_it(server: Server) -> None:
    """An example that failed stops the relay while the program's calls wait at the servers: each relayed call
    ends (both connections closed, the call journaled as `info`) before `close` returns."""
    relay, history, url = relay_to(f"http://127.0.0.1:{server.server_port}")
    failed: list[BaseException] = []

    def held_run() -> None:
        try:
            httpx.post(url + "/run", json={"hold": True}, timeout=30)
        except httpx.TransportError as error:
            failed.append(error)

    program = threading.Thread(target=held_run)
    program.start()
    wait_until(lambda: bool(server.requests), "the held /run at the server", 10)

    relay.close()

    program.join()
    assert server.client_gone.wait(10)
    assert len(failed) == 1
    invoke, lost = history.events
    assert (invoke.f, lost.type, lost.invoke_index) == ("run", "info", invoke.index)


def test_a_program_that_goes_away_closes_the_server_s_connection(server: Server) -> None:
    relay, history, url = relay_to(f"http://127.0.0.1:{server.server_port}")
    try:
        with httpx.Client() as client, pytest.raises(httpx.ReadTimeout):
            client.post(url + "/run", json={"hold": True}, timeout=0.3)
        wait_until(server.client_gone.is_set, "the server to see its client gone")
        wait_until(lambda: len(history.events) == 2, "the call's completion journaled")
    finally:
        relay.close()
    assert history.events[1].type == "info"


def test_a_server_that_closes_an_idle_connection_closes_the_program_s_and_the_next_call_opens_another(
    server: Server,
) -> None:
    relay, _, url = relay_to(f"http://127.0.0.1:{server.server_port}")
    try:
        with httpx.Client() as client:
            assert client.post(url + "/close-after", json={}).json() == {"ok": True}
            wait_until(lambda: relay.open_connections == 0, "the relay to hold no connection")
            assert client.post(url + COMMIT, json={"checkpoint_id": "c2"}).status_code == 200
    finally:
        relay.close()
    assert len({port for *_, port in server.requests}) == 2


def test_an_observer_that_fails_is_journaled_and_the_reply_still_goes_back(server: Server) -> None:
    def observe(*_: Any) -> dict[str, Any]:
        raise PermissionError("denied")

    relay, history, url = relay_to(f"http://127.0.0.1:{server.server_port}", observe)
    try:
        with httpx.Client() as client:
            assert client.post(url + COMMIT, json={"checkpoint_id": "c3"}).status_code == 200
    finally:
        relay.close()
    assert history.events[1].value["observe_error"] == "PermissionError: denied"


def test_which_requests_are_journaled() -> None:
    assert operation_of("POST", "/run") == "run"
    assert operation_of("POST", COMMIT) == "commit"
    assert operation_of("POST", COMMIT + "?x=1") == "commit"
    assert operation_of("GET", STATUS) is None
    assert operation_of("POST", "/ng-control/v1/checkpoint/a/b") is None
    assert operation_of("POST", "/v1/responses") is None
