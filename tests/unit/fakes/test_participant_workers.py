"""The multi-worker environment, agent and resources servers' pure parts on hand-built values: the merged status
extras, session routing's owner and keys, and when a coordinator refuses a restore before asking its workers."""

from __future__ import annotations

import asyncio
import gc
import json
from collections import Counter
from typing import Any

import pytest

from fakes.gym.control.store import encode_record, record_line
from fakes.gym.protocol.errors import CheckpointStateError
from fakes.gym.protocol.wire import EpisodeId
from fakes.gym.servers.participant_workers import (
    export_wire,
    keys_from_wire,
    keys_wire,
    record_order,
    records_from_wire,
    restore_refusal,
)
from fakes.gym.workers.channel import Framed
from fakes.gym.workers.reports import merge_extras
from fakes.gym.workers.routes import BulkyControlMiddleware
from fakes.gym.workers.session_routing import SessionRouter, default_worker, key_in_path, key_in_run_body


def test_extras_unite_lists_sum_counts_and_keep_the_coordinators_configuration() -> None:
    own = {"restored_pending": ["a-a1"], "retired_sessions": 0, "mode": "exported", "accepting": True}
    workers = [
        {"restored_pending": ["c-a1", "b-a1"], "retired_sessions": 2, "mode": "stateless", "accepting": True},
        {"restored_pending": ["b-a1"], "retired_sessions": 1, "mode": "stateless", "accepting": False},
    ]
    assert merge_extras(own, workers) == {
        "restored_pending": ["a-a1", "b-a1", "c-a1"],
        "retired_sessions": 3,
        "mode": "exported",
        "accepting": False,
    }


def test_extras_of_no_worker_are_the_coordinators() -> None:
    own = {"restored_pending": [], "retired_sessions": 0}
    assert merge_extras(own, []) == own


def test_a_key_the_placement_does_not_name_has_the_same_worker_everywhere_and_the_keys_spread() -> None:
    keys = [f"r{index}-a0" for index in range(200)]
    owners = Counter(default_worker(key, 2) for key in keys)
    assert set(owners) == {0, 1}
    assert min(owners.values()) > 60, owners
    assert {default_worker(key, 1) for key in keys} == {0}


def test_the_placement_names_a_keys_worker_before_the_default() -> None:
    router = SessionRouter("environment", 2, "UNUSED")
    key = "r0"
    router.placement = {key: 1 - default_worker(key, 2)}
    assert router.owner(key) == 1 - default_worker(key, 2)
    assert router.owner("r1-a1") == default_worker("r1-a1", 2)


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/ng-rollout/r0-a1/v1/responses", "r0-a1"),
        ("/ng-rollout/r0/seed_session", "r0"),
        ("/ng-rollout//seed_session", None),
        ("/run", None),
        ("/ng-control/v1/checkpoint/status", None),
    ],
)
def test_a_path_names_its_episodes_key_only_under_the_rollout_prefix(path: str, key: str | None) -> None:
    assert key_in_path(path) == key


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"episode_id": {"rollout_id": "r3", "attempt": 2}, "task": {}}, "r3-a2"),
        ({"episode_id": {"rollout_id": "r3", "attempt": 0}}, "r3"),
        ({"_ng_rollout_id": "legacy-1", "_ng_attempt_index": 1}, "legacy-1-a1"),
        ({"_ng_rollout_id": "legacy-1"}, "legacy-1"),
        ({"task": {}}, None),
        (["not", "a", "row"], None),
        ({"episode_id": {"rollout_id": "r3", "attempt": "two"}}, None),
    ],
)
def test_a_run_body_names_its_episodes_key(body: object, key: str | None) -> None:
    assert key_in_run_body(json.dumps(body).encode()) == key


def test_a_run_body_that_is_not_json_names_no_key() -> None:
    assert key_in_run_body(b"{not json") is None


def test_a_restore_is_refused_once_a_worker_left_or_one_did_not_close() -> None:
    assert restore_refusal(left=False, unreported=0) is None
    assert "left since it started" in (restore_refusal(left=True, unreported=0) or "")
    assert "1 did not answer" in (restore_refusal(left=False, unreported=1) or "")


def test_a_scope_reaches_the_workers_as_its_capture_keys() -> None:
    scope = [EpisodeId(rollout_id="r0", attempt=0), EpisodeId(rollout_id="r1", attempt=3)]
    sent = keys_wire(episode.capture_key for episode in scope)
    keys = keys_from_wire(Framed(json.loads(json.dumps(sent.body)), sent.data))
    assert keys is not None
    assert "r1-a3" in keys
    assert "r1" not in keys
    assert keys == {"r0", "r1-a3"}
    assert {"r0", "r2"} & keys == {"r0"}
    assert keys_from_wire(keys_wire([])) == set()
    assert keys_from_wire(keys_wire(None)) is None


def test_keys_are_split_only_when_asked_about() -> None:
    keys = keys_from_wire(keys_wire(["a", "b"]))
    assert keys is not None
    assert keys._keys is None
    assert "a" in keys
    assert keys._keys == {"a", "b"}


def test_merged_records_sort_by_rollout_then_attempt() -> None:
    records = [
        {"episode_id": {"rollout_id": "r1", "attempt": 0}},
        {"episode_id": {"rollout_id": "r0", "attempt": 2}},
        {"episode_id": {"rollout_id": "r0"}},
    ]
    encoded = [encode_record(record, index) for index, record in enumerate(records)]
    assert [record.order for record in sorted(encoded, key=record_order)] == [("r0", 0), ("r0", 2), ("r1", 0)]


def test_a_workers_export_reaches_its_coordinator_as_the_lines_one_process_writes() -> None:
    records = [
        {"episode_id": {"rollout_id": "r1", "attempt": 0}, "text": 'é\n"quoted"'},
        {"episode_id": {"rollout_id": "r0", "attempt": 2}, "nested": {"a": [1, 2.5, None]}},
    ]
    reply = export_wire([encode_record(record, index) for index, record in enumerate(records)], 3)
    sent = json.loads(json.dumps(reply.body))  # the JSON half crosses the channel as JSON
    received = records_from_wire(Framed(sent, reply.data))
    assert sent["index"] == 3
    assert [record.key for record in received] == ["r1", "r0-a2"]
    assert [record.order for record in received] == [("r1", 0), ("r0", 2)]
    assert [record.line for record in received] == [record_line(record, 0) for record in records]
    assert [json.loads(bytes(record.line)) for record in received] == records


def test_a_record_without_a_valid_episode_is_refused_before_it_is_encoded() -> None:
    with pytest.raises(CheckpointStateError, match="every record must name its episode"):
        encode_record({"episode_id": {"rollout_id": "r0-a1"}}, 0)


@pytest.mark.parametrize(
    ("path", "paused"),
    [
        ("/ng-control/v1/checkpoint/commit", True),
        ("/ng-control/v1/checkpoint/restore", True),
        ("/ng-control/v1/checkpoint/retire", True),
        ("/ng-control/v1/checkpoint/prepare", False),
        ("/run", False),
    ],
)
def test_a_worker_serves_a_bulky_control_call_with_the_collector_paused(path: str, paused: bool) -> None:
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(gc.isenabled())

    async def serve() -> None:
        await BulkyControlMiddleware(app)({"type": "http", "path": path}, None, None)  # type: ignore[arg-type]

    enabled = gc.isenabled()
    gc.enable()
    try:
        asyncio.run(serve())
        assert seen == [not paused]
        assert gc.isenabled()
    finally:
        if not enabled:
            gc.disable()
