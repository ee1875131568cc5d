"""Scale mode: Gym's scenario 13 (`test_checkpoint_at_scale`) against the look-alike stack.

Thousands of native weather rollouts are put in flight, checkpointed (prepare, commit), every Gym process is
killed (SIGKILL of each process group; the fake backend survives), the checkpoint is restored and resumed, and
every replacement runs. The controller contract is then checked as Gym checks it, plus the continuation check
this checker adds:

- finished and exported are disjoint and together cover every rollout (P1);
- no `/run` in flight replies while the checkpoint is open (P2);
- every replacement completes with the reward of an uninterrupted run (P3);
- every rollout made exactly the model calls its script still needed, by message count: a replacement's first
  backend call is the call after the last delivered one (P4, as `properties.continuation.p4_calls` judges it).

Before the checkpoint every rollout is in one of three places, so the continuation check sees every boundary:
finished (both calls released, replied before prepare), waiting at its first call (restores from the start:
calls 2, 4), or waiting at its second call with the first delivered (continues with call 4 alone).

How many can be in flight at once is bounded by file descriptors, not by the protocol: a rollout waiting at the
backend holds a socket on each side of every hop (client -> environment -> agent -> model -> backend), so a middle
server holds two per rollout, and a worker that relays a request to the sibling owning its episode two more. The
servers are split into enough workers (`workers_for`) that no process needs more than its RLIMIT_NOFILE allows;
what cannot be split, the checker's own process and the fake backend, holds one per rollout (`in_flight_max`).
Rollouts beyond that bound are finished before the checkpoint (the plan says so, and the stage table prints it).

Thousands of concurrent `/run`s share one event loop in one thread (`RunSender`); each `/run` uses its own
connection, since httpx's pool scans every connection on every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import httpx

from ckpt_model.deployments.gate import BackendGate
from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import poll
from ckpt_model.errors import HarnessError, QuiescenceTimeout
from ckpt_model.model.contract import SCRIPTS, ScriptCall, capture_key
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.properties.continuation import p2_silent_while_checkpointed, p3_every_reply_complete, p4_calls_complete
from ckpt_model.properties.scope import p1_finished_or_exported
from ckpt_model.protocol.client import ControlClient
from ckpt_model.protocol.gym_tasks import WEATHER_SCRIPT, native_run_body
from ckpt_model.protocol.http import checked_json, control_call
from ckpt_model.protocol.wire import EpisodeId
from ckpt_model.results.progress import EVERY_S, PLAIN_PREFIX, Heartbeat

TOPOLOGY = "native"
SCALE_ENV = "CKPT_MODEL_SCALE"
ROLLOUT_PREFIX = "scale-"
# Share of the rollouts finished before the checkpoint: by default none, every rollout in flight at the checkpoint
# (Gym's scenario 13); a share above 0 also checks rollouts that replied before it (the default run uses 0.125).
FINISHED_SHARE = 0.0
# Descriptors a server needs besides two per rollout: its listening socket and logs, and the idle keep-alive
# connections it keeps to each peer (up to 256 a peer in fakes.gym.protocol.http).
FDS_RESERVED = 1024
# Descriptors a rollout in flight costs the processes that cannot be split: the checker's `/run` socket, the
# backend's side of the waiting call.
FDS_PER_ROLLOUT = 1
# The kernel hands each connection to whichever worker accepts first, so a worker can get more than its share: a
# server gets enough workers that each could hold twice its share.
WORKER_SHARE_HEADROOM = 2.0
WORKERS_MAX = 16
# /runs sent but not yet seen at the backend (or replied): enough to keep every server busy, few enough that
# connects never overflow a listen backlog (uvicorn's is 2048) and the servers' idle connections get reused.
DISPATCH_WINDOW = 256
CONTROL_DEADLINE_S = 600.0
# A wait gives up only when nothing moved for this long: slowness alone is never a verdict.
STALL_S = 120.0
LOG_LINES_SHOWN = 40
CHECKPOINT_ID = "scale-c1"
RESTORE_ID = "scale-r1"
T = TypeVar("T")


class ScaleError(HarnessError):
    """The scale run could not reach a state it needs (a wait ran out, a control call failed)."""


# --- the plan and the pure checks --------------------------------------------------------------------------


@attrs.frozen
class ScalePlan:
    """Where each rollout stands at the checkpoint; rollout IDs are `scale-<index>`."""

    finished: tuple[str, ...]
    at_first: tuple[str, ...]
    at_second: tuple[str, ...]

    @classmethod
    def split(cls, rollouts: int, in_flight_max: int, finished_share: float = FINISHED_SHARE) -> ScalePlan:
        """`finished_share` finished (rounded up), more where `in_flight_max` caps what can be in flight; the rest
        in flight, half at each call."""
        if rollouts < 3:
            raise ValueError(f"'rollouts' must be at least 3, one per place (got {rollouts})")
        if in_flight_max < 2:
            raise ValueError(f"'in_flight_max' must be at least 2 (got {in_flight_max})")
        if not 0 <= finished_share < 1:
            raise ValueError(f"'finished_share' must be at least 0 and below 1 (got {finished_share})")
        # At least one at each call.
        finished = min(max(math.ceil(rollouts * finished_share), rollouts - in_flight_max), rollouts - 2)
        in_flight = rollouts - finished
        width = len(str(rollouts - 1))
        names = [f"{ROLLOUT_PREFIX}{index:0{width}d}" for index in range(rollouts)]
        second = in_flight // 2
        return cls(
            finished=tuple(names[:finished]),
            at_second=tuple(names[finished : finished + second]),
            at_first=tuple(names[finished + second :]),
        )

    @property
    def rollouts(self) -> tuple[str, ...]:
        return self.finished + self.at_second + self.at_first

    @property
    def in_flight(self) -> tuple[str, ...]:
        return self.at_second + self.at_first


def expected_calls(plan: ScalePlan) -> dict[str, tuple[ScriptCall, ...]]:
    """Every capture key's backend calls, by message count: a replacement makes the calls not yet delivered."""
    script = SCRIPTS[TOPOLOGY]
    expected: dict[str, tuple[ScriptCall, ...]] = {}
    for rollout in plan.finished:
        expected[rollout] = script
    for delivered, rollouts in ((0, plan.at_first), (1, plan.at_second)):
        for rollout in rollouts:
            expected[rollout] = script[: delivered + 1]
            expected[capture_key(rollout, 1)] = script[delivered:]
    return expected


