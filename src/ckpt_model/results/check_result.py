"""What one `ckpt-model check` run found, as data: the verdict, each failure with its minimal steps, the run's
settings, timings and statistics; written as JSON (`--json`) and as JUnit XML (`--junit`) for CI dashboards.

The printed report is for a person; these files are for programs (a CI job that keeps a verdict, a dashboard that
counts failures by property). Both are built from one `CheckResult`, so they never disagree. JUnit has one test
case per property the controller's machine reports on (the registry, `properties.registry.REGISTRY`, for the
trainer's; with the collection properties for rollout collection's): a violated one carries a `<failure>`, one this
deployment cannot check a `<skipped>` with why, the others pass; a run that could not judge adds one errored case.
Pure: building and rendering do no I/O beyond `write`.
"""

from __future__ import annotations

import errno
import json
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from ckpt_model.properties.registry import REGISTRY
from ckpt_model.results import verdicts
from ckpt_model.results.regression import DEFAULT_CONTROLLER
from ckpt_model.results.stats import SearchStats

Verdict = Literal["passed", "violation", "unjudged"]
VERDICT_OF_EXIT: dict[int, Verdict] = {0: "passed", 1: "violation", 2: "unjudged"}
FORMAT_VERSION = 1


@attrs.frozen
class FailureResult:
    """One failure the run reported: its kind, property (a violation's), message, rate and the steps to replay."""

    kind: str
    property_id: str | None
    title: str | None
    message: str
    rollout: str | None = None
    rate: str | None = None
    steps: tuple[str, ...] = ()
    regression_file: str | None = None
    timeline: str | None = None

    def document(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False) | {"steps": list(self.steps)}


@attrs.frozen
class Statistics:
    """What the examples did: counts, and the coverage goals and rules they reached."""

    examples: int
    examples_finished: int
    steps: int
    crashes: int
    crashes_inside_operations: int
    goals: Mapping[str, int]
    rules_drawn: Mapping[str, int]
    # Each drawn rule's seconds over its draws (its settle and audits included).
    rule_seconds: Mapping[str, float] = attrs.field(factory=dict)
    # Every applicable goal and rule no example reached, in words (`goals.unmet`).
    unmet: tuple[str, ...] = ()
    stopped_by_time: bool = False
    # The rules Hypothesis drew (at most `steps_asked` an example); `steps` counts model steps: these, the rules they
    # played inside them (a crash before a restore) and the teardowns' drain steps.
    steps_drawn: int = 0
    # The rounds of a search bounded by time (`ckpt_model.search.aim`), each as `RoundStat` holds it.
    rounds: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, stats: SearchStats, unmet: Sequence[str] = ()) -> Statistics:
        return cls(
            examples=stats.examples,
            examples_finished=len(stats.finished),
            steps=stats.steps,
            steps_drawn=stats.drawn_steps,
            crashes=sum(example.crashes for example in stats.finished),
            crashes_inside_operations=sum(example.crashes_inside for example in stats.finished),
            goals=dict(sorted(stats.goals.items())),
            rules_drawn=dict(sorted(stats.drawn.items())),
            rule_seconds={rule: round(seconds, 4) for rule, seconds in sorted(stats.rule_seconds.items())},
            unmet=tuple(unmet),
            stopped_by_time=stats.stopped_by_time,
            rounds=tuple(attrs.asdict(began) for began in stats.rounds),
        )

    def document(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False) | {
            "goals": dict(self.goals),
            "rules_drawn": dict(self.rules_drawn),
            "rule_seconds": dict(self.rule_seconds),
            "unmet": list(self.unmet),
            "rounds": [dict(began) for began in self.rounds],
        }


def registry_titles() -> dict[str, str]:
    """Every property of the registry by ID, with its title: what the trainer's machine reports on."""
    return {property_id: info.title for property_id, info in REGISTRY.items()}


