"""Lost replies: one armed operation loses exactly its next reply, and says so."""

from __future__ import annotations

import pytest

from fakes.gym.faults.lost_replies import LOSABLE, LostReplies


@pytest.mark.parametrize("operation", LOSABLE)
def test_an_armed_operation_loses_its_next_reply_only(operation: str) -> None:
    replies = LostReplies()
    replies.arm(operation)
    others = [other for other in LOSABLE if other != operation]

    assert [replies.take(other) for other in others] == [False] * len(others)
    assert replies.state() == {"armed": [operation], "lost": 0}
    assert replies.take(operation) is True
    assert replies.take(operation) is False
    assert replies.state() == {"armed": [], "lost": 1}


def test_an_operation_whose_reply_cannot_be_lost_is_refused() -> None:
    with pytest.raises(ValueError, match="no losable operation 'retire'"):
        LostReplies().arm("retire")
