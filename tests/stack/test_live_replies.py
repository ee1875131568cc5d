"""The look-alike stack's live replies against the strict reply models of `ckpt_model.protocol.wire`.

The checker reads replies tolerantly (extras pass, so it can drive a real Gym), and the field table
(`ckpt_model.protocol.fields`) is held to the reply models and to golden replies; nothing else would notice a field the
fakes start sending. Here a few fixed scenarios run on deployments that between them reach every body of the table,
every JSON reply the checker's HTTP clients receive is recorded (a response hook on the clients
`new_http_client` builds), mapped by method and route to its body in `fields.FIELDS`, and validated with the body's
model (extras forbidden), refusals included; a route with no body fails, and so does a body never seen.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import httpx
import pytest
from pydantic import TypeAdapter, ValidationError

from ckpt_model.deployments import harness as deployment
from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.protocol import client as coordination
from ckpt_model.protocol import fields, wire
from ckpt_model.protocol.get_round import GetRound
from ckpt_model.search.deployment_scenarios import named
from ckpt_model.search.scenarios import run

# Each deployment with the short scenarios that reach its bodies and fields.
DEPLOYMENTS: tuple[tuple[DeploymentSpec, tuple[str, ...]], ...] = (
    # retire, forget, a refused late /run, retried calls (an idempotent resume), refusals of an older controller.
    (
        DeploymentSpec("native"),
        ("retried_calls__return_their_first_result", "late_calls_of_an_older_controller__are_refused"),
    ),
    # The ledgers: manifests, a 410 after retire, a refused retire and delete, a stale ledger deleted.
    (
        DeploymentSpec("counter", token_capture=True),
        (
            "ledger_removal__refused_while_a_checkpoint_is_open",
            "token_lineage__retired_ledger_run_again_is_deleted_first",
        ),
    ),
    # Cuts on two workers: continued calls, cut prefixes in the token store, the coordinator's fields, a renew.
    (
        DeploymentSpec("native", token_capture=True, generation_cuts=True, policy_workers=2),
        (
            "generation_cut__in_flight_call_continued_from_its_prefix",
            "generation_cut__hung_cut_costs_only_a_regeneration",
        ),
    ),
    # Two participants of each kind but the model: a restart environment with a restart-only resources server.
    (DeploymentSpec("mixed"), ("restart__never_holds_up_a_checkpoint_and_starts_over_after_a_crash",)),
    # Verification: judge calls, a blocked prepare, the resources server's verify mode.
    (DeploymentSpec("slow", "wait"), ("verification_in_flight__blocks_prepare_then_redispatched",)),
    # The legacy /run reply (reward at the top, the agent's response).
    (DeploymentSpec("legacy"), ("crash_after_prepare__continues_from_boundary",)),
)

# Bodies of the table no checker client receives, each with why.
UNREACHABLE: dict[str, str] = {
    "generation-cut": "the backend answers it to the policy model; the checker reads the cut rounds (GET /_ctl/cuts)",
    "ledger retire": "the checker retires a ledger only while a checkpoint is open, so it sees only the refusal",
}

# `report.counts` keys of the table no look-alike server sends, each with why.
UNSENT_COUNT_KEYS: dict[tuple[str, str], str] = {
    ("agent", "inflight"): "only a restart-only agent counts it (reference 9.2); the look-alike agent never is one",
}

# Routes the checker calls whose replies hold no field to list, each with why; a route in neither this nor the
# table fails the test. A shape, where given, is what the reply must be.
FIELDLESS: dict[str, tuple[str, TypeAdapter[Any] | None]] = {
    "GET /_ctl/cuts": ("each cut round's model call IDs, compared by p12_cut_round", TypeAdapter(list[list[str]])),
    "POST /_ctl/gate": ("a receipt the checker only checks for success", None),
    "POST /_ctl/reset": ("a receipt the checker only checks for success", None),
    "POST /_ctl/script": ("an echo of the script the checker sent, only checked for success", None),
    "POST /_ctl/cut_stall": ("a receipt the checker only checks for success", None),
}

# Bodies whose reply holds many entries: a list of them, or a mapping of key to entry.
LISTED = {"backend calls"}
KEYED = {"backend staged"}
REFUSAL = "error"
# A status probe answered 404 says "not a participant" (`ControlClient.discover_from_servers`): only its code is read.
NOT_A_PARTICIPANT = (404, f"GET {wire.CHECKPOINT_ROUTE_PREFIX}/status")


@attrs.frozen
class LiveReply:
    method: str
    url: httpx.URL
    status: int
    body: Any  # the parsed JSON; None when the body is not JSON

    @property
    def route(self) -> str:
        return f"{self.method} {self.url.path}"

    @property
    def server(self) -> str:
        return f"{self.url.host}:{self.url.port}"


class Recorder:
    """Every reply the hooked clients receive, in arrival order (fan-outs send from several threads)."""

    def __init__(self) -> None:
        self.replies: list[LiveReply] = []
        self._lock = threading.Lock()

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        try:
            body = response.json()
        except ValueError:
            body = None
        reply = LiveReply(response.request.method, response.request.url, response.status_code, body)
        with self._lock:
            self.replies.append(reply)

    def hooked(self, build: Callable[..., httpx.Client]) -> Callable[..., httpx.Client]:
        def build_hooked(*args: Any, **kwargs: Any) -> httpx.Client:
            client = build(*args, **kwargs)
            client.event_hooks = {**client.event_hooks, "response": [*client.event_hooks["response"], self]}
            return client

        return build_hooked


def _route_pattern(route: str) -> re.Pattern[str] | None:
    """A table route (`GET /a/<key>/b`) as a pattern of `METHOD path`; None for a route that is not one."""
    if not route.split(" ", 1)[0].isupper():
        return None
    return re.compile(
        "".join("[^/]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<\w+>)", route)) + r"\Z"
    )


ROUTES: dict[str, re.Pattern[str]] = {
    name: pattern for name, body in fields.FIELDS.items() if (pattern := _route_pattern(body.route)) is not None
}


def body_of(reply: LiveReply) -> str | None:
    """The table's body for `reply`: its route's, or the refusal for a 4xx or 5xx; None if the table has none."""
    if reply.status >= 400:
        return REFUSAL
    return next((name for name, pattern in ROUTES.items() if pattern.match(reply.route)), None)


@attrs.define
class Findings:
    """What the replies showed: problems, replies validated per body, and count keys seen per kind."""

    problems: list[str] = attrs.Factory(list)
    validated: Counter[str] = attrs.Factory(Counter)
    fieldless: Counter[str] = attrs.Factory(Counter)
    count_keys: dict[str, set[str]] = attrs.Factory(dict)
    kinds: dict[str, str] = attrs.Factory(dict)  # server (host:port) -> the kind its last status named

    def add(self, label: str, reply: LiveReply) -> None:
        """Validate one reply, noting what is wrong with it as a problem."""
        where = f"{label}: {reply.route} -> {reply.status}"
        if (reply.status, reply.route) == NOT_A_PARTICIPANT:
            self.fieldless[reply.route] += 1
            return
        name = body_of(reply)
        if name is None:
            self._fieldless(where, reply)
            return
        if reply.body is None:
            self.problems.append(f"{where}: not JSON")
            return
        try:
            for entry in _entries(name, reply.body):
                fields.FIELDS[name].model.model_validate(entry)
        except (ValidationError, TypeError) as error:
            self.problems.append(f"{where}: does not fit {name} ({fields.FIELDS[name].model.__name__}): {_said(error)}")
            return
        self.validated[name] += 1
        if isinstance(reply.body, dict) and isinstance(reply.body.get("report"), dict):
            self._report(where, reply, reply.body["report"])

    def _fieldless(self, where: str, reply: LiveReply) -> None:
        if reply.route not in FIELDLESS:
            self.problems.append(f"{where}: a route with no body in fields.FIELDS (nor in FIELDLESS)")
            return
        shape = FIELDLESS[reply.route][1]
        try:
            if shape is not None:
                shape.validate_python(reply.body, strict=True)
        except ValidationError as error:
            self.problems.append(f"{where}: not the shape FIELDLESS gives it: {_said(error)}")
            return
        self.fieldless[reply.route] += 1

    def _report(self, where: str, reply: LiveReply, report: Mapping[str, Any]) -> None:
        """A report's fields are the model's (it allows extras) and its count keys its kind's."""
        if "kind" in reply.body:
            self.kinds[reply.server] = reply.body["kind"]
        extra = sorted(set(report) - set(wire.PrepareReportWire.model_fields))
        if extra:
            self.problems.append(f"{where}: report fields not in PrepareReportWire: {extra}")
        kind = self.kinds.get(reply.server)
        if kind is None:
            self.problems.append(f"{where}: a report from a server whose kind no status named yet")
            return
        keys = set(report.get("counts", {}))
        allowed = set(fields.COUNTS.get(kind, {})) | set(fields.COUNTS["coordinator"])
        if not keys <= allowed:
            self.problems.append(f"{where}: {kind} count keys not in fields.COUNTS: {sorted(keys - allowed)}")
        for key in keys:
            self.count_keys.setdefault("coordinator" if key in fields.COUNTS["coordinator"] else kind, set()).add(key)

    def summary(self) -> str:
        """Each distinct problem once, with how many replies showed it."""
        counted = Counter(self.problems)
        return "\n".join(f"{times} x {problem}" for problem, times in counted.most_common())


