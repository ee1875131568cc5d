"""Every exception the checker raises, in two roots that must never be confused.

A run ends in one of three outcomes: the system under test broke the contract (a property violation), the
checker could not do its job (a harness error: the outcome is unknown), or it passed. Hypothesis tells bugs
apart by exception type and raise location, so each property gets its own subclass, and harness problems never
inherit from `AssertionError`.

    Exception
    ├── AssertionError
    │   └── PropertyViolation          the system under test broke a property of the controller contract
    │       └── P1Violation, ...       one per property, defined next to the property itself
    ├── HarnessError                   the checker itself could not decide: the run's outcome is unknown
    │   ├── ServerStartError           a server process exited or never became healthy
    │   ├── QuiescenceTimeout          the quiet state the model predicted never arrived
    │   ├── ProtocolError              a reply does not match the wire schema, so it cannot be judged
    │   ├── StepNotEnabled             a scenario or regression file calls a rule whose precondition fails
    │   ├── ControlCallFailed          a call that drives the deployment failed (a /_ctl route, a clock, a fault,
    │   │                              a signal): it names the call, the status and what the checker was doing
    │   └── SituationNotReached        a fixed scenario's step took a branch that skips what the scenario is for
    └── CoordinationError              a controller operation failed on some participants (`coordination.py`)
        .failures: {server name: ParticipantFailure}

`CoordinationError` is neither a violation nor a harness error: participants refuse operations as part of the
protocol (a restore of a corrupt checkpoint must fail), so only the caller, which knows what the model
predicts, can tell whether a refusal is correct.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

import attrs

LOG_TAIL_LINES_SHOWN = 30


class _KeywordPickle:
    """Lets exceptions with keyword-only constructors survive pickling (BaseException re-calls cls(*args))."""

    _fields: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {name: getattr(self, name) for name in self._fields}
        return (_rebuild, (type(self), kwargs), dict(vars(self)))


def _rebuild(cls: type[BaseException], kwargs: dict[str, Any]) -> BaseException:
    return cls(**kwargs)


# --- property violations -----------------------------------------------------------------------------------


def violation_message(
    property_id: str,
    title: str,
    rollout: str | None,
    expected: object,
    observed: object,
    history_indices: Sequence[int],
) -> str:
    """The first lines of a failure report: which property, which rollout, what was expected and seen."""
    subject = f" (rollout {rollout})" if rollout is not None else ""
    lines = [
        f"{property_id} {title}{subject}",
        f"  expected: {expected}",
        f"  observed: {observed}",
    ]
    if history_indices:
        lines.append("  history:  " + ", ".join(f"#{index}" for index in history_indices))
    return "\n".join(lines)


class PropertyViolation(_KeywordPickle, AssertionError):
    """The system under test broke a property; subclasses name the property through the class attributes."""

    property_id: str = "P?"
    title: str = "a property of the controller contract"
    _fields = ("rollout", "expected", "observed", "history_indices", "property_id", "title")

    def __init__(
        self,
        *,
        rollout: str | None,
        expected: object,
        observed: object,
        history_indices: Sequence[int] = (),
        property_id: str | None = None,
        title: str | None = None,
    ) -> None:
        self.property_id = property_id if property_id is not None else type(self).property_id
        self.title = title if title is not None else type(self).title
        self.rollout = rollout
        self.expected = expected
        self.observed = observed
        self.history_indices = tuple(history_indices)
        super().__init__(
            violation_message(self.property_id, self.title, rollout, expected, observed, self.history_indices)
        )


# --- harness errors ----------------------------------------------------------------------------------------


class HarnessError(Exception):
    """The checker could not do its job; says nothing about whether the system under test is correct."""


class ServerStartError(_KeywordPickle, HarnessError):
    """A server process exited, or never answered its health check, while the checker started it."""

    _fields = ("name", "exit_status", "log_tail", "log_path")

    def __init__(self, *, name: str, exit_status: int | None, log_tail: str, log_path: str) -> None:
        self.name = name
        self.exit_status = exit_status
        self.log_tail = log_tail
        self.log_path = log_path
        what = "never became healthy" if exit_status is None else f"exited with status {exit_status}"
        tail = "\n".join("    " + line for line in log_tail.splitlines()[-LOG_TAIL_LINES_SHOWN:])
        super().__init__(
            f"server {name!r} {what}; last lines of its log:\n{tail or '    (empty)'}\nfull log: {log_path}"
        )


class QuiescenceTimeout(_KeywordPickle, HarnessError):
    """The quiet state the model predicted was not reached in time: the checker's model or waits are wrong."""

    _fields = ("prediction", "observed", "pending", "timeout_s")

    def __init__(
        self, *, prediction: object, observed: object, pending: Sequence[str], timeout_s: float | None = None
    ) -> None:
        self.prediction = prediction
        self.observed = observed
        self.pending = tuple(pending)
        self.timeout_s = timeout_s
        within = f" within {timeout_s:g} s" if timeout_s is not None else ""
        super().__init__(
            f"the predicted quiet state was not reached{within}\n"
            f"  predicted: {prediction}\n"
            f"  observed:  {observed}\n"
            f"  pending:   {', '.join(self.pending) or '(nothing listed)'}"
        )


