"""Silence and continuation. P2 silent while prepared: no `/run` reply and no held model response while a checkpoint is
open. P3 continuations complete: every attempt completes with the reward of an uninterrupted run, and every native
`/run` reply has nemo-gym 0.7.0's shape. P4 continued, not
redone: an attempt makes exactly the model calls its episode still needs. P14 resumed equals uninterrupted: a
completed attempt's outcome is its task's outcome run once with no checkpoint, crash or fault.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckpt_model.errors import PropertyViolation
from ckpt_model.model.contract import VERIFY, ScriptCall
from ckpt_model.model.outcome import Outcome
from ckpt_model.properties.evidence import keys_shown, shortened
from ckpt_model.properties.verification import P11Violation
from ckpt_model.protocol.history import Event, History
from ckpt_model.protocol.replies import native_run_reply_problems


class P2Violation(PropertyViolation):
    property_id = "P2"
    title = "silent while prepared: no /run reply and no held model response while a checkpoint is open"


class P3Violation(PropertyViolation):
    property_id = "P3"
    title = "continuations complete: every attempt completes with the reward of an uninterrupted run"


class P4Violation(PropertyViolation):
    property_id = "P4"
    title = "continued, not redone: an attempt makes exactly the model calls its episode still needs"


class P14Violation(PropertyViolation):
    property_id = "P14"
    title = (
        "resumed equals uninterrupted: every completed rollout ends with the outcome of its task run once with no "
        "checkpoint, crash or fault (its /run reply and ledger chain, identifiers normalised)"
    )


def p2_no_reply_while_prepared(history: History) -> None:
    """No `/run` completed with a reply inside a prepared interval (from prepared to resume or crash)."""
    p2_no_reply_within(history.intervals("prepared", ("resume", "crash")), history.events)


def p2_no_reply_within(spans: Sequence[tuple[float, float]], events: Iterable[Event]) -> None:
    """No `/run` completed with a reply strictly inside one of the prepared `spans` (start, end) of the history."""
    if not spans:
        return
    for event in events:
        if event.f != "run" or event.type != "ok":
            continue
        for start_s, end_s in spans:
            if start_s < event.time_s < end_s:
                raise P2Violation(
                    rollout=event.process,
                    expected=f"no /run reply between prepared at {start_s:.3f}s and the end at {end_s:.3f}s",
                    observed=f"{event.process} replied at {event.time_s:.3f}s: {event.value}",
                    history_indices=[event.index],
                )


def p2_held_responses(checkpoint_id: str, expected_held: int, observed_held: Any) -> None:
    if observed_held != expected_held:
        raise P2Violation(
            rollout=None,
            expected=f"the model server holds {expected_held} released response(s) while {checkpoint_id} is open",
            observed=f"it holds {observed_held}: a held response was delivered while prepared",
        )


def p2_silent_while_checkpointed(replied: str | None) -> None:
    """Scale mode: no `/run` in flight at the checkpoint ended before the crash (`replied` describes one that did)."""
    if replied is not None:
        raise P2Violation(
            rollout=None,
            expected="no /run in flight replies while the checkpoint is prepared and committed",
            observed=replied,
        )


def p3_reply_complete(key: str, status_code: int | None, body: Any, reward: float | None) -> None:
    """A finished attempt replied 200 with the reward an uninterrupted run gets. With `reward` None (a real model,
    whose free-text replies earn no reward the checker can predict) it replied 200 with a finite numeric reward
    and no `failure`: well formed, which is all that can be judged."""
    result = body.get("result") if isinstance(body, dict) and "result" in body else body
    got = result.get("reward") if isinstance(result, dict) else None
    if reward is None:
        failed = isinstance(body, dict) and body.get("failure") is not None
        numeric = isinstance(got, int | float) and not isinstance(got, bool) and math.isfinite(got)
        complete = status_code == 200 and numeric and not failed
    else:
        complete = status_code == 200 and got == reward
    if not complete:
        wanted = "a numeric reward and no failure" if reward is None else f"reward {reward}"
        raise P3Violation(
            rollout=key,
            expected=f"HTTP 200 with {wanted}",
            observed=f"HTTP {status_code}: {shortened(body)}",
        )


def p3_run_reply_shape(key: str, status_code: int | None, body: Any) -> None:
    """A native `/run` reply (HTTP 200) has nemo-gym 0.7.0's shape (`native_run_reply_problems`: exactly one of
    `result` and `failure`, a failure as the release writes it, Gym's own failures terminal as it makes them);
    the violation names every field that misses it. Any other status is a refusal, judged elsewhere."""
    if status_code != 200:
        return
    problems = native_run_reply_problems(body)
    if problems:
        raise P3Violation(
            rollout=key,
            expected="a native /run reply of nemo-gym 0.7.0's shape",
            observed=f"{'; '.join(problems)}: {shortened(body)}",
        )


def p3_still_running(
    key: str,
    calls_made: int,
    calls_total: int,
    open_checkpoint: str | None,
    status_code: int | None,
    body: Any,
    error: str | None,
) -> None:
    """An attempt the model says still runs has neither replied (`status_code`) nor failed (`error`): a failure is
    P3, a reply while a checkpoint is open P2, a 200 reply P4 (it ended without the calls the model still expects)
    and any other reply P3. Decided at once: no wait takes a reply back."""
    if error is not None:
        raise P3Violation(rollout=key, expected="the /run still running", observed=f"it failed: {error}")
    if status_code is None:
        return
    if open_checkpoint is not None:
        raise P2Violation(
            rollout=key,
            expected=f"no reply while {open_checkpoint} is open",
            observed=f"HTTP {status_code}: {body}",
        )
    raise (P4Violation if status_code == 200 else P3Violation)(
        rollout=key,
        expected=f"the /run still running at call {calls_made} of {calls_total}",
        observed=f"it ended with HTTP {status_code}: {body}",
    )


def p3_every_reply_complete(
    what: str, reward: float | None, replies: Mapping[str, tuple[int | None, Any] | None]
) -> None:
    """Scale mode: every native `/run` of `what` replied (None: it never did), each with HTTP 200, the release's
    shape (`p3_run_reply_shape`) and the reward of an uninterrupted run, or with a real model (`reward` None) well
    formed (`p3_reply_complete`); one violation names how many failed, and the first."""
    replied = {key: reply for key, reply in replies.items() if reply is not None}
    missing = sorted(set(replies) - set(replied))
    if missing:
        raise P3Violation(
            rollout=missing[0],
            expected=f"every {what} /run replies",
            observed=f"{len(missing)} never replied: {keys_shown(missing)}",
        )
    wrong = {}
    for key, (status_code, body) in replied.items():
        try:
            p3_run_reply_shape(key, status_code, body)
            p3_reply_complete(key, status_code, body, reward)
        except P3Violation as violation:
            wrong[key] = violation
    if wrong:
        first = wrong[min(wrong)]
        raise P3Violation(
            rollout=first.rollout,
            expected=f"every {what} /run replies {first.expected}",
            observed=f"{len(wrong)} did not ({keys_shown(wrong)}); {first.rollout}: {first.observed}",
        )


def p4_calls(
    expected: Mapping[str, tuple[ScriptCall, ...]], observed: Mapping[str, tuple[ScriptCall, ...]]
) -> list[str]:
    """Raise on a call the model cannot explain; return the keys still missing calls (not yet made).

    Calls are message counts, or `verify` for a judge call; a wrong or missing judge call is a P11 violation
    (verification run again, or skipped), any other difference P4."""
    missing = []
    for key in sorted(set(expected) | set(observed)):
        want, got = expected.get(key, ()), observed.get(key, ())
        if got == want:
            continue
        if len(got) > len(want) or got != want[: len(got)]:
            first = next(i for i in range(len(got)) if i >= len(want) or got[i] != want[i])
            verification = VERIFY in (got[first], want[first] if first < len(want) else None)
            raise (P11Violation if verification else P4Violation)(
                rollout=key,
                expected=f"calls {list(want)} (policy calls by message count, judge calls as {VERIFY!r})",
                observed=f"backend calls {list(got)}",
            )
        missing.append(key)
    return missing


def p4_calls_complete(
    expected: Mapping[str, tuple[ScriptCall, ...]], observed: Mapping[str, tuple[ScriptCall, ...]]
) -> None:
    """Scale mode, once every run replied: every expected capture key made exactly its calls (`p4_calls`), none
    still missing; calls of keys the plan does not name are not judged."""
    missing = p4_calls(expected, {key: calls for key, calls in observed.items() if key in expected})
    if missing:
        first = missing[0]
        raise P4Violation(
            rollout=first,
            expected=f"calls {list(expected[first])} (and the expected calls of every other key)",
            observed=f"{len(missing)} keys are missing calls once every run replied, {first}: "
            f"{list(observed.get(first, ()))}; missing: {keys_shown(missing)}",
        )


def p14_resumed_equals_uninterrupted(key: str, uninterrupted: Outcome, completed: Outcome) -> None:
    """A completed attempt's normalised outcome (`completed`) is byte for byte its task's uninterrupted one; the
    violation shows both and a diff of the two, line per field."""
    expected, observed = uninterrupted.text(), completed.text()
    if expected != observed:
        diff = difflib.unified_diff(
            expected.splitlines(), observed.splitlines(), "uninterrupted", key, lineterm="", n=2
        )
        raise P14Violation(
            rollout=key,
            expected=f"the outcome of the task run once uninterrupted: {_compact(uninterrupted)}",
            observed=f"{_compact(completed)}\n  diff (normalised):\n    " + "\n    ".join(diff),
        )


def _compact(outcome: Outcome) -> str:
    return json.dumps(json.loads(outcome.text()), sort_keys=True, separators=(",", ":"))