def _said(error: ValidationError | TypeError) -> str:
    """A validation error in one line: each field's path and complaint."""
    if isinstance(error, TypeError):
        return str(error)
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())


def _entries(name: str, body: Any) -> list[Any]:
    if name in LISTED:
        if not isinstance(body, list):
            raise TypeError(f"a list of entries, got {type(body).__name__}")
        return body
    if name in KEYED:
        if not isinstance(body, dict):
            raise TypeError(f"a mapping of entries, got {type(body).__name__}")
        return list(body.values())
    return [body]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Hooks every client the checker builds, at each module that builds one, and the rounds that read statuses
    and the backend's call list over connections of their own (`GetRound`)."""
    recording = Recorder()
    build_hooked = recording.hooked(coordination.new_http_client)
    for module in (coordination, deployment):
        monkeypatch.setattr(module, "new_http_client", build_hooked)
    get_all = GetRound.get_all

    def recorded_get_all(self: GetRound, urls: Sequence[str], headers: Mapping[str, str]) -> Any:
        answers = get_all(self, urls, headers)
        for answer in answers or ():
            if isinstance(answer, httpx.Response):
                recording(answer)
        return answers

    monkeypatch.setattr(GetRound, "get_all", recorded_get_all)
    return recording


def _recorded(spec: DeploymentSpec, scenarios: tuple[str, ...], recorder: Recorder) -> Iterator[LiveReply]:
    start = len(recorder.replies)
    with Harness.embedded(spec) as harness:
        for name in scenarios:
            run(harness, named(name))
    yield from recorder.replies[start:]


