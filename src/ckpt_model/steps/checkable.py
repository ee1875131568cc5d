"""What a deployment lets the checker check: the rules it can draw and the properties it can judge, from what the
deployment can do (`Capabilities`), each one it cannot with why.

What each rule needs and judges is declared on the rule (`steplog.action`, read by `steplog.declarations`), and
the functions here take those declarations (`Rules`):

- a rule's `needs`: what it needs to be drawn at all, from its precondition: a capability of the harness it asks
  for (`can_*` of the harness, its clocks or its faults; a gated backend; the lease grace), or one it needs through
  the model (a rule that needs a rollout needs the gate, since only `dispatch` starts one; one that needs a retire
  mark or a retired attempt needs a rollout; one that needs a pending or dead attempt needs the gate and crashes,
  since a restore that continues one needs fresh processes, which after a dispatch only a crash gives).
  `tests/unit/checker/test_checkable.py` evaluates every precondition on states the model reaches with and
  without each capability, and holds each rule's `needs` to it.
- where each property is judged: in the rules that declare it (`judges`), or by the audits and settles whatever
  rule ran (`JUDGED_AT`, at the `SITES`: every step, every commit, the teardown, or whatever the rollouts did). A
  property that no rule or site of this deployment reaches is never judged, and a run that passes says so instead
  of claiming it.

The sites, where each property is judged and every property a run reports on are a machine's `Judging`: the
trainer's machine's is `TRAINER_JUDGING`, the collection machine's its own (`ckpt_model.collection.coverage`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from ckpt_model.properties.registry import REGISTRY

if TYPE_CHECKING:
    from ckpt_model.deployments.harness import Harness
    from ckpt_model.model.spec import DeploymentSpec


class Declared(Protocol):
    """What these tables read of a rule's declaration (`steplog.Declaration`, which imports this module)."""

    @property
    def needs(self) -> tuple[Need, ...]: ...

    @property
    def judges(self) -> tuple[str, ...]: ...


# Each rule of a machine and its declaration (`steplog.declarations`).
Rules = Mapping[str, Declared]

# The longest lease grace with which the checker waits for a lease to lapse (`controller.QUIET_LEASE_GRACE_MAX_S`).
LEASE_GRACE_WAITED_MAX_S = 1.0


@attrs.frozen
class Capabilities:
    """What a deployment can do, as the machine's preconditions ask it (`Capabilities.of(harness)`), and the
    traits of what it runs."""

    gate: bool = True  # a gated backend: the checker holds every model call, so rollouts run
    crashes: bool = True  # Gym can be crashed and started afresh (`Harness.can_crash`)
    restart_one: bool = False  # one server restarted alone (`RestartsOne`)
    kill_workers: bool = False  # one worker of a multi-worker server killed alone (`KillsWorkers`)
    failpoints: bool = False  # work stopped at a named point (`Failpoints`)
    lose_unsynced: bool = False  # a power cut (`LosesUnsynced`)
    break_storage: bool = False  # writes that fail or stall (`BreaksStorage`)
    pause: bool = False  # a server frozen and let go (`Pauses`)
    lose_replies: bool = False  # a reply lost on the wire (`LosesReplies`)
    fail_hooks: bool = False  # hooks that raise (`FailsHooks`)
    skew_clocks: bool = False  # a server's wall clock moved (`SkewsClocks`)
    jump_clocks: bool = False  # time passing for every server (`JumpsClocks`)
    lease_lapses: bool = True  # a lease grace short enough to wait for a lapse
    token_capture: bool = False
    generation_cuts: bool = False
    judge: bool = False  # a topology whose verification asks a judge (slow)
    verify_wait: bool = True  # verify mode `wait`
    restart_environment: bool = False  # a topology with a restart environment (mixed)
    telemetry: bool = False  # every Gym server process exports its spans and metrics to files (`ExportsTelemetry`)

    @classmethod
    def of(cls, harness: Harness) -> Capabilities:
        spec = harness.spec
        return cls(
            gate=harness.backend is not None,
            crashes=harness.can_crash,
            restart_one=harness.can_restart_one,
            kill_workers=harness.can_kill_workers,
            failpoints=harness.faults.can_stop_inside_commit,
            lose_unsynced=harness.can_lose_unsynced,
            break_storage=harness.faults.can_break_storage,
            pause=harness.faults.can_pause,
            lose_replies=harness.faults.can_lose_replies,
            fail_hooks=harness.faults.can_fail_hooks,
            skew_clocks=harness.clocks.can_skew_clocks,
            jump_clocks=harness.clocks.can_jump_clocks,
            lease_lapses=harness.spec.lease_grace_s <= LEASE_GRACE_WAITED_MAX_S,
            token_capture=spec.token_capture,
            generation_cuts=spec.generation_cuts,
            judge=spec.traits.judge,
            verify_wait=spec.verify_mode == "wait",
            restart_environment=spec.traits.restart_environment,
            telemetry=harness.telemetry_dir is not None,
        )

    @classmethod
    def of_look_alike(cls, spec: DeploymentSpec) -> Capabilities:
        """What the embedded look-alike stack can do when it runs `spec` (with faketime installed): every nemesis,
        one worker killed alone only with several server workers, clocks skewed alone unless time jumps, and every
        server's telemetry exported."""
        return cls(
            restart_one=True,
            kill_workers=spec.server_workers > 1,
            failpoints=True,
            lose_unsynced=True,
            break_storage=True,
            pause=True,
            lose_replies=True,
            fail_hooks=True,
            skew_clocks=not spec.time_jumps,
            jump_clocks=spec.time_jumps,
            lease_lapses=spec.lease_grace_s <= LEASE_GRACE_WAITED_MAX_S,
            token_capture=spec.token_capture,
            generation_cuts=spec.generation_cuts,
            judge=spec.traits.judge,
            verify_wait=spec.verify_mode == "wait",
            restart_environment=spec.traits.restart_environment,
            telemetry=True,
        )


