"""A participant's reply as the controller's client reads it: the fields each operation's reply must carry
(reference 2.4 and 2.5; extras are always allowed, as Gym's own client allows them), the shape of a native `/run`
reply (nemo-gym 0.7.0's episode contracts), and the failure a refusal, an error envelope or a transport error
stands for (`ParticipantFailure`). The wire models of the bodies are in
`ckpt_model.protocol.wire`; `ckpt_model.protocol.client` sends the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import pydantic

from ckpt_model.errors import ParticipantFailure, ProtocolError
from ckpt_model.protocol.wire import (
    GYM_OWN_FAILURES,
    PHASES,
    EpisodeFailureWire,
    NativeRunReply,
    PrepareReportWire,
    gym_own_failure,
)

ERROR_TEXT_SHOWN_MAX = 300

# Fields each reply must carry, with their JSON types (reference 2.4 and 2.5). Extras are always allowed.
REPLY_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "status": {"kind": (str,), "instance": (str,), "phase": (str,), "report": (dict,)},
    "prepare": {"phase": (str,), "report": (dict,)},
    "renew": {"lease_expires_at": (int, float)},
    "commit": {"phase": (str,), "manifest": (dict,), "episode_ids": (list,)},
    "restore": {"phase": (str,), "source_checkpoint_id": (str,), "restored": (list,)},
    "resume": {"phase": (str,), "idempotent": (bool,)},
    "retire": {"retired": (list,)},
    "forget": {"forgotten": (list,)},
}


def reply_problems(operation: str, reply: object) -> list[str]:
    """Every way `reply` misses the shape of `operation`'s reply; empty when it fits."""
    if not isinstance(reply, dict):
        return [f"reply must be a JSON object (got {type(reply).__name__})"]
    problems = []
    for field, types in REPLY_FIELDS[operation].items():
        if field not in reply:
            problems.append(f"'{field}' is missing")
        elif not isinstance(reply[field], types) or (bool not in types and isinstance(reply[field], bool)):
            expected = " or ".join(kind.__name__ for kind in types)
            problems.append(f"'{field}' must be {expected} (got {reply[field]!r})")
    if isinstance(reply.get("phase"), str) and reply["phase"] not in PHASES:
        problems.append(f"'phase' must be one of {', '.join(PHASES)} (got {reply['phase']!r})")
    if isinstance(reply.get("report"), dict):
        try:
            PrepareReportWire.model_validate(reply["report"])
        except pydantic.ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(part) for part in error["loc"])
                problems.append(f"'report.{where}' {error['msg'].lower()}")
    return problems


def native_run_reply_problems(reply: object) -> list[str]:
    """Every way a native `/run` reply (HTTP 200) misses nemo-gym 0.7.0's shape, each naming its field; empty when
    it fits: `episode_id` and `task_id`, exactly one of `result` and `failure`, and a failure as the release writes
    it, Gym's own failures with the `terminal` and `stage` the release gives them."""
    if not isinstance(reply, dict):
        return [f"reply must be a JSON object (got {type(reply).__name__})"]
    try:
        parsed = NativeRunReply.model_validate(reply)
    except pydantic.ValidationError as exc:
        return [_validation_problem(error) for error in exc.errors()]
    return [] if parsed.failure is None else gym_failure_problems(parsed.failure)


def gym_failure_problems(failure: EpisodeFailureWire) -> list[str]:
    """A failure the environment server makes itself (a timeout, an unhandled error) must carry the `terminal` and
    `stage` the release gives it; any other failure is the environment's own and may say what it likes."""
    own = gym_own_failure(failure.failure_reason)
    if own is None:
        return []
    terminal, stage = GYM_OWN_FAILURES[own]
    what = f"a failure {own!r}" + ("..." if own != failure.failure_reason else "")
    problems = []
    if failure.terminal != terminal:
        problems.append(f"'failure.terminal': {what} is terminal={terminal} (got {failure.terminal})")
    if failure.stage != stage:
        wanted = "no stage" if stage is None else f"stage {stage!r}"
        problems.append(f"'failure.stage': {what} has {wanted} (got {failure.stage!r})")
    return problems


def _validation_problem(error: Any) -> str:
    """One pydantic error as `'failure.stage': Input should be ...`, without pydantic's `Value error, ` prefix."""
    where = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"'{where}': {message}" if where else message


def failure_from_response(name: str, response: httpx.Response) -> ParticipantFailure:
    """Reads Gym's `{"error": {"code", "detail"}}` envelope, or FastAPI's own `{"detail": ...}` (422, 404)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    code: str | None = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        detail = str(body["error"].get("detail", ""))
    elif isinstance(body, dict) and isinstance(body.get("detail"), list):
        detail = _validation_detail(body["detail"])
    elif isinstance(body, dict) and "detail" in body:
        detail = str(body["detail"])
    else:
        detail = response.text[:ERROR_TEXT_SHOWN_MAX]
    return ParticipantFailure(participant=name, http_status=response.status_code, code=code, detail=detail)


def _validation_detail(errors: list[Any]) -> str:
    """FastAPI's 422 list as `body.checkpoint_id: Field required; ...`."""
    rendered = []
    for error in errors:
        if isinstance(error, dict):
            where = ".".join(str(part) for part in error.get("loc", ()))
            rendered.append(f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", "")))
        else:
            rendered.append(str(error))
    return "; ".join(rendered)


def status_outcome(name: str, response: httpx.Response) -> Any:
    """A status reply's body, or the participant's failure."""
    if response.status_code != 200:
        return failure_from_response(name, response)
    return json_or_none(response)


def transport_failure(name: str, exc: Exception) -> ParticipantFailure:
    return ParticipantFailure(
        participant=name, http_status=None, code=None, detail=f"transport error {type(exc).__name__}: {exc}"
    )


def json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def raise_on_problems(operation: str, replies: Mapping[str, object]) -> None:
    problems = [
        f"{name}: {problem}" for name in sorted(replies) for problem in reply_problems(operation, replies[name])
    ]
    if problems:
        raise ProtocolError(source=f"checkpoint {operation} reply", problems=problems, reply=dict(replies))
