"""`ckpt-model audit` on checkpoint directories our stack wrote: a rollout collection's root (a SIGUSR1 checkpoint,
then a SIGTERM one, so `LATEST`, two published checkpoints and their participants' shares) passes,
and each damaged copy fails naming the damage, by the property it breaks. The damage covers every defect the
checker's reader (`ckpt_model.protocol.storage`) and the collection reader (`ckpt_model.protocol.collection_files`)
name."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.collection.machine import collection_machine_for
from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.modes.audit import NothingToAudit, audit
from ckpt_model.protocol.collection_files import LATEST, MANIFEST, latest_id
from ckpt_model.protocol.storage import MANIFEST_NAME
from ckpt_model.search import scenarios

NATIVE = DeploymentSpec("native")


@pytest.fixture(scope="module")
def written(harness_of: Callable[[DeploymentSpec], Harness], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkpoint root a collection run on `native` left: a requested checkpoint and a stop's."""
    machine = collection_machine_for(harness_of(NATIVE))()
    try:
        machine.start_run()
        machine.release(pick=0)
        machine.request_checkpoint()
        machine.preempt()
        copy = tmp_path_factory.mktemp("audit") / "checkpoints"
        shutil.copytree(machine.checkpoints, copy)
        telemetry = machine.harness.telemetry_dir
        assert telemetry is not None, "the look-alike exports telemetry"
        shutil.copytree(telemetry, copy.parent / "telemetry")
    finally:
        machine.stop()
    return copy


@pytest.fixture
def root(written: Path, tmp_path: Path) -> Path:
    """A copy of the written root for one test to damage."""
    return Path(shutil.copytree(written, tmp_path / "checkpoints"))


@pytest.fixture
def telemetry(written: Path, tmp_path: Path) -> Path:
    """A copy of the telemetry the stack's servers wrote up to the end of the run, for one test to damage."""
    return Path(shutil.copytree(written.parent / "telemetry", tmp_path / "telemetry"))


def latest_dir(root: Path) -> Path:
    checkpoint_id = latest_id(root)
    assert checkpoint_id is not None
    return root / checkpoint_id


def share(root: Path, kind: str = "environment") -> Path:
    """The first participant directory of `kind` in the checkpoint LATEST names."""
    return sorted((latest_dir(root) / "gym" / kind).iterdir())[0]


def manifest_of(directory: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((directory / MANIFEST_NAME).read_text())
    return loaded


def rewrite_manifest(directory: Path, **changes: object) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest_of(directory) | changes))


def records_path(directory: Path) -> Path:
    return directory / str(manifest_of(directory)["records_file"])


def reseal(directory: Path, data: bytes) -> None:
    """New records, sealed as a writer seals them: the file named after its digest, the manifest to match."""
    old = records_path(directory)
    digest = hashlib.sha256(data).hexdigest()
    old.unlink()
    name = f"records-{digest}.jsonl"
    (directory / name).write_bytes(data)
    lines = [line for line in data.split(b"\n") if line]
    rewrite_manifest(directory, records_file=name, records_sha256=digest, record_count=len(lines))


def test_the_root_a_collection_run_wrote_passes(written: Path) -> None:
    result = audit(written)

    assert result.passed, result.report()
    assert result.latest is not None
    assert [c.published for c in result.checkpoints] == [True, True]  # the two newest kept, nothing partial
    kinds = {"agent", "environment", "model", "resources"}
    assert all({p.kind for p in c.participants} == kinds for c in result.checkpoints), result.report()
    assert sum(p.records or 0 for c in result.checkpoints for p in c.participants) > 0
    verdict = "PASSED: every file verifies (P5, P9, P12, P22, P23, P24: what needs no live system)"
    assert result.report().endswith(verdict)