@attrs.frozen
class Need:
    """One thing a rule or a judgement needs: what it is in words, and whether a deployment has it."""

    name: str
    says: str
    met: Callable[[Capabilities], bool] = attrs.field(eq=False, repr=False)


GATE = Need("gate", "a gated backend to hold model calls (backend_url)", lambda c: c.gate)
CRASHES = Need("crashes", "crashes (start_command, or crash_command and restart_command)", lambda c: c.crashes)
# A restore needs processes that served nothing since they started (`Model.can_restore`): with a gated backend
# every checkpoint holds a rollout (`pipeline.MachineBase._may_checkpoint`), so after a commit only a crash gives them.
FRESH = Need(
    "fresh",
    "crashes (with a gated backend, only a crash leaves a Gym that served nothing to restore into)",
    lambda c: c.crashes or not c.gate,
)
RESTART_ONE = Need("restart_one", "one server restarted alone (restart_server)", lambda c: c.restart_one)
KILL_WORKERS = Need(
    "kill_workers",
    "one worker of a multi-worker server killed alone (kill_worker; the look-alike's --server-workers 2)",
    lambda c: c.kill_workers,
)
FAILPOINTS = Need("failpoints", "failpoints (arm_failpoint)", lambda c: c.failpoints)
LOSE_UNSYNCED = Need("lose_unsynced", "a power cut (lose_unsynced)", lambda c: c.lose_unsynced)
BREAK_STORAGE = Need("break_storage", "storage faults (break_storage)", lambda c: c.break_storage)
PAUSE = Need("pause", "servers frozen and let go (pause_server)", lambda c: c.pause)
LOSE_REPLIES = Need("lose_replies", "replies lost on the wire (lose_reply)", lambda c: c.lose_replies)
FAIL_HOOKS = Need("fail_hooks", "hooks that raise (fail_hook)", lambda c: c.fail_hooks)
SKEW_CLOCKS = Need(
    "skew_clocks",
    "a server's clock skewed (skew_clock; the look-alike needs Debian's faketime)",
    lambda c: c.skew_clocks,
)
JUMP_CLOCKS = Need(
    "jump_clocks", "time passing for every server (jump_clock; the look-alike's --time-jumps)", lambda c: c.jump_clocks
)
TELEMETRY = Need(
    "telemetry",
    "a deployment whose servers export spans and metrics to files the checker reads (telemetry_dir; the look-alike's)",
    lambda c: c.telemetry,
)
LEASE_LAPSES = Need(
    "lease_lapses", f"a lease grace of at most {LEASE_GRACE_WAITED_MAX_S:g} s (lease_grace_s)", lambda c: c.lease_lapses
)
TOKEN_CAPTURE = Need("token_capture", "token capture (capture ledgers; --token-capture)", lambda c: c.token_capture)
GENERATION_CUTS = Need("generation_cuts", "generation cuts (--generation-cuts)", lambda c: c.generation_cuts)
# `machine.LedgerWatch.cuts` is on only with the gate, token capture and generation cuts all on.
NO_CUTS = Need("no_cuts", "no generation cuts", lambda c: not (c.gate and c.token_capture and c.generation_cuts))
JUDGE = Need("judge", "a topology whose verification asks a judge (slow)", lambda c: c.judge)
VERIFY_WAIT = Need("verify_wait", "verify mode wait", lambda c: c.verify_wait)
RESTART_ENVIRONMENT = Need(
    "restart_environment", "a topology with a restart environment (mixed)", lambda c: c.restart_environment
)
ONE_PER_KIND = Need(
    "one_per_kind", "one participant per kind (not topology mixed)", lambda c: not c.restart_environment
)


