"""Checkpoint IDs drawn at the edges of Gym's rules (reference 2.2: 1-128 characters, `^[A-Za-z0-9][A-Za-z0-9._-]*$`).

`CHECKPOINT_STEMS` draws the stems `prepare` and `checkpoint` name the example's checkpoints with (the model numbers
each apart: `ckpt_model.model.checkpoint_names`): stems with dots, dashes and underscores, ending in `-a1` (which a
rollout ID may not end in and a checkpoint ID may), `.`, `_`, `-` or doubled ones, and stems of exactly
`CHECKPOINT_ID_MAX_CHARS` characters, which the model trims to exactly that length once numbered.
`REJECTED_CHECKPOINT_IDS` draws IDs the rules refuse: empty, one character too long, a leading `-`, `.` or `_`,
characters outside the alphabet, whitespace before or after a valid ID (a trailing newline among them).
"""

from __future__ import annotations

from hypothesis import strategies as st

from ckpt_model.model.checkpoint_names import RESTORE_MARK, checkpoint_name
from ckpt_model.protocol.wire import CHECKPOINT_ID_MAX_CHARS, is_valid_checkpoint_id, is_valid_name
from ckpt_model.trainer.rollout_ids import NAME_ALPHABET

# The operations whose body carries a checkpoint ID (reference 2.2), each of which a rejected one is sent with.
CONTROL_OPERATIONS = ("prepare", "renew", "commit", "resume", "restore", "retire", "forget")
_LEADS = ("c", "ck", "Ckpt", "z")
ENDINGS = ("", "-a1", "-a0", "-a12", ".", "_", "-", "..", "__", "--", ".tmp", "-v1.2_rc-")


def _usable(stem: str) -> bool:
    return RESTORE_MARK not in stem and is_valid_checkpoint_id(checkpoint_name(stem, 1))


def _long(lead: str, ending: str) -> str:
    return f"{lead}.{'x' * (CHECKPOINT_ID_MAX_CHARS - len(lead) - len(ending) - 1)}{ending}"


_SHORT = st.builds(
    lambda lead, middle, ending: f"{lead}{middle}{ending}",
    st.sampled_from(_LEADS),
    st.text(alphabet=NAME_ALPHABET, max_size=6),
    st.sampled_from(ENDINGS),
)
_LONG = st.builds(_long, st.sampled_from(_LEADS), st.sampled_from(ENDINGS))
# Most draws are the plain edges; one in five a long stem.
CHECKPOINT_STEMS = st.one_of(_SHORT, _SHORT, _SHORT, _SHORT, _LONG).filter(_usable)

_TOO_LONG = st.builds(lambda lead: f"{lead}{'x' * (CHECKPOINT_ID_MAX_CHARS + 1 - len(lead))}", st.sampled_from(_LEADS))
_OUTSIDE = st.builds(
    lambda lead, char: f"{lead}{char}y",
    st.sampled_from(_LEADS),
    st.sampled_from(["/", " ", ":", "é", "+", "@", "%2F", "\t"]),
)
_LEADING = st.builds(lambda first, lead: f"{first}{lead}", st.sampled_from(["-", ".", "_"]), st.sampled_from(_LEADS))
# Whitespace around a valid ID: refused as sent, whatever a lenient server would make of it once stripped.
_PADDED = st.builds(
    lambda lead, pad, before: f"{pad}{lead}1" if before else f"{lead}1{pad}",
    st.sampled_from(_LEADS),
    st.sampled_from([" ", "\n", "\t", "\r\n"]),
    st.booleans(),
)
REJECTED_CHECKPOINT_IDS = st.one_of(_TOO_LONG, _OUTSIDE, _LEADING, _PADDED, st.sampled_from(["", "..", "-"]))


def rejection_reason(checkpoint_id: str) -> str:
    """Why Gym's rules refuse `checkpoint_id` (`ValueError` if they accept it)."""
    if not checkpoint_id:
        return "it is empty"
    if not is_valid_name(checkpoint_id):
        if is_valid_name(f"x{checkpoint_id}"):
            return "it does not start alphanumeric"
        return "it has characters outside the alphabet"
    if len(checkpoint_id) > CHECKPOINT_ID_MAX_CHARS:
        return f"it is longer than {CHECKPOINT_ID_MAX_CHARS} characters"
    raise ValueError(f"{checkpoint_id!r} is a valid checkpoint ID")
