"""The controller client: drives the checkpoint control plane of a Gym deployment (ours or a real one).

Wire-compatible with Gym's `nemo_gym._checkpoint.coordination` (reference section 4): the same routes,
bodies, bearer header, per-call timeout and coordination orders. Every operation is stateless on the client
side and may be retried with the same checkpoint ID. Replies are returned as the plain dicts that came off the
wire (checked for their required fields, `ckpt_model.protocol.replies`); the only typed value built here is
`PrepareResult`. Wire shapes stay in this module, `ckpt_model.protocol.replies` and `ckpt_model.protocol.wire`
(STYLE rule 2).

One `httpx.Client` serves every call (`ckpt_model.protocol.http.new_http_client`): building a client costs about
42 ms here (SPEC section 11), a keep-alive round trip under 1 ms. Fan-outs run on a small thread pool that shares
that client (httpx clients are safe to send from several threads). Tests inject an `httpx.MockTransport`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import httpx
import pydantic
import yaml

from ckpt_model.errors import CoordinationError, ParticipantFailure, ProtocolError
from ckpt_model.protocol.get_round import GetRound
from ckpt_model.protocol.http import new_http_client
from ckpt_model.protocol.replies import (
    failure_from_response,
    json_or_none,
    raise_on_problems,
    reply_problems,
    status_outcome,
    transport_failure,
)
from ckpt_model.protocol.telemetry import (
    OUTCOME_OK,
    TRACE_SALT,
    TRACEPARENT_HEADER,
    ControlCall,
    call_span_id,
    trace_id_of,
    traceparent,
)
from ckpt_model.protocol.wire import (
    CHECKPOINT_ROUTE_PREFIX,
    PREPARE_ORDER,
    RETIRE_ORDER,
    CheckpointRequest,
    CommitRequest,
    EpisodeId,
    ForgetRequest,
    RestoreRequest,
    RetireRequest,
)

log = logging.getLogger(__name__)

Reply = dict[str, Any]
V = TypeVar("V")
Clock = Callable[[], float]

# Gym adds this to the time left before the deadline, so a participant that gives up at its deadline can still
# answer (reference section 4, `_post`).
CALL_TIMEOUT_MARGIN_S = 5.0
# Gym probes discovery with 60 s overall and 3 tries on connection errors (reference section 4, `discover`).
BASE_TIMEOUT_S = 60.0
DISCOVER_TRIES = 3
# A failed restore's cleanup gets at least this long, even when the restore's own deadline has passed.
CLEANUP_DEADLINE_MIN_S = 30.0
FANOUT_THREADS_MAX = 8

SERVER_TYPES: tuple[str, ...] = (
    "environment_servers",
    "responses_api_models",
    "responses_api_agents",
    "resources_servers",
)
NO_MODEL_DETAIL = "no policy model takes part in checkpoints"


# --- participants ------------------------------------------------------------------------------------------


def _check_kind(_instance: object, _attribute: object, kind: str) -> None:
    if kind not in PREPARE_ORDER:
        raise ValueError(f"'kind' must be one of {', '.join(PREPARE_ORDER)} (got {kind!r})")


@attrs.frozen
class Participant:
    """One server that takes part in checkpoints; `url` is its base URL without a trailing slash."""

    name: str
    kind: str = attrs.field(validator=_check_kind)
    url: str = attrs.field(converter=lambda url: url.rstrip("/"))


def _prepare_rank(member: Participant) -> tuple[int, str]:
    return (PREPARE_ORDER.index(member.kind), member.name)


def _sorted_members(members: Iterable[Participant]) -> tuple[Participant, ...]:
    ordered = tuple(sorted(members, key=_prepare_rank))
    names = [member.name for member in ordered]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"participant names must be unique (got {', '.join(duplicates)} twice or more)")
    return ordered


@attrs.frozen
class Participants:
    """The deployment's participants, sorted by (PREPARE_ORDER index, name) so every listing is stable."""

    members: tuple[Participant, ...] = attrs.field(default=(), converter=_sorted_members)

    def of_kind(self, kind: str) -> tuple[Participant, ...]:
        return tuple(member for member in self.members if member.kind == kind)

    def of_kinds(self, kinds: Iterable[str]) -> tuple[Participant, ...]:
        wanted = set(kinds)
        return tuple(member for member in self.members if member.kind in wanted)

    def names(self) -> tuple[str, ...]:
        return tuple(member.name for member in self.members)

    def __iter__(self) -> Iterator[Participant]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)