# Where the audits and settles judge, whatever rule ran, and what each needs to judge anything.
SITES: Mapping[str, tuple[Need, ...]] = {
    # every settle: each participant's status against the model (P10), what every status names (P15)
    "every step": (),
    # every commit, also of an empty scope: each reply and share (P1, P15), the checkpoint verifies (P9)
    "every commit": (),
    # after the drain (P13)
    "the teardown": (),
    # the `/run` replies, the backend's calls, the history's prepared intervals, the twin's outcome, the resources
    # sessions an episode exports: all made by rollouts
    "the rollouts": (GATE,),
    "the capture ledgers": (GATE, TOKEN_CAPTURE),
    "the generation cuts": (GATE, TOKEN_CAPTURE, GENERATION_CUTS),
    "the judge calls": (GATE, JUDGE),
    # P20 judges rollouts that were parked while time passed
    "the rollouts parked while time passed": (GATE, JUMP_CLOCKS),
    # every settle and the teardown: the controller's control calls against the spans and metrics exported (P26)
    "the telemetry files": (TELEMETRY,),
}

# Where each property is judged by the audits and settles (`SITES`); the rules that judge a property say so
# themselves (`steplog.Declaration.judges`). A property judged at a site every deployment reaches names only
# that site.
JUDGED_AT: Mapping[str, tuple[str, ...]] = {
    "P1": ("every commit",),
    "P2": ("the rollouts",),
    "P3": ("the rollouts",),
    "P4": ("the rollouts",),
    "P5": ("the capture ledgers",),
    "P6": ("the rollouts",),
    "P9": ("every commit",),
    "P10": ("every step",),
    "P11": ("the judge calls",),
    "P12": ("the generation cuts",),
    "P13": ("the teardown",),
    "P14": ("the rollouts",),
    "P15": ("every step",),
    "P20": ("the rollouts parked while time passed",),
    "P26": ("the telemetry files",),
}


@attrs.frozen
class Judging:
    """Where a machine judges its properties beside its rules' own judgements: its sites and what each needs to judge
    anything, the sites that judge each property, every property a run of it reports on (by ID, with its title, in
    report order), and those it never judges, each with why."""

    sites: Mapping[str, tuple[Need, ...]]
    judged_at: Mapping[str, tuple[str, ...]]
    titles: Mapping[str, str]
    never: Mapping[str, str] = attrs.field(factory=dict)


# The trainer's machine: it reports on every property of the registry, and judges each somewhere.
TRAINER_JUDGING = Judging(SITES, JUDGED_AT, {property_id: info.title for property_id, info in REGISTRY.items()})


@attrs.frozen
class Unchecked:
    """A property no rule or site of the deployment judges, or a rule it never draws, and why."""

    name: str
    why: str

    @property
    def text(self) -> str:
        return f"{self.name}: {self.why}"


def missing(needs: Iterable[Need], capabilities: Capabilities) -> list[Need]:
    return [need for need in needs if not need.met(capabilities)]


