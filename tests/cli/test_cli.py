"""`ckpt-model` as a user runs it: in a subprocess (`python -m ckpt_model`), judged by exit code and output.

Exit codes: 0 passed, 1 property violation, 2 could not judge, 3 usage, 130 interrupted (143 by SIGTERM). Each run
starts in its own directory with its own `TMPDIR` and regression directory, so no run reads another's example
database and whatever a run leaves behind is found.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.deployments.catalogue import fault_catalogue
from ckpt_model.results import regression
from tests.stack.conftest import wait_until
from tests.stacks_dump import default_sigint, stacks_of
from tests.ungated_backend import SERVED_MODEL, ungated_backend

pytestmark = pytest.mark.processes

# A guard against a hang, not a speed check: generous enough for a search and its minimising on loaded cores.
RUN_TIMEOUT_S = 600.0
# Found in examples of a few steps, seeded, so the same examples every run; the search stops at the first failure
# and the checker's minimiser cuts it down (Hypothesis's own shrink, which took minutes here, is off by default).
FAULT_SEARCH = ["--faults", "resume_deletes_records", "--examples", "30", "--steps", "4", "--seed", "2"]


def environment(workdir: Path, *, developer: bool = False) -> dict[str, str]:
    """The test's environment for the command; `developer`: as on a laptop (no `CI`), whatever runs the tests."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HYPOTHESIS")}
    if developer:
        env.pop("CI", None)
    env["TMPDIR"] = str(workdir / "tmp")
    env["CKPT_MODEL_REGRESSIONS"] = str(workdir / "regressions")
    env["CKPT_MODEL_RUNS"] = str(workdir / "runs")
    (workdir / "tmp").mkdir(exist_ok=True)
    return env


