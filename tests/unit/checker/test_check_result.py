"""`check_result`: the JSON and JUnit files of a `ckpt-model check` run, built from hand-made results."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import attrs
import pytest

from ckpt_model.errors import StepNotEnabled
from ckpt_model.properties.durability import P9Violation
from ckpt_model.properties.registry import REGISTRY
from ckpt_model.results import check_result
from ckpt_model.results.check_result import CheckResult, FailureResult, Statistics, failure_results, write
from ckpt_model.results.stats import RoundStat, SearchStats


def statistics() -> Statistics:
    stats = SearchStats()
    stats.example_started()
    stats.example_finished(steps=5, crashes=2, seconds=1.0, crashes_inside=1, drawn=3)
    stats.example_covered({"crash_inside_commit": 1}, ["dispatch"], {"dispatch": 3, "crash": 2}, {"crash": 0.25})
    stats.stopped_by_time = True
    stats.rounds.append(RoundStat(0.5, 0, "round 1: the weights' own draw"))
    aimed = {"goals": ["stalled_write_retried"], "pins": {"stalled_write": {"then_retry": True}}}
    stats.rounds.append(RoundStat(60.2, 131, "round 2: aimed at 1 left", aimed))
    return Statistics.of(stats, ["rule commit never drawn"])


COVERAGE = {
    "examples": 1,
    "goals": [{"name": "crash_inside_commit", "says": "a crash inside a commit", "steps": 1, "examples": 1}],
    "rules": [{"name": "commit", "enabled": 0, "drawn": 0, "examples": 0, "ms_per_draw": None, "status": "NEVER"}],
    "never": ["commit"],
}


def result(failures: tuple[FailureResult, ...] = (), skipped: dict[str, str] | None = None) -> CheckResult:
    verdict = "violation" if any(f.kind == "violation" for f in failures) else "unjudged" if failures else "passed"
    return CheckResult(
        verdict=verdict,
        exit_code={"passed": 0, "violation": 1, "unjudged": 2}[verdict],
        system="embedded look-alike stack",
        deployment="native with resume_deletes_records",
        seed=7,
        profile="default",
        examples_asked=8,
        steps_asked=14,
        failures=failures,
        timings={"total": 12.345, "search": 4.0, "first_failure": 3.5, "measuring": 8.3},
        statistics=statistics(),
        skipped=skipped or {},
        version="0.1.0",
        coverage=COVERAGE,
    )


P9 = FailureResult(
    kind="violation",
    property_id="P9",
    title=P9Violation.title,
    message='P9 checkpoints are durable\n  expected: c1 verifies\n  observed: <gone> & "quoted"',
    rate="P9 in 10 of 10 replays",
    steps=("state.dispatch(worker=0)", "state.checkpoint(then_resume=True)"),
    regression_file="regressions/P9-native.json",
)


def test_the_json_names_the_verdict_the_property_the_steps_and_the_statistics() -> None:
    document = json.loads(result((P9,)).json_text())

    assert document["verdict"] == "violation"
    assert document["exit_code"] == 1
    assert document["properties_violated"] == ["P9"]
    assert document["seed"] == 7
    assert document["deployment"] == "native with resume_deletes_records"
    assert document["failures"][0]["steps"] == ["state.dispatch(worker=0)", "state.checkpoint(then_resume=True)"]
    assert document["failures"][0]["regression_file"] == "regressions/P9-native.json"
    assert document["timings_s"] == {"total": 12.35, "search": 4.0, "first_failure": 3.5, "measuring": 8.3}
    assert document["statistics"]["steps"] == 5
    assert document["statistics"]["crashes_inside_operations"] == 1
    assert document["statistics"]["goals"] == {"crash_inside_commit": 1}
    assert document["statistics"]["rules_drawn"] == {"crash": 2, "dispatch": 3}
    assert document["statistics"]["rule_seconds"] == {"crash": 0.25}
    assert document["statistics"]["unmet"] == ["rule commit never drawn"]
    assert document["statistics"]["stopped_by_time"] is True
    first, second = document["statistics"]["rounds"]
    assert first == {"started_s": 0.5, "examples_before": 0, "says": "round 1: the weights' own draw", "aim": None}
    assert second["examples_before"] == 131
    assert second["aim"]["pins"] == {"stalled_write": {"then_retry": True}}


def test_a_passing_run_names_no_property() -> None:
    document = json.loads(result().json_text())

    assert document["verdict"] == "passed"
    assert document["properties_violated"] == []
    assert document["failures"] == []


def test_junit_has_a_case_per_property_the_violated_one_failing_and_skipped_ones_skipped() -> None:
    suite = ElementTree.fromstring(result((P9,), skipped={"P3": "needs a gated backend"}).junit_text())

    cases = suite.findall("testcase")
    assert len(cases) == len(REGISTRY) == int(suite.get("tests", "0"))
    assert suite.get("failures") == "1"
    assert suite.get("skipped") == "1"
    failing = [case for case in cases if case.find("failure") is not None]
    assert [case.get("name", "").split()[0] for case in failing] == ["P9"]
    failure = failing[0].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("P9 in 10 of 10 replays: P9 checkpoints are durable")
    assert '<gone> & "quoted"' in (failure.text or "")  # escaped in the file, whole once parsed
    assert "ckpt-model replay regressions/P9-native.json" in (failure.text or "")
    skipped = [case for case in cases if case.find("skipped") is not None]
    assert [case.get("name", "").split()[0] for case in skipped] == ["P3"]


def test_junit_of_a_run_that_could_not_judge_has_one_errored_case() -> None:
    harness = FailureResult(kind="harness", property_id=None, title=None, message="ServerStartError: agent exited")
    suite = ElementTree.fromstring(result((harness,)).junit_text())

    assert suite.get("errors") == "1"
    assert suite.get("failures") == "0"
    errored = [case for case in suite.findall("testcase") if case.find("error") is not None]
    assert len(errored) == 1
    assert errored[0].find("error").get("message") == "ServerStartError: agent exited"  # type: ignore[union-attr]


def test_failure_results_put_violations_first_and_name_their_files() -> None:
    harness_error = StepNotEnabled(step="commit({})", index=1, rule="commit")
    violation = P9Violation(rollout="r0", expected="c1 verifies", observed="it does not")

    def files(error: BaseException) -> tuple[str | None, str | None]:
        return f"{type(error).__name__}.json", f"{type(error).__name__}.html"

    results = failure_results([harness_error, violation], files)

    assert [(r.kind, r.property_id, r.rollout) for r in results] == [("violation", "P9", "r0"), ("harness", None, None)]
    assert (results[0].regression_file, results[0].timeline) == ("P9Violation.json", "P9Violation.html")
    assert json.loads(result(results).json_text())["failures"][0]["timeline"] == "P9Violation.html"
    assert results[0].message.startswith("P9 ")


def test_write_leaves_the_whole_file_and_no_partial(tmp_path: Path) -> None:
    target = tmp_path / "out" / "result.json"

    write(target, "{}\n")

    assert target.read_text() == "{}\n"
    assert [path.name for path in target.parent.iterdir()] == ["result.json"]


def test_the_json_carries_the_coverage_table_and_the_steps_drawn_beside_the_model_steps() -> None:
    document = json.loads(result().json_text())

    assert document["coverage"] == COVERAGE
    assert (document["steps_asked"], document["statistics"]["steps_drawn"], document["statistics"]["steps"]) == (
        14,
        3,
        5,
    )


def test_a_run_that_started_no_deployment_has_no_coverage() -> None:
    document = json.loads(attrs.evolve(result(), coverage=None).json_text())

    assert document["coverage"] is None


# --- a result file checked writable before the run --------------------------------------------------------------


def test_a_writable_result_path_is_checked_and_left_as_it_was(tmp_path: Path) -> None:
    check_result.check_writable(tmp_path / "new" / "result.json")
    assert [path.name for path in (tmp_path / "new").iterdir()] == []  # the directory made as `write` makes it
    (tmp_path / "old.json").write_text("kept")
    check_result.check_writable(tmp_path / "old.json")
    assert (tmp_path / "old.json").read_text() == "kept"


@pytest.mark.parametrize(("where", "raised"), [("a-file/result.json", FileExistsError), ("a-dir", IsADirectoryError)])
def test_an_unwritable_result_path_raises_what_the_write_would(
    tmp_path: Path, where: str, raised: type[OSError]
) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-dir").mkdir()
    with pytest.raises(raised):
        check_result.check_writable(tmp_path / where)
