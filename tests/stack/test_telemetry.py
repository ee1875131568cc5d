"""The look-alike's telemetry over real processes: one checkpoint is one trace with one span per participant per
operation, on single-process and multi-worker servers alike, and its metrics count what the spans show (P26)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from ckpt_model.errors import CoordinationError
from ckpt_model.properties.telemetry import P26Violation, p26_one_span_per_call
from ckpt_model.protocol.telemetry import trace_id_of
from ckpt_model.trainer.telemetry_watch import TelemetryReader
from tests.stack.conftest import Deployment, deadline

pytestmark = pytest.mark.processes

OPERATIONS = ("prepare", "commit", "resume")


@pytest.mark.parametrize(
    "workers",
    [{}, {"server_workers": 2, "policy_workers": 2}],
    ids=["one-process-each", "two-workers-everywhere"],
)
def test_one_checkpoint_is_one_trace_with_a_span_per_participant_per_operation(
    deploy: Callable[..., Deployment], workers: dict[str, int]
) -> None:
    deployment = deploy("native", **workers)
    control = deployment.control
    control.begin_traces()
    assert control.prepare("c1", deadline()).prepared
    control.commit("c1", str(deployment.stack.checkpoint_root / "c1"), [], deadline())
    control.resume("c1", deadline())
    with pytest.raises(CoordinationError):
        control.prepare("c1", deadline())  # resumed: every environment refuses it with stale_checkpoint

    assert deployment.stack.telemetry_dir is not None
    reader = TelemetryReader(deployment.stack.telemetry_dir)
    reader.read_new()  # every metrics line is judged against its file's spans (P26) as it is read
    p26_one_span_per_call(control.control_calls(), reader.spans)

    names = sorted(member.name for member in control.participants)
    spans = [span for span in reader.spans if span.operation is not None]
    per_participant = Counter((span.attributes["gym.participant.instance"], span.operation) for span in spans)
    assert per_participant == Counter(
        {**{(name, op): 1 for name in names for op in OPERATIONS}, ("environment", "prepare"): 2}
    )
    assert {span.trace_id for span in reader.spans} == {trace_id_of("c1")}  # steps too: one trace
    refused = [span for span in spans if span.outcome != "ok"]
    assert [(span.operation, span.outcome) for span in refused] == [("prepare", "stale_checkpoint")]
    # One file per process that runs a control plane: a multi-worker server's coordinator, never its workers.
    assert sorted({span.source.rsplit("-", 1)[0] for span in reader.spans}) == names


def test_a_refused_span_that_says_ok_fails_p26(deploy: Callable[..., Deployment]) -> None:
    deployment = deploy("native", faults=("span_outcome_always_ok",))
    control = deployment.control
    control.begin_traces()
    control.resume("c0", deadline())  # idle: remembered, so a prepare of it is refused with stale_checkpoint
    with pytest.raises(CoordinationError):
        control.prepare("c0", deadline())
    assert deployment.stack.telemetry_dir is not None
    reader = TelemetryReader(deployment.stack.telemetry_dir)
    reader.read_new()

    with pytest.raises(P26Violation, match="stale_checkpoint"):
        p26_one_span_per_call(control.control_calls(), reader.spans)