def ckpt_model(workdir: Path, *arguments: str, developer: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_model", *arguments],
        cwd=workdir,
        env=environment(workdir, developer=developer),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@contextmanager
def started(workdir: Path, *arguments: str) -> Iterator[subprocess.Popen[str]]:
    """`ckpt-model ARGUMENTS` as a terminal starts a foreground job (Ctrl-C's default meaning), its output piped;
    killed at the end of the block if it still runs (a failed assertion must leave nothing running)."""
    with subprocess.Popen(
        [sys.executable, "-m", "ckpt_model", *arguments],
        cwd=workdir,
        env=environment(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
    ) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def read_until(process: subprocess.Popen[str], text: str, what: str) -> None:
    """Read `process`'s output up to the line holding `text`; fail if it ends first."""
    assert process.stdout is not None
    while text not in process.stdout.readline():
        assert process.poll() is None, f"{what} ended before it printed {text!r}"


def interrupted(process: subprocess.Popen[str], what: str) -> str:
    """SIGINT `process` (Ctrl-C) and return everything it printed once it stopped; fail, with its stacks, if it
    does not stop."""
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not stop after SIGINT; its stacks:\n{stacks_of(process.pid)}")
    return output


def left_behind(workdir: Path) -> list[str]:
    """Temporary directories of the run, and processes that still carry its `TMPDIR` in their environment."""
    marker = f"TMPDIR={workdir / 'tmp'}".encode()
    processes = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                processes.append(f"pid {entry.name}: {command!r}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return [str(path) for path in (workdir / "tmp").iterdir()] + processes


def regression_file(workdir: Path, steps: list[Any], *, faults: list[str], recorded: str) -> Path:
    path = workdir / f"{recorded}.json"
    document = {
        "format": 1,
        "failure": {"type": f"{recorded}Violation", "property": recorded},
        "topology": "native",
        "verify_mode": "wait",
        "faults": faults,
        "steps": steps,
    }
    path.write_text(json.dumps(document))
    return path


def test_faults_lists_every_planted_fault(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "faults")

    assert result.returncode == 0, result.stderr
    for fault in fault_catalogue():
        assert fault.name in result.stdout
        assert fault.caught_by in result.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["check", "--faults", "no_such_fault"], "unknown fault(s) 'no_such_fault'; known faults:"),
        (["check", "--topology", "kubernetes"], "argument --topology: invalid choice: 'kubernetes'"),
        (["check", "--examples", "0"], "must be a positive integer (got '0')"),
        (["check", "--deployment", "missing-gym.json"], "not a readable deployment description"),
        (["replay", "missing.json"], "not a readable regression file"),
        (["minimise", "missing.json"], "not a readable regression file"),
        (["replay", "unknown-rule.json"], "step 2 names 'teleport', which is no rule of the machine"),
        (["minimise", "unknown-rule.json"], "step 1 (dispatch) has arguments its rule does not take"),
        (["check", "--keep-artifacts", "."], "--keep-artifacts: "),
        (["check", "--keep-artifacts", "unknown-rule.json/kept"], "cannot be created"),
        (["check", "--weights", "crashes=2,teleports=1"], "--weights: 'teleports=1': expected FAMILY=WEIGHT"),
        (["check", "--max-time", "soon"], "must be a duration such as 90, 90s, 2m or 1h (got 'soon')"),
        (["check", "--json", "unknown-rule.json/result.json"], "--json unknown-rule.json/result.json: cannot be"),
        (["check", "--transition-depth", "7"], "argument --transition-depth: must be at most 6 (got '7')"),
        (["explore", "--depth", "0"], "argument --depth: must be a positive integer (got '0')"),
        (["check", "--junit", "."], "--junit .: cannot be written"),
        (["check", "--quiet", "--verbose"], "argument --verbose: not allowed with argument --quiet"),
    ],
    ids=[
        "unknown-subcommand",
        "unknown-fault",
        "bad-topology",
        "no-examples",
        "real-gym",
        "unreadable-file",
        "minimise-unreadable-file",
        "unknown-rule",
        "unknown-argument",
        "artifacts-not-empty",
        "artifacts-not-creatable",
        "unknown-family",
        "bad-duration",
        "json-unwritable",
        "transition-depth-too-deep",
        "explore-depth-zero",
        "junit-unwritable",
        "quiet-and-verbose",
    ],
)
def test_usage_errors_exit_3(tmp_path: Path, arguments: list[str], message: str) -> None:
    steps = [["dispatch", {"speed": 3} if arguments[0] == "minimise" else {}], ["teleport", {}]]
    regression_file(tmp_path, steps, faults=[], recorded="unknown-rule")

    result = ckpt_model(tmp_path, *arguments)

    assert result.returncode == 3, result.stdout + result.stderr
    assert message in result.stderr
    assert not (tmp_path / "tmp").exists() or left_behind(tmp_path) == []  # found before any server started
    if arguments[-1] == "no_such_fault":
        assert all(fault.name in result.stderr for fault in fault_catalogue())
    if "--keep-artifacts" in arguments:  # the user's files are as they were
        assert sorted(path.name for path in tmp_path.iterdir()) == ["tmp", "unknown-rule.json"]


