"""What a search of the collection machine must reach and where it judges what: its families of rules, each with the
coverage goals its rules must reach (`ckpt_model.steps.goals`), and its `Judging` (`ckpt_model.steps.checkable`).

The goals are the situations the collection properties are about: a run that finished every row, a stop that
published its checkpoint, a rerun that continues a checkpoint (the same one twice, from past a delivered call), a
rerun after the last row, a save that failed on a request and on a stop. Each is a pure predicate over one step,
reading the machine's `Prediction` before and after it (`tests/unit/checker/test_collection_coverage.py`).

The machine draws as Hypothesis does, uniformly among the rules enabled: its families group its rules in the
coverage table and the statistics and carry their goals, and no `--weights` weighs them, so a family's weight here
only orders it in the table (the runs and their calls first, as a run goes; then the cluster's faults).
"""

from __future__ import annotations

from ckpt_model.collection.prediction import Prediction
from ckpt_model.model.contract import capture_key
from ckpt_model.properties.collection import (
    EXIT_PREEMPTED,
    P22Violation,
    P23Violation,
    P24Violation,
    P25Violation,
)
from ckpt_model.properties.registry import REGISTRY
from ckpt_model.results.stats import SearchStats
from ckpt_model.steps import checkable
from ckpt_model.steps.families import Family
from ckpt_model.steps.goals import Goal, LongerRun, Step

EXIT_DONE = 0


def more_examples(stats: SearchStats) -> str:
    return f"more --examples than this run's {stats.examples}, or a longer --max-time"


# How a longer search of the collection machine is asked for (the coverage table's words on what it never reached):
# it draws as Hypothesis does, so a search bounded by time is one round, aimed at nothing, and no `--weights`.
LONGER_RUN = LongerRun(
    more_examples,
    "--examples N runs more examples, --max-time D runs examples until D (in one round: the collection machine "
    "draws as Hypothesis does, so nothing aims it), --steps N makes each example longer",
)


def new_exits(step: Step) -> tuple[int, ...]:
    """The exit codes of the runs that ended in this step."""
    before: Prediction = step.before
    after: Prediction = step.after
    return after.exits[len(before.exits) :]


def run_finished(step: Step) -> bool:
    """A run exited 0 on its own: every row is in the output (P25, and P13 on the servers after it)."""
    return EXIT_DONE in new_exits(step)


def preempted_with_checkpoint(step: Step) -> bool:
    """A SIGTERM that ended the run with exit 75: a checkpoint published for that stop (P23)."""
    return step.rule == "preempt" and EXIT_PREEMPTED in new_exits(step)


def rerun_continues(step: Step) -> bool:
    """A rerun that restores `LATEST` (P24's continued rows, P4 from their boundary)."""
    return step.rule == "start_run" and len(step.after.restores) > len(step.before.restores)


def same_checkpoint_continued_twice(step: Step) -> bool:
    """A rerun that restores a checkpoint an earlier rerun restored: its attempts go again under the same keys."""
    return rerun_continues(step) and step.after.restores[-1] in step.before.restores


def continued_past_a_call(step: Step) -> bool:
    """A rerun that continues an attempt past its first call: the boundary a checkpoint recorded is where it goes
    on (P4)."""
    after: Prediction = step.after
    starts = dict(after.starts)
    sent = [capture_key(rollout, attempt) for rollout, attempt in after.attempts]
    return rerun_continues(step) and any(starts.get(key, 0) > 0 for key in sent)


def rerun_after_the_last_row(step: Step) -> bool:
    """A rerun once every row finished: it must add no row (P25)."""
    before: Prediction = step.before
    return step.rule == "start_run" and before.runs > 0 and not before.unfinished


def failed_save_goal(stop: bool) -> Goal:
    """A save that fails part-way, on a SIGTERM's checkpoint (`stop`) or a SIGUSR1's."""
    says = "a failed save on a stop" if stop else "a failed save on a request"

    def reached(step: Step) -> bool:
        return step.rule == "failing_save" and bool(step.arguments.get("stop")) == stop

    reached.__doc__ = f"{says[0].upper()}{says[1:]}."
    name = f"failed_save_{'stopped' if stop else 'resumed'}"
    return Goal(name, says, reached, rule="failing_save", pins=(("stop", stop),))


