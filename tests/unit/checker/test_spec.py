"""The deployment spec: its encodings round-trip, its key is the one Hypothesis has always keyed on, the one rule
for the deployment planted faults need, and errors that say what is wrong."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from ckpt_model.deployments.catalogue import PlantedFault, fault_catalogue
from ckpt_model.deployments.harness import Harness
from ckpt_model.model.spec import FAULT_FREE, OPTIONS, DeploymentSpec, SpecError, main, option_words, options_of_words
from ckpt_model.results import regression
from ckpt_model.trainer.machine import machine_for

# --- the key: what main's `machine.deployment_key` computed, written out literally ------------------------------


def main_option_words(options: Mapping[str, Any]) -> list[str]:
    """`regression.option_words` as it was before the spec (the words of the key, after the faults)."""
    words = [word for word, name in (("capture", "token_capture"), ("cuts", "generation_cuts")) if options.get(name)]
    if options.get("policy_workers", 1) != 1:
        words.append(f"workers{options['policy_workers']}")
    if options.get("server_workers", 1) != 1:
        words.append(f"servers{options['server_workers']}")  # an option added after the spec, in declaration order
    if options.get("time_jumps"):
        words.append("jumps")  # an option added after the spec: its word follows the older ones
    return words


def main_key(topology: str, verify_mode: str, faults: Sequence[str], options: Mapping[str, Any]) -> str:
    """`machine.deployment_key(harness)` before the spec, from what the harness was started with."""
    return "/".join((topology, verify_mode, ",".join(sorted(faults)), *main_option_words(options)))


# The fault-free deployments as tests/stateful started them before the spec, with the key each was keyed on.
STATEFUL_BEFORE = [
    (("native", "wait", {}), "native/wait/"),
    (("legacy", "wait", {}), "legacy/wait/"),
    (("counter", "wait", {}), "counter/wait/"),
    (("slow", "wait", {}), "slow/wait/"),
    (("slow", "replay", {}), "slow/replay/"),
    (("mixed", "wait", {}), "mixed/wait/"),
    (("counter", "wait", {"token_capture": True}), "counter/wait//capture"),
    (
        ("native", "wait", {"token_capture": True, "generation_cuts": True, "policy_workers": 2}),
        "native/wait//capture/cuts/workers2",
    ),
]
# The fault-free deployments added since, each with its key (appended: the keys above never change).
STATEFUL_SINCE = [
    (("slow", "replay", {"time_jumps": True}), "slow/replay//jumps"),
    (
        ("native", "wait", {"token_capture": True, "generation_cuts": True, "policy_workers": 2, "server_workers": 2}),
        "native/wait//capture/cuts/workers2/servers2",
    ),
]


def fault_deployments() -> list[DeploymentSpec]:
    return [DeploymentSpec.for_faults([fault]) for fault in fault_catalogue()]


def every_deployment() -> list[DeploymentSpec]:
    return [*FAULT_FREE, *fault_deployments()]


def harness_of(spec: DeploymentSpec) -> Harness:
    """A harness that only knows its spec (nothing started): what `machine_for` reads to key the database."""
    harness = Harness.__new__(Harness)
    harness.spec = spec
    return harness


def test_the_fault_free_matrix_is_the_one_the_stateful_suite_ran_with_the_same_keys() -> None:
    matrix = STATEFUL_BEFORE + STATEFUL_SINCE
    expected = [DeploymentSpec(topology, mode, **options) for (topology, mode, options), _ in matrix]
    assert list(FAULT_FREE) == expected
    for spec, ((topology, mode, options), key) in zip(FAULT_FREE, matrix, strict=True):
        assert spec.key == key == main_key(topology, mode, (), options)


@pytest.mark.parametrize("fault", fault_catalogue(), ids=lambda fault: fault.name)
def test_a_fault_deployment_keeps_the_key_its_search_had(fault: PlantedFault) -> None:
    """`faultsearch.harness_for` started the fault's own topology, verify mode and options before the spec."""
    options = {
        "token_capture": fault.token_capture,
        "generation_cuts": fault.generation_cuts,
        "policy_workers": fault.policy_workers,
        "server_workers": fault.server_workers,
        "time_jumps": fault.time_jumps,
    }
    spec = DeploymentSpec.for_faults([fault])
    assert spec.key == main_key(fault.topology, fault.verify_mode, (fault.name,), options)


def test_several_faults_are_keyed_sorted_whatever_order_they_are_named_in() -> None:
    spec = DeploymentSpec("native", faults=("resume_deletes_records", "agent_retire_keeps_sessions"))
    assert spec.faults == ("agent_retire_keeps_sessions", "resume_deletes_records")
    assert spec.key == main_key("native", "wait", ("resume_deletes_records", "agent_retire_keeps_sessions"), {})