@attrs.frozen
class CheckResult:
    """A whole run. `timings` holds seconds: `total`, `search`, `first_failure` (from the start, or None) and
    `measuring` (replays and minimising). `skipped` maps a property this deployment cannot check to why;
    `properties` is every property the controller's machine reports on, by ID, with its title; `coverage`, the
    coverage table: each goal and rule, its counts, and whether it was reached (NEVER: applicable, never reached);
    `transitions`, the transition coverage (None for a machine not on the contract model)."""

    verdict: Verdict
    exit_code: int
    system: str
    deployment: str
    seed: int | None
    profile: str
    examples_asked: int
    steps_asked: int
    failures: tuple[FailureResult, ...]
    timings: Mapping[str, float | None]
    statistics: Statistics
    skipped: Mapping[str, str] = attrs.field(factory=dict)
    version: str = ""
    controller: str = DEFAULT_CONTROLLER
    properties: Mapping[str, str] = attrs.field(factory=registry_titles)
    # The coverage table as data (`ckpt_model.steps.goals.document`); None when no deployment started.
    coverage: Mapping[str, Any] | None = None
    # The share of the model's explored transitions the run took (`ckpt_model.search.transition_coverage`).
    transitions: Mapping[str, Any] | None = None
    # The run store's directory of this run (`ckpt_model.results.runstore`), when it kept a failure.
    run_dir: str | None = None

    def document(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "ckpt_model_version": self.version,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "properties_violated": sorted({f.property_id for f in self.failures if f.property_id}),
            "controller": self.controller,
            "system": self.system,
            "deployment": self.deployment,
            "seed": self.seed,
            "profile": self.profile,
            "examples_asked": self.examples_asked,
            "steps_asked": self.steps_asked,
            "failures": [failure.document() for failure in self.failures],
            "run_dir": self.run_dir,
            "timings_s": {name: _rounded(value) for name, value in self.timings.items()},
            "statistics": self.statistics.document(),
            "properties_skipped": dict(self.skipped),
            "coverage": self.coverage,
            "transitions": self.transitions,
        }

    def json_text(self) -> str:
        return json.dumps(self.document(), indent=2) + "\n"

    def junit_text(self) -> str:
        """JUnit XML: a `testsuite` of one case per property, plus one errored case when the run could not judge."""
        violated = {f.property_id: f for f in self.failures if f.kind == "violation" and f.property_id}
        unjudged = [f for f in self.failures if f.kind != "violation"]
        suite = ElementTree.Element(
            "testsuite",
            name=f"ckpt-model check ({self.deployment})",
            tests=str(len(self.properties) + (1 if unjudged else 0)),
            failures=str(len(violated)),
            errors=str(1 if unjudged else 0),
            skipped=str(sum(1 for pid in self.properties if pid in self.skipped and pid not in violated)),
            time=f"{self.timings.get('total') or 0.0:.1f}",
        )
        properties = ElementTree.SubElement(suite, "properties")
        for name, value in (
            ("controller", self.controller),
            ("system", self.system),
            ("deployment", self.deployment),
            ("seed", "none" if self.seed is None else str(self.seed)),
            ("profile", self.profile),
            ("examples", str(self.statistics.examples)),
        ):
            ElementTree.SubElement(properties, "property", name=name, value=value)
        for property_id, title in self.properties.items():
            case = ElementTree.SubElement(
                suite, "testcase", classname=f"ckpt-model.{self.deployment}", name=f"{property_id} {title}"
            )
            if property_id in violated:
                failure = violated[property_id]
                element = ElementTree.SubElement(
                    case, "failure", message=f"{failure.rate or property_id}: {_first_line(failure.message)}"
                )
                element.text = _failure_text(failure)
            elif property_id in self.skipped:
                ElementTree.SubElement(case, "skipped", message=self.skipped[property_id])
        if unjudged:
            case = ElementTree.SubElement(
                suite, "testcase", classname=f"ckpt-model.{self.deployment}", name="the checker could judge the run"
            )
            element = ElementTree.SubElement(case, "error", message=_first_line(unjudged[0].message))
            element.text = "\n\n".join(_failure_text(failure) for failure in unjudged)
        ElementTree.indent(suite)
        return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _failure_text(failure: FailureResult) -> str:
    lines = [failure.message]
    if failure.steps:
        lines += ["", "Steps:", *failure.steps]
    if failure.regression_file:
        lines += ["", f"Replay: ckpt-model replay {failure.regression_file}"]
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def check_writable(path: Path) -> None:
    """Raise the `OSError` that `write(path, ...)` would meet, before a run starts rather than at its end: the
    directory made as `write` makes it, a file created and removed beside the path, and the path no directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    probe = path.with_name(f".{path.name}.partial")
    with probe.open("w"):
        pass
    probe.unlink()


def write(path: Path, text: str) -> None:
    """Write the file whole (a temporary beside it, then a rename), so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)


def failure_results(
    leaves: Sequence[BaseException], files: Callable[[BaseException], tuple[str | None, str | None]]
) -> tuple[FailureResult, ...]:
    """A `FailureResult` for each failure a run raised (`verdicts.leaves`), violations first; `files(error)` names
    each one's regression file and timeline (each None if there is none)."""
    results = [
        FailureResult(
            kind=verdicts.kind_of(error),
            property_id=getattr(error, "property_id", None),
            title=getattr(error, "title", None),
            message=str(error) or type(error).__name__,
            rollout=getattr(error, "rollout", None),
            rate=verdicts.headline(error),
            steps=verdicts.shrunk_steps(error),
            regression_file=regression_file,
            timeline=timeline,
        )
        for error in leaves
        for regression_file, timeline in [files(error)]
    ]
    return tuple(sorted(results, key=lambda result: result.kind != "violation"))
