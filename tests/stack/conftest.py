"""Fixtures for tests that run the look-alike stack as real processes and drive it over HTTP only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs
import httpx
import pytest

from ckpt_model.protocol.client import ControlClient, PrepareResult
from ckpt_model.protocol.gym_tasks import native_run_body
from fakes.gym.protocol.wire import bearer
from fakes.processes import process_groups
from fakes.processes.process_groups import process_state
from fakes.stack.launcher import Stack

WAIT_TIMEOUT_S = 30.0
POLL_S = 0.01
DEADLINE_S = 20.0
T = TypeVar("T")


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


group_gone = process_groups.gone


def move_clock(deployment: Deployment, name: str, offset_s: float) -> None:
    """Move server `name`'s wall clock `offset_s` from the true time (`POST /_ctl/clock`; 0 puts it back)."""
    response = httpx.post(
        f"{deployment.url(name)}/_ctl/clock",
        json={"offset_s": offset_s},
        headers={"Authorization": bearer(deployment.stack.token)},
    )
    response.raise_for_status()


def process_gone(pid: int) -> bool:
    """Gone or a zombie: an orphan is reaped by whoever adopts it, which may take its time."""
    return process_state(pid) in (None, "Z")


def deadline() -> float:
    return time.time() + DEADLINE_S


class Deployment:
    """A started stack plus the clients a controller would hold: control plane, backend, `/run`."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = httpx.Client(timeout=httpx.Timeout(30.0, read=None), trust_env=False)
        self.control = ControlClient(stack.token, http=self.http)
        self.discover()

    def discover(self) -> None:
        self.control.discover_from_servers({name: server.url for name, server in self.stack.gym.items()})

    def backend(self, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.stack.backend_url}{path}"
        response = self.http.post(url, json=body or {}) if path != "/_ctl/calls" else self.http.get(url)
        response.raise_for_status()
        return response.json()

    def calls(self) -> list[dict[str, Any]]:
        return self.backend("/_ctl/calls")

    def url(self, name: str) -> str:
        return self.stack.gym[name].url

    def status(self, name: str) -> dict[str, Any]:
        """The status reply of the participant server `name` (`environment`, `agent`, `resources`, ...)."""
        (member,) = [member for member in self.control.participants if member.name == name]
        return self.control.status(member)

    def wait_call_waiting(self, index: int, kind: str) -> None:
        """Wait until backend call `index` (a `policy` or `judge` call) has arrived and waits at the backend."""

        def waiting() -> bool:
            calls = self.calls()
            return len(calls) > index and calls[index]["waiting"] and calls[index]["kind"] == kind

        wait_until(waiting, f"{kind} call {index} to wait at the backend")

    def release_when_waiting(self, index: int, kind: str) -> None:
        """Wait until call `index` waits at the gated backend, then let exactly it go."""
        self.wait_call_waiting(index, kind)
        self.backend("/_ctl/step", {"indices": [index]})

    def run(self, body: dict[str, Any], server: str = "environment") -> httpx.Response:
        """A native `/run` on the environment server `server` (`restart_environment` in topology `mixed`)."""
        return self.http.post(self.url(server) + "/run", json=body)

    def run_in_background(self, body: dict[str, Any], server: str = "environment") -> BackgroundRun:
        return BackgroundRun(lambda: self.run(body, server))

    def start_held(self, body: dict[str, Any], calls_delivered: int) -> BackgroundRun:
        """Send `/run` in the background with the backend holding every call after the first `calls_delivered`;
        return once the held call has reached the backend."""
        self.backend("/_ctl/hold", {"after_calls": calls_delivered})
        run = self.run_in_background(body)
        wait_until(lambda: len(self.calls()) == calls_delivered + 1, f"model call {calls_delivered} to be held")
        return run

    def start_mixed(self) -> tuple[BackgroundRun, BackgroundRun]:
        """Topology `mixed`, Gym's scenarios 15 and 16: hold every model call, send `continued` to the environment
        and `restart` to restart_environment (attempt 0 each); return both `/run`s once each first call is held."""
        self.backend("/_ctl/hold", {"after_calls": 0})
        continued = self.run_in_background(native_run_body("continued", 0))
        restart = self.run_in_background(native_run_body("restart", 0), "restart_environment")
        wait_until(lambda: len(self.calls()) == 2, "the first model call of both rollouts to be held")
        return continued, restart

    def finish_verification_during_prepare(
        self, rollout_id: str, checkpoint_id: str
    ) -> tuple[BackgroundRun, PrepareResult]:
        """Gym's scenario 10 up to its prepare (slow topology, `wait` mode): gate the backend, start attempt 0 of
        `rollout_id` and release its two policy calls, so its judge call (call 2) waits; start a prepare, which
        must wait on the environment with that episode as its blocker; release the judge call; return the
        prepare's result with the `/run`, still waiting for its reply."""
        self.backend("/_ctl/gate")
        run = self.run_in_background(native_run_body(rollout_id, 0))
        self.release_when_waiting(0, "policy")
        self.release_when_waiting(1, "policy")
        self.wait_call_waiting(2, "judge")
        prepare = InBackground(lambda: self.control.prepare(checkpoint_id, deadline()))

        def environment_waits_for_verification() -> bool:
            status = self.status("environment")
            return status["phase"] == "preparing" and status["report"]["blockers"] == [rollout_id]

        wait_until(environment_waits_for_verification, f"the environment's prepare to wait for {rollout_id}")
        self.backend("/_ctl/step", {"indices": [2]})
        return run, prepare.result()

    def crash_and_restart(self) -> None:
        """SIGKILL every Gym process group, release what the backend held, start fresh Gym processes."""
        self.stack.crash_gym()
        self.backend("/_ctl/release")
        self.stack.start_gym()
        self.discover()