def test_a_legacy_collection_s_root_passes_its_episodes_named_by_the_agent(
    harness_of: Callable[[DeploymentSpec], Harness], tmp_path: Path
) -> None:
    """Legacy agents own their episodes and the environment is a relay, no participant: P24 reads the agent's
    records without being told; told the environment owns them, it finds `continued` naming what nobody exported."""
    machine = collection_machine_for(harness_of(DeploymentSpec("legacy")))()
    try:
        machine.start_run()
        machine.request_checkpoint()
        root = Path(shutil.copytree(machine.checkpoints, tmp_path / "checkpoints"))
    finally:
        machine.stop()

    assert audit(root).passed, audit(root).report()
    told = audit(root, "environment")
    assert [finding.property_id for finding in told.findings] == ["P24"], told.report()


def test_one_checkpoint_directory_alone_passes(written: Path) -> None:
    one = latest_dir(written)
    result = audit(one)
    assert result.passed, result.report()
    assert [c.path for c in result.checkpoints] == [one]


def _extra_record(root: Path) -> None:
    with records_path(share(root)).open("ab") as records:
        records.write(b'{"damaged": true}\n')


def _record_not_json(root: Path) -> None:
    directory = share(root)
    reseal(directory, records_path(directory).read_bytes() + b"{not json\n")


def _model_records(root: Path, *records: dict[str, object]) -> None:
    """The policy model's share of LATEST's checkpoint holding `records` (token capture's), sealed as written."""
    reseal(share(root, "model"), b"".join(json.dumps(record).encode() + b"\n" for record in records))


def _model_record(calls: list[str], cuts: int = 0, rollout: str = "row-0") -> dict[str, object]:
    cut = {"continuation": {"source_capture_key": rollout, "source_model_call_id": "held"}}
    return {
        "episode_id": {"rollout_id": rollout, "attempt": 0},
        "rows": [{"model_call_id": call, "staging_key": f"{rollout}/{call}"} for call in calls],
        "generation_cuts": [cut] * cuts,
    }


