"""The look-alike collector's files on hand-built directories: checkpoint IDs, publishing, `LATEST`, pruning, the
dispatch log, the output and input rows, and the config's refusals (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes.collection import layout
from fakes.collection.config import CollectionConfig, ConfigError
from fakes.collection.layout import CollectionManifest, DispatchLog, Episode, LayoutError
from fakes.collection.rows import InputRow, RowError, finished_rollouts, output_row, read_inputs, reward_of


def manifest(checkpoint_id: str, created_at: float, *continued: Episode) -> CollectionManifest:
    return CollectionManifest(checkpoint_id, "run-1", created_at, continued, ())


def published(root: Path, checkpoint_id: str, created_at: float) -> None:
    (root / checkpoint_id).mkdir()
    layout.publish(root, manifest(checkpoint_id, created_at))


IDS = [f"ckpt-20261204T1200{second:02d}-0000000{second}" for second in range(5)]


def test_a_checkpoint_id_is_ckpt_a_utc_stamp_and_8_hex() -> None:
    checkpoint_id = layout.new_checkpoint_id(0.0)

    assert checkpoint_id.startswith("ckpt-19700101T000000-")
    assert layout.CHECKPOINT_ID.match(checkpoint_id)
    assert layout.new_checkpoint_id(0.0) != checkpoint_id


def test_publish_writes_the_manifest_then_points_latest_at_it(tmp_path: Path) -> None:
    (tmp_path / IDS[0]).mkdir()
    written = manifest(IDS[0], 5.0, Episode("long-1", 0))

    layout.publish(tmp_path, written)

    assert (tmp_path / "LATEST").read_text() == IDS[0] + "\n"
    assert layout.latest(tmp_path) == written
    assert json.loads((tmp_path / IDS[0] / "collection.json").read_text())["continued"] == [
        {"rollout_id": "long-1", "attempt": 0}
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["LATEST", IDS[0]]  # no temporary file left


def test_latest_is_none_without_latest_and_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    assert layout.latest(tmp_path) is None
    (tmp_path / "LATEST").write_text("../elsewhere\n")
    with pytest.raises(LayoutError, match="not a checkpoint ID"):
        layout.latest(tmp_path)
    (tmp_path / "LATEST").write_text(IDS[1] + "\n")
    (tmp_path / IDS[1]).mkdir()
    (tmp_path / IDS[1] / "collection.json").write_text(json.dumps(manifest(IDS[0], 1.0).wire()))
    with pytest.raises(LayoutError, match="names checkpoint"):
        layout.latest(tmp_path)


def test_prune_keeps_the_two_newest_published_and_deletes_partial_ones(tmp_path: Path) -> None:
    for number, checkpoint_id in enumerate(IDS[:4]):
        published(tmp_path, checkpoint_id, float(number))
    (tmp_path / IDS[4]).mkdir()  # partial: no collection.json
    (tmp_path / "unrelated").mkdir()

    deleted = layout.prune(tmp_path)

    assert deleted == [IDS[0], IDS[1], IDS[4]]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["LATEST", IDS[2], IDS[3], "unrelated"]


def test_prune_never_deletes_the_checkpoint_latest_names(tmp_path: Path) -> None:
    published(tmp_path, IDS[0], 9.0)
    published(tmp_path, IDS[1], 1.0)
    published(tmp_path, IDS[2], 2.0)
    published(tmp_path, IDS[3], 10.0)
    (tmp_path / "LATEST").write_text(IDS[1] + "\n")  # an older one, as after a clock step back

    layout.prune(tmp_path)

    assert sorted(path.name for path in tmp_path.iterdir() if path.is_dir()) == [IDS[0], IDS[1], IDS[3]]


def test_the_dispatch_log_names_the_highest_attempt_of_every_rollout_over_every_run(tmp_path: Path) -> None:
    first = DispatchLog(tmp_path, "run-1")
    first.record("a", 0)
    first.record("b", 0)
    first.close()
    second = DispatchLog(tmp_path, "run-2")
    second.record("a", 1)
    second.close()

    assert layout.dispatched_attempts(tmp_path) == {"a": 1, "b": 0}
    assert (tmp_path / "dispatched.jsonl").read_text().splitlines()[0] == '{"run_id": "run-1"}'


def test_a_torn_last_line_is_skipped_and_a_torn_line_before_it_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"b": ')
    assert list(layout.json_lines(path)) == [{"a": 1}]
    path.write_text('{"a": \n{"b": 2}\n')
    with pytest.raises(LayoutError, match=":1 is not JSON"):
        list(layout.json_lines(path))


def test_output_rows_carry_the_rollout_its_attempt_and_the_reward(tmp_path: Path) -> None:
    native = {"episode_id": {"rollout_id": "n", "attempt": 1}, "result": {"reward": 1.0}}
    path = tmp_path / "out.jsonl"
    path.write_text(output_row("n", 1, native) + "\n" + output_row("l", 0, {"reward": 0}) + "\n")

    assert reward_of(native) == 1.0
    assert reward_of({"failure": {"failure_reason": "Episode timed out"}}) is None
    assert finished_rollouts(path) == {"n", "l"}
    assert json.loads(path.read_text().splitlines()[1])["reward"] == 0.0


def test_input_rows_become_run_bodies_of_their_format(tmp_path: Path) -> None:
    row = InputRow("r", {"rollout_id": "r", "task": {"task_id": 1}})
    assert row.run_body("native", 2) == {"episode_id": {"rollout_id": "r", "attempt": 2}, "task": {"task_id": 1}}
    legacy = InputRow("r", {"_ng_rollout_id": "r", "responses_create_params": {}})
    assert legacy.run_body("legacy", 1) == {
        "_ng_rollout_id": "r",
        "responses_create_params": {},
        "_ng_attempt_index": 1,
    }

    path = tmp_path / "in.jsonl"
    path.write_text('{"rollout_id": "r", "task": {}}\n{"rollout_id": "r", "task": {}}\n')
    with pytest.raises(RowError, match="names rollout 'r' again"):
        read_inputs(path, "native")
    path.write_text('{"task": {}}\n')
    with pytest.raises(RowError, match="has no rollout_id"):
        read_inputs(path, "native")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"servers": {"environment": "http://x"}, "run_server": "relay"}, "run_server 'relay' is not among"),
        ({"servers": {"environment": "http://x"}, "checkpoint_dir": "c"}, "needs the control bearer token"),
        ({"servers": {"environment": "http://x"}, "resume_from_cache": True}, "resume_from_cache needs"),
        ({"servers": {"environment": "http://x"}, "checkpoint_every_s": 0}, "must be positive"),
        ({"servers": {"environment": "http://x"}, "tokn": "t"}, "unknown fields"),
        ({"servers": {"environment": "http://x"}, "faults": ["nope"]}, "unknown faults"),
    ],
)
def test_a_config_that_cannot_run_is_refused_naming_the_field(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"input_jsonl_fpath": "in", "output_jsonl_fpath": "out", **fields}))

    with pytest.raises(ConfigError, match=message):
        CollectionConfig.from_file(path)