@pytest.mark.parametrize("spec", every_deployment(), ids=lambda spec: spec.words)
def test_the_machine_keys_a_harness_and_a_spec_as_the_spec_says(spec: DeploymentSpec) -> None:
    assert machine_for(harness_of(spec))._hypothesis_internal_add_digest == spec.key.encode()  # type: ignore[attr-defined]


# --- words, documents, labels ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", every_deployment(), ids=lambda spec: spec.words)
def test_words_and_documents_round_trip(spec: DeploymentSpec) -> None:
    assert DeploymentSpec.from_words(spec.words) == spec
    assert DeploymentSpec.from_document(json.loads(json.dumps(spec.document()))) == spec


def test_the_words_are_the_fuzz_targets_encoding() -> None:
    assert [spec.words for spec in FAULT_FREE] == [
        "native:wait:",
        "legacy:wait:",
        "counter:wait:",
        "slow:wait:",
        "slow:replay:",
        "mixed:wait:",
        "counter:wait::capture",
        "native:wait::capture+cuts+workers2",
        "slow:replay::jumps",
        "native:wait::capture+cuts+workers2+servers2",
    ]
    assert DeploymentSpec("slow", "replay", ("b", "a")).words == "slow:replay:a,b"
    assert DeploymentSpec.from_words("native") == DeploymentSpec.from_words("native:wait:") == DeploymentSpec("native")
    # Cuts need token capture, so the word alone turns it on (as the `--generation-cuts` flag does).
    assert DeploymentSpec.from_words("native:wait::cuts") == DeploymentSpec(
        "native", token_capture=True, generation_cuts=True
    )


def test_labels_name_the_verify_mode_only_where_a_topology_runs_in_several() -> None:
    assert [spec.label for spec in FAULT_FREE] == [
        "native",
        "legacy",
        "counter",
        "slow/wait",
        "slow/replay",
        "mixed",
        "counter+capture",
        "native+capture+cuts+workers2",
        "slow/replay+jumps",
        "native+capture+cuts+workers2+servers2",
    ]
    assert DeploymentSpec("native", faults=("x", "y")).label == "native with x, y"


def test_a_regression_file_is_named_as_before() -> None:
    """`<property>-<topology>[-<verify mode of slow>]-<faults>-<option words>.json`."""
    assert DeploymentSpec("native", faults=("resume_deletes_records",)).file_words == (
        "native",
        "resume_deletes_records",
    )
    assert DeploymentSpec("slow", "replay", ("f",), token_capture=True).file_words == ("slow", "replay", "f", "capture")


def test_an_old_regression_file_replays_the_deployment_it_was_written_for(tmp_path: Path) -> None:
    """Written before the spec: only the options that differ from their defaults; older still, none at all and no
    verify mode."""
    steps = [["dispatch", {}], ["release", {"pick": 0}]]
    with_options = {
        "format": 1,
        "failure": {"type": "P5Violation", "property": "P5"},
        "topology": "counter",
        "verify_mode": "wait",
        "faults": ["workers_export_ignores_snapshots"],
        "token_capture": True,
        "policy_workers": 2,
        "steps": steps,
    }
    before_options = {"format": 1, "failure": {"type": "P9Violation"}, "topology": "slow", "faults": [], "steps": steps}
    for name, document in (("new.json", with_options), ("old.json", before_options)):
        (tmp_path / name).write_text(json.dumps(document))
    assert DeploymentSpec.from_document(regression.load(tmp_path / "new.json")) == DeploymentSpec(
        "counter", "wait", ("workers_export_ignores_snapshots",), token_capture=True, policy_workers=2
    )
    assert DeploymentSpec.from_document(regression.load(tmp_path / "old.json")) == DeploymentSpec("slow", "wait")


def test_a_document_holds_only_what_differs_from_the_defaults() -> None:
    assert DeploymentSpec("counter", token_capture=True).document() == {
        "topology": "counter",
        "verify_mode": "wait",
        "faults": [],
        "token_capture": True,
    }
    assert DeploymentSpec("native", lease_grace_s=2).document()["lease_grace_s"] == 2.0


def test_the_system_gets_only_the_options_that_differ_from_their_defaults() -> None:
    assert DeploymentSpec("native", faults=("f",)).system_keywords() == {
        "faults": ("f",),
        "verify_mode": "wait",
        "lease_grace_s": 0.25,
    }
    assert DeploymentSpec("native", policy_workers=2).system_keywords()["policy_workers"] == 2


def test_option_words_round_trip_and_follow_the_declarations() -> None:
    assert [option.name for option in OPTIONS] == [
        "token_capture",
        "generation_cuts",
        "policy_workers",
        "server_workers",
        "time_jumps",
    ]
    options = {"token_capture": True, "generation_cuts": True, "policy_workers": 3}
    assert option_words(options) == ("capture", "cuts", "workers3")
    assert options_of_words(option_words(options)) == options
    assert option_words({}) == ()


def test_the_matrix_prints_one_deployment_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fault-free"]) == 0
    assert capsys.readouterr().out.splitlines() == [spec.words for spec in FAULT_FREE]