class ProtocolError(_KeywordPickle, HarnessError):
    """A reply that does not match the wire schema; every problem is listed at once."""

    _fields = ("source", "problems", "reply")

    def __init__(self, *, source: str, problems: Sequence[str], reply: object = None) -> None:
        self.source = source
        self.problems = tuple(problems)
        self.reply = reply
        listed = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"{source} does not match the wire schema:\n{listed}")


class StepNotEnabled(_KeywordPickle, HarnessError):
    """A fixed scenario or a replayed file calls a rule the machine would not draw in that state: the scenario
    no longer means what its name says, so nothing it shows could be trusted."""

    _fields = ("step", "index", "rule")

    def __init__(self, *, step: str, index: int, rule: str) -> None:
        self.step = step
        self.index = index
        self.rule = rule
        super().__init__(
            f"step {index} ({step}) is not enabled: the precondition of rule {rule!r} does not hold in the state "
            "the steps before it reach; fix the scenario (or re-record the regression file)"
        )


class ControlCallFailed(_KeywordPickle, HarnessError):
    """A call the checker makes to drive the deployment, not to judge it, failed: a control route of the backend or
    the look-alike (`/_ctl/...`: the gate, a clock, a failpoint, a storage fault, a lost reply, a failing hook), or
    one of the deployment's capabilities (a pause, a crash, a worker killed). The step could not do what it meant
    to, so it shows nothing about the system under test. `call` is the HTTP call (method and URL) or the capability
    called; `status` the HTTP status, None when no reply came; `detail` the reply's detail (or the exception),
    shortened; `doing` what the checker was doing; `rule` the rule that ran it and its step, once the step log
    knows (`during`)."""

    _fields = ("doing", "call", "status", "detail", "rule")

    def __init__(
        self, *, doing: str, call: str, status: int | None = None, detail: str = "", rule: str | None = None
    ) -> None:
        self.doing = doing
        self.call = call
        self.status = status
        self.detail = detail
        self.rule = rule
        super().__init__(self._message())

    def during(self, rule: str) -> None:
        """Name the rule (and its step) that made the call, once: the innermost rule that saw it."""
        if self.rule is None:
            self.rule = rule
            self.args = (self._message(),)

    def _message(self) -> str:
        answered = f"answered HTTP {self.status}{_phrase(self.status)}" if self.status is not None else "failed"
        lines = [f"a control call failed: {self.call} {answered}" + (f": {self.detail}" if self.detail else "")]
        lines.append(f"  doing: {self.doing}")
        if self.rule is not None:
            lines.append(f"  rule:  {self.rule}")
        return "\n".join(lines)


def _phrase(status: int) -> str:
    try:
        return f" {HTTPStatus(status).phrase}"
    except ValueError:
        return ""


class SituationNotReached(_KeywordPickle, HarnessError):
    """A fixed scenario ran, but a step took the branch a rule allows on a slow machine (a prepare that missed its
    short deadline, say) instead of the one the scenario is named for: it passed without checking what it is for, so
    neither a pass nor a planted fault "not shown" could be trusted."""

    _fields = ("scenario", "missed")

    def __init__(self, *, scenario: str, missed: Sequence[str]) -> None:
        self.scenario = scenario
        self.missed = tuple(missed)
        listed = "\n".join(f"  - {why}" for why in self.missed)
        super().__init__(f"scenario {scenario} did not reach its situation:\n{listed}")


# --- coordination ------------------------------------------------------------------------------------------


@attrs.frozen
class ParticipantFailure:
    """Why one participant failed one control call; `http_status` is None when no reply arrived."""

    participant: str
    http_status: int | None
    code: str | None
    detail: str

    def describe(self) -> str:
        parts = [f"HTTP {self.http_status}"] if self.http_status is not None else []
        if self.code:
            parts.append(self.code)
        parts.append(self.detail)
        return " ".join(parts)


def _as_failure(participant: str, failure: ParticipantFailure | str) -> ParticipantFailure:
    if isinstance(failure, ParticipantFailure):
        return failure
    return ParticipantFailure(participant=participant, http_status=None, code=None, detail=failure)


class CoordinationError(_KeywordPickle, Exception):
    """A controller operation failed on some participants; `replies` keeps what the others answered."""

    _fields = ("operation", "failures", "replies")

    def __init__(
        self,
        operation: str,
        failures: Mapping[str, ParticipantFailure | str],
        replies: Mapping[str, Any] | None = None,
    ) -> None:
        self.operation = operation
        self.failures = {name: _as_failure(name, failures[name]) for name in sorted(failures)}
        self.replies = dict(replies or {})
        listed = "; ".join(f"{name}: {failure.describe()}" for name, failure in self.failures.items())
        super().__init__(f"checkpoint {operation} failed on {len(self.failures)} participant(s): {listed}")


# --- usage ---------------------------------------------------------------------------------------------------


class UsageError(Exception):
    """Bad input found after parsing (an unknown fault, an unreadable file, options that do not go together): the
    command line tools exit 3 with this message, before anything starts."""
