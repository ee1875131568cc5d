"""How the model names a rollout: the name it is dispatched under is its rollout ID on the wire.

A drawn name (`ckpt_model.trainer.rollout_ids`) gets the model's sequence number after its leading letters, so
that every rollout of an example is named apart however the draws repeat, and the rest of the drawn name (its
dots, dashes and underscores, its `-a0` or `-a01` ending, its length) reaches the wire unchanged. The number is
followed by a non-digit or nothing, so the leading letters and the number can be read back off the name and two
sequence numbers never give one name. With no drawn name a rollout is `r<seq>`, as it always was. Checkpoint IDs
are numbered the same way (`ckpt_model.model.checkpoint_names`).
"""

from __future__ import annotations

import re

from ckpt_model.protocol.wire import is_valid_rollout_id

_LEADING_LETTERS = re.compile(r"[A-Za-z]*")


def numbered_apart(drawn: str, seq: int, max_chars: int | None = None) -> str:
    """`drawn` with `seq` after its leading letters (and `_` when a digit follows, so the number reads back
    whole); with `max_chars`, the start of the rest is trimmed to keep the name within it, its ending kept."""
    letters = _LEADING_LETTERS.match(drawn)
    assert letters is not None  # `*` matches the empty string
    lead, rest = f"{letters.group()}{seq}", drawn[letters.end() :]
    if max_chars is not None and len(lead) + len(rest) > max_chars:
        rest = rest[len(lead) + len(rest) - max_chars :]
    if rest[:1].isdigit():
        rest = f"_{rest[1:]}" if max_chars is not None and len(lead) + len(rest) >= max_chars else f"_{rest}"
    return f"{lead}{rest}"


def rollout_name(drawn: str | None, seq: int) -> str:
    """The rollout ID of the `seq`-th rollout of an example, drawn as `drawn` (None: `r<seq>`)."""
    if drawn is None:
        return f"r{seq}"
    name = numbered_apart(drawn, seq)
    if not is_valid_rollout_id(name):
        raise ValueError(f"the drawn rollout ID {drawn!r} names {name!r}, which Gym's rules reject")
    return name
