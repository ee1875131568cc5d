"""`ckpt-model replay` and `ckpt-model minimise`: a regression file run again on the machine of the controller it
names, without Hypothesis, or made 1-minimal and rewritten."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_model.commands.check import artifacts_dir
from ckpt_model.errors import PropertyViolation, UsageError
from ckpt_model.interrupts import interrupts_held
from ckpt_model.model.spec import DeploymentSpec, SpecError
from ckpt_model.results.reproduction import Rate
from ckpt_model.results.verdicts import Exit, exception_text, failure_report, report_failure
from ckpt_model.search.controllers import TRAINER, ControllerMachine

if TYPE_CHECKING:  # the stateful module is imported only when a check runs
    pass


def load_regression(path: Path) -> tuple[dict[str, Any], DeploymentSpec, ControllerMachine]:
    """The file, its deployment and the machine of the controller it names; every problem with it at once, as a
    usage error."""
    from ckpt_model.deployments.catalogue import fault_catalogue
    from ckpt_model.results import regression
    from ckpt_model.search.controllers import UnknownController, for_origin

    try:
        document = regression.load(path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    known = {fault.name for fault in fault_catalogue()}
    failure = document.get("failure")
    problems: list[str] = []
    try:
        spec = DeploymentSpec.from_document(document)
    except SpecError as error:
        problems.extend(error.problems)
    else:
        if not set(spec.faults) <= known:
            problems.append(f"'faults' must be known fault names (got {document['faults']!r}; see `ckpt-model faults`)")
    if not isinstance(failure, dict) or not isinstance(failure.get("type"), str):
        problems.append(f"'failure' must be {{'type': ..., 'property': ...}} (got {failure!r})")
    origin = regression.Origin.from_document(document)
    controller: ControllerMachine = TRAINER
    try:
        controller = for_origin(origin)
    except UnknownController as error:
        problems.append(str(error))
    else:
        if not set(origin.faults) <= controller.program_faults():
            problems.append(
                f"'controller_faults' must be faults of the {origin.controller} controller's program "
                f"(got {list(origin.faults)!r}; see `ckpt-model faults`)"
            )
        problems += unknown_rules(document.get("steps"), controller.machine_type)
    if problems:
        raise UsageError(f"{path}: not a replayable regression file:\n" + "\n".join(f"  - {p}" for p in problems))
    return document, spec, controller


def unknown_rules(steps: Any, machine: type) -> list[str]:
    """Each step that names no rule of the machine, or arguments its rule does not take, said as a problem of the
    file: found before any server starts (a replay would start the stack, then stop at it)."""
    import inspect

    if not isinstance(steps, list):
        return []  # `regression.load` already refused a file without a list of steps
    problems: list[str] = []
    for index, (name, arguments) in enumerate(steps, start=1):
        function = getattr(machine, name, None)
        if function is None or getattr(function, "hypothesis_stateful_rule", None) is None:
            problems.append(f"step {index} names {name!r}, which is no rule of the machine")
            continue
        try:
            inspect.signature(function).bind(None, **arguments)
        except TypeError as error:
            problems.append(f"step {index} ({name}) has arguments its rule does not take: {error}")
    return problems


def lasting_path(path: Path) -> Path:
    """`path` absolute, its links resolved: what still names the file once this run is over. A replay keeps its own
    failure in the run store and moves `runs/latest` to it, so a path through `latest` would name another run's
    directory by then."""
    return path.resolve()


def run_replay(args: argparse.Namespace) -> int:
    from ckpt_model.results import regression, runstore
    from ckpt_model.search.scenarios import replay

    document, _, _ = load_regression(args.file)
    kept = artifacts_dir(args)
    recorded_type = document["failure"]["type"]
    recorded = document["failure"].get("property") or recorded_type
    print(f"replaying {args.file} (recorded: {recorded})\n  {regression.describe(document)}", flush=True)
    again = f"ckpt-model replay {lasting_path(Path(args.file))}"
    try:
        replay(document, artifacts=kept, run_store=runstore.root())
    except PropertyViolation as violation:
        if document["failure"].get("property"):
            same = violation.property_id == document["failure"]["property"]
        else:
            same = type(violation).__name__ == recorded_type
        verdict = "as recorded" if same else f"with a different property than recorded ({recorded})"
        report = f"{exception_text(violation, replay_command=again)}\n\nFAILED {verdict}: {violation.property_id} "
        report += violation.title
        print(report, flush=True)
        keep_report(violation, report)
        return Exit.VIOLATION
    except Exception as error:
        code, report = failure_report(error, replay_command=again)
        print(report, flush=True)
        keep_report(error, report)
        return code
    print(f"PASSED: the recorded {recorded} no longer happens", flush=True)
    return Exit.PASSED


def run_minimise(args: argparse.Namespace) -> int:
    """Replay the file; only if it fails as recorded, minimise it and rewrite it with the minimal steps, once
    they failed as recorded on their final replay. Anything else leaves the file as it was."""
    from ckpt_model.results import regression
    from ckpt_model.search.minimise import as_state, describe, minimise_on, provenance, replay_once, signature

    document, spec, controller = load_regression(args.file)
    kept = artifacts_dir(args)
    recorded = (document["failure"]["type"], document["failure"].get("property"))
    steps = [(name, arguments) for name, arguments in document["steps"]]
    print(f"minimising {args.file} (recorded: {recorded[1] or recorded[0]})\n  {regression.describe(document)}")
    try:
        with regression_harness(spec, kept) as harness:
            first = replay_once(harness, steps, controller=controller)
            if signature(first) != recorded:
                return not_minimised(args.file, first, recorded)
            found = Rate.from_document(document.get("reproduction"))  # judges the candidates, if recorded
            print(f"fails as recorded; minimising {len(steps)} steps (each candidate replays)...", flush=True)
            result, replayer = minimise_on(harness, steps, recorded, found, controller=controller)
    except Exception as error:  # the deployment did not start, or a bug: nothing was written
        code = report_failure(error)
        print(f"not minimised; {args.file} left as it was", flush=True)
        return code
    if not result.reproduced:
        print(f"\nCOULD NOT JUDGE: {result.summary()}; {args.file} left as it was", flush=True)
        return Exit.UNJUDGED
    try:
        reproduction = result.rate.document() if result.rate is not None else None
        regression.rewrite(args.file, document, list(result.steps), provenance(result), reproduction)
    except OSError as error:
        raise UsageError(f"{args.file}: could not rewrite it ({error}); it is as it was") from None
    print("\n".join(["", as_state(controller), *result.code, "state.teardown()"]))
    print(f"\nMINIMISED ({result.summary()}); {args.file} now holds these steps", flush=True)
    print(f"the minimal run fails with {describe(replayer.last_failure)}: `ckpt-model replay {args.file}` shows it")
    stored = keep_minimised(harness, first, replayer.last_failure, args.file)
    if stored is not None:
        print(f"kept in the run store: {stored}", flush=True)
    return Exit.PASSED


def keep_minimised(harness: Any, first: BaseException | None, minimal: BaseException | None, path: Path) -> Path | None:
    """Keep the rewritten file, and the minimal run's timeline, in the run directory where the first replay's
    failure was kept (over its steps: `regression.replaces`); that directory, or None. `harness`: the closed one
    the steps ran on (the timeline names its deployment)."""
    from ckpt_model.results import regression, runstore
    from ckpt_model.results.report import draw_timeline

    kept = runstore.kept_of(first) if first is not None else None
    if kept is None or kept.run_dir is None:
        return None
    copy = kept.run_dir / kept.name
    try:
        written = regression.write_unless_better(copy, regression.load(path))
    except (OSError, ValueError) as error:
        print(f"note: the minimised file was not kept in {kept.run_dir}: {error}", flush=True)
        return None
    if written and minimal is not None:
        draw_timeline(minimal, harness, copy)
    return kept.run_dir


def keep_report(error: BaseException, report: str) -> None:
    """Keep the printed report in the run directory the failure was kept in (`ckpt_model.results.runstore`)."""
    from ckpt_model.results import runstore

    kept = runstore.kept_of(error)
    runstore.keep_report(kept.run_dir if kept is not None else None, report)


@contextlib.contextmanager
def regression_harness(spec: DeploymentSpec, kept: Path | None = None) -> Iterator[Any]:
    """A fresh embedded deployment of the file's deployment, whose failures write their regression files under
    its own root, or in the artefacts' directory `kept` (never over the file being minimised)."""
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results import runstore

    harness = Harness.embedded(spec, artifacts=kept)
    if kept is None:
        harness.regressions_dir = harness.root / "regressions"
    runstore.begin(harness)  # the first replay's failure, which the report names, outlives the run
    try:
        yield harness
    finally:
        with interrupts_held():  # an interrupt now waits for the teardown, then ends the run
            harness.close()


def not_minimised(path: Path, error: BaseException | None, recorded: tuple[str, str | None]) -> int:
    """The steps did not fail as recorded: say what they did, leave the file as it was."""
    what = recorded[1] or recorded[0]
    if error is None:
        print(f"PASSED: the recorded {what} no longer happens; {path} left as it was", flush=True)
        return Exit.PASSED
    if isinstance(error, PropertyViolation):
        print(exception_text(error, replay_command=f"ckpt-model replay {path}"), flush=True)
        print(
            f"\nFAILED with a different property than recorded ({what}): {error.property_id} {error.title}; "
            f"not minimised, {path} left as it was",
            flush=True,
        )
        return Exit.VIOLATION
    code = report_failure(error, replay_command=f"ckpt-model replay {path}")
    print(f"not minimised: the steps did not fail as recorded ({what}); {path} left as it was", flush=True)
    return code