# --- the one rule: which deployment planted faults need ---------------------------------------------------------


@attrs.frozen
class NeedingFault:
    name: str
    topology: str = "native"
    verify_mode: str = "wait"
    token_capture: bool = False
    generation_cuts: bool = False
    policy_workers: int = 1
    server_workers: int = 1
    time_jumps: bool = False


def test_without_faults_the_deployment_is_native_with_what_was_asked() -> None:
    assert DeploymentSpec.for_faults([]) == DeploymentSpec("native")
    assert DeploymentSpec.for_faults([], topology="slow", verify_mode="replay") == DeploymentSpec("slow", "replay")
    assert DeploymentSpec.for_faults([], options={"generation_cuts": True}) == DeploymentSpec(
        "native", token_capture=True, generation_cuts=True
    )


def test_faults_get_the_deployment_they_show_in_with_every_option_any_needs() -> None:
    slow = NeedingFault("a", "slow", "replay")
    assert DeploymentSpec.for_faults([slow]) == DeploymentSpec("slow", "replay", ("a",))
    cut = NeedingFault("c", token_capture=True, generation_cuts=True)
    workers = NeedingFault("w", "counter", token_capture=True, policy_workers=2)
    # Two deployments: native, wait, with the options of both.
    assert DeploymentSpec.for_faults([cut, workers]) == DeploymentSpec(
        "native", faults=("c", "w"), token_capture=True, generation_cuts=True, policy_workers=2
    )
    # Options asked for come on top: at least as many workers as asked, or as a fault needs.
    assert DeploymentSpec.for_faults([workers], options={"policy_workers": 3}).policy_workers == 3
    assert DeploymentSpec.for_faults([workers], options={"policy_workers": 1}).policy_workers == 2


def test_a_topology_asked_for_replaces_the_faults_and_keeps_their_verify_mode_only_if_it_is_theirs() -> None:
    slow = NeedingFault("a", "slow", "replay")
    assert DeploymentSpec.for_faults([slow], topology="slow") == DeploymentSpec("slow", "replay", ("a",))
    assert DeploymentSpec.for_faults([slow], topology="native") == DeploymentSpec("native", "wait", ("a",))
    assert DeploymentSpec.for_faults([slow], verify_mode="wait").verify_mode == "wait"


def test_every_catalogued_fault_runs_in_its_own_deployment() -> None:
    for fault in fault_catalogue():
        spec = DeploymentSpec.for_faults([fault])
        assert (spec.topology, spec.verify_mode, spec.faults) == (fault.topology, fault.verify_mode, (fault.name,))
        assert spec.token_capture == (fault.token_capture or fault.generation_cuts)
        assert (spec.generation_cuts, spec.policy_workers) == (fault.generation_cuts, fault.policy_workers)


def test_a_deployment_that_cannot_exist_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"'verify_mode' must be one of \['wait'\] in topology native \(got 'replay'\)"):
        DeploymentSpec.for_faults([], verify_mode="replay")


# --- errors that say what is wrong -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ("", "deployment words must be topology[:verify_mode[:fault,...[:option+...]]] (got '')"),
        ("native:wait:::", "deployment words must be"),
        ("kubernetes", "'topology' must be one of ['native', 'legacy', 'counter', 'slow', 'mixed'] (got 'kubernetes')"),
        ("native:replay", "'verify_mode' must be one of ['wait'] in topology native (got 'replay')"),
        ("native:wait::turbo", "unknown deployment option 'turbo': use capture, cuts, workersN"),
        ("native:wait::workers0", "unknown deployment option 'workers0'"),
    ],
)
def test_bad_words_say_what_is_wrong(words: str, message: str) -> None:
    with pytest.raises(SpecError) as error:
        DeploymentSpec.from_words(words)
    assert message in str(error.value)


def test_a_bad_document_lists_every_problem_at_once() -> None:
    document = {"topology": "gym", "faults": "a,b", "token_capture": "yes", "policy_workers": True}
    with pytest.raises(SpecError) as error:
        DeploymentSpec.from_document(document)
    assert error.value.problems == (
        "'topology' must be one of ['native', 'legacy', 'counter', 'slow', 'mixed'] (got 'gym')",
        "'faults' must be a list of fault names (got 'a,b')",
        "'token_capture' must be true or false (got 'yes')",
        "'policy_workers' must be an integer >= 1 (got True)",
    )


def test_the_spec_refuses_what_cannot_exist() -> None:
    with pytest.raises(ValueError, match="'generation_cuts' needs 'token_capture' on"):
        DeploymentSpec("native", generation_cuts=True)
    with pytest.raises(ValueError, match="'lease_grace_s' must be a finite number of seconds >= 0"):
        DeploymentSpec("native", lease_grace_s=-1)
    with pytest.raises(TypeError, match="not one string"):
        DeploymentSpec("native", faults="resume_deletes_records")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'policy_workers' must be >= 1"):
        DeploymentSpec("native", policy_workers=0)
