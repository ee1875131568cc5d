"""Hook failures: one armed hook raises exactly once, and says so."""

from __future__ import annotations

import pytest

from fakes.gym.faults.hooks import HOOKS, HookFailure, HookFaults


@pytest.mark.parametrize("hook", HOOKS)
def test_an_armed_hook_fails_its_next_call_only(hook: str) -> None:
    faults = HookFaults()
    faults.arm(hook)
    for other in HOOKS:
        if other != hook:
            faults.hit(other)

    with pytest.raises(HookFailure, match=f"{hook} hook failed"):
        faults.hit(hook)
    faults.hit(hook)
    assert faults.state() == {"armed": [], "failed": 1}


def test_an_unknown_hook_is_refused() -> None:
    with pytest.raises(ValueError, match="no hook 'retire'"):
        HookFaults().arm("retire")