DAMAGES: dict[str, tuple[Callable[[Path], object], str, str]] = {
    "records-digest": (_extra_record, "P9", "is not the manifest's"),
    "record-count": (lambda r: rewrite_manifest(share(r), record_count=99), "P9", "the manifest says 99"),
    "record-not-json": (_record_not_json, "P9", ": not JSON"),
    "records-missing": (lambda r: records_path(share(r)).unlink(), "P9", "cannot read the records"),
    "manifest-missing": (lambda r: (share(r) / MANIFEST_NAME).unlink(), "P9", "cannot read the manifest"),
    "manifest-not-json": (lambda r: (share(r) / MANIFEST_NAME).write_text("{"), "P9", "not UTF-8 JSON"),
    "manifest-other-checkpoint": (
        lambda r: rewrite_manifest(share(r), checkpoint_id="ckpt-20000101T000000-00000000"),
        "P9",
        "belongs to checkpoint 'ckpt-20000101T000000-00000000'",
    ),
    "manifest-other-participant": (lambda r: rewrite_manifest(share(r), kind="agent"), "P9", "belongs to 'agent'/"),
    "manifest-schema": (lambda r: rewrite_manifest(share(r), schema_version=2), "P9", "'schema_version' must be"),
    "participants-gone": (lambda r: shutil.rmtree(latest_dir(r) / "gym"), "P22", "none of kind"),
    "latest-garbled": (lambda r: (r / LATEST).write_text("latest\n"), "P22", "not one checkpoint ID"),
    "latest-names-nothing": (
        lambda r: (r / LATEST).write_text("ckpt-20990101T000000-00000000\n"),
        "P22",
        "ckpt-20990101T000000-00000000",
    ),
    "collection-json-field": (
        lambda r: (latest_dir(r) / MANIFEST).write_text(
            json.dumps(json.loads((latest_dir(r) / MANIFEST).read_text()) | {"extra": 1})
        ),
        "P22",
        "fields",
    ),
    "continued-unexported": (
        lambda r: (latest_dir(r) / MANIFEST).write_text(
            json.dumps(
                json.loads((latest_dir(r) / MANIFEST).read_text())
                | {"continued": [{"rollout_id": "nobody", "attempt": 0}]}
            )
        ),
        "P24",
        "continued ['nobody']",
    ),
    "model-row-twice": (lambda r: _model_records(r, _model_record(["c1", "c1"])), "P5", "more than once"),
    "model-record-empty": (lambda r: _model_records(r, _model_record([])), "P5", "carry neither"),
    "model-two-cuts": (lambda r: _model_records(r, _model_record(["c1"], cuts=2)), "P12", "it carries 2"),
    "third-published": (
        lambda r: shutil.copytree(latest_dir(r), r / "ckpt-20000101T000000-00000000"),
        "P23",
        "at most 2 published checkpoints",
    ),
    "partial-left-behind": (
        lambda r: (r / "ckpt-20000101T000000-00000001" / "gym").mkdir(parents=True),
        "P23",
        "partial ['ckpt-20000101T000000-00000001']",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_copy_fails_naming_the_damage(root: Path, damage: str) -> None:
    damaging, property_id, phrase = DAMAGES[damage]
    damaging(root)

    result = audit(root)

    assert not result.passed
    named = [finding.message for finding in result.findings if finding.property_id == property_id]
    assert any(phrase in message for message in named), result.report()
    assert result.report().splitlines()[-1].startswith("FAILED: ")


def test_a_model_share_with_rows_and_one_cut_per_record_passes(root: Path) -> None:
    other = _model_record([], cuts=1, rollout="row-1")
    _model_records(root, _model_record(["c1", "c2"], cuts=1), other)
    result = audit(root)
    assert result.passed, result.report()


def test_a_partial_checkpoint_begun_after_latest_s_second_is_a_save_under_way(root: Path) -> None:
    (root / "ckpt-20990101T000000-00000000" / "gym").mkdir(parents=True)
    latest = latest_id(root)
    assert latest is not None
    same_second = latest[: latest.rindex("-")] + "-00000000"  # sorts before LATEST's, begun in the same second
    (root / same_second / "gym").mkdir(parents=True)
    result = audit(root)
    assert result.passed, result.report()


def test_a_checkpoint_whose_manifests_name_two_ids_fails_p9(written: Path, tmp_path: Path) -> None:
    """Outside a collection the checkpoint's ID is the one most manifests name, and every other must name it."""
    one = Path(shutil.copytree(latest_dir(written), tmp_path / "trainer-checkpoint"))
    (one / MANIFEST).unlink()
    assert audit(one).passed
    agent = sorted((one / "gym" / "agent").iterdir())[0]
    rewrite_manifest(agent, checkpoint_id="another")
    result = audit(one)
    assert [finding.property_id for finding in result.findings] == ["P9"], result.report()
    assert "belongs to checkpoint 'another'" in result.findings[0].message


def test_an_empty_directory_has_nothing_to_audit(tmp_path: Path) -> None:
    with pytest.raises(NothingToAudit, match="holds no checkpoint"):
        audit(tmp_path)


def ckpt_model(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_model", "audit", *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_command_exits_0_on_the_written_root_1_on_a_damaged_one_and_3_on_nothing(
    root: Path, tmp_path: Path
) -> None:
    before = {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}
    passed = ckpt_model(root)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.splitlines()[-1].startswith("PASSED")
    assert {path: path.read_bytes() for path in root.rglob("*") if path.is_file()} == before  # read only

    _extra_record(root)
    written = tmp_path / "audit.json"
    failed = ckpt_model(root, "--json", written)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "P9: expected " in failed.stdout
    # LATEST's checkpoint no longer verifies (P22 too); what its owner exported is unknown, so no P24 is judged.
    assert failed.stdout.splitlines()[-2:] == ["FAILED: 2 finding(s) (P22, P9)", f"wrote {written}"]
    document = json.loads(written.read_text())
    assert (document["verdict"], document["properties_violated"]) == ("violation", ["P22", "P9"])
    assert document["latest"] == latest_id(root)
    assert [finding["property_id"] for finding in document["findings"]] == ["P9", "P22"]
    assert all(len(checkpoint["participants"]) == 4 for checkpoint in document["checkpoints"])

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = ckpt_model(empty)
    assert nothing.returncode == 3, nothing.stdout + nothing.stderr
    assert "ckpt-model audit: error: " in nothing.stderr


# --- with the telemetry the run wrote (P26 offline) ---------------------------------------------------------------


def span_lines(telemetry: Path) -> dict[Path, list[dict[str, object]]]:
    return {
        path: [json.loads(line) for line in path.read_text().splitlines()] for path in sorted(telemetry.glob("*.jsonl"))
    }


def rewrite_lines(telemetry: Path, change: Callable[[dict[str, object]], dict[str, object] | None]) -> int:
    """Each line through `change` (None drops it); how many lines it changed or dropped."""
    changed = 0
    for path, records in span_lines(telemetry).items():
        kept = []
        for record in records:
            new = change(dict(record))
            changed += new != record
            if new is not None:
                kept.append(new)
        path.write_text("".join(json.dumps(record) + "\n" for record in kept))
    return changed


def of_latest(root: Path, operation: str, kind: str) -> Callable[[dict[str, object]], bool]:
    """Whether a line is the span of `operation` on the `kind` participant for LATEST's checkpoint."""
    latest = latest_id(root)

    def matches(record: dict[str, object]) -> bool:
        attributes = record.get("attributes")
        return (
            record.get("name") == f"gym.checkpoint.{operation}"
            and isinstance(attributes, dict)
            and attributes.get("gym.checkpoint.id") == latest
            and attributes.get("gym.participant.kind") == kind
        )

    return matches


def test_the_root_and_the_telemetry_the_run_wrote_pass(written: Path) -> None:
    result = audit(written, telemetry=written.parent / "telemetry")

    assert result.passed, result.report()
    assert result.telemetry is not None
    published = sorted(c.checkpoint_id for c in result.checkpoints if c.checkpoint_id is not None)
    assert list(result.telemetry.covered) == published
    assert result.telemetry.not_covered == ()
    assert result.telemetry.metrics_judged > 0
    assert result.report().endswith("(P5, P9, P12, P22, P23, P24, P26: what needs no live system)")


def _commit_span_dropped(root: Path, telemetry: Path) -> None:
    matches = of_latest(root, "commit", "agent")
    # the metrics line after it counts it: drop the count too, so only the share without a commit is left
    assert rewrite_lines(telemetry, lambda record: None if matches(record) else record) == 1
    _recount(telemetry)


def _commit_in_another_trace(root: Path, telemetry: Path) -> None:
    matches = of_latest(root, "commit", "environment")
    assert rewrite_lines(telemetry, lambda record: record | {"trace_id": "e" * 32} if matches(record) else record)


def _outcome_rewritten(root: Path, telemetry: Path) -> None:
    matches = of_latest(root, "commit", "resources")

    def refused(record: dict[str, object]) -> dict[str, object]:
        attributes = record["attributes"]
        assert isinstance(attributes, dict)
        return record | {"attributes": attributes | {"gym.checkpoint.outcome": "stale_checkpoint"}}

    assert rewrite_lines(telemetry, lambda record: refused(record) if matches(record) else record) == 1


def _share_removed(root: Path, telemetry: Path) -> None:
    shutil.rmtree(share(root, "resources"))


def _line_garbled(root: Path, telemetry: Path) -> None:
    path = next(iter(span_lines(telemetry)))
    path.write_text(path.read_text() + "{garbled\n")


def _step_outside(root: Path, telemetry: Path) -> None:
    commits = {str(r["span_id"]): r for r in span_lines(telemetry)[_agent_file(telemetry)] if _is_commit(r)}

    def moved(record: dict[str, object]) -> dict[str, object]:
        parent = commits.get(str(record.get("parent_span_id")))
        if parent is None or _is_commit(record):
            return record
        return record | {"end_ns": int(str(parent["end_ns"])) + 1_000_000}

    assert rewrite_lines(telemetry, moved)


def _agent_file(telemetry: Path) -> Path:
    return next(path for path in span_lines(telemetry) if path.name.startswith("agent"))


def _is_commit(record: dict[str, object]) -> bool:
    return record.get("name") == "gym.checkpoint.commit"


def _recount(telemetry: Path) -> None:
    """Every metrics line rewritten to count the spans before it: telemetry that agrees with itself."""
    for path, records in span_lines(telemetry).items():
        operations: dict[tuple[str, str], int] = {}
        lines = []
        for record in records:
            if record["type"] == "span" and str(record["name"]).removeprefix("gym.checkpoint.") in TRACED:
                attributes = record["attributes"]
                assert isinstance(attributes, dict)
                key = (str(record["name"]).removeprefix("gym.checkpoint."), str(attributes["gym.checkpoint.outcome"]))
                operations[key] = operations.get(key, 0) + 1
            if record["type"] == "metrics":
                durations: dict[str, int] = {}
                for (op, _), n in operations.items():
                    durations[op] = durations.get(op, 0) + n
                record = record | {
                    "operations": [{"op": op, "outcome": out, "count": n} for (op, out), n in operations.items()],
                    "durations": [{"op": op, "count": n, "sum_s": 0.0} for op, n in durations.items()],
                }
            lines.append(record)
        path.write_text("".join(json.dumps(record) + "\n" for record in lines))


TRACED = {"prepare", "renew", "commit", "restore", "resume", "retire", "forget"}

TELEMETRY_DAMAGES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "commit span dropped": (_commit_span_dropped, "written by a commit whose span says ok"),
    "commit in another trace": (_commit_in_another_trace, "2 traces"),
    "commit outcome rewritten": (_outcome_rewritten, "metrics in "),
    "share removed after an ok commit": (_share_removed, "a directory in "),
    "line garbled": (_line_garbled, "not JSON"),
    "step outside its commit": (_step_outside, "the step "),
}


@pytest.mark.parametrize("damage", sorted(TELEMETRY_DAMAGES))
def test_damaged_telemetry_fails_p26_naming_the_damage(root: Path, telemetry: Path, damage: str) -> None:
    damaging, phrase = TELEMETRY_DAMAGES[damage]
    damaging(root, telemetry)

    result = audit(root, telemetry=telemetry)

    named = [finding.message for finding in result.findings if finding.property_id == "P26"]
    assert any(phrase in message for message in named), result.report()


def test_the_command_judges_telemetry_and_refuses_a_path_with_nothing_to_read(
    root: Path, telemetry: Path, tmp_path: Path
) -> None:
    passed = ckpt_model(root, "--telemetry", telemetry)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert any(line.startswith(f"telemetry {telemetry}: ") for line in passed.stdout.splitlines())

    _line_garbled(root, telemetry)
    failed = ckpt_model(root, "--telemetry", telemetry)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stdout.splitlines()[-1] == "FAILED: 1 finding(s) (P26)"

    missing = ckpt_model(root, "--telemetry", tmp_path / "none")
    assert missing.returncode == 3, missing.stdout + missing.stderr
    assert "no such file or directory" in missing.stderr


def test_a_trainers_checkpoints_and_the_telemetry_of_its_run_pass(
    harness_of: Callable[[DeploymentSpec], Harness], tmp_path: Path
) -> None:
    """The contract machine as the trainer: two checkpoints kept, one restored; its controller client's trace per
    checkpoint ID, the restore's resume in it too."""
    harness = harness_of(NATIVE)
    checkpoint = ("checkpoint", {"then_resume": True})
    scenarios.run(
        harness, scenarios.steps("dispatch", "dispatch", checkpoint, "dispatch", checkpoint, ("recover", {"pick": 0}))
    )
    assert harness.telemetry_dir is not None
    root = Path(shutil.copytree(harness.checkpoint_dir, tmp_path / "checkpoints"))
    telemetry = Path(shutil.copytree(harness.telemetry_dir, tmp_path / "telemetry"))

    result = audit(root, telemetry=telemetry)

    assert result.passed, result.report()
    assert result.telemetry is not None
    assert len(result.telemetry.covered) == 2, result.report()


# --- the ledger chain from one published checkpoint to the next (P5, P12) -------------------------------------------

CAPTURE = DeploymentSpec.from_words("native:wait::capture+cuts")


@pytest.fixture(scope="module")
def chained(harness_of: Callable[[DeploymentSpec], Harness], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collection root with token capture and generation cuts: a checkpoint with a delivered call, a stop, a run
    that restores it, and a checkpoint of the restored rollouts, whose rows it stamped with their first attempt."""
    machine = collection_machine_for(harness_of(CAPTURE))()
    try:
        machine.start_run()
        machine.release(pick=0)
        machine.request_checkpoint()
        machine.preempt()
        machine.start_run()
        machine.request_checkpoint()
        copy = tmp_path_factory.mktemp("chained") / "checkpoints"
        shutil.copytree(machine.checkpoints, copy)
    finally:
        machine.stop()
    return copy


def model_records(root: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in records_path(share(root, "model")).read_text().splitlines()]


def test_a_chain_carried_through_a_restore_passes(chained: Path) -> None:
    result = audit(chained)
    assert result.passed, result.report()
    stamped = [row for record in model_records(chained) for row in record["rows"] if "capture_key" in row]  # type: ignore[union-attr]
    assert stamped, "the later checkpoint holds rows a restore carried"


def _records_changed(root: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    reseal(
        share(root, "model"), b"".join(json.dumps(change(record)).encode() + b"\n" for record in model_records(root))
    )


def _carried_row_replaced(record: dict[str, Any]) -> dict[str, Any]:
    """A carried row swapped for a call the earlier checkpoint never held (dropping the whole carried chain would
    look like an attempt that started over, which the files cannot tell apart)."""
    rows = [row | {"model_call_id": "unknown.9"} if "capture_key" in row else row for row in record["rows"]]
    return record | {"rows": rows}


def _stamped_with_its_own_attempt(record: dict[str, Any]) -> dict[str, Any]:
    own = f"{record['episode_id']['rollout_id']}-a{record['episode_id']['attempt']}"
    return record | {"rows": [row | {"capture_key": own} for row in record["rows"]]}


def _cut_of_a_delivered_call(record: dict[str, Any]) -> dict[str, Any]:
    if not record["rows"] or not record["generation_cuts"]:
        return record
    call = record["rows"][0]
    cut = record["generation_cuts"][0]
    continuation = cut["continuation"] | {
        "source_capture_key": call["capture_key"],
        "source_model_call_id": call["model_call_id"],
    }
    return record | {"generation_cuts": [cut | {"continuation": continuation}]}


CHAIN_DAMAGES: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str, str]] = {
    "a carried row replaced": (_carried_row_replaced, "P5", "lost or added"),
    "rows stamped with their own attempt": (_stamped_with_its_own_attempt, "P5", "rows stamped"),
    "a cut of a delivered call": (_cut_of_a_delivered_call, "P12", "a call whose row the record carries"),
}


@pytest.mark.parametrize("damage", sorted(CHAIN_DAMAGES))
def test_a_damaged_chain_fails_naming_the_damage(chained: Path, tmp_path: Path, damage: str) -> None:
    change, property_id, phrase = CHAIN_DAMAGES[damage]
    root = Path(shutil.copytree(chained, tmp_path / "checkpoints"))
    _records_changed(root, change)

    result = audit(root)

    named = [finding.message for finding in result.findings if finding.property_id == property_id]
    assert any(phrase in message for message in named), result.report()