class InBackground(Generic[T]):
    """Any blocking call (a prepare that must wait, say) on its own thread; its value or exception is kept."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value = call()
        except BaseException as error:  # re-raised on the test's thread by result()
            self._error = error

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout_s: float = WAIT_TIMEOUT_S) -> T:
        self._thread.join(timeout_s)
        assert self.done, f"the background call did not return within {timeout_s:g} s"
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when no error was raised


class BackgroundRun:
    """A `/run` on its own thread: the reply (or the transport error of a crash) is kept for the test."""

    def __init__(self, send: Callable[[], httpx.Response]) -> None:
        self.reply: httpx.Response | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(send,), daemon=True)
        self._thread.start()

    def _run(self, send: Callable[[], httpx.Response]) -> None:
        try:
            self.reply = send()
        except httpx.HTTPError as error:
            self.error = error

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        self._thread.join(timeout_s)
        assert self.done, f"/run neither replied nor failed within {timeout_s:g} s"

    def result(self, timeout_s: float = WAIT_TIMEOUT_S) -> httpx.Response:
        self.wait(timeout_s)
        assert self.reply is not None, f"/run did not reply within {timeout_s:g} s (error: {self.error})"
        return self.reply


@attrs.frozen
class StackOptions:
    """What a test asks of a deployment apart from its faults: tests asking the same share a stack."""

    topology: str
    verify_mode: str = "wait"
    policy_workers: int = 1
    fork_server: bool = True
    token_capture: bool = False
    generation_cuts: bool = False
    server_workers: int = 1


def redeployable(options: StackOptions) -> dict[str, Any]:
    """The options `Stack.redeploy` takes besides the topology: all but the start path."""
    return attrs.asdict(options, filter=lambda field, _: field.name not in ("topology", "fork_server"))


class StackPool:
    """The stacks one pytest worker keeps between tests. A test gets an idle stack started afresh
    (`Stack.start_afresh`: new Gym servers, a reset backend, empty directories), which skips a backend and a fork
    server warming up: most of a stack test's CPU. One used with the same options is taken first; otherwise one
    with the same start path (fork server or cold) is redeployed to the options asked (`Stack.redeploy`). The
    `keep` most recently used idle stacks are kept; the others, and all of them at the end of the session, are
    stopped."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = root
        self.keep = keep
        self.idle: dict[StackOptions, Stack] = {}
        self.started = 0

    def take(self, options: StackOptions, faults: tuple[str, ...]) -> Stack:
        stack = self.idle.pop(options, None) or self._idle_to_redeploy(options)
        if stack is not None and self._reusable(stack):
            try:
                stack.redeploy(options.topology, **redeployable(options))
                stack.start_afresh(faults)
            except BaseException:
                stack.stop()
                raise
            return stack
        if stack is not None:
            stack.stop()
        return self._start(options, faults)

    def _idle_to_redeploy(self, options: StackOptions) -> Stack | None:
        """The most recently used idle stack on the same start path, taken out of the pool (None: there is none)."""
        for idle_options in reversed(list(self.idle)):
            if idle_options.fork_server == options.fork_server:
                return self.idle.pop(idle_options)
        return None

    def give_back(self, options: StackOptions, stack: Stack) -> None:
        """Kill the test's Gym servers now (nothing of one test runs on into the next) and keep the stack idle."""
        try:
            stack.crash_gym()
        except BaseException:
            stack.stop()
            raise
        replaced = self.idle.pop(options, None)  # a test that started two alike: keep the later one
        if replaced is not None:
            replaced.stop()
        self.idle[options] = stack
        while len(self.idle) > self.keep:
            oldest = next(iter(self.idle))
            self.idle.pop(oldest).stop()

    def close(self) -> None:
        while self.idle:
            _, stack = self.idle.popitem()
            stack.stop()

    def _start(self, options: StackOptions, faults: tuple[str, ...]) -> Stack:
        self.started += 1
        stack = Stack(
            options.topology,
            self.root / f"stack-{self.started}",
            faults=faults,
            fork_server=options.fork_server,
            **redeployable(options),
        )
        try:
            stack.start_backend()
            stack.start_gym()
        except BaseException:
            stack.stop()
            raise
        return stack

    @staticmethod
    def _reusable(stack: Stack) -> bool:
        """The backend still runs (a test may have killed it); a dead fork server is replaced by the next start."""
        backend = stack.backend
        return backend is not None and backend.process is not None and backend.process.poll() is None