@pytest.mark.processes
def test_every_live_reply_fits_its_body_and_every_body_is_seen(recorder: Recorder) -> None:
    findings = Findings()
    for spec, scenarios in DEPLOYMENTS:
        for reply in _recorded(spec, scenarios, recorder):
            findings.add(spec.label, reply)

    assert not findings.problems, f"replies the table does not hold:\n{findings.summary()}"
    assert sorted(set(fields.FIELDS) - set(UNREACHABLE) - set(findings.validated)) == [], "bodies never seen"
    assert sorted(set(UNREACHABLE) & set(findings.validated)) == [], "seen after all: validated, so list no more"
    assert sorted(set(FIELDLESS) - set(findings.fieldless)) == [], "fieldless routes never called: list no more"
    seen_keys = {(kind, key) for kind, keys in findings.count_keys.items() for key in keys}
    table_keys = {(kind, key) for kind, keys in fields.COUNTS.items() for key in keys}
    assert sorted(table_keys - set(UNSENT_COUNT_KEYS) - seen_keys) == [], "count keys never seen"
    assert sorted(seen_keys & set(UNSENT_COUNT_KEYS)) == [], "count keys seen after all: list them no more"


# The classification itself, on hand-built replies (no processes).


def _reply(route: str, body: Any, status: int = 200, server: str = "127.0.0.1:9") -> LiveReply:
    method, path = route.split(" ", 1)
    return LiveReply(method, httpx.URL(f"http://{server}{path}"), status, body)


STATUS: dict[str, Any] = {
    "kind": "environment",
    "instance": "environment",
    "phase": "idle",
    "checkpoint_id": None,
    "lease_expires_at": None,
    "retired_rollouts": 0,
    "report": {"ready": True, "blockers": [], "blocker_count": 0, "counts": {"episodes": 0}, "restarts": []},
}
STATUS_ROUTE = f"GET {wire.CHECKPOINT_ROUTE_PREFIX}/status"


def _problems(*replies: LiveReply) -> list[str]:
    findings = Findings()
    for reply in replies:
        findings.add("native", reply)
    return findings.problems


def test_a_reply_that_fits_its_body_is_no_problem() -> None:
    findings = Findings()
    findings.add("native", _reply(STATUS_ROUTE, STATUS))
    findings.add("native", _reply("POST /run", wire.error_body("stale_attempt", "retired"), status=409))
    findings.add("native", _reply(f"GET {fields.LEDGER}/r0-a1/manifest", {"rollout_id": "r0-a1", "records": []}))
    assert (findings.problems, dict(findings.validated)) == ([], {"status": 1, "error": 1, "ledger manifest": 1})


@pytest.mark.parametrize(
    ("replies", "problem"),
    [
        ([_reply(STATUS_ROUTE, {**STATUS, "new_field": 1})], "new_field"),
        (
            [_reply("GET /_ctl/calls", [{"index": 0, "n_messages": 2, "t": 0.0, "returned": True, "new_key": 1}])],
            "new_key",
        ),
        ([_reply("GET /_ctl/brand_new", {})], "a route with no body"),
        ([_reply("POST /run", {"detail": "Not Found"}, status=404)], "does not fit error"),
        ([_reply(STATUS_ROUTE, {**STATUS, "report": {**STATUS["report"], "extra": 1}})], "not in PrepareReportWire"),
        ([_reply(STATUS_ROUTE, {**STATUS, "report": {**STATUS["report"], "counts": {"held": 0}}})], "['held']"),
        ([_reply("GET /_ctl/cuts", [["a", 1]])], "not the shape"),
        ([_reply("GET /_ctl/staged", [])], "a mapping of entries, got list"),
    ],
    ids=[
        "extra-field",
        "extra-entry-field",
        "unlisted-route",
        "not-an-envelope",
        "report-extra",
        "count-key",
        "cuts",
        "entries-not-keyed",
    ],
)
def test_a_reply_the_table_does_not_hold_is_a_problem(replies: list[LiveReply], problem: str) -> None:
    (found,) = _problems(*replies)
    assert problem in found