def check_cover(rollouts: Iterable[str], finished: Iterable[str], exported: Iterable[str]) -> str:
    """Finished and exported are disjoint and together cover every rollout (P1); returns the verdict."""
    everything, done, saved = set(rollouts), set(finished), set(exported)
    p1_finished_or_exported(everything, done, saved)
    return f"ok: {len(done)} finished + {len(saved)} exported = {len(everything)} rollouts, disjoint"


@attrs.frozen
class RunOutcome:
    """How one `/run` ended: an HTTP status and decoded body, or a transport error (a crash cut it off)."""

    status_code: int | None
    body: Any
    error: str | None = None


def check_replies(outcomes: Mapping[str, RunOutcome | None], reward: float, what: str) -> str:
    """Every `/run` replied HTTP 200 with the reward of an uninterrupted run (P3); returns the verdict."""
    replies = {
        key: None if outcome is None else (outcome.status_code, outcome.body) for key, outcome in outcomes.items()
    }
    p3_every_reply_complete(what, reward, replies)
    return f"ok: {len(outcomes)} {what} /runs replied 200 with reward {reward}"


def check_finished(outcomes: Mapping[str, RunOutcome | None], reward: float) -> str:
    """`check_replies` on the rollouts planned to finish before the checkpoint; with none planned, says so."""
    if not outcomes:
        return "none planned: every rollout was in flight at the checkpoint (a finished share above 0 plans some)"
    return check_replies(outcomes, reward, "finished")


def check_silent(replied: str | None, in_flight: int) -> str:
    """No `/run` in flight at the checkpoint ended before the crash (P2): it waits at the backend, or is held."""
    p2_silent_while_checkpointed(replied)
    return f"ok: none of the {in_flight} /runs in flight replied between the dispatch and the crash"


