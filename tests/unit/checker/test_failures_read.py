"""How a rule reads a failed control call's failures: every one a missed deadline of the named participants
(`only_deadline_missed`), or every one an answer that never came from them (`only_unanswered`)."""

from __future__ import annotations

import pytest

from ckpt_model.errors import CoordinationError, ParticipantFailure
from ckpt_model.trainer.pipeline import only_deadline_missed, only_unanswered

NO_REPLY = ParticipantFailure("environment", None, None, "transport error ReadTimeout: timed out")
MISSED = ParticipantFailure("agent", 409, "deadline_exceeded", "deadline passed")
REFUSED = ParticipantFailure("agent", 409, "invalid_checkpoint_state", "refused")


@pytest.mark.parametrize(
    ("failures", "names", "unanswered", "missed"),
    [
        ({"environment": NO_REPLY}, ["environment"], True, False),
        ({"environment": NO_REPLY}, ["agent"], False, False),
        ({"agent": MISSED}, ["agent"], False, True),
        ({"agent": REFUSED}, ["agent"], False, False),
        ({"environment": NO_REPLY, "agent": MISSED}, ["environment", "agent"], False, False),
    ],
    ids=["no-reply-from-named", "no-reply-from-other", "deadline-missed", "refused", "mixed"],
)
def test_a_failed_call_is_read_by_what_every_failure_was(
    failures: dict[str, ParticipantFailure], names: list[str], unanswered: bool, missed: bool
) -> None:
    error = CoordinationError("prepare", failures)
    assert only_unanswered(error, names) is unanswered
    assert only_deadline_missed(error, names) is missed
