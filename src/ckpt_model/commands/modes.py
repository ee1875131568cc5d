"""The commands beside the search: `stack` (the look-alike stack on its own), `scale` (and real-model mode), `faults`
(the catalogue) and `audit` (checkpoint directories and telemetry judged offline)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ckpt_model.commands.check import outputs_writable, write_output
from ckpt_model.errors import CoordinationError, PropertyViolation, UsageError
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.results.verdicts import Exit

if TYPE_CHECKING:  # the stateful module is imported only when a check runs
    pass


def run_stack(argv: list[str]) -> int:
    from ckpt_model.deployments.seam import system

    try:
        return system().launch(argv, prog="ckpt-model stack")
    except SystemExit as stop:  # the stack's own argparse: --help exits 0, a usage error 2, which is our 3
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        return Exit.USAGE if code == 2 else code


def run_scale(args: argparse.Namespace) -> int:
    """Scale mode: the stage table, then the verdict (exit 0, 1 on a violated property, 2 if not judged)."""
    from ckpt_model.modes.scale import FINISHED_SHARE
    from ckpt_model.modes.scale import run_scale as scale_run

    if args.model_url is not None:
        return run_real_model(args)
    if args.model_name is not None:
        raise UsageError("'--model-name' needs '--model-url' (the gated fake backend serves one model)")
    finished_share = FINISHED_SHARE if args.finished_share is None else args.finished_share
    if not 0.0 <= finished_share < 1.0:
        raise UsageError(f"'--finished-share' must be in [0, 1) (got {finished_share})")
    return _stage_table_run(
        lambda: scale_run(args.rollouts or 2000, finished_share=finished_share, progress=print),
        lambda result: "PASSED: every verdict holds",
    )


def _stage_table_run(run: Callable[[], Any], passed: Callable[[Any], str]) -> int:
    """A scale-style run: its table and the line `passed` makes of its result (exit 0), or the violated property
    (1), or why it could not be judged (2)."""
    from ckpt_model.errors import HarnessError

    try:
        result = run()
    except PropertyViolation as violation:
        print(f"{type(violation).__name__}: {violation}\nFAILED: property violation ({violation.property_id})")
        return Exit.VIOLATION
    except (HarnessError, CoordinationError) as error:
        print(f"{type(error).__name__}: {error}\nCOULD NOT JUDGE: harness")
        return Exit.UNJUDGED
    print(result.table())
    print(passed(result))
    return Exit.PASSED


def run_real_model(args: argparse.Namespace) -> int:
    """Scale mode with a real model: the seed's real-model test, its table, what was and was not checked."""
    from ckpt_model.modes.real_model import model_base_url, model_name_from_env
    from ckpt_model.modes.real_model import run_real_model as real_run

    if args.finished_share is not None:
        raise UsageError("'--finished-share' does not apply with '--model-url': a real model finishes what it finishes")
    try:
        model_base_url(args.model_url)
    except ValueError as error:
        raise UsageError(str(error).replace("'CKPT_MODEL_MODEL_URL'", "'--model-url'")) from error
    return _stage_table_run(
        lambda: real_run(
            args.model_url,
            model_name=args.model_name or model_name_from_env(),
            rollouts=args.rollouts or 16,
            progress=print,
        ),
        lambda result: (
            f"PASSED: every verdict holds ({len(result.not_checked)} checks not made with a real model, listed above)"
        ),
    )


def run_faults() -> int:
    from ckpt_model.deployments.catalogue import collection_fault_catalogue, fault_catalogue

    rows = [
        (
            fault.name,
            attrs.evolve(DeploymentSpec.for_faults([fault]), faults=()).label,
            "/".join(fault.shows_as),
            f"{fault.server}: {fault.description}",
        )
        for fault in fault_catalogue()
    ]
    header = ("fault", "deployment", "property", "server: description")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[3])
    collector = [(fault.name, fault.caught_by, fault.description) for fault in collection_fault_catalogue()]
    if collector:
        print("\nthe collector's (check --controller collection --faults ...):")
        titles = ("fault", "property", "description")
        widths = [max(len(row[column]) for row in [titles, *collector]) for column in range(2)]
        for line in [titles, *collector]:
            print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[2])
    return Exit.PASSED


def run_audit(args: argparse.Namespace) -> int:
    """Every finding, then the verdict; a ROOT with no checkpoint is a usage error."""
    from ckpt_model.modes.audit import NothingToAudit, audit
    from ckpt_model.modes.audit_telemetry import NoTelemetry

    outputs_writable({"--json": args.json})
    try:
        result = audit(args.root, args.episode_owner, args.telemetry)
    except (NothingToAudit, NoTelemetry) as error:
        raise UsageError(str(error)) from None
    print(result.report())
    if args.json is not None:
        write_output(args.json, result.json_text())
    return Exit.PASSED if result.passed else Exit.VIOLATION