# --- typed helpers over replies ----------------------------------------------------------------------------


@attrs.frozen
class PrepareResult:
    """What a prepare round saw; `replies` holds every contacted participant's reply, keyed by sorted name."""

    prepared: bool
    replies: dict[str, Reply]

    def blockers(self) -> dict[str, list[str]]:
        """Capture keys still blocking, per participant that is not prepared."""
        return {
            name: list(reply["report"]["blockers"])
            for name, reply in self.replies.items()
            if reply["phase"] != "prepared"
        }

    def restarts(self) -> set[EpisodeId]:
        """Episodes some participant can only restart, so the controller must not continue them."""
        return {
            EpisodeId.from_capture_key(key) for reply in self.replies.values() for key in reply["report"]["restarts"]
        }

    def continued(self, episode_ids: Iterable[EpisodeId]) -> list[EpisodeId]:
        """The given episodes minus the restarts, in the given order: the scope a commit may name."""
        restarts = self.restarts()
        return [episode for episode in episode_ids if episode not in restarts]


# --- reading a Gym head server's global config -------------------------------------------------------------


def servers_from_global_config(config_text: str, head_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """Base URLs of every Gym server named in the head server's global config, plus entries that lack one.

    Gym's head server answers `/global_config_dict_yaml` with the YAML text JSON-encoded as a string (its
    route returns a `str`); a plain YAML body is read too, since YAML parses the JSON string to that text.
    A host of `""` or `0.0.0.0` (listen everywhere) is reached through the head server's own host.
    """
    document = yaml.safe_load(config_text)
    if isinstance(document, str):
        document = yaml.safe_load(document)
    if not isinstance(document, dict):
        raise ValueError(f"the global config must be a mapping (got {type(document).__name__})")
    head_host = urlsplit(head_url).hostname or "127.0.0.1"
    urls: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name, entry in document.items():
        if not isinstance(entry, dict):
            continue
        server_type = next((key for key in SERVER_TYPES if key in entry), None)
        if server_type is None:
            continue
        address = _host_port(entry[server_type])
        if address is None:
            problems[str(name)] = f"'{name}.{server_type}.<implementation>' has no host and port"
            continue
        host, port = address
        urls[str(name)] = f"http://{head_host if host in ('', '0.0.0.0') else host}:{port}"
    return urls, problems


def _host_port(implementations: object) -> tuple[str, int] | None:
    if not isinstance(implementations, dict):
        return None
    for config in implementations.values():
        if isinstance(config, dict) and "host" in config and "port" in config:
            try:
                return str(config["host"] or ""), int(config["port"])
            except (TypeError, ValueError):
                return None
    return None


# --- the client --------------------------------------------------------------------------------------------


class ControlClient:
    """Coordinates checkpoints across a deployment's participants through one reused `httpx.Client`.

    Pass `http` (a client the caller owns and closes) or `transport` (tests: `httpx.MockTransport`); with
    neither, the client builds and owns one. `clock` gives Unix seconds for per-call timeouts.
    """

    def __init__(
        self,
        token: str,
        participants: Participants | None = None,
        *,
        http: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = BASE_TIMEOUT_S,
        clock: Clock = time.time,
        fanout_threads_max: int = FANOUT_THREADS_MAX,
        status_round: GetRound | None = None,
    ) -> None:
        if http is not None and transport is not None:
            raise ValueError("pass 'http' or 'transport', not both (got both)")
        self.token = token
        self.participants = participants if participants is not None else Participants()
        self.timeout_s = timeout_s
        self.clock = clock
        self._owns_http = http is None
        # A caller that needs a proxy injects its own client (`new_http_client` reads none from the environment).
        self._http = http if http is not None else new_http_client(timeout_s, transport=transport)
        self._fanout_threads_max = fanout_threads_max
        self._pool: ThreadPoolExecutor | None = None
        # Where the caller gives one (real servers; tests use `transport`), status rounds over plain HTTP take it.
        self._status_round = status_round
        # Every control call sent since `begin_traces`, by its parent span ID, in send order, with what its reply
        # showed (`ckpt_model.protocol.telemetry`): what P26 holds the deployment's spans to.
        self.trace_salt = TRACE_SALT
        self._calls: dict[str, ControlCall] = {}
        self._call_numbers: dict[tuple[str, str, str], int] = {}
        self._calls_lock = threading.Lock()

    @classmethod
    def from_servers(cls, servers: Mapping[str, str], token: str, **options: Any) -> ControlClient:
        """A client for the participants among `servers` ({name: base URL})."""
        client = cls(token, **options)
        try:
            client.discover_from_servers(servers)
        except BaseException:
            client.close()
            raise
        return client

    @classmethod
    def from_head(cls, head_url: str, token: str, **options: Any) -> ControlClient:
        """A client for the participants of the Gym deployment whose head server is at `head_url`."""
        client = cls(token, **options)
        try:
            client.discover_from_head(head_url)
        except BaseException:
            client.close()
            raise
        return client

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.close()

    # --- discovery -----------------------------------------------------------------------------------------

    def discover_from_servers(self, servers: Mapping[str, str]) -> Participants:
        """Probes each server's status route (404: not a participant); sets and returns `participants`."""
        candidates = [(name, servers[name].rstrip("/")) for name in sorted(servers)]
        outcomes = self._map(lambda candidate: self._probe(*candidate), candidates)
        members: list[Participant] = []
        failures: dict[str, ParticipantFailure] = {}
        for (name, url), outcome in zip(candidates, outcomes, strict=True):
            if isinstance(outcome, ParticipantFailure):
                failures[name] = outcome
            elif outcome is not None:
                members.append(Participant(name=name, kind=outcome, url=url))
        if failures:
            raise CoordinationError("discover", failures)
        if not any(member.kind == "model" for member in members):
            raise CoordinationError("discover", {"deployment": NO_MODEL_DETAIL})
        self.participants = Participants(members)
        return self.participants

    def discover_from_head(self, head_url: str) -> Participants:
        """Reads the servers from a Gym head server's global config, then discovers among them."""
        head_url = head_url.rstrip("/")
        # No bearer here: the head server is not a participant and has no business seeing the control token.
        response = self._get_with_retries("head", f"{head_url}/global_config_dict_yaml", authorized=False)
        if isinstance(response, ParticipantFailure):
            raise CoordinationError("discover", {"head": response})
        if response.status_code != 200:
            raise CoordinationError("discover", {"head": failure_from_response("head", response)})
        try:
            servers, problems = servers_from_global_config(response.text, head_url)
        except (yaml.YAMLError, ValueError) as exc:
            raise CoordinationError("discover", {"head": f"unreadable global config: {exc}"}) from exc
        if problems:
            raise CoordinationError("discover", problems)
        return self.discover_from_servers(servers)

    def _probe(self, name: str, url: str) -> str | ParticipantFailure | None:
        """The participant kind of one server, None when it is not a participant."""
        response = self._get_with_retries(name, f"{url}{CHECKPOINT_ROUTE_PREFIX}/status")
        if isinstance(response, ParticipantFailure):
            return response
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            return failure_from_response(name, response)
        reply = json_or_none(response)
        problems = reply_problems("status", reply)
        if problems:
            return ParticipantFailure(
                participant=name,
                http_status=200,
                code=None,
                detail="malformed status reply: " + "; ".join(problems),
            )
        kind = reply["kind"]
        if kind not in PREPARE_ORDER:
            return ParticipantFailure(
                participant=name, http_status=200, code=None, detail=f"unknown participant kind {kind!r}"
            )
        return kind

    def _get_with_retries(self, name: str, url: str, *, authorized: bool = True) -> httpx.Response | ParticipantFailure:
        # Retried at once, without waiting: discovery runs after health checks, so a connection error here is
        # a stale pooled connection or a server that is gone, not one still starting.
        error: httpx.HTTPError | None = None
        for _ in range(DISCOVER_TRIES):
            try:
                headers = self._headers() if authorized else {}
                return self._http.get(url, headers=headers, timeout=self.timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
                error = exc
            except httpx.HTTPError as exc:
                return transport_failure(name, exc)
        assert error is not None
        return transport_failure(name, error)

    # --- status --------------------------------------------------------------------------------------------

    def status(self, participant: Participant) -> Reply:
        """One participant's status reply."""
        outcome = self._get_status(participant)
        if isinstance(outcome, ParticipantFailure):
            raise CoordinationError("status", {participant.name: outcome})
        raise_on_problems("status", {participant.name: outcome})
        return outcome

    def status_all(self) -> dict[str, Reply]:
        """Every participant's status reply, keyed by sorted name (one concurrent round: on the status round the
        caller gave, else on the fan-out threads)."""
        members = self.participants.members
        outcomes = self._status_round_outcomes(members)
        if outcomes is None:
            outcomes = self._map(self._get_status, members)
        replies = {m.name: o for m, o in zip(members, outcomes, strict=True) if not isinstance(o, ParticipantFailure)}
        failures = {m.name: o for m, o in zip(members, outcomes, strict=True) if isinstance(o, ParticipantFailure)}
        raise_on_problems("status", replies)
        if failures:
            raise CoordinationError("status", failures, replies)
        return _sorted_dict(replies.items())

    def _get_status(self, participant: Participant) -> Any:
        try:
            response = self._http.get(
                f"{participant.url}{CHECKPOINT_ROUTE_PREFIX}/status",
                headers=self._headers(),
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            return transport_failure(participant.name, exc)
        return status_outcome(participant.name, response)

    def _status_round_outcomes(self, members: Sequence[Participant]) -> list[Any] | None:
        """Each member's status outcome through the status round, or None where it cannot ask them all now."""
        urls = [f"{m.url}{CHECKPOINT_ROUTE_PREFIX}/status" for m in members]
        if self._status_round is None or len(urls) <= 1 or not all(GetRound.serves(url) for url in urls):
            return None
        answers = self._status_round.get_all(urls, self._headers())
        if answers is None:
            return None
        return [
            transport_failure(m.name, answer) if isinstance(answer, Exception) else status_outcome(m.name, answer)
            for m, answer in zip(members, answers, strict=True)
        ]

    # --- coordination --------------------------------------------------------------------------------------

    def prepare(self, checkpoint_id: str, deadline_ts: float) -> PrepareResult:
        """Prepares stage by stage in PREPARE_ORDER; stops at the first stage that is not fully prepared."""
        body = _body(CheckpointRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts))
        replies: dict[str, Reply] = {}
        for kind in PREPARE_ORDER:
            stage = self._post_stage("prepare", self.participants.of_kind(kind), body, deadline_ts, replies)
            replies.update(stage)
            if any(reply["phase"] != "prepared" for reply in stage.values()):
                return PrepareResult(prepared=False, replies=_sorted_dict(replies.items()))
        return PrepareResult(prepared=True, replies=_sorted_dict(replies.items()))

    def renew(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Reply]:
        """Extends every participant's lease; for publications that outlast the last call's lease."""
        body = _body(CheckpointRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts))
        return self._post_stage("renew", self.participants.members, body, deadline_ts, {})

    def commit(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        episode_ids: Sequence[EpisodeId] | None,
        deadline_ts: float,
    ) -> dict[str, Reply]:
        """Writes the checkpoint on every participant at once; any failure fails it (no automatic resume)."""
        request = CommitRequest(
            checkpoint_id=checkpoint_id,
            deadline_ts=deadline_ts,
            checkpoint_dir=checkpoint_dir,
            episode_ids=None if episode_ids is None else list(episode_ids),
        )
        return self._post_stage("commit", self.participants.members, _body(request), deadline_ts, {})

    def resume(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Reply]:
        """Re-opens admission in reverse PREPARE_ORDER; every stage is tried, failures are raised together."""
        body = _body(CheckpointRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts))
        replies: dict[str, Reply] = {}
        failures: dict[str, ParticipantFailure] = {}
        for kind in reversed(PREPARE_ORDER):
            try:
                replies.update(self._post_stage("resume", self.participants.of_kind(kind), body, deadline_ts, {}))
            except CoordinationError as exc:
                replies.update(exc.replies)
                failures.update(exc.failures)
        if failures:
            raise CoordinationError("resume", failures, replies)
        return _sorted_dict(replies.items())

    def restore(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        episode_ids: Sequence[EpisodeId],
        deadline_ts: float,
    ) -> dict[str, Reply]:
        """Installs a checkpoint everywhere, all or nothing (a failure retires what it installed)."""
        request = RestoreRequest(
            checkpoint_id=checkpoint_id,
            deadline_ts=deadline_ts,
            checkpoint_dir=checkpoint_dir,
            episode_ids=list(episode_ids),
        )
        try:
            return self._post_stage("restore", self.participants.members, _body(request), deadline_ts, {})
        except CoordinationError as failure:
            self._undo_restore(failure, checkpoint_id, episode_ids, deadline_ts)
            raise

    def _undo_restore(
        self,
        failure: CoordinationError,
        checkpoint_id: str,
        episode_ids: Sequence[EpisodeId],
        deadline_ts: float,
    ) -> None:
        """Retires the next attempts a partial restore may have installed, then re-opens admission.

        Errors of both steps are kept as notes on the restore's error, which the caller re-raises.
        """
        cleanup_deadline_ts = max(deadline_ts, self.clock() + CLEANUP_DEADLINE_MIN_S)
        next_attempts = [episode.next_attempt() for episode in episode_ids]
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("retire", lambda: self.retire(checkpoint_id, next_attempts, cleanup_deadline_ts)),
            ("resume", lambda: self.resume(checkpoint_id, cleanup_deadline_ts)),
        )
        for step, call in steps:
            try:
                call()
            except (CoordinationError, ProtocolError) as exc:
                log.warning("cleanup %s after a failed restore of %s failed: %s", step, checkpoint_id, exc)
                failure.add_note(f"cleanup {step} after the failed restore also failed: {exc}")

    def retire(self, checkpoint_id: str, episode_ids: Sequence[EpisodeId], deadline_ts: float) -> dict[str, Reply]:
        """Stops and frees attempts in RETIRE_ORDER (callers before callees); a failing stage ends it."""
        if not episode_ids:
            return {}
        request = RetireRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts, episode_ids=list(episode_ids))
        return self._post_retire_order("retire", _body(request), deadline_ts)

    def forget(self, checkpoint_id: str, rollout_ids: Iterable[str], deadline_ts: float) -> dict[str, Reply]:
        """Drops the retire marks of rollouts (de-duplicated, sorted) in RETIRE_ORDER."""
        unique_ids = sorted(set(rollout_ids))
        if not unique_ids:
            return {}
        request = ForgetRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts, rollout_ids=unique_ids)
        return self._post_retire_order("forget", _body(request), deadline_ts)

    def _post_retire_order(self, operation: str, body: Reply, deadline_ts: float) -> dict[str, Reply]:
        replies: dict[str, Reply] = {}
        for kinds in RETIRE_ORDER:
            replies.update(self._post_stage(operation, self.participants.of_kinds(kinds), body, deadline_ts, replies))
        return _sorted_dict(replies.items())

    def post_each(
        self, operation: str, body: Reply, deadline_ts: float, names: Collection[str] | None = None
    ) -> dict[str, Reply | ParticipantFailure]:
        """Sends one control call to every participant (or those in `names`) separately and returns each answer,
        refusals included.

        Unlike the coordination functions it neither stages nor stops at the first refusal: a checker probing
        fencing or idempotent replay must hear every participant."""
        members = [m for m in self.participants.members if names is None or m.name in names]
        outcomes = self._map(lambda member: self._post(member, operation, body, deadline_ts), members)
        answers: list[tuple[str, Reply | ParticipantFailure]] = list(
            zip((m.name for m in members), outcomes, strict=True)
        )
        return _sorted_dict(answers)

    # --- transport -----------------------------------------------------------------------------------------

    def _post_stage(
        self,
        operation: str,
        members: Sequence[Participant],
        body: Reply,
        deadline_ts: float,
        earlier: Mapping[str, Reply],
    ) -> dict[str, Reply]:
        """POSTs to `members` concurrently; raises with every failure once all have answered."""
        outcomes = self._map(lambda member: self._post(member, operation, body, deadline_ts), members)
        replies: dict[str, Reply] = {}
        failures: dict[str, ParticipantFailure] = {}
        for member, outcome in zip(members, outcomes, strict=True):
            if isinstance(outcome, ParticipantFailure):
                failures[member.name] = outcome
            else:
                replies[member.name] = outcome
        raise_on_problems(operation, replies)
        if failures:
            raise CoordinationError(operation, failures, {**earlier, **replies})
        return _sorted_dict(replies.items())

    def _post(self, member: Participant, operation: str, body: Reply, deadline_ts: float) -> Any:
        """One control call, in the trace of the checkpoint it names; the reply as decoded JSON, or the failure."""
        timeout_s = max(deadline_ts - self.clock(), 0.0) + CALL_TIMEOUT_MARGIN_S
        call = self._sent(member.name, operation, str(body.get("checkpoint_id", "")))
        headers = {**self._headers(), TRACEPARENT_HEADER: traceparent(call.trace_id, call.span_id)}
        try:
            response = self._http.post(
                f"{member.url}{CHECKPOINT_ROUTE_PREFIX}/{operation}",
                json=body,
                headers=headers,
                timeout=timeout_s,
            )
        except httpx.HTTPError as exc:
            return transport_failure(member.name, exc)
        if response.status_code != 200:
            failure = failure_from_response(member.name, response)
            self._answered(call, failure)
            return failure
        self._answered(call, None)
        return json_or_none(response)

    # --- trace context --------------------------------------------------------------------------------------

    def begin_traces(self) -> None:
        """Forget the calls sent so far and number calls from 0 again (a new example: the same steps then send the
        same `traceparent` headers)."""
        with self._calls_lock:
            self._calls.clear()
            self._call_numbers.clear()

    def control_calls(self) -> list[ControlCall]:
        """Every control call sent since `begin_traces`, in send order, each with its reply's outcome so far."""
        with self._calls_lock:
            return list(self._calls.values())

    def _sent(self, participant: str, operation: str, checkpoint_id: str) -> ControlCall:
        trace_id = trace_id_of(checkpoint_id, self.trace_salt)
        with self._calls_lock:
            key = (trace_id, participant, operation)
            number = self._call_numbers.get(key, 0)
            self._call_numbers[key] = number + 1
            call = ControlCall(participant, operation, checkpoint_id, trace_id, call_span_id(*key, number))
            self._calls[call.span_id] = call
        return call

    def _answered(self, call: ControlCall, outcome: ParticipantFailure | None) -> None:
        """Record what the reply to `call` showed; a call no reply came to stays unanswered."""
        if outcome is None:
            shown: str | None = OUTCOME_OK
        elif outcome.http_status is None:
            return
        else:
            shown = outcome.code or f"http_{outcome.http_status}"
        with self._calls_lock:
            self._calls[call.span_id] = attrs.evolve(call, outcome=shown, answered=True)

    def _map(self, call: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """`call` over `items`, concurrently when there is more than one; results in the order of `items`."""
        if len(items) <= 1:
            return [call(item) for item in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._fanout_threads_max, thread_name_prefix="ckpt-control")
        return list(self._pool.map(call, items))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def request_body(
    operation: str,
    checkpoint_id: str,
    deadline_ts: float,
    *,
    checkpoint_dir: str = "",
    episode_ids: Sequence[EpisodeId] = (),
    rollout_ids: Sequence[str] = (),
) -> Reply:
    """The wire body of `operation` (prepare, renew, resume, commit, restore, retire, forget), validated."""
    ids = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline_ts}
    request: pydantic.BaseModel
    if operation in ("prepare", "renew", "resume"):
        request = CheckpointRequest.model_validate(ids)
    elif operation in ("commit", "restore"):
        model = CommitRequest if operation == "commit" else RestoreRequest
        request = model.model_validate({**ids, "checkpoint_dir": checkpoint_dir, "episode_ids": list(episode_ids)})
    elif operation == "retire":
        request = RetireRequest.model_validate({**ids, "episode_ids": list(episode_ids)})
    elif operation == "forget":
        request = ForgetRequest.model_validate({**ids, "rollout_ids": list(rollout_ids)})
    else:
        raise ValueError(f"'operation' must be a control operation (got {operation!r})")
    return _body(request)


def _body(request: pydantic.BaseModel) -> Reply:
    return request.model_dump(mode="json")


def _sorted_dict(items: Iterable[tuple[str, V]]) -> dict[str, V]:
    return dict(sorted(items, key=lambda item: item[0]))