def judged_by(rules: Rules, judging: Judging = TRAINER_JUDGING) -> dict[str, tuple[str, ...]]:
    """Where each property the machine judges is judged: at its sites (`judging.judged_at`), or in the rules that
    declare they judge it (in name order)."""
    return {
        property_id: judging.judged_at.get(property_id, ())
        + tuple(rule for rule, declared in rules.items() if property_id in declared.judges)
        for property_id in judging.titles
        if property_id not in judging.never
    }


def needs_of(judge: str, rules: Rules, judging: Judging = TRAINER_JUDGING) -> tuple[Need, ...]:
    """What a rule or a site needs to judge anything."""
    return judging.sites[judge] if judge in judging.sites else rules[judge].needs


def undrawable_rules(capabilities: Capabilities, rules: Rules) -> list[Unchecked]:
    """Every rule the machine never draws on this deployment, with what it lacks, in name order."""
    return [
        Unchecked(rule, "needs " + _joined(need.says for need in lacking))
        for rule, declared in sorted(rules.items())
        if (lacking := missing(declared.needs, capabilities))
    ]


def unchecked_properties(
    capabilities: Capabilities, rules: Rules, judging: Judging = TRAINER_JUDGING
) -> list[Unchecked]:
    """Every property no rule or site of this deployment judges, with what it lacks (or why the machine never
    judges it), in report order."""
    judged = judged_by(rules, judging)
    found: list[Unchecked] = []
    for property_id in judging.titles:
        if property_id in judging.never:
            found.append(Unchecked(property_id, judging.never[property_id]))
            continue
        lacking = {judge: missing(needs_of(judge, rules, judging), capabilities) for judge in judged[property_id]}
        if all(lacking.values()):
            found.append(Unchecked(property_id, _why(lacking, judging.sites)))
    return found


def _why(lacking: Mapping[str, Sequence[Need]], sites: Mapping[str, tuple[Need, ...]]) -> str:
    """ "judged only on the rollouts, which need a gated backend ..." or "judged only in a, b (which need ...) and
    c (which needs ...)"."""
    by_needs: dict[tuple[str, ...], list[str]] = {}
    for judge, needs in lacking.items():
        by_needs.setdefault(tuple(need.says for need in needs), []).append(judge)
    parts = []
    for says, judges in by_needs.items():
        which = "which need" if len(judges) > 1 or judges[0] in sites else "which needs"
        parts.append(f"{_joined(judges)} ({which} {_joined(says)})")
    where = "on" if all(judge in sites for judge in lacking) else "in"
    return f"judged only {where} " + _joined(parts, last=" or ")


def _joined(items: Iterable[str], last: str = " and ") -> str:
    listed = list(items)
    return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + last + listed[-1]


def ranges(property_ids: Iterable[str]) -> str:
    """`P1, P8-P10, P13` from property IDs."""
    numbers = sorted(int(property_id[1:]) for property_id in property_ids)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(f"P{run[0]}" if len(run) == 1 else f"P{run[0]}-P{run[-1]}" for run in runs) or "none"


def summary(
    capabilities: Capabilities,
    rules: Rules,
    rule_shown: Callable[[str], bool] = lambda _rule: True,
    judging: Judging = TRAINER_JUDGING,
) -> list[str]:
    """The lines a run ends with: the properties not judged here and why, the rules never drawn here (those
    `rule_shown` keeps: the coverage table marks the others n/a already), and the properties checked."""
    unchecked = unchecked_properties(capabilities, rules, judging)
    undrawable = [rule for rule in undrawable_rules(capabilities, rules) if rule_shown(rule.name)]
    lines = []
    if unchecked:
        lines.append("not checked on this deployment:")
        lines += [f"  {item.name} {judging.titles[item.name].split(':')[0]}: {item.why}" for item in unchecked]
    if undrawable:
        lines.append("rules never drawn on this deployment:")
        lines += [f"  {item.text}" for item in undrawable]
    return lines


def verdict_scope(capabilities: Capabilities, rules: Rules, judging: Judging = TRAINER_JUDGING) -> str:
    """What a pass covers: "checked: P1, P8-P10, ...; not checked: P2-P7, ... (listed above)"."""
    unchecked = {item.name for item in unchecked_properties(capabilities, rules, judging)}
    checked = [property_id for property_id in judging.titles if property_id not in unchecked]
    if not unchecked:
        return f"checked: {ranges(checked)}"
    return f"checked: {ranges(checked)}; not checked: {ranges(unchecked)} (listed above)"