RUNS = Family(
    "runs",
    "collection runs start, and rerun from the latest checkpoint",
    3,
    protocol=True,
    goals=(
        Goal("run_finished", "a run that finished every row (exit 0)", run_finished),
        Goal("rerun_continues", "a rerun that continues LATEST", rerun_continues, rule="start_run"),
        Goal(
            "same_checkpoint_continued_twice",
            "the same checkpoint continued twice",
            same_checkpoint_continued_twice,
            rule="start_run",
        ),
        Goal("continued_past_a_call", "a row continued past its first call", continued_past_a_call, rule="start_run"),
        Goal("rerun_after_the_last_row", "a rerun after the last row", rerun_after_the_last_row, rule="start_run"),
    ),
)
# `release` lets one held call return, as in the trainer machine.
RELEASES = Family("calls", "a held model call returns", 2, protocol=True)
REQUESTS = Family("requests", "SIGUSR1: a checkpoint, then the run goes on", 1, protocol=True)
STOPS = Family(
    "stops",
    "SIGTERM and SIGKILL of the run, as a cluster ends a job",
    3,
    goals=(Goal("preempted_with_checkpoint", "a stop with exit 75", preempted_with_checkpoint, rule="preempt"),),
)
SAVES = Family(
    "saves",
    "a checkpoint write that fails or stalls, and signals while it is written",
    2,
    goals=(failed_save_goal(stop=False), failed_save_goal(stop=True)),
)
CRASHES = Family("crashes", "every Gym server killed while the run waits on them", 1)


# The collection machine's sites: where its audits judge, whatever rule ran.
SITES: dict[str, tuple[checkable.Need, ...]] = {
    # after every rule, once the run is quiet or exited: the calls the collector made since (the relay's journal)
    # and the backend's calls
    "every step": (),
    # each run's exit, and each checkpoint the run published while it goes on
    "every exit and checkpoint": (),
    # once the teardown drained the collection to its last row
    "the teardown": (),
    "the telemetry files": (checkable.TELEMETRY,),
}
JUDGED_AT: dict[str, tuple[str, ...]] = {
    "P1": ("every step",),
    "P2": ("every step",),
    "P3": ("every step",),
    "P4": ("every step",),
    "P9": ("every step",),
    "P10": ("every step",),
    "P13": ("every exit and checkpoint",),
    "P15": ("every step",),
    "P22": ("every exit and checkpoint",),
    "P23": ("every exit and checkpoint",),
    "P24": ("every exit and checkpoint",),
    "P25": ("every exit and checkpoint", "the teardown"),
    "P26": ("the telemetry files",),
}
# The servers' properties the collector's own calls cannot show, and why (docs/collection.md).
NEVER: dict[str, str] = {
    "P5": "the collection runs do not turn on token capture",
    "P6": "it needs the model's prediction of each session's state; P25's reward on the counter task stands in",
    "P7": "the collector retires only attempts whose /run already failed",
    "P8": "the collector restores into fresh servers, which do not refuse",
    "P11": "the collection machine does not gate the judge's calls",
    "P12": "the collection runs do not turn on token capture",
    "P14": "no twin runs each task once without checkpoints under the collector; P25's reward stands in",
    "P16": "a failed commit is the collector's to handle; P22 and P23 judge what it publishes then",
    "P17": "no reply of the collector's is lost on the wire",
    "P18": "no server's clock is skewed under the collector",
    "P19": "no server is unreachable from the collector",
    "P20": "no time passes for the servers under the collector",
    "P21": "no server is frozen under the collector",
}
COLLECTION_PROPERTIES = (P22Violation, P23Violation, P24Violation, P25Violation)
TITLES = dict(
    sorted(
        [(property_id, info.title) for property_id, info in REGISTRY.items()]
        + [(violation.property_id, violation.title) for violation in COLLECTION_PROPERTIES],
        key=lambda item: int(item[0][1:]),
    )
)
JUDGING = checkable.Judging(SITES, JUDGED_AT, TITLES, NEVER)
