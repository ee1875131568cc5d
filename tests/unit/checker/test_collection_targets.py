"""What `ckpt-model check --controller collection` checks, read from its options (`ckpt_model.search.targets`): the
collection machine with the collector's faults, every output option `check` has, and a usage error, before anything
starts, for what only the trainer's machine takes (no processes)."""

from __future__ import annotations

import pytest

from ckpt_model.cli import build_parser
from ckpt_model.deployments.catalogue import collection_fault_catalogue
from ckpt_model.errors import UsageError
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.search.controllers import TRAINER, Collection
from ckpt_model.search.targets import TARGETS, Target


def target(*arguments: str) -> Target:
    args = build_parser().parse_args(["check", *arguments])
    return TARGETS[args.controller](args)


def test_the_collection_controller_takes_check_s_outputs_swarm_and_the_collector_s_faults() -> None:
    fault = collection_fault_catalogue()[0].name
    outputs = ["--json", "r.json", "--junit", "r.xml", "--keep-artifacts", "kept", "--swarm", "--no-minimise"]

    chosen = target("--controller", "collection", "--topology", "legacy", "--faults", fault, *outputs)

    assert chosen.controller == Collection((fault,))
    assert chosen.controller.origin.document() == {"controller": "collection", "controller_faults": [fault]}
    assert chosen.spec == DeploymentSpec("legacy")  # the collector's faults are not the servers'
    assert [planted.name for planted in chosen.faults] == [fault]


def test_the_trainer_stays_the_default_with_its_faults_planted_in_the_servers() -> None:
    chosen = target("--faults", "resume_deletes_records")

    assert chosen.controller is TRAINER
    assert chosen.spec.faults == ("resume_deletes_records",)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--faults", "no_such_fault"], "unknown collector fault(s) 'no_such_fault'; the collector's: "),
        (["--faults", "resume_deletes_records"], "unknown collector fault(s) 'resume_deletes_records'"),
        (["--weights", "calls=2"], "does not take --weights (the collection machine draws as"),
        (["--verify-mode", "replay", "--token-capture"], "does not take --verify-mode, --token-capture"),
    ],
    ids=["unknown-fault", "server-fault", "draw-options", "deployment-options"],
)
def test_what_only_the_trainer_s_machine_takes_is_a_usage_error(arguments: list[str], message: str) -> None:
    with pytest.raises(UsageError) as refused:
        target("--controller", "collection", *arguments)
    assert message in str(refused.value)


def test_the_collection_controller_takes_a_time_limit_and_runs_it_in_one_round() -> None:
    chosen = target("--controller", "collection", "--max-time", "1m")

    assert chosen.controller == Collection(())
    assert not chosen.controller.aims  # it draws as Hypothesis does: nothing to aim a later round with
    assert TRAINER.aims
