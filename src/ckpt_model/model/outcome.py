"""A completed rollout's final outcome, with its identifiers normalised, so two runs of one task compare (P14).

What the trainer takes from a rollout is its `/run` reply (the reward, the tool calls and outputs its loop saw, the
response it trains on) and, with token capture, its capture-ledger chain (the calls it trains on, each with its
tokens). Two runs of the same task and script must give the same outcome byte for byte, except for what names the
run: rollout IDs, attempt numbers, capture keys, the task's name, model call IDs, session IDs and timestamps.
`normalised` replaces exactly those; everything else, a wrong ID included, stays as the system sent it. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ckpt_model.protocol.gym_tasks import TaskName, task_id_wire
from ckpt_model.protocol.ledger import LedgerRow

KEY = "<key>"
ROLLOUT = "<rollout>"
ATTEMPT = "<attempt>"
SESSION = "<session>"
TIMESTAMP = "<timestamp>"
TASK = "<task>"
# Fields whose value is the run's rollout ID or attempt number, when it is the run's own (a capture key and a rollout
# ID are the same string at attempt 0, so elsewhere that string reads as the key).
ROLLOUT_FIELDS = frozenset({"rollout_id", "_ng_rollout_id"})
ATTEMPT_FIELDS = frozenset({"attempt", "_ng_attempt_index", "attempt_index"})
# Fields that hold a session handle (derived from the capture key, possibly hashed) or a wall-clock time.
SESSION_FIELD = re.compile(r"(^|_)session_id$")
TIMESTAMP_FIELD = re.compile(r"(^|_)(ts|timestamp|created|created_at|started_at|finished_at|time)$")
# A name is replaced only where it stands alone: `r1` inside `r10` is another rollout.
_NAME_EDGE = "A-Za-z0-9_"


@attrs.frozen
class Identity:
    """What names one run: its rollout ID, its attempt number and capture key, and the name of its task (None: the
    topology's own)."""

    rollout: str
    attempt: int
    key: str
    task: TaskName | None = None

    def aliases(self) -> dict[str, str]:
        """Each name of the run and what it reads as once normalised (the capture key wins over the rollout ID
        when they are the same, as at attempt 0)."""
        return {self.rollout: ROLLOUT, self.key: KEY}


def normalised(value: Any, identity: Identity) -> Any:
    """`value` with the run's own names replaced: its rollout ID and attempt number in their fields, its task's
    name in a `task_id` field, its capture key and rollout ID wherever they stand alone in any other string, and
    every session ID and timestamp field."""
    return _normalised(value, identity, _substitution(identity.aliases()))


def _normalised(value: Any, identity: Identity, substitute: Any, field: str | None = None) -> Any:
    if field is not None and SESSION_FIELD.search(field) and isinstance(value, str):
        return SESSION
    if field is not None and TIMESTAMP_FIELD.search(field) and isinstance(value, (int, float, str)):
        return TIMESTAMP
    if field in ROLLOUT_FIELDS and value == identity.rollout:
        return ROLLOUT
    if field in ATTEMPT_FIELDS and value == identity.attempt and not isinstance(value, bool):
        return ATTEMPT
    if field == "task_id" and value == task_id_wire(identity.task):
        return TASK
    if isinstance(value, str):
        return substitute(value)
    if isinstance(value, Mapping):
        return {substitute(str(k)): _normalised(v, identity, substitute, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(item, identity, substitute) for item in value]
    return value


def _substitution(aliases: Mapping[str, str]) -> Any:
    """One pass over a string replacing each alias where it stands alone, the longest first (`r0-a1` before `r0`)."""
    names = sorted(aliases, key=len, reverse=True)
    pattern = re.compile(f"(?<![{_NAME_EDGE}])(" + "|".join(re.escape(n) for n in names) + f")(?![{_NAME_EDGE}])")
    return lambda text: pattern.sub(lambda match: aliases[match.group(1)], text)


def ledger_chain(rows: Sequence[LedgerRow], staged: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the trainer reads through a ledger: per row, in order, which earlier row it continues (by position;
    `None` for the first call, `outside` for a parent not in the chain) and the tokens staged for it. Model call
    IDs and staging keys name the run and are left out; the tokens are read through them."""
    position = {row.model_call_id: index for index, row in enumerate(rows)}
    chain = []
    for row in rows:
        entry = staged.get(row.staging_key) if row.staging_key else None
        parent = row.parent_call_id
        chain.append(
            {
                "parent": None if parent is None else position.get(parent, "outside"),
                "tokens": entry.get("tokens") if isinstance(entry, Mapping) else None,
            }
        )
    return chain


@attrs.frozen
class Outcome:
    """A completed run's final outcome, normalised: its `/run` reply body and (token capture) its ledger chain."""

    body: Any
    chain: list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The outcome as stable, line-per-field JSON, for comparing and for a readable diff."""
        shown: dict[str, Any] = {"body": self.body}
        if self.chain is not None:
            # A row's tokens on one line: a diff then names the rows that differ, not single tokens.
            shown["ledger chain"] = [{**row, "tokens": _one_line(row.get("tokens"))} for row in self.chain]
        return json.dumps(shown, indent=1, sort_keys=True)


def _one_line(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
