"""The property checks on plain values: which violation a difference in backend calls is."""

from __future__ import annotations

import pytest

from ckpt_model.contract import VERIFY
from ckpt_model.properties import P4Violation, P11Violation, p4_calls


def test_calls_not_yet_made_are_pending_not_a_violation() -> None:
    assert p4_calls({"r0": (2, 4), "r1": (2,)}, {"r0": (2,), "r1": (2,)}) == ["r0"]


def test_a_policy_call_made_again_is_p4() -> None:
    with pytest.raises(P4Violation, match=r"backend calls \[2, 2\]"):
        p4_calls({"r0-a1": (4,)}, {"r0-a1": (2, 2)})


def test_a_verification_run_again_is_p11() -> None:
    with pytest.raises(P11Violation, match="verify"):
        p4_calls({"r0-a1": ()}, {"r0-a1": (VERIFY,)})


def test_a_verification_skipped_for_a_policy_call_is_p11() -> None:
    with pytest.raises(P11Violation):
        p4_calls({"r0-a1": (VERIFY,)}, {"r0-a1": (4,)})
