"""What the families' checks share: how a violation shows a long value or many keys, how an error envelope's code and
a 409 refusal are read, and whether a status is idle with admission open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ckpt_model.errors import PropertyViolation

# Keys a scale verdict names before it only counts the rest.
SHOWN_MAX = 10


def shortened(value: Any, limit: int = 300) -> str:
    """`value` as text, cut at `limit` characters: a violation shows a reply, not a whole body."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def keys_shown(keys: Iterable[str]) -> str:
    """At most `SHOWN_MAX` keys, sorted, and how many more: a scale verdict may be about thousands."""
    listed = sorted(keys)
    more = f" and {len(listed) - SHOWN_MAX} more" if len(listed) > SHOWN_MAX else ""
    return f"{listed[:SHOWN_MAX]}{more}"


def error_code(body: Any) -> str | None:
    """The `code` of a `{"error": {"code", "detail"}}` envelope, or None for any other body."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def refused_409(
    violation: type[PropertyViolation], key: str, code: str, what: str, until: str, status_code: int | None, body: Any
) -> None:
    """A reply refused with 409 `code` (`what` was sent, refused `until` something, if it says), else `violation`."""
    if status_code != 409 or error_code(body) != code:
        raise violation(
            rollout=key,
            expected=f"{what} is refused with 409 {code}" + (f" {until}" if until else ""),
            observed=f"HTTP {status_code}: {shortened(body)}",
        )


def not_idle_and_open(status: Mapping[str, Any]) -> str | None:
    """What a status shows that is not idle, with no checkpoint and admission open (`accepting` true where the
    status has it); None when it is all three."""
    shown = (status.get("phase"), status.get("checkpoint_id"), status.get("accepting", True))
    if shown == ("idle", None, True):
        return None
    return f"phase {shown[0]!r}, checkpoint {shown[1]!r}, accepting {shown[2]!r}"