def test_check_passes_on_the_fault_free_stack_after_its_banner(tmp_path: Path) -> None:
    result = ckpt_model(
        tmp_path,
        *["check", "--topology", "native", "--examples", "2", "--steps", "6", "--keep-artifacts", "kept"],
        developer=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    banner = result.stdout.split("PASSED")[0]
    for line in [
        "topology:    native",
        "verify mode: wait",
        "faults:      none",
        "profile:     default (random, example database .hypothesis/examples)",
        "seed:",
        "examples:    2 valid, each of up to 6 steps drawn",
        "swarm:       no",
        "draw:        a family by weight, then one of its rules: rollouts 20, calls 15,",
        f"artifacts:   kept in {tmp_path / 'kept'} (--keep-artifacts)",
        "time:        owned by the checker (clock jumps",
    ]:
        assert line in banner
    assert "PASSED" in result.stdout
    table = banner.split("coverage over ")[1]
    assert re.match(r"\d+ examples \(native\):", table)  # every example started, those Hypothesis rejected too
    assert "a reply held across a commit" in table
    assert "dispatch_restart" in table
    assert table.splitlines()[1].split() == ["family", "steps", "share", "ms/step"]
    # A passing run keeps every server's full log, with the requests the servers served, and nothing else.
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == ["logs"]
    assert '"POST /run HTTP/1.1" 200' in (tmp_path / "kept" / "logs" / "environment.log").read_text()
    assert left_behind(tmp_path) == []


def test_check_says_its_waits_are_real_where_no_clock_can_be_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without libfaketime the look-alike's clocks are not the checker's: a rule's wait for a deadline or a lease
    takes its seconds, and the banner says so (with it, the line says the clocks jump: the test above)."""
    monkeypatch.setenv("CKPT_MODEL_LIBFAKETIME", "/nonexistent/libfaketime.so.1")
    result = ckpt_model(tmp_path, "check", "--topology", "native", "--examples", "1", "--steps", "2", developer=True)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "time:        real waits (the native deployment cannot move its servers' clocks" in result.stdout


def test_check_stops_at_its_time_limit_between_examples_and_reports_what_it_covered(tmp_path: Path) -> None:
    """With --max-time and no --examples the search runs examples until the limit (counted from the deployment's
    start), then ends as a passing run: no example cut short, the coverage and the statistics of those that ran."""
    result = ckpt_model(
        tmp_path,
        "check",
        *("--seed", "3", "--steps", "4", "--max-time", "1s", "--weights", "pauses=0", "--progress-every", "0.2s"),
        developer=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "until the time limit, each of up to 4 steps drawn; no example begins that the median" in result.stdout
    # Piped: a plain line at each --progress-every, never a carriage return.
    assert re.search(r"\nprogress: \w.* · example \d+ \(until the time limit\) · \d+ steps · ", result.stdout)
    assert "\r" not in result.stdout
    assert "pauses 0" in result.stdout
    assert "(--weights)" in result.stdout
    (statistics,) = [line for line in result.stdout.splitlines() if line.startswith("statistics: ")]
    assert statistics.endswith("; stopped at its time limit (--max-time)")
    assert "cut short" not in statistics  # however many examples the second allowed (the stack's start counts)
    assert re.search(r"coverage over \d+ examples \(native\):", result.stdout)
    assert "examples (as many as its time allowed: --max-time) in " in result.stdout
    assert left_behind(tmp_path) == []


def test_check_with_swarm_passes_on_the_fault_free_stack(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "check", "--examples", "2", "--steps", "6", "--swarm", developer=True)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "swarm:       yes: each example leaves out some rules and mechanisms" in result.stdout
    # Every example the machine started counts, those Hypothesis then rejected too (its rule flags on top of the
    # swarm can leave one nothing to draw), so there may be more than 2.
    assert re.search(r"coverage over \d+ examples \(native\):", result.stdout)
    assert left_behind(tmp_path) == []


def test_check_finds_a_planted_fault_and_names_its_property(tmp_path: Path) -> None:
    result = ckpt_model(
        tmp_path, "check", *FAULT_SEARCH, "--json", "result.json", "--junit", "result.xml", "--keep-artifacts", "kept"
    )

    assert result.returncode == 1, result.stdout + result.stderr
    assert "seed:        2 (from --seed" in result.stdout
    assert "P9Violation: P9 checkpoints are durable and immutable" in result.stdout
    # The minimal failing steps are printed (which ones depends on the first failing example: the drain
    # checkpoints and resumes, so the fault can show without a committing step among them).
    assert "Minimal failing sequence (ckpt_model.search.minimise:" in result.stdout
    assert "FAILED: property violation (P9 in 10 of 10 replays)\nwrote result.json\nwrote result.xml" in result.stdout
    kept = tmp_path / "kept"
    assert not (tmp_path / "regressions").exists()  # with --keep-artifacts the regression file is kept with the rest
    written = json.loads((tmp_path / "result.json").read_text())
    replayable = Path(written["failures"][0]["regression_file"])
    assert re.fullmatch(r"P9-native-resume_deletes_records-[0-9a-f]{8}\.json", replayable.name)
    assert sorted(path.name for path in kept.iterdir()) == sorted(
        [
            replayable.with_suffix(".html").name,  # the timeline of the failing history, beside its regression file
            replayable.name,
            "checkpoints",
            "history.jsonl",
            "logs",
        ]
    )
    assert written["failures"][0]["timeline"] == str(kept / replayable.with_suffix(".html").name)
    assert f"ckpt-model replay {replayable}" in result.stdout
    assert_kept_artifacts(result.stdout, kept, replayable)
    document = regression.load(replayable)
    assert document["reproduction"]["text"] == "P9 in 10 of 10 replays"  # the minimal steps replay every time
    # The run store keeps the same failure, the report and the result, in a directory of this run's.
    run_dir = Path(written["run_dir"])
    assert run_dir.parent == tmp_path / "runs"
    assert sorted(path.name for path in run_dir.iterdir()) == sorted(
        [replayable.name, replayable.with_suffix(".html").name, "report.txt", "result.json"]
    )
    assert regression.load(run_dir / replayable.name) == document
    assert "FAILED: property violation (P9 in 10 of 10 replays)" in (run_dir / "report.txt").read_text()
    assert json.loads((run_dir / "result.json").read_text()) == written
    assert f"kept in {run_dir} ({tmp_path / 'runs' / 'latest'} links to it):" in result.stdout  # its last lines
    assert f"  {replayable.name}: {len(document['steps'])} steps, minimised" in result.stdout
    assert (written["verdict"], written["exit_code"], written["properties_violated"]) == ("violation", 1, ["P9"])
    assert written["seed"] == 2
    assert [step for step, _ in document["steps"]] == [
        step.removeprefix("state.").split("(")[0] for step in written["failures"][0]["steps"]
    ]  # the JSON's steps are the minimal ones the regression file holds, and they are printed
    assert all(step in result.stdout for step in written["failures"][0]["steps"])
    suite = ElementTree.parse(tmp_path / "result.xml").getroot()
    failing = [case.get("name", "") for case in suite.iter("testcase") if case.find("failure") is not None]
    assert [name.split()[0] for name in failing] == ["P9"]
    assert left_behind(tmp_path) == []


def test_check_quiet_prints_one_line_for_its_verdict(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "check", *FAULT_SEARCH, "--quiet")

    assert result.returncode == 1, result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("FAILED P9 native with resume_deletes_records: checkpoints are durable and immutable")
    replayable = re.escape(str(tmp_path / "regressions" / "P9-native-resume_deletes_records-"))
    assert re.search(f"replay: ckpt-model replay {replayable}[0-9a-f]{{8}}\\.json$", line), line
    assert left_behind(tmp_path) == []


def assert_kept_artifacts(report: str, kept: Path, replayable: Path) -> None:
    """The report's paths point into `kept` and outlive the run: the failing example's checkpoints, the server logs
    (whole, with the requests served), the history as JSON lines, and the regression file the replay line names."""
    assert replayable.parent == kept
    assert f"(open in a browser): {replayable.with_suffix('.html')}" in report  # the timeline beside it
    observed = report.split("  observed: ", 1)[1].split(":", 1)[0]
    assert observed.startswith(str(kept / "checkpoints" / "example-"))
    example = kept / "checkpoints" / Path(observed).relative_to(kept / "checkpoints").parts[0]
    assert [path.name for path in (kept / "checkpoints").iterdir()] == [example.name]  # the failing example's only
    assert (example / "checkpoints").is_dir()
    assert f"--- environment ({kept / 'logs' / 'environment.log'})" in report
    assert f"Kept in {kept} (valid after the run)" in report
    assert "removed when the run exits" not in report
    assert '"POST /run HTTP/1.1"' in (kept / "logs" / "environment.log").read_text()
    events = [json.loads(line) for line in (kept / "history.jsonl").read_text().splitlines()]
    assert events
    assert [event["index"] for event in events] == list(range(len(events)))


@pytest.mark.parametrize(
    ("recorded", "verdict"),
    [("P9", "FAILED as recorded: P9"), ("P4", "FAILED with a different property than recorded (P4): P9")],
)
def test_replay_of_a_failing_file_exits_1_and_says_whether_as_recorded(
    tmp_path: Path, recorded: str, verdict: str
) -> None:
    steps = [["dispatch", {}], ["checkpoint", {"then_resume": True}]]
    path = regression_file(tmp_path, steps, faults=["resume_deletes_records"], recorded=recorded)

    result = ckpt_model(tmp_path, "replay", str(path))

    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict in result.stdout
    # Without --keep-artifacts the report says its paths go with the run, and how to keep them.
    assert "are temporary and removed when the run exits; to keep them" in result.stdout
    assert "rerun with `--keep-artifacts DIR`" in result.stdout
    # The command that replays it is the one just run; the timeline it drew is the run store's, which outlives the
    # run (with the report and the regression file); what Hypothesis would replay does not apply to a replay.
    assert f"Replay it again: ckpt-model replay {path.resolve()}\n" in result.stdout
    assert "Replay without Hypothesis" not in result.stdout
    timeline_line = next(line for line in result.stdout.splitlines() if line.startswith("Timeline of"))
    picture = Path(timeline_line.split("(open in a browser): ")[1])
    assert picture.parent.parent == tmp_path / "runs"
    assert (picture.exists(), picture.with_suffix(".json").exists(), (picture.parent / "report.txt").exists()) == (
        True,
    ) * 3
    assert "temporary" not in timeline_line
    assert "Under Hypothesis" not in result.stdout
    assert left_behind(tmp_path) == []


def test_replay_with_keep_artifacts_keeps_what_its_report_names(tmp_path: Path) -> None:
    steps = [["dispatch", {}], ["checkpoint", {"then_resume": True}]]
    path = regression_file(tmp_path, steps, faults=["resume_deletes_records"], recorded="P9")
    before = path.read_bytes()

    result = ckpt_model(tmp_path, "replay", str(path), "--keep-artifacts", "kept")

    assert result.returncode == 1, result.stdout + result.stderr
    (replayable,) = (tmp_path / "kept").glob("P9-native-resume_deletes_records-*.json")
    assert_kept_artifacts(result.stdout, tmp_path / "kept", replayable)
    assert path.read_bytes() == before  # the replayed file is not the one kept
    assert replayable.with_suffix(".html").exists()
    assert left_behind(tmp_path) == []


def test_replay_passes_once_the_fault_is_gone(tmp_path: Path) -> None:
    path = regression_file(
        tmp_path, [["dispatch", {}], ["checkpoint", {"then_resume": True}]], faults=[], recorded="P9"
    )

    result = ckpt_model(tmp_path, "replay", str(path))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED: the recorded P9 no longer happens" in result.stdout


def test_a_harness_error_exits_2(tmp_path: Path) -> None:
    # A commit before any prepare is a step the machine would never draw: StepNotEnabled, a harness error.
    path = regression_file(tmp_path, [["commit", {}]], faults=[], recorded="P9")

    result = ckpt_model(tmp_path, "replay", str(path))

    assert result.returncode == 2, result.stdout + result.stderr
    assert "StepNotEnabled: step 1 (commit({})) is not enabled" in result.stdout
    assert "COULD NOT JUDGE: harness" in result.stdout
    assert left_behind(tmp_path) == []


def test_ctrl_c_during_check_stops_everything_and_exits_130(tmp_path: Path) -> None:
    with started(tmp_path, "check", "--examples", "1000", "--steps", "20", "--seed", "3") as check:
        read_until(check, "examples:    1000 valid, each of up to 20 steps drawn", "ckpt-model check")
        # Into the run: its servers are up (their logs exist), an example under way.
        wait_until(lambda: any((tmp_path / "tmp").glob("ckpt-model-*/stack/logs/environment.log")), "servers up", 60)
        output = interrupted(check, "ckpt-model check")

    assert check.returncode == 130, output
    assert "INTERRUPTED (SIGINT)" in output
    assert left_behind(tmp_path) == []


def test_a_second_run_interrupted_while_measuring_loses_nothing_the_first_kept(tmp_path: Path) -> None:
    """The same failure found twice (the same seed, so the same steps and the same file name): the second run,
    interrupted while it measures, leaves the first's minimised file and run directory as they were, keeps what it
    found in a run directory of its own, and says so."""
    arguments = ["check", "--faults", "resume_deletes_records", "--seed", "1"]
    first = ckpt_model(tmp_path, *arguments)
    assert first.returncode == 1, first.stdout + first.stderr
    first_dir = (tmp_path / "runs" / "latest").resolve()
    kept_first = {path.name: path.read_bytes() for path in first_dir.iterdir()}
    (replayable,) = (tmp_path / "regressions").glob("P9-native-resume_deletes_records-*.json")
    minimal = regression.load(replayable)
    assert "minimised" in minimal
    assert replayable.name in kept_first

    with started(tmp_path, *arguments) as second:
        read_until(second, "measuring and minimising the failing run", "the second run")
        output = interrupted(second, "the second ckpt-model check")

    assert {path.name: path.read_bytes() for path in first_dir.iterdir()} == kept_first
    assert regression.load(replayable)["steps"] == minimal["steps"]  # never the steps found over the minimal ones
    assert "minimised" in regression.load(replayable)
    second_dir = (tmp_path / "runs" / "latest").resolve()
    assert second_dir != first_dir
    assert regression.load(second_dir / replayable.name)["steps"]  # the second run's own steps, kept
    if second.returncode == 130:  # else the run ended before the interrupt came (its report is then the verdict)
        assert f"kept in {second_dir} ({tmp_path / 'runs' / 'latest'} links to it):" in output
        assert f"  {replayable.name}: " in output
        assert f"and in the replayable set: {replayable}: {len(minimal['steps'])} steps, minimised" in output
    assert left_behind(tmp_path) == []


# --- minimise ------------------------------------------------------------------------------------------------


def test_minimise_rewrites_a_file_with_its_1_minimal_steps(tmp_path: Path) -> None:
    # resume_deletes_records fails P9 once a checkpoint with a rollout in it is resumed, by the drain if not by the
    # steps: `dispatch; checkpoint(then_resume=False)`; the rest is noise.
    longer = [["dispatch", {}], ["release", {"pick": 3}], ["dispatch", {}], ["checkpoint", {"then_resume": True}]]
    path = regression_file(tmp_path, longer, faults=["resume_deletes_records"], recorded="P9")

    result = ckpt_model(tmp_path, "minimise", str(path), "--keep-artifacts", "kept")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "fails as recorded; minimising 4 steps" in result.stdout
    assert "MINIMISED (4 -> 2 steps" in result.stdout
    document = json.loads(path.read_text())
    assert document["steps"] == [["dispatch", {}], ["checkpoint", {"then_resume": False}]]
    assert document["failure"] == {"type": "P9Violation", "property": "P9"}
    assert document["minimised"]["steps_before"] == 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [path.name]  # no partial file left
    assert not (tmp_path / "regressions").exists()  # the candidates' failures wrote nothing of the user's
    # Kept: the first replay's failure (its regression file, history and checkpoints) and every server's full log.
    (first,) = (tmp_path / "kept").glob("P9-native-resume_deletes_records-*.json")
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == sorted(
        [first.name, first.with_suffix(".html").name, "checkpoints", "history.jsonl", "logs"]
    )
    # The run store keeps the first replay's failure too, now with the minimal steps, as the line says.
    (run_dir,) = [path for path in (tmp_path / "runs").iterdir() if path.name != "latest"]
    assert f"kept in the run store: {run_dir}" in result.stdout
    assert regression.load(run_dir / first.name)["steps"] == document["steps"]
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("faults", "steps", "recorded", "code", "verdict"),
    [
        ([], [["dispatch", {}], ["checkpoint", {"then_resume": True}]], "P9", 0, "PASSED: the recorded P9"),
        (
            ["resume_deletes_records"],
            [["dispatch", {}], ["checkpoint", {"then_resume": True}]],
            "P4",
            1,
            "FAILED with a different property than recorded (P4): P9",
        ),
        (["resume_deletes_records"], [["commit", {}]], "P9", 2, "COULD NOT JUDGE: harness"),
    ],
    ids=["passes-now", "other-property", "step-not-enabled"],
)
def test_minimise_leaves_a_file_that_does_not_fail_as_recorded_as_it_was(
    tmp_path: Path, faults: list[str], steps: list[Any], recorded: str, code: int, verdict: str
) -> None:
    path = regression_file(tmp_path, steps, faults=faults, recorded=recorded)
    before = path.read_bytes()

    result = ckpt_model(tmp_path, "minimise", str(path))

    assert result.returncode == code, result.stdout + result.stderr
    assert verdict in result.stdout
    assert "left as it was" in result.stdout
    assert path.read_bytes() == before
    assert left_behind(tmp_path) == []


def test_fuzz_hands_its_arguments_to_the_fuzz_commands(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "fuzz", "--help")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "usage: ckpt-model fuzz" in result.stdout
    for command in ("worker", "replay", "redis"):
        assert command in result.stdout


def test_scale_prints_its_stage_table_and_passes_on_the_fault_free_stack(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "scale", "--rollouts", "24")

    assert result.returncode == 0, result.stdout + result.stderr
    for stage in ("prepare", "commit", "restore"):
        assert stage in result.stdout
    assert "finished and exported (P1): ok" in result.stdout
    assert result.stdout.rstrip().endswith("PASSED: every verdict holds")
    assert left_behind(tmp_path) == []


def test_scale_with_a_model_url_runs_the_real_model_test_and_says_what_it_did_not_check(tmp_path: Path) -> None:
    with ungated_backend(tmp_path / "backend.log") as url:
        result = ckpt_model(tmp_path, "scale", "--model-url", url, "--rollouts", "6")

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"real model {SERVED_MODEL!r} at {url}: 6 rollouts" in result.stdout
    assert "silent while checkpointed (P2): ok" in result.stdout
    assert "continued from the boundary (P4): not checked" in result.stdout
    assert result.stdout.rstrip().endswith(
        "PASSED: every verdict holds (2 checks not made with a real model, listed above)"
    )
    assert left_behind(tmp_path) == []


def test_ctrl_c_during_a_real_model_run_stops_every_gym_server_and_exits_130(tmp_path: Path) -> None:
    # Seconds a call: the probe answers, and the first wave is still generating when the interrupt comes.
    with (
        ungated_backend(tmp_path / "backend.log", latency_ms=3000) as url,
        started(tmp_path, "scale", "--model-url", url) as run,
    ):
        read_until(run, "dispatch ...", "ckpt-model scale")  # the Gym servers are up
        output = interrupted(run, "ckpt-model scale")

    assert run.returncode == 130, output
    assert "INTERRUPTED (SIGINT)" in output
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model-url", "gpu:8000"], "'--model-url' must be an http:// or https:// URL"),
        (["--model-name", "org/served"], "'--model-name' needs '--model-url'"),
        (["--model-url", "http://127.0.0.1:1", "--finished-share", "0.5"], "'--finished-share' does not apply"),
    ],
)
def test_scale_refuses_real_model_options_that_do_not_fit(tmp_path: Path, arguments: list[str], message: str) -> None:
    result = ckpt_model(tmp_path, "scale", *arguments)

    assert result.returncode == 3, result.stdout + result.stderr
    assert message in result.stderr


def test_scale_refuses_a_share_outside_0_to_1(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "scale", "--finished-share", "1.5")

    assert result.returncode == 3
    assert "'--finished-share' must be in [0, 1)" in result.stderr


def test_explore_prints_each_depth_and_checks_the_invariants(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "explore", "--depth", "3", "--json", "explored.json")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "exploring the contract model of native: to depth 3, at most 3 rollouts live" in result.stdout
    assert re.search(r"^\s+3\s+157\s+509\s+[\d.]+$", result.stdout, re.MULTILINE), result.stdout
    assert "177 states, 558 transitions in " in result.stdout
    assert "PASSED: every invariant held on every state reached" in result.stdout
    written = json.loads((tmp_path / "explored.json").read_text())
    assert (written["states"], written["transitions"], written["violations"]) == (177, 558, [])
    assert "drain_reaches_a_clean_end" in written["invariants"]


def test_check_aim_walks_tours_and_reports_the_transitions_taken(tmp_path: Path) -> None:
    result = ckpt_model(tmp_path, "check", "--examples", "3", "--seed", "1", "--aim", "--json", "result.json")

    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^transitions: to depth 5: \d+ of \d+ ", result.stdout, re.MULTILINE), result.stdout
    taken = json.loads((tmp_path / "result.json").read_text())["transitions"]
    assert taken["depth"] == 5
    assert sum(share["taken"] for share in taken["by_depth"]) > 0
    assert taken["unmodelled"] == []
    assert left_behind(tmp_path) == []
