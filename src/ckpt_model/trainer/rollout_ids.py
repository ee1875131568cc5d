"""Rollout IDs drawn at the edges of Gym's rules (reference 5.1; nemo-gym 0.7.0's `EpisodeId`).

`ROLLOUT_IDS` draws the names `dispatch` gives its rollouts (the model numbers each apart:
`ckpt_model.model.rollout_names`): names with dots, dashes and underscores; names that end in `-a0`, `-a01`, or
with a digit after `-a` inside them (`-a1b`, `-a12_y`), which look like an attempt suffix and are not one; and names
of `ROLLOUT_ID_LONG` characters. `REJECTED_ROLLOUT_IDS` draws names the rules refuse: a trailing `-a<N>` (the suffix
capture keys reserve), a leading dash or dot, characters outside `[A-Za-z0-9._-]`, a trailing newline.

The protocol sets no length on a rollout ID; the long names reach the 128 characters it allows a checkpoint ID,
whose alphabet a rollout ID shares. Every drawn name holds a letter before the model's number, so it never stands
alone as a number in a reply's text (P14 normalises a run's own names wherever they stand alone).
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

from ckpt_model.model.rollout_names import rollout_name
from ckpt_model.protocol.wire import is_valid_name, is_valid_rollout_id

ROLLOUT_ID_LONG = 128
# Room left in a long name for the model's number (up to 999 rollouts an example; no separator follows it).
_NUMBER_ROOM = 3
NAME_ALPHABET = string.ascii_letters + string.digits + "._-"
_LEADS = ("r", "x", "Run", "z")
# Endings that look like an attempt suffix and are not one, and the alphabet's other characters at the end.
VALID_ENDINGS = ("", "-a0", "-a01", "-a007", "-a1b", "-a12_y", "-a1.x", ".a1", "_a1", "-a", "-A1", "-", ".", "_")


def _valid(drawn: str) -> bool:
    return is_valid_rollout_id(rollout_name(drawn, 0)) if drawn else False


def _compose(lead: str, middle: str, ending: str) -> str:
    return f"{lead}{middle}{ending}"


def _long(lead: str, ending: str) -> str:
    return f"{lead}.{'x' * (ROLLOUT_ID_LONG - _NUMBER_ROOM - len(lead) - len(ending) - 1)}{ending}"


_SHORT = st.builds(
    _compose,
    st.sampled_from(_LEADS),
    st.text(alphabet=NAME_ALPHABET, max_size=6),
    st.sampled_from(VALID_ENDINGS),
)
_LONG = st.builds(_long, st.sampled_from(_LEADS), st.sampled_from(VALID_ENDINGS))
# Most draws are the plain edges; one in five a long name.
ROLLOUT_IDS = st.one_of(_SHORT, _SHORT, _SHORT, _SHORT, _LONG).filter(_valid)

# Names the rules refuse, each for one reason (`rejection_reason` names it).
_RESERVED = st.builds(
    lambda lead, attempt: f"{lead}-a{attempt}", st.sampled_from(_LEADS), st.integers(min_value=1, max_value=12)
)
_OUTSIDE = st.builds(
    lambda lead, char: f"{lead}{char}y",
    st.sampled_from(_LEADS),
    st.sampled_from(["/", " ", ":", "é", "+", "@", "%2F", "\t"]),
)
_LEADING = st.builds(lambda first, lead: f"{first}{lead}", st.sampled_from(["-", ".", "_"]), st.sampled_from(_LEADS))
REJECTED_ROLLOUT_IDS = st.one_of(_RESERVED, _OUTSIDE, _LEADING, st.sampled_from(["", "x\n", "x-a1\n"]))


def rejection_reason(name: str) -> str:
    """Why Gym's rules refuse `name` as a rollout ID (`ValueError` if they accept it)."""
    if not name:
        return "it is empty"
    if not is_valid_name(name):
        return (
            "it does not start alphanumeric" if is_valid_name(f"x{name}") else "it has characters outside the alphabet"
        )
    if not is_valid_rollout_id(name):
        return "it ends in -a<N>, which capture keys reserve"
    raise ValueError(f"{name!r} is a valid rollout ID")
