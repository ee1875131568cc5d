"""What `ckpt-model check` checks, from its options: the machine of the controller it plays (`--controller`), the
deployment (the embedded stack in the topology and options asked for, or a real Gym's, `--deployment`), and the
planted faults `--faults` names: in the servers for the trainer's machine, in the collector for rollout
collection's. Each controller reads the options it takes and refuses, as a usage error before anything starts, those
it cannot take (`TARGETS`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ckpt_model.errors import UsageError
from ckpt_model.model.spec import OPTIONS, DeploymentSpec, OptionValue, SpecError
from ckpt_model.results.regression import COLLECTION_CONTROLLER, TRAINER_CONTROLLER
from ckpt_model.search.controllers import TRAINER, Collection, ControllerMachine

if TYPE_CHECKING:
    from ckpt_model.deployments.catalogue import CollectorFault, PlantedFault

    NamedFault = PlantedFault | CollectorFault


def planted_faults(text: str) -> tuple[PlantedFault, ...]:
    """The servers' planted faults a comma-separated list names; a usage error naming every known one."""
    from ckpt_model.deployments.catalogue import UnknownFaults, faults_named

    try:
        return faults_named(text)
    except UnknownFaults as error:
        raise UsageError(
            f"unknown fault(s) {', '.join(map(repr, error.unknown))}; known faults:\n"
            + "\n".join(f"  {name}" for name in error.known)
            + "\n(`ckpt-model faults` describes them)"
        ) from None


def asked_options(args: argparse.Namespace) -> dict[str, OptionValue]:
    """The option flags given (a count left out is None: the faults' and the default's)."""
    return {option.name: value for option in OPTIONS if (value := vars(args)[option.name]) is not None}


def chosen_spec(args: argparse.Namespace, planted: Sequence[PlantedFault]) -> DeploymentSpec:
    """The deployment to check: `DeploymentSpec.for_faults` with what the options ask for."""
    try:
        return DeploymentSpec.for_faults(
            planted, topology=args.topology, verify_mode=args.verify_mode, options=asked_options(args)
        )
    except SpecError as error:
        raise UsageError(str(error)) from None


def elsewhere(spec: DeploymentSpec, faults: Sequence[PlantedFault]) -> list[str]:
    """The banner's notes on planted faults that show in another deployment than the one checked."""
    return [
        f"{fault.name} shows in topology {fault.topology} (verify mode {fault.verify_mode}); "
        f"on {spec.topology}/{spec.verify_mode} it may never show"
        for fault in faults
        if (fault.topology, fault.verify_mode) != (spec.topology, spec.verify_mode)
    ]


@attrs.frozen
class Target:
    """What `check` checks: the controller's machine, the deployment (a real Gym's `gym`, or the embedded stack's),
    the planted faults the banner names (the servers', or the controller's own program's) and its notes on them."""

    controller: ControllerMachine
    spec: DeploymentSpec
    faults: tuple[NamedFault, ...] = ()
    notes: tuple[str, ...] = ()
    gym: Any = None


def trainer_target(args: argparse.Namespace) -> Target:
    """The trainer's machine on the deployment the options ask for: `--faults` planted in its servers, or a real Gym
    (`--deployment`); the families' weights in the draw (`--weights`)."""
    from ckpt_model.steps import draw
    from ckpt_model.steps.steplog import families_of

    gym = None
    faults = planted_faults(args.faults)
    if args.deployment is not None:
        from ckpt_model.deployments.gym import described

        if faults:
            raise UsageError("--faults plants faults in the embedded stack; a real Gym deployment has none")
        try:
            gym, spec = described(args.deployment)
        except ValueError as error:
            raise UsageError(f"--deployment: {error}") from None
        args.system = gym.label  # the banner's system line
        if gym.examples_max is not None:  # a Gym nothing may restart serves one example (docs/real-gym.md)
            args.examples = min(args.examples or gym.examples_max, gym.examples_max)
    else:
        spec = chosen_spec(args, faults)
    machine = TRAINER.machine_type
    try:
        weights = draw.parse_weights(args.weights or "", families_of(machine).values())
    except ValueError as error:
        raise UsageError(f"--weights: {error}") from None
    args.family_weights = draw.weights_of(machine, weights)
    return Target(TRAINER, spec, faults, tuple(elsewhere(spec, faults)), gym)


# Options of `check` that the collection machine cannot take, and why where it is not plain.
NOT_FOR_COLLECTION = {
    "deployment": "--deployment (a real Gym's deployment file cannot name a collection program yet)",
    "verify_mode": "--verify-mode",
    "weights": "--weights (the collection machine draws as Hypothesis does)",
}


def collection_target(args: argparse.Namespace) -> Target:
    """Rollout collection's machine on the embedded stack's topology, `--faults` planted in its collector; a usage
    error names every option it cannot take."""
    from ckpt_model.deployments.catalogue import UnknownFaults, collection_fault_catalogue, named_in

    asked = [flag for field, flag in NOT_FOR_COLLECTION.items() if getattr(args, field, None) not in (None, False)]
    asked += [option.flag() for option in OPTIONS if getattr(args, option.name, None) not in (None, False)]
    if asked:
        raise UsageError(f"--controller collection does not take {', '.join(asked)}")
    try:
        faults = named_in(args.faults, collection_fault_catalogue())
    except UnknownFaults as error:
        raise UsageError(
            f"--faults: unknown collector fault(s) {', '.join(map(repr, error.unknown))}; the collector's: "
            + ", ".join(error.known)
        ) from None
    args.system = "embedded look-alike stack: its rollout collection program and servers (docs/collection.md)"
    controller = Collection(tuple(fault.name for fault in faults))
    return Target(controller, chosen_spec(args, ()), faults)


# How `check --controller` reads its options into what it checks.
TARGETS: dict[str, Callable[[argparse.Namespace], Target]] = {
    TRAINER_CONTROLLER: trainer_target,
    COLLECTION_CONTROLLER: collection_target,
}
