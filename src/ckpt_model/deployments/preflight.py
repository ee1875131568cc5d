"""The pre-flight of a real Gym deployment: before any example runs, every URL answers, the token is accepted and
the participants are the kinds the topology needs, or the run stops in seconds with one paragraph naming the URL
and what it did.

What it asks, each with a short timeout (`PREFLIGHT_TIMEOUT_S` per request) and no retry:

- the head server's `/global_config_dict_yaml` (as `coordination.discover_from_head` reads it), when there is one;
- every server's status route (`/ng-control/v1/checkpoint/status`) with the bearer: a refused connection, a
  timeout, a 401 or 403 (the token refused), a reply that is not a status, a kind the topology does not have;
  a 404 is a server that is not a participant (a legacy relay), as discovery says;
- the gated backend's `/_ctl/calls`, when one is given.

A Gym the checker may not restart (attached with crashes off) must also be at rest before each example
(`check_at_rest`): every participant idle, with nothing counted and no marks, and not yet fenced against the first
checkpoint ID an example prepares. Every example names its checkpoints `c1`, `c2`, ... (`contract.Model.prepare`),
and a participant refuses a resumed ID for good (reference 2.6), so a Gym that already ran an example (of an earlier
check) would refuse the next one's first prepare. That is asked with the same call the checker makes before every
prepare: a prepare of `c1` whose deadline passed, which a participant refuses with `deadline_exceeded` without
changing anything, or with `stale_checkpoint` when it already resumed `c1`.

Everything here only reads or is refused: nothing is started, stopped or signalled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import httpx
import yaml

from ckpt_model.errors import HarnessError
from ckpt_model.model.topologies import TOPOLOGIES
from ckpt_model.properties.state import NOT_LEFTOVERS
from ckpt_model.protocol.client import servers_from_global_config
from ckpt_model.protocol.wire import CHECKPOINT_ROUTE_PREFIX, PREPARE_ORDER

PREFLIGHT_TIMEOUT_S = 2.0
HEAD_ROUTE = "/global_config_dict_yaml"
STATUS_ROUTE = f"{CHECKPOINT_ROUTE_PREFIX}/status"
PREPARE_ROUTE = f"{CHECKPOINT_ROUTE_PREFIX}/prepare"
BACKEND_ROUTE = "/_ctl/calls"
# The first checkpoint ID of every example (`contract.Model.prepare`).
FIRST_CHECKPOINT_ID = "c1"
# The probe's deadline passed this long ago (the checker's own probe before a prepare uses 1 s; clocks may differ).
PAST_DEADLINE_S = 60.0
WHAT_TO_DO = "Check that Gym runs and that the URLs and the token in the deployment file are right (docs/real-gym.md)."


@attrs.frozen
class Problem:
    """What one URL did wrong; `transient` when waiting could mend it (a server still starting)."""

    url: str
    what: str
    transient: bool = False


class PreflightError(HarnessError):
    """The deployment cannot be checked as it stands: a URL that does not answer, a token refused, participants of
    the wrong kinds, a Gym not at rest. The message is one paragraph: each URL and what it did, then what to do."""

    def __init__(self, problems: Sequence[Problem], advice: str = WHAT_TO_DO) -> None:
        self.problems = tuple(problems)
        self.advice = advice
        super().__init__(f"pre-flight: {said(self.problems)}. {advice}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems, self.advice))


def said(problems: Sequence[Problem]) -> str:
    """Each problem as "URL: what"; URLs with the same problem share one: "URL, URL: what"."""
    by_what: dict[str, list[str]] = {}
    for problem in problems:
        by_what.setdefault(problem.what, []).append(problem.url)
    return "; ".join(f"{', '.join(urls)}: {what}" for what, urls in by_what.items())


@attrs.frozen
class Found:
    """The participants the pre-flight found answering: name -> URL, name -> kind, name -> status; `absent`, the
    servers whose status route answered 404 (no checkpoint routes: they take no part), name -> the URL asked."""

    urls: dict[str, str]
    kinds: dict[str, str]
    statuses: dict[str, dict[str, Any]]
    absent: dict[str, str] = attrs.field(factory=dict)


# --- the whole pre-flight ----------------------------------------------------------------------------------


def check(
    http: httpx.Client,
    *,
    token: str,
    topology: str,
    head_url: str | None = None,
    servers: Mapping[str, str] | None = None,
    backend_url: str | None = None,
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
) -> Found:
    """Every URL answers, the token is accepted, the participants are the topology's kinds, the backend has its
    control routes: the participants found, else `PreflightError` listing every problem at once."""
    found = participants(http, token=token, head_url=head_url, servers=servers, timeout_s=timeout_s)
    problems = kind_problems(found, topology)
    if backend_url is not None:
        problems += backend_problems(http, backend_url, timeout_s)
    if problems:
        raise PreflightError(problems)
    return found


def participants(
    http: httpx.Client,
    *,
    token: str,
    head_url: str | None = None,
    servers: Mapping[str, str] | None = None,
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
) -> Found:
    """The servers (the head server's, or `servers`), each asked for its status at once: the participants among
    them, else `PreflightError` naming every server that failed (a 404 is a server that takes no part)."""
    named = dict(servers) if servers is not None else head_servers(http, head_url, timeout_s)
    names = sorted(named)
    with ThreadPoolExecutor(max_workers=max(len(names), 1), thread_name_prefix="preflight") as pool:
        outcomes = list(pool.map(lambda name: status_of(http, named[name], token, timeout_s), names))
    problems = [outcome for outcome in outcomes if isinstance(outcome, Problem)]
    if problems:
        raise PreflightError(problems)
    statuses = {name: outcome for name, outcome in zip(names, outcomes, strict=True) if isinstance(outcome, dict)}
    return Found(
        urls={name: named[name].rstrip("/") for name in statuses},
        kinds={name: str(status["kind"]) for name, status in statuses.items()},
        statuses=statuses,
        absent={
            name: named[name].rstrip("/") + STATUS_ROUTE
            for name, outcome in zip(names, outcomes, strict=True)
            if outcome is None
        },
    )


def head_servers(http: httpx.Client, head_url: str | None, timeout_s: float) -> dict[str, str]:
    """Every server the head server's global config names: name -> base URL."""
    if head_url is None:
        raise PreflightError([Problem("(no URL)", "the deployment names neither 'head_url' nor 'servers'")])
    url = head_url.rstrip("/") + HEAD_ROUTE
    response = get(http, url, timeout_s)
    if isinstance(response, Problem):
        raise PreflightError([attrs.evolve(response, what=f"the head server: {response.what}")])
    if response.status_code != httpx.codes.OK:
        problem = Problem(url, f"the head server answered HTTP {response.status_code}", response.status_code >= 500)
        raise PreflightError([problem])
    try:
        found, unreadable = servers_from_global_config(response.text, head_url)
    except (yaml.YAMLError, ValueError) as error:
        raise PreflightError([Problem(url, f"not a Gym global config ({error})")]) from None
    if unreadable:
        raise PreflightError([Problem(url, f"global config entry {name}: {what}") for name, what in unreadable.items()])
    return found


def status_of(http: httpx.Client, base_url: str, token: str, timeout_s: float) -> dict[str, Any] | Problem | None:
    """One server's status reply (with the bearer); None for a server that takes no part (404)."""
    url = base_url.rstrip("/") + STATUS_ROUTE
    response = get(http, url, timeout_s, headers={"Authorization": f"Bearer {token}"})
    if isinstance(response, Problem):
        return response
    if response.status_code == httpx.codes.NOT_FOUND:
        return None
    if response.status_code in (httpx.codes.UNAUTHORIZED, httpx.codes.FORBIDDEN):
        return Problem(
            url,
            f"the token is refused (HTTP {response.status_code}): 'token' must be the Gym's "
            "checkpoint.control_auth_token",
        )
    if response.status_code != httpx.codes.OK:
        return Problem(
            url, f"answered HTTP {response.status_code}: {_short(response.text)}", response.status_code >= 500
        )
    try:
        reply = response.json()
    except ValueError:
        return Problem(url, f"not a checkpoint status (not JSON: {_short(response.text)})")
    kind = reply.get("kind") if isinstance(reply, dict) else None
    if kind not in PREPARE_ORDER:
        return Problem(
            url, f"not a checkpoint status of a known kind (kind {kind!r}; known: {', '.join(PREPARE_ORDER)})"
        )
    return dict(reply)


def get(
    http: httpx.Client, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
) -> httpx.Response | Problem:
    try:
        return http.get(url, headers=dict(headers or {}), timeout=timeout_s)
    except httpx.HTTPError as error:
        return Problem(url, transport_error(error, timeout_s), transient=True)


def transport_error(error: httpx.HTTPError, timeout_s: float) -> str:
    """A transport failure in words: refused, timed out, or what httpx says."""
    if isinstance(error, httpx.TimeoutException):
        return f"no answer within {timeout_s:g} s (timeout)"
    text = str(error)
    if isinstance(error, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused (nothing listens there)"
    return f"{type(error).__name__}: {text or 'no detail'}"


# --- what the topology needs -------------------------------------------------------------------------------


def expected_kinds(topology: str) -> dict[str, int]:
    """How many participants of each kind the topology has: an agent, a resources server and a policy model; an
    environment when it owns the episodes (a legacy relay takes no part); with a restart environment, a second
    environment and its restart-only resources server."""
    traits = TOPOLOGIES[topology]
    kinds = {"agent": 1, "resources": 1, "model": 1}
    if traits.episode_owner == "environment":
        kinds["environment"] = 1
    if traits.restart_environment:
        kinds["environment"] = kinds.get("environment", 0) + 1
        kinds["resources"] += 1
    return {kind: kinds[kind] for kind in PREPARE_ORDER if kind in kinds}


def kind_problems(found: Found, topology: str) -> list[Problem]:
    """Participants of kinds, or in numbers, the topology does not have (the model predicts each by its kind)."""
    wanted = expected_kinds(topology)
    counted = {kind: list(found.kinds.values()).count(kind) for kind in PREPARE_ORDER}
    wrong = [kind for kind in PREPARE_ORDER if counted[kind] != wanted.get(kind, 0)]
    if not wrong:
        return []
    have = ", ".join(f"{name} is {kind} ({found.urls[name]})" for name, kind in sorted(found.kinds.items()))
    need = ", ".join(f"{count} {kind}" for kind, count in wanted.items())
    where = ", ".join(f"{counted[kind]} {kind}" for kind in wrong)
    absent = ", ".join(f"{name} ({url})" for name, url in sorted(found.absent.items()))
    not_found = f"; answered HTTP 404 Not Found, so no checkpoint routes: {absent}" if absent else ""
    return [
        Problem(
            "the participants",
            f"topology {topology} needs {need} participant(s), and this Gym has {where} "
            f"({have or 'no participant answered'}{not_found}): 'topology' must name what the Gym runs, and each URL "
            "a Gym server",
        )
    ]


def backend_problems(http: httpx.Client, backend_url: str, timeout_s: float) -> list[Problem]:
    """The gated backend answers its call list (Gym's e2e fake backend's control routes)."""
    url = backend_url.rstrip("/") + BACKEND_ROUTE
    response = get(http, url, timeout_s)
    if isinstance(response, Problem):
        return [attrs.evolve(response, what=f"the backend: {response.what}")]
    try:
        calls = response.json() if response.status_code == httpx.codes.OK else None
    except ValueError:
        calls = None
    if not isinstance(calls, list):
        return [
            Problem(
                url,
                f"not a gated backend: its call list answered HTTP {response.status_code} "
                f"{_short(response.text)} ('backend_url' must have Gym's e2e fake backend's /_ctl routes)",
            )
        ]
    return []


# --- a Gym the checker cannot restart ----------------------------------------------------------------------


def check_at_rest(
    http: httpx.Client,
    found: Found,
    token: str,
    *,
    clock: Callable[[], float] = time.time,
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
) -> None:
    """Every participant idle with nothing counted, no marks and admission open, and not fenced against the first
    checkpoint ID of an example; else `PreflightError` naming each that is not."""
    problems = [problem for name in sorted(found.urls) for problem in _unrested(found, name)]
    problems += [
        problem
        for name in sorted(found.urls)
        if (problem := _fenced(http, found.urls[name], token, clock() - PAST_DEADLINE_S, timeout_s)) is not None
    ]
    if problems:
        raise PreflightError(
            problems,
            "Without crashes the checker runs its example on the Gym as it is, which must be at rest and never have "
            "run an example (every example names its checkpoints c1, c2, ..., and a resumed ID is refused for "
            "good): restart the Gym by hand, or give 'crash_command' and 'restart_command' (docs/real-gym.md).",
        )


def _unrested(found: Found, name: str) -> list[Problem]:
    status = found.statuses[name]
    counts = status.get("report", {}).get("counts", {})
    leftovers = {key: value for key, value in counts.items() if value and key not in NOT_LEFTOVERS}
    busy = {
        "phase": status.get("phase") if status.get("phase") != "idle" else None,
        "checkpoint_id": status.get("checkpoint_id"),
        "retired_rollouts": status.get("retired_rollouts") or None,
        "restored_pending": status.get("restored_pending") or None,
        "accepting": False if status.get("accepting") is False else None,
        "counts": leftovers or None,
    }
    shown = {key: value for key, value in busy.items() if value is not None}
    if not shown:
        return []
    return [Problem(found.urls[name] + STATUS_ROUTE, f"{name} is not at rest ({shown})")]


def _fenced(http: httpx.Client, base_url: str, token: str, deadline_ts: float, timeout_s: float) -> Problem | None:
    """A prepare of the first checkpoint ID whose deadline passed: refused with deadline_exceeded (at rest), or
    with stale_checkpoint (it already resumed that ID)."""
    url = base_url.rstrip("/") + PREPARE_ROUTE
    body = {"checkpoint_id": FIRST_CHECKPOINT_ID, "deadline_ts": deadline_ts}
    try:
        response = http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
    except httpx.HTTPError as error:
        return Problem(url, transport_error(error, timeout_s), transient=True)
    code = _error_code(response)
    if response.status_code == httpx.codes.CONFLICT and code == "deadline_exceeded":
        return None
    if code == "stale_checkpoint":
        return Problem(url, f"it already resumed checkpoint {FIRST_CHECKPOINT_ID!r} (an earlier check ran here)")
    return Problem(
        url,
        f"a prepare of {FIRST_CHECKPOINT_ID!r} whose deadline passed answered HTTP {response.status_code} "
        f"{code or _short(response.text)} (expected 409 deadline_exceeded)",
    )


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _short(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