@pytest.fixture(scope="session")
def stack_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackPool]:
    pool = StackPool(tmp_path_factory.mktemp("stacks"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def deploy(stack_pool: StackPool) -> Iterator[Callable[..., Deployment]]:
    """Start a whole deployment of a topology (optionally with planted faults, token capture and generation cuts,
    several policy model workers, or cold-started servers): fresh Gym servers, a reset backend and empty
    directories, on a stack of the worker's pool (`StackPool`); its Gym servers stop at teardown."""
    taken: list[tuple[StackOptions, Deployment]] = []

    def start(
        topology: str,
        verify_mode: str = "wait",
        faults: tuple[str, ...] = (),
        policy_workers: int = 1,
        fork_server: bool = True,
        *,
        token_capture: bool = False,
        generation_cuts: bool = False,
        server_workers: int = 1,
    ) -> Deployment:
        options = StackOptions(
            topology,
            verify_mode,
            policy_workers,
            fork_server,
            token_capture=token_capture,
            generation_cuts=generation_cuts,
            server_workers=server_workers,
        )
        stack = stack_pool.take(options, tuple(faults))
        try:
            deployment = Deployment(stack)
        except BaseException:
            stack_pool.give_back(options, stack)
            raise
        taken.append((options, deployment))
        return deployment

    yield start
    for options, deployment in taken:
        deployment.http.close()
        stack_pool.give_back(options, deployment.stack)
