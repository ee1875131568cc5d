"""The machine of each controller the checker plays, as the search runner, the minimiser, regression files and
`ckpt-model check` use it: one small protocol (`ControllerMachine`) both machines satisfy, so none of them asks which
controller it runs.

- the trainer's (`TRAINER`): `ckpt_model.trainer.machine.CheckpointMachine`, the checker itself playing the
  controller; nothing of the controller is planted.
- rollout collection's (`Collection(faults)`): `ckpt_model.collection.machine.CollectionMachine`, the cluster around
  the system's collection program, with the collector's planted `faults`.

A regression file names its controller and that controller's faults (`regression.Origin`); `for_origin` gives back
the machine that replays it. The machines are imported when first used: `ckpt-model --help` needs neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ckpt_model.results.regression import COLLECTION_CONTROLLER, DEFAULT_ORIGIN, TRAINER_CONTROLLER, Origin

if TYPE_CHECKING:
    from hypothesis.stateful import RuleBasedStateMachine

    from ckpt_model.deployments.harness import Harness
    from ckpt_model.results.stats import SearchStats
    from ckpt_model.steps.checkable import Judging
    from ckpt_model.steps.draw import Focus, Weights

Steps = Sequence[tuple[str, Mapping[str, Any]]]


class ControllerMachine(Protocol):
    """What the search machinery needs of the state machine that plays one controller."""

    @property
    def origin(self) -> Origin:
        """The controller, and its program's planted faults, as a regression file records them."""
        ...

    @property
    def machine_type(self) -> type[RuleBasedStateMachine]:
        """The machine's class: its rules' declarations, families, coverage goals."""
        ...

    @property
    def judging(self) -> Judging:
        """Where it judges its properties beside its rules, and every property it reports on."""
        ...

    @property
    def settle_timeout_s(self) -> float:
        """How long a replay waits for a state its machine predicts (and the minimiser's final confirmation)."""
        ...

    @property
    def aims(self) -> bool:
        """Whether a search bounded by time alone runs in aimed rounds (`ckpt_model.search.aim`): a machine that draws
        a family first by weight can be aimed; one that draws as Hypothesis does runs its time in one round."""
        ...

    @property
    def candidates_settle_briefly(self) -> bool:
        """Whether the minimiser's candidates settle within its brief candidate timeout (the trainer's: a mismatch
        that must outlive the settle costs a full one), or within the full one (the collection machine's waits are
        for the collector's processes, which a brief one would cut short)."""
        ...

    def program_faults(self) -> frozenset[str]:
        """Every fault its controller's program can have planted (`--faults`, a file's `controller_faults`)."""
        ...

    def factory(
        self,
        harness: Harness,
        stats: SearchStats | None = None,
        *,
        swarm: bool = False,
        weights: Weights | None = None,
        focus: Focus | None = None,
    ) -> type[RuleBasedStateMachine]:
        """The factory Hypothesis runs (`run_state_machine_as_test`), bound to `harness`; with `swarm`, of swarm
        machines; `weights` and `focus` for a machine that draws a family first."""
        ...

    def fresh(self, harness: Harness, settle_timeout_s: float) -> RuleBasedStateMachine:
        """One machine on `harness`, for rule calls played outside Hypothesis."""
        ...


def replay(
    controller: ControllerMachine, harness: Harness, steps: Steps, settle_timeout_s: float | None = None
) -> None:
    """Play rule calls on a fresh machine of `controller` (each only if enabled, then its teardown); raises what the
    run raises."""
    from ckpt_model.steps.playback import play  # the stateful machinery, only when something is replayed

    timeout_s = controller.settle_timeout_s if settle_timeout_s is None else settle_timeout_s
    play(controller.fresh(harness, timeout_s), steps)


@attrs.frozen
class Trainer:
    """The trainer's machine: the checker plays the controller, so nothing of it is planted."""

    origin: Origin = DEFAULT_ORIGIN
    candidates_settle_briefly: bool = True
    aims: bool = True

    @property
    def machine_type(self) -> type[RuleBasedStateMachine]:
        from ckpt_model.trainer.machine import CheckpointMachine

        return CheckpointMachine

    @property
    def judging(self) -> Judging:
        from ckpt_model.steps.checkable import TRAINER_JUDGING

        return TRAINER_JUDGING

    @property
    def settle_timeout_s(self) -> float:
        from ckpt_model.trainer.quiescence import SETTLE_TIMEOUT_S

        return SETTLE_TIMEOUT_S

    def program_faults(self) -> frozenset[str]:
        return frozenset()

    def factory(
        self,
        harness: Harness,
        stats: SearchStats | None = None,
        *,
        swarm: bool = False,
        weights: Weights | None = None,
        focus: Focus | None = None,
    ) -> type[RuleBasedStateMachine]:
        from ckpt_model.trainer.machine import machine_for

        return machine_for(harness, stats, swarm=swarm, weights=weights, focus=focus)

    def fresh(self, harness: Harness, settle_timeout_s: float) -> RuleBasedStateMachine:
        from ckpt_model.trainer.machine import CheckpointMachine

        return CheckpointMachine(harness, settle_timeout_s=settle_timeout_s)


@attrs.frozen
class Collection:
    """Rollout collection's machine, with the collector's planted `faults`. It draws as Hypothesis does (no family
    weights, no aimed rounds: a search bounded by time runs its time in one round)."""

    faults: tuple[str, ...] = ()
    candidates_settle_briefly: bool = False
    aims: bool = False

    @property
    def origin(self) -> Origin:
        return Origin(COLLECTION_CONTROLLER, self.faults)

    @property
    def machine_type(self) -> type[RuleBasedStateMachine]:
        from ckpt_model.collection.machine import CollectionMachine

        return CollectionMachine

    @property
    def judging(self) -> Judging:
        from ckpt_model.collection.coverage import JUDGING

        return JUDGING

    @property
    def settle_timeout_s(self) -> float:
        from ckpt_model.collection.machine import SETTLE_TIMEOUT_S

        return SETTLE_TIMEOUT_S

    def program_faults(self) -> frozenset[str]:
        from ckpt_model.deployments.catalogue import collection_fault_catalogue

        return frozenset(fault.name for fault in collection_fault_catalogue())

    def factory(
        self,
        harness: Harness,
        stats: SearchStats | None = None,
        *,
        swarm: bool = False,
        weights: Weights | None = None,
        focus: Focus | None = None,
    ) -> type[RuleBasedStateMachine]:
        from ckpt_model.collection.machine import collection_machine_for

        return collection_machine_for(harness, self.faults, stats, swarm=swarm)

    def fresh(self, harness: Harness, settle_timeout_s: float) -> RuleBasedStateMachine:
        from ckpt_model.collection.machine import CollectionMachine

        return CollectionMachine(harness, self.faults, settle_timeout_s=settle_timeout_s)


TRAINER = Trainer()
# Each controller by the name a regression file and `check --controller` give it, made with its program's faults.
BY_NAME: Mapping[str, Callable[[tuple[str, ...]], ControllerMachine]] = {
    TRAINER_CONTROLLER: lambda _faults: TRAINER,
    COLLECTION_CONTROLLER: Collection,
}


class UnknownController(LookupError):
    """A regression file names a controller the checker does not play."""


def for_origin(origin: Origin) -> ControllerMachine:
    """The machine that replays a file of `origin` (with its program's faults)."""
    make = BY_NAME.get(origin.controller)
    if make is None:
        raise UnknownController(f"'controller' must be one of {', '.join(BY_NAME)} (got {origin.controller!r})")
    return make(origin.faults)