def check_continuations(
    expected: Mapping[str, tuple[ScriptCall, ...]], observed: Mapping[str, tuple[ScriptCall, ...]]
) -> str:
    """Every capture key made exactly its expected calls, none missing (P4); returns the verdict."""
    p4_calls_complete(expected, observed)
    continued = sum(1 for key in expected if EpisodeId.from_capture_key(key).attempt > 0)
    return f"ok: {len(expected)} capture keys made exactly their calls; {continued} continued from their boundary"


# --- file descriptors --------------------------------------------------------------------------------------


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def in_flight_max(fd_limit: int) -> int:
    """Rollouts that can wait at the backend at once: the checker and the backend (one process each) hold a socket
    per rollout; every server is split into enough workers (`workers_for`) to stay under the limit."""
    return max(2, (fd_limit - FDS_RESERVED) // FDS_PER_ROLLOUT)


def relaying_server_fds(in_flight: int, workers: int) -> float:
    """Descriptors one worker of an environment or agent server holds with `in_flight` rollouts spread evenly:
    its accepted requests and its requests to the next hop (one per rollout each, divided among the workers), and,
    for the accepted requests of episodes a sibling owns ((workers - 1) / workers of them), the relay to that
    sibling and the sibling's side of it."""
    share = in_flight / workers
    return share * (2 + 2 * (workers - 1) / workers)


def in_flight_bound(fd_limit: int, server_workers: int, policy_workers: int) -> int:
    """Rollouts that can be in flight at once on servers with these workers, each worker holding an even share
    (no headroom: the servers are what they are)."""
    usable = fd_limit - FDS_RESERVED
    per_server_rollout = relaying_server_fds(1, server_workers)
    return max(2, min(in_flight_max(fd_limit), int(usable / per_server_rollout), usable * policy_workers // 2))


def workers_for(in_flight: int, fd_limit: int) -> tuple[int, int]:
    """`(server_workers, policy_workers)`: the fewest workers of the environment and agent servers (which relay a
    request to the worker owning its episode) and of the policy model (which serves a call where it lands, as
    scale mode places none) with which each worker stays under `fd_limit`, with `WORKER_SHARE_HEADROOM`."""
    budget = (fd_limit - FDS_RESERVED) / WORKER_SHARE_HEADROOM

    def fewest(fds: Callable[[int], float], what: str) -> int:
        for workers in range(1, WORKERS_MAX + 1):
            if workers == 1 and 2 * in_flight <= fd_limit - FDS_RESERVED:
                return 1  # one process needs no headroom: it holds exactly its own
            if fds(workers) <= budget:
                return workers
        raise ValueError(f"{in_flight} rollouts in flight need more than {WORKERS_MAX} {what} workers")

    server = fewest(lambda n: relaying_server_fds(in_flight, n), "server")
    policy = fewest(lambda n: 2 * in_flight / n, "policy model")
    return server, policy


# --- the /run sender ---------------------------------------------------------------------------------------


class RunSender:
    """Thousands of concurrent `/run`s on one event loop in one thread; outcomes kept by capture key.

    A thread per request would need thousands of threads, and httpx's pool re-scans all its connections whenever
    a request starts or ends (quadratic in the requests in flight). So each `/run` is one plain HTTP/1.1 exchange
    on its own connection (`connection: close`), over asyncio streams."""

    def __init__(self, run_url: str, *, connect_timeout_s: float) -> None:
        url = urlsplit(run_url)
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(f"'run_url' must be an http:// URL (got {run_url!r})")
        self._host, self._port = url.hostname, url.port or 80
        self._head = (
            f"POST {url.path or '/'} HTTP/1.1\r\nhost: {url.netloc}\r\ncontent-type: application/json\r\n"
            "connection: close\r\ncontent-length: "
        ).encode()
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._outcomes: dict[str, RunOutcome] = {}
        # The loop holds its tasks weakly: these keep every `/run` alive while it waits.
        self._started: list[Future[RunOutcome]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="scale-runs", daemon=True)
        self._thread.start()

    def send(self, bodies: Mapping[str, dict[str, Any]]) -> None:
        """Start a `/run` for each capture key; returns at once."""
        for key, body in bodies.items():
            content = json.dumps(body).encode()
            request = self._head + str(len(content)).encode() + b"\r\n\r\n" + content
            self._started.append(asyncio.run_coroutine_threadsafe(self._post(key, request), self._loop))

    def outcomes(self, keys: Iterable[str]) -> dict[str, RunOutcome | None]:
        with self._lock:
            return {key: self._outcomes.get(key) for key in keys}

    def ended(self, keys: Iterable[str]) -> int:
        with self._lock:
            return sum(1 for key in keys if key in self._outcomes)

    def any_ended(self, keys: Iterable[str]) -> str | None:
        """None while every `/run` of `keys` is still open; else how many ended and how the first did."""
        with self._lock:
            ended = {key: self._outcomes[key] for key in keys if key in self._outcomes}
        if not ended:
            return None
        first = min(ended)
        return f"{len(ended)} /runs that should wait at the backend ended, {first}: {ended[first]}"

    def close(self) -> None:
        """Cancel what still runs, let it close its connections, and stop the loop."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _post(self, key: str, request: bytes) -> RunOutcome:
        try:
            outcome = await self._exchange(request)
        except (OSError, TimeoutError, ValueError) as error:
            outcome = RunOutcome(status_code=None, body=None, error=f"{type(error).__name__}: {error}")
        with self._lock:
            self._outcomes[key] = outcome
        return outcome

    async def _exchange(self, request: bytes) -> RunOutcome:
        async with asyncio.timeout(self._connect_timeout_s):
            reader, writer = await asyncio.open_connection(self._host, self._port)
        try:
            writer.write(request)
            await writer.drain()
            reply = await reader.read()  # the server closes after its reply (`connection: close`)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return _parsed_reply(reply)


def _parsed_reply(reply: bytes) -> RunOutcome:
    """Status and JSON body of a whole HTTP/1.1 reply; ValueError when it is cut short or malformed."""
    head, separator, body = reply.partition(b"\r\n\r\n")
    if not separator:
        raise ValueError(f"the server closed the connection without a whole reply ({len(reply)} bytes)")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status_code = int(status_line.split(" ", 2)[1])
    headers = dict(line.lower().split(":", 1) for line in header_lines)
    length = headers.get("content-length")
    if length is not None and len(body) != int(length):
        raise ValueError(f"the reply was cut short: {len(body)} of {int(length)} bytes")
    if "chunked" in headers.get("transfer-encoding", ""):
        raise ValueError("a chunked /run reply is not expected from this server")
    return RunOutcome(status_code=status_code, body=_decoded(body))


async def _cancel_all() -> None:
    """Cancel every other task on the loop and wait for them, so each closes its connection."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _decoded(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content.decode(errors="replace")


# --- the backend's calls -----------------------------------------------------------------------------------


class CallLog:
    """The backend's calls, read incrementally (`GET /_ctl/calls?since=n`): a poll costs only the new calls."""

    def __init__(self, gate: BackendGate, http: httpx.Client) -> None:
        self._url = gate.url + "/_ctl/calls"
        self._http = http
        self.calls: list[dict[str, Any]] = []

    def refresh(self) -> list[dict[str, Any]]:
        """Fetch the calls not yet seen; returns them."""
        with control_call("reading the backend's new calls"):
            new = checked_json(self._http.get(self._url, params={"since": len(self.calls)}))
        # A backend without `since` answers every call: keep only the unseen tail.
        if new and new[0]["index"] < len(self.calls):
            new = new[len(self.calls) :]
        self.calls.extend(new)
        return new

    def index_of(self, keys: Iterable[str], n_messages: int) -> list[int]:
        """The indices of the calls with `n_messages` of each key, in call order."""
        wanted = set(keys)
        return [c["index"] for c in self.calls if c["capture_key"] in wanted and c["n_messages"] == n_messages]

    def by_key(self) -> dict[str, tuple[ScriptCall, ...]]:
        made: dict[str, list[ScriptCall]] = {}
        for call in self.calls:
            key = call.get("capture_key")
            if key is not None:
                made.setdefault(key, []).append(call["n_messages"])
        return {key: tuple(calls) for key, calls in made.items()}


def wait_for(
    progress: Callable[[], int],
    target: int,
    prediction: str,
    *,
    hopeless: Callable[[], str | None] = lambda: None,
    stall_s: float = STALL_S,
    watch: Callable[[int], None] = lambda _now: None,
) -> None:
    """Poll `progress` with the checker's one back-off poll (`observe.poll`) until it reaches `target`, telling
    `watch` each count it reads (what the run's progress line says).

    A `QuiescenceTimeout` once it stood still for `stall_s` (a run of thousands is slow on loaded cores, but it
    moves); a `ScaleError` as soon as `hopeless()` says why it never can (a `/run` that should wait ended). So the
    poll itself has no deadline: how long a wait may last is how long nothing moves."""
    last, moved_at = -1, time.monotonic()

    def reached() -> bool:
        nonlocal last, moved_at
        now = progress()
        watch(now)
        if now >= target:
            return True
        why = hopeless()
        if why is not None:
            raise ScaleError(f"{prediction}: never, {why}")
        if now != last:
            last, moved_at = now, time.monotonic()
        elif time.monotonic() - moved_at > stall_s:
            raise QuiescenceTimeout(
                prediction=prediction, observed=f"{now} of {target}, unchanged for {stall_s:g} s", pending=[]
            )
        return False

    poll(reached, math.inf)


# --- the run -----------------------------------------------------------------------------------------------


@attrs.frozen
class ScaleResult:
    """Seconds per stage (in run order), the verdicts, and what the run was made of.

    `stage_cpu_s` is the CPU time this process and the stack's processes spent in each stage (None where /proc is
    missing): on shared cores the wall time says how loaded the machine was, the CPU time what the stage costs.
    A process killed during a stage takes its CPU time with it, so the crash stage counts only the survivors."""

    rollouts: int
    finished: int
    exported: int
    at_first: int
    at_second: int
    in_flight_max: int
    stage_s: dict[str, float]
    stage_cpu_s: dict[str, float | None]
    verdicts: dict[str, str]
    records: dict[str, int]
    # Workers of each environment, agent and resources server, and of the policy model.
    server_workers: int = 1
    policy_workers: int = 1
    # The most descriptors any one process of the run held at the end of the dispatch, and its name (None: no /proc).
    fds_peak: tuple[str, int] | None = None

    def table(self) -> str:
        """The stage table, as `benchmarks/scale.py` prints it."""
        lines = [
            f"rollouts {self.rollouts}: {self.at_second + self.at_first} in flight at the checkpoint "
            f"({self.at_second} at their second call, {self.at_first} at their first), {self.finished} finished "
            f"before it, {self.exported} exported; at most {self.in_flight_max} could be in flight (file descriptors)",
            f"workers: {self.server_workers} per environment, agent and resources server, {self.policy_workers} of "
            "the policy model"
            + (
                ""
                if self.fds_peak is None
                else f"; most descriptors in one process: {self.fds_peak[1]} ({self.fds_peak[0]})"
            ),
            f"{'stage':<12} {'wall s':>9} {'cpu s':>9}",
        ]
        for stage, seconds in self.stage_s.items():
            cpu_s = self.stage_cpu_s.get(stage)
            lines.append(f"{stage:<12} {seconds:>9.3f} {'-' if cpu_s is None else f'{cpu_s:.3f}':>9}")
        lines.append("records written: " + ", ".join(f"{name} {count}" for name, count in self.records.items()))
        lines += [f"{name}: {verdict}" for name, verdict in self.verdicts.items()]
        return "\n".join(lines)


def process_tree_cpu_s() -> dict[int, float] | None:
    """CPU seconds spent so far by this process and each live descendant, by pid (Linux /proc); None without it."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu_s: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        cpu_s[pid] = (int(fields[11]) + int(fields[12])) / ticks_per_s  # utime + stime, every thread
    tree = {os.getpid()}
    grown = True
    while grown:
        new = {pid for pid, ppid in parent.items() if ppid in tree and pid not in tree}
        tree |= new
        grown = bool(new)
    return {pid: cpu_s[pid] for pid in tree if pid in cpu_s}


def process_tree_fds() -> tuple[str, int] | None:
    """The process of this tree (this one and its descendants) holding the most descriptors: its name and count
    (Linux /proc; None without it)."""
    cpu = process_tree_cpu_s()
    if cpu is None:
        return None
    peak: tuple[str, int] | None = None
    for pid in cpu:
        try:
            count = len(os.listdir(f"/proc/{pid}/fd"))
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue  # gone meanwhile
        if peak is None or count > peak[1]:
            peak = (f"{name} {pid}", count)
    return peak


def cpu_spent_s(before: Mapping[int, float] | None, after: Mapping[int, float] | None) -> float | None:
    """CPU seconds between two `process_tree_cpu_s` snapshots: what each surviving or new process spent."""
    if before is None or after is None:
        return None
    return sum(max(spent - before.get(pid, 0.0), 0.0) for pid, spent in after.items())


class _Stages:
    """Times each stage, wall clock and CPU, and reports it as it ends."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float | None] = {}
        self._progress = progress
        self.current = "starting"
        self.current_since_s = time.monotonic()

    def timed(self, stage: str, work: Callable[[], Any]) -> Any:
        self._progress(f"{stage} ...")
        self.current, self.current_since_s = stage, time.monotonic()
        cpu_before = process_tree_cpu_s()
        started = time.perf_counter()
        result = work()
        self.seconds[stage] = time.perf_counter() - started
        cpu_s = self.cpu_seconds[stage] = cpu_spent_s(cpu_before, process_tree_cpu_s())
        shown = "" if cpu_s is None else f" (cpu {cpu_s:.3f} s)"
        self._progress(f"{stage}: {self.seconds[stage]:.3f} s{shown}")
        return result


class _ScaleRun:
    """One scale run over a harness whose Gym servers are started; the steps of `run_scale` in order."""

    def __init__(self, harness: Harness, plan: ScalePlan) -> None:
        if not isinstance(harness.backend, BackendGate):
            raise ScaleError("scale mode needs the look-alike stack's gated backend (an embedded harness)")
        assert harness.control is not None, "begin_example starts Gym and discovers the participants"
        self.harness = harness
        self.control: ControlClient = harness.control
        self.gate: BackendGate = harness.backend
        self.plan = plan
        self.calls = CallLog(harness.backend, harness.http)
        self.sender = RunSender(harness.run_url, connect_timeout_s=STALL_S)
        self.reward = TOPOLOGIES[TOPOLOGY].reward(WEATHER_SCRIPT)
        self.directory = str(harness.checkpoint_dir / CHECKPOINT_ID)
        # What the stage under way waits for, and how far it got: the progress line's words.
        self.doing = ""

    # -- before the checkpoint -----------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Finish `finished` with the gate open; then gate, dispatch the rest and release each one's first call
        for `at_second`, so every in-flight rollout waits at the call its place says."""
        finished, in_flight, at_second = self.plan.finished, self.plan.in_flight, self.plan.at_second
        self._ungate()
        self._windowed(finished, self._runs(0), lambda: self.sender.ended(finished), "every finished rollout replied")
        self.gate.gate()
        base = len(self.calls.calls) + len(self.calls.refresh())
        self._windowed(
            in_flight,
            self._runs(0),
            lambda: self._calls_since(base),
            "every in-flight rollout's first call waits at the backend",
            self._in_flight_ended,
        )
        self._windowed(
            self.calls.index_of(at_second, 2),
            lambda indices: self.gate.release(list(indices)),
            lambda: self._calls_since(base + len(in_flight)),
            "every at_second rollout's second call waits at the backend",
            self._in_flight_ended,
        )

    def _windowed(
        self,
        items: Sequence[T],
        start: Callable[[Sequence[T]], object],
        arrived: Callable[[], int],
        prediction: str,
        hopeless: Callable[[], str | None] = lambda: None,
    ) -> None:
        """Start `items` a quarter window at a time, keeping at most DISPATCH_WINDOW started and not yet
        `arrived`; then wait for all of them. Thousands started at once would overflow listen backlogs (a connect
        the kernel retries a second later) and, at the in-flight limit, the servers' file descriptors."""
        step = max(1, DISPATCH_WINDOW // 4)
        total = len(items)
        for started in range(0, total, step):

            def watch(now: int, started: int = started) -> None:
                self.doing = f"{prediction}: {now} of {total} ({started} started)"

            wait_for(
                arrived,
                started + step - DISPATCH_WINDOW,
                f"{prediction} ({started} started)",
                hopeless=hopeless,
                watch=watch,
            )
            start(items[started : started + step])
        wait_for(arrived, total, prediction, hopeless=hopeless, watch=self._watching(prediction, total))

    def _watching(self, prediction: str, target: int) -> Callable[[int], None]:
        """What a wait for `target` of `prediction` tells the progress line."""

        def watch(now: int) -> None:
            self.doing = f"{prediction}: {now} of {target}"

        return watch

    def _runs(self, attempt: int) -> Callable[[Sequence[str]], None]:
        """Sends the `/run` of `attempt` for each rollout of a batch."""

        def send(rollouts: Sequence[str]) -> None:
            self.sender.send({capture_key(key, attempt): native_run_body(key, attempt) for key in rollouts})

        return send

    # -- the checkpoint --------------------------------------------------------------------------------------

    def prepare(self) -> None:
        result = self.control.prepare(CHECKPOINT_ID, time.time() + CONTROL_DEADLINE_S)
        if not result.prepared:
            raise ScaleError(f"prepare of {CHECKPOINT_ID} did not complete: blockers {result.blockers()}")

    def commit(self) -> dict[str, Any]:
        """Commit every rollout that has not replied (the controller continues all of them)."""
        replied = self.sender.outcomes(self.plan.rollouts)
        scope = [EpisodeId(rollout_id=key) for key, outcome in replied.items() if outcome is None]
        return self.control.commit(CHECKPOINT_ID, self.directory, scope, time.time() + CONTROL_DEADLINE_S)

    def crash(self) -> None:
        """SIGKILL every Gym process group and start fresh ones. The stage ends when its fallout is over: every
        `/run` in flight ended with an error, and the backend saw every waiting call's caller go (so the restore
        is timed alone, not with thousands of cut-off calls still being torn down)."""
        self.doing = "killing every Gym process group and starting fresh ones"
        self.harness.crash()
        in_flight = self.plan.in_flight
        ended = "every /run in flight ended at the crash"
        wait_for(
            lambda: self.sender.ended(in_flight), len(in_flight), ended, watch=self._watching(ended, len(in_flight))
        )
        gone = "the backend saw every waiting call's caller go after the crash"

        def watch(now: int) -> None:
            self.doing = f"{gone}: {-now} still waiting"

        wait_for(lambda: -self._backend_waiting(), 0, gone, watch=watch)

    def restore(self, exported: Sequence[str]) -> dict[str, Any]:
        scope = [EpisodeId(rollout_id=key) for key in exported]
        return self.control.restore(RESTORE_ID, self.directory, scope, time.time() + CONTROL_DEADLINE_S)

    def resume(self) -> None:
        self.control.resume(RESTORE_ID, time.time() + CONTROL_DEADLINE_S)

    def replacements(self, exported: Sequence[str]) -> None:
        """Every exported rollout runs again as attempt 1, with the gate open."""
        self._ungate()
        keys = [capture_key(key, 1) for key in exported]
        self._windowed(exported, self._runs(1), lambda: self.sender.ended(keys), "every replacement replied")

    # -- plumbing --------------------------------------------------------------------------------------------

    def _ungate(self) -> None:
        """The backend's `/_ctl/release` (Gym's own route): every call returns at once until the next gate."""
        with control_call("letting every call through the backend's gate"):
            self.harness.http.post(self.gate.url + "/_ctl/release", json={}).raise_for_status()

    def _backend_waiting(self) -> int:
        """How many calls wait at the backend: a step that releases nothing answers the count."""
        return int(self.gate.release([])["waiting"])

    def _in_flight_ended(self) -> str | None:
        return self.sender.any_ended(self.plan.in_flight)

    def _calls_since(self, base: int) -> int:
        self.calls.refresh()
        return len(self.calls.calls) - base

    def close(self) -> None:
        self.sender.close()


def run_scale(
    rollouts: int,
    *,
    finished_share: float = FINISHED_SHARE,
    harness: Harness | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = EVERY_S,
) -> ScaleResult:
    """Gym's scenario 13 on the look-alike stack (native topology): the stage times and verdicts, or the
    violated property (`P1Violation` ... `P4Violation`), or a `HarnessError` naming the state that
    never came. A harness passed in is reused (a fresh example begins) and left open. `progress` hears each stage
    begin and end, and every `progress_every_s` seconds what the stage under way waits for (`stage_progress`)."""
    fd_limit = raise_fd_limit()
    if harness is None:
        in_flight_limit = in_flight_max(fd_limit)
        plan = ScalePlan.split(rollouts, in_flight_limit, finished_share)
        server_workers, policy_workers = workers_for(len(plan.in_flight), fd_limit)
        spec = DeploymentSpec(TOPOLOGY, server_workers=server_workers, policy_workers=policy_workers)
    else:
        in_flight_limit = in_flight_bound(fd_limit, harness.spec.server_workers, harness.spec.policy_workers)
        plan = ScalePlan.split(rollouts, in_flight_limit, finished_share)
    say = progress or (lambda _line: None)
    stages = _Stages(say)
    own = harness is None
    if harness is None:
        say(
            f"starting the look-alike stack: {spec.server_workers} worker(s) per environment, agent and resources "
            f"server, {spec.policy_workers} of the policy model"
        )
        harness = Harness.embedded(spec)
    try:
        harness.begin_example()
        run = _ScaleRun(harness, plan)
        try:
            if progress is None:
                return _checked_run(run, stages, in_flight_limit)
            with Heartbeat(lambda: stage_progress(stages, run), every_s=progress_every_s, say=progress):
                return _checked_run(run, stages, in_flight_limit)
        except Exception as error:  # a violation, a harness error, or a control call that failed
            error.add_note(f"stages done: {stages.seconds}\nserver log tails:\n{harness.log_tails(LOG_LINES_SHOWN)}")
            raise
        finally:
            run.close()
    finally:
        if own:
            harness.close()


def stage_progress(stages: _Stages, run: _ScaleRun) -> str:
    """The progress line of a scale run: the stage under way, for how long, and how far its wait got."""
    elapsed_s = time.monotonic() - stages.current_since_s
    return f"{PLAIN_PREFIX}{stages.current} for {elapsed_s:.0f} s" + (f": {run.doing}" if run.doing else "")


def _checked_run(run: _ScaleRun, stages: _Stages, in_flight_limit: int) -> ScaleResult:
    plan = run.plan
    stages.timed("dispatch", run.dispatch)
    fds_peak = process_tree_fds()
    verdicts = {"finished complete (P3)": check_finished(run.sender.outcomes(plan.finished), run.reward)}
    stages.timed("prepare", run.prepare)
    committed: dict[str, Any] = stages.timed("commit", run.commit)
    replied = run.sender.outcomes(plan.rollouts)
    finished = [key for key, outcome in replied.items() if outcome is not None]
    exported = list(committed["environment"]["episode_ids"])
    verdicts["finished and exported (P1)"] = check_cover(plan.rollouts, finished, exported)
    verdicts["silent while checkpointed (P2)"] = check_silent(run.sender.any_ended(plan.in_flight), len(plan.in_flight))
    stages.timed("crash", run.crash)
    stages.timed("restore", lambda: run.restore(exported))
    stages.timed("resume", run.resume)
    stages.timed("replacement", lambda: run.replacements(exported))
    replacements = run.sender.outcomes(capture_key(key, 1) for key in exported)
    verdicts["replacements complete (P3)"] = check_replies(replacements, run.reward, "replacement")
    run.calls.refresh()
    verdicts["continued from the boundary (P4)"] = check_continuations(expected_calls(plan), run.calls.by_key())
    return ScaleResult(
        rollouts=len(plan.rollouts),
        finished=len(finished),
        exported=len(exported),
        at_first=len(plan.at_first),
        at_second=len(plan.at_second),
        in_flight_max=in_flight_limit,
        stage_s=dict(stages.seconds),
        stage_cpu_s=dict(stages.cpu_seconds),
        verdicts=verdicts,
        records={name: reply["manifest"]["record_count"] for name, reply in committed.items()},
        server_workers=run.harness.spec.server_workers,
        policy_workers=run.harness.spec.policy_workers,
        fds_peak=fds_peak,
    )
