"""A deployment as one frozen value, the one rule for the deployment planted faults need, and the one matrix of
fault-free deployments.

`DeploymentSpec` holds everything that makes one deployment behave differently from another: the topology, its
verify mode, the planted faults, the options (token capture, generation cuts, policy model workers, time jumps)
and the lease grace. It names, keys, labels and starts a deployment, in these encodings:

    words        counter:wait::capture     a fuzz target (`CKPT_MODEL_FUZZ_TARGETS`); `from_words` reads it back
    key          counter/wait//capture     what Hypothesis keys its example database and derandomized draws on
    label        counter+capture           reports, banners, benchmarks and test ids (`slow/replay`: the verify
                                           mode only for a topology that runs in several)
    document()   {"topology": ...}         a regression file's deployment; `from_document` reads it back
    file_words   counter-capture           a regression file's name

The key must never change for an existing deployment: Hypothesis would lose the examples it saved for it, and a
derandomized run would draw other examples.

An option is a field of `DeploymentSpec` whose metadata is `option(word, help)`. Its words, the key, the label,
regression files, the flags of `ckpt-model check` and of the pytest plugin (`OPTIONS`), and the keywords
`Harness.embedded` hands the system under test all follow from that one declaration.

`python -m ckpt_model.model.spec --fault-free` prints `FAULT_FREE`, one deployment's words a line (the nightly reads
it).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import attrs

from ckpt_model.model.topologies import TOPOLOGIES, Topology

# The participants' lease grace: short, so the machine can let a lease lapse in well under a second (its rule
# `quiet_controller`); every other control call sets a deadline far enough ahead that no lease lapses by itself.
LEASE_GRACE_S = 0.25
DEFAULT_TOPOLOGY = "native"
DEFAULT_VERIFY_MODE = "wait"
OPTION = "ckpt_model.option"
# An option's value: on or off, or a count (bool before int: a bool is an int too).
OptionValue = bool | int


class SpecError(ValueError):
    """A deployment that cannot be read, or cannot exist; `problems` lists everything wrong with it at once."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def option(word: str, help: str, needs: str | None = None) -> dict[str, Any]:
    """The metadata that makes a field of `DeploymentSpec` a deployment option: its word in words, keys and file
    names (a count appends its value: `workers2`), its command-line help, and the option it turns on."""
    return {OPTION: (word, help, needs)}


def fault_names(names: Iterable[str]) -> tuple[str, ...]:
    """Planted faults as a spec holds them: each once, sorted (the key sorts them; so does every other name)."""
    if isinstance(names, str):
        raise TypeError(f"'faults' must be a sequence of fault names, not one string (got {names!r})")
    return tuple(sorted(dict.fromkeys(names)))


def _known_topology(_spec: object, _attribute: object, name: str) -> None:
    if name not in TOPOLOGIES:
        raise ValueError(f"'topology' must be one of {list(TOPOLOGIES)} (got {name!r})")


def _seconds(_spec: object, _attribute: object, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"'lease_grace_s' must be a finite number of seconds >= 0 (got {value!r})")


BOOL = attrs.validators.instance_of(bool)


@attrs.frozen
class DeploymentSpec:
    """One deployment: topology, verify mode, planted faults, options and lease grace (see the module)."""

    topology: str = attrs.field(validator=_known_topology)
    verify_mode: str = attrs.field(default=DEFAULT_VERIFY_MODE)
    faults: tuple[str, ...] = attrs.field(default=(), converter=fault_names)
    token_capture: bool = attrs.field(
        default=False,
        kw_only=True,
        validator=BOOL,
        metadata=option("capture", "the policy model keeps capture ledgers (P5 token lineage)"),
    )
    generation_cuts: bool = attrs.field(
        default=False,
        kw_only=True,
        validator=BOOL,
        metadata=option(
            "cuts", "cut in-flight generations at every prepare (P12); implies token capture", needs="token_capture"
        ),
    )
    policy_workers: int = attrs.field(
        default=1,
        kw_only=True,
        validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)],
        metadata=option("workers", "worker processes of the policy model behind its one port"),
    )
    server_workers: int = attrs.field(
        default=1,
        kw_only=True,
        validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)],
        metadata=option("servers", "worker processes of each environment, agent and resources server behind its port"),
    )
    time_jumps: bool = attrs.field(
        default=False,
        kw_only=True,
        validator=BOOL,
        metadata=option(
            "jumps", "time can pass for every server at once, its monotonic clock too (P20); no clock skews then"
        ),
    )
    lease_grace_s: float = attrs.field(default=LEASE_GRACE_S, kw_only=True, converter=float, validator=_seconds)

    @verify_mode.validator
    def _verify_mode_of_the_topology(self, _attribute: object, mode: str) -> None:
        modes = TOPOLOGIES[self.topology].verify_modes
        if mode not in modes:
            raise ValueError(f"'verify_mode' must be one of {list(modes)} in topology {self.topology} (got {mode!r})")

    def __attrs_post_init__(self) -> None:
        options = self.options
        for chosen in OPTIONS:
            if chosen.needs is not None and options[chosen.name] != chosen.default and not options[chosen.needs]:
                raise ValueError(
                    f"'{chosen.name}' needs '{chosen.needs}' on (got {chosen.name}={options[chosen.name]!r}, "
                    f"{chosen.needs}={options[chosen.needs]!r})"
                )

    # -- what it is --------------------------------------------------------------------------------------------

    @property
    def traits(self) -> Topology:
        """The topology's traits (`ckpt_model.model.topologies`)."""
        return TOPOLOGIES[self.topology]

    @property
    def options(self) -> dict[str, OptionValue]:
        """Every option's value, by field name."""
        return attrs.asdict(self, filter=lambda attribute, _: OPTION in attribute.metadata)

    @property
    def changed_options(self) -> dict[str, OptionValue]:
        """The options that differ from their defaults."""
        return {name: value for name, value in self.options.items() if value != OPTIONS_BY_NAME[name].default}

    # -- its names ---------------------------------------------------------------------------------------------

    @property
    def option_words(self) -> tuple[str, ...]:
        """`capture`, `cuts`, `workers2`: the options that differ from their defaults, in declaration order."""
        return option_words(self.options)

    @property
    def verify_words(self) -> tuple[str, ...]:
        """The verify mode, for a topology that runs in more than one (names leave it out otherwise)."""
        return (self.verify_mode,) if len(self.traits.verify_modes) > 1 else ()

    @property
    def words(self) -> str:
        """`topology:verify_mode:fault,fault[:option+option]`, one word of `CKPT_MODEL_FUZZ_TARGETS`."""
        text = f"{self.topology}:{self.verify_mode}:{','.join(self.faults)}"
        return text + (f":{'+'.join(self.option_words)}" if self.option_words else "")

    @property
    def key(self) -> str:
        """What makes this deployment behave differently from another, as one string: Hypothesis's example
        database and derandomized draws are keyed on it (`ckpt_model.trainer.machine.machine_for`). Never change it."""
        return "/".join((self.topology, self.verify_mode, ",".join(self.faults), *self.option_words))

    @property
    def label(self) -> str:
        """How reports and banners name it: `native`, `slow/replay`, `counter+capture`, `native with f1, f2`."""
        name = "+".join(("/".join((self.topology, *self.verify_words)), *self.option_words))
        return name + (f" with {', '.join(self.faults)}" if self.faults else "")

    @property
    def file_words(self) -> tuple[str, ...]:
        """A regression file's name after its property: `P9-native-resume_deletes_records.json`."""
        return (self.topology, *self.verify_words, *self.faults, *self.option_words)

    @property
    def options_text(self) -> str:
        """Every option as a banner shows it: `token capture: no, generation cuts: no, policy workers: 1`."""
        shown = {True: "yes", False: "no"}
        return ", ".join(
            f"{name.replace('_', ' ')}: {shown[value] if isinstance(value, bool) else value}"
            for name, value in self.options.items()
        )

    def document(self) -> dict[str, Any]:
        """Its part of a regression file: topology, verify mode, faults, and what differs from the defaults (so a
        file written before an option existed reads as that option's default)."""
        lease = {} if self.lease_grace_s == LEASE_GRACE_S else {"lease_grace_s": self.lease_grace_s}
        return {
            "topology": self.topology,
            "verify_mode": self.verify_mode,
            "faults": list(self.faults),
            **self.changed_options,
            **lease,
        }

    def system_keywords(self) -> dict[str, Any]:
        """The keywords of the system under test's deployment factory beside the topology. Options only where they
        differ from their defaults, so a system without one still starts every deployment that leaves it off."""
        return {
            "faults": self.faults,
            "verify_mode": self.verify_mode,
            "lease_grace_s": self.lease_grace_s,
            **self.changed_options,
        }

    # -- reading one -------------------------------------------------------------------------------------------

    @classmethod
    def from_words(cls, text: str) -> DeploymentSpec:
        """Read `words` back; the verify mode, faults and options may be left out (`native` is `native:wait:`)."""
        parts = text.split(":")
        if len(parts) > 4 or not parts[0]:
            shape = "topology[:verify_mode[:fault,...[:option+...]]]"
            raise SpecError([f"deployment words must be {shape} (got {text!r})"])
        topology, verify_mode, faults, words = [*parts, "", "", ""][:4]
        options = options_of_words(word for word in words.split("+") if word)
        names = tuple(name for name in faults.split(",") if name)
        return cls._built(topology, verify_mode or DEFAULT_VERIFY_MODE, names, options)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> DeploymentSpec:
        """Read `document()` back, from a regression file (written by any version: an option absent from it is at
        its default, as it was when the file was written). Every problem is listed at once."""
        problems = []
        name = document.get("topology")
        if name not in TOPOLOGIES:
            problems.append(f"'topology' must be one of {list(TOPOLOGIES)} (got {name!r})")
        verify_mode = document.get("verify_mode", DEFAULT_VERIFY_MODE)
        faults = document.get("faults", [])
        if not isinstance(faults, list) or not all(isinstance(name, str) for name in faults):
            problems.append(f"'faults' must be a list of fault names (got {faults!r})")
        options: dict[str, OptionValue] = {}
        for chosen in OPTIONS:
            value = document.get(chosen.name, chosen.default)
            if type(value) is not type(chosen.default):
                problems.append(f"'{chosen.name}' must be {chosen.kind} (got {value!r})")
            options[chosen.name] = value
        lease_grace_s = document.get("lease_grace_s", LEASE_GRACE_S)
        if isinstance(lease_grace_s, bool) or not isinstance(lease_grace_s, int | float):
            problems.append(f"'lease_grace_s' must be a number of seconds (got {lease_grace_s!r})")
        if problems:
            raise SpecError(problems)
        return cls._built(str(name), verify_mode, faults, options, lease_grace_s=lease_grace_s)

    @classmethod
    def _built(
        cls,
        topology: str,
        verify_mode: str,
        faults: Iterable[str],
        options: Mapping[str, OptionValue],
        *,
        lease_grace_s: float = LEASE_GRACE_S,
    ) -> DeploymentSpec:
        """A spec from parsed parts, with the options those asked for need turned on; a SpecError if it cannot
        exist."""
        try:
            options_as_keywords: dict[str, Any] = implied(options)
            return cls(topology, verify_mode, tuple(faults), lease_grace_s=lease_grace_s, **options_as_keywords)
        except (TypeError, ValueError) as error:
            raise SpecError([str(error)]) from None

    @classmethod
    def for_faults(
        cls,
        faults: Sequence[FaultNeeds],
        *,
        topology: str | None = None,
        verify_mode: str | None = None,
        options: Mapping[str, OptionValue] | None = None,
    ) -> DeploymentSpec:
        """The one rule for the deployment planted faults need (what `ckpt-model check`, the fuzz workers, the
        fault searches and the pytest plugin run):

        - the topology and verify mode every fault shows in, if they share one, else native and wait;
        - a topology asked for in its place, then in verify mode wait unless a verify mode is asked for too;
        - every option any fault needs (on, or at least as many), and the options asked for; an option on turns on
          the option it needs (generation cuts need token capture).

        A SpecError if that deployment cannot exist (a verify mode the topology does not run)."""
        shown_in = {(fault.topology, fault.verify_mode) for fault in faults}
        # topology -> verify mode of the one deployment the faults show in
        shown = dict(shown_in) if len(shown_in) == 1 else {DEFAULT_TOPOLOGY: DEFAULT_VERIFY_MODE}
        chosen = topology or next(iter(shown))
        mode = verify_mode or shown.get(chosen, DEFAULT_VERIFY_MODE)
        asked = dict(options or {})
        needs = [options_needed_by(fault) for fault in faults]
        values = {
            each.name: max([asked.get(each.name, each.default), *(need.get(each.name, each.default) for need in needs)])
            for each in OPTIONS
        }
        return cls._built(chosen, mode, (fault.name for fault in faults), values)


class FaultNeeds(Protocol):
    """What a planted fault says about the deployment it shows in (fields of the system's fault catalogue)."""

    @property
    def name(self) -> str: ...

    @property
    def topology(self) -> str: ...

    @property
    def verify_mode(self) -> str: ...

    @property
    def token_capture(self) -> bool: ...

    @property
    def generation_cuts(self) -> bool: ...

    @property
    def policy_workers(self) -> int: ...

    @property
    def server_workers(self) -> int: ...

    @property
    def time_jumps(self) -> bool: ...


def options_needed_by(fault: FaultNeeds) -> dict[str, OptionValue]:
    """The options a planted fault needs to show (read once, here)."""
    return {
        "token_capture": fault.token_capture,
        "generation_cuts": fault.generation_cuts,
        "policy_workers": fault.policy_workers,
        "server_workers": fault.server_workers,
        "time_jumps": fault.time_jumps,
    }


@attrs.frozen
class Option:
    """One deployment option, as it is spelled outside the spec (declared by `option` on a field)."""

    name: str
    default: OptionValue
    word: str
    help: str
    needs: str | None = None

    @property
    def counts(self) -> bool:
        """A count (`workers2`), not a switch (`capture`)."""
        return not isinstance(self.default, bool)

    @property
    def kind(self) -> str:
        return "an integer >= 1" if self.counts else "true or false"

    @property
    def pattern(self) -> str:
        return f"{self.word}N" if self.counts else self.word

    def flag(self, prefix: str = "--") -> str:
        """Its command-line flag: `--token-capture` (`--ckpt-token-capture` with the pytest plugin's prefix)."""
        return prefix + self.name.replace("_", "-")

    def words(self, value: OptionValue) -> tuple[str, ...]:
        if value == self.default:
            return ()
        return (f"{self.word}{value}",) if self.counts else (self.word,)

    def value_of(self, word: str) -> OptionValue | None:
        """The value `word` spells for this option; None if it is not one of this option's words."""
        if not self.counts:
            return True if word == self.word else None
        count = word.removeprefix(self.word)
        return int(count) if word != count and count.isdigit() and int(count) >= 1 else None


OPTIONS: tuple[Option, ...] = tuple(
    Option(field.name, cast(OptionValue, field.default), *field.metadata[OPTION])
    for field in attrs.fields(DeploymentSpec)
    if OPTION in field.metadata
)
OPTIONS_BY_NAME: Mapping[str, Option] = {each.name: each for each in OPTIONS}


def option_words(options: Mapping[str, OptionValue]) -> tuple[str, ...]:
    """The words of the options that differ from their defaults (absent ones are at their defaults)."""
    return tuple(word for each in OPTIONS for word in each.words(options.get(each.name, each.default)))


def options_of_words(words: Iterable[str]) -> dict[str, OptionValue]:
    """The options `option_words` wrote; a SpecError names an unknown word."""
    options: dict[str, OptionValue] = {}
    for word in words:
        values = [(each.name, value) for each in OPTIONS if (value := each.value_of(word)) is not None]
        if not values:
            known = ", ".join(each.pattern for each in OPTIONS)
            raise SpecError([f"unknown deployment option {word!r}: use {known}"])
        options.update(values)
    return options


def implied(options: Mapping[str, OptionValue]) -> dict[str, OptionValue]:
    """The options with every option an option that is on needs turned on too."""
    filled = dict(options)
    for each in OPTIONS:
        if each.needs is not None and filled.get(each.name, each.default) != each.default:
            filled[each.needs] = True
    return filled


def positive_count(text: str) -> int:
    """An argparse type for a count option: an integer >= 1, else an error that says so."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return int(text)


def flag_keywords(each: Option) -> dict[str, Any]:
    """An option's command-line flag (argparse's and pytest's `addoption` keywords): a switch, or a count whose
    absence (None) leaves it to the faults and the default."""
    if not each.counts:
        return {"action": "store_true", "help": each.help}
    return {"type": positive_count, "default": None, "metavar": "N", "help": each.help}


FAULT_FREE: tuple[DeploymentSpec, ...] = (
    *(DeploymentSpec(traits.name, mode) for traits in TOPOLOGIES.values() for mode in traits.verify_modes),
    # Gym's lineage scenarios' deployment, and its cut scenario's with two policy-model workers behind one port.
    DeploymentSpec("counter", token_capture=True),
    DeploymentSpec("native", token_capture=True, generation_cuts=True, policy_workers=2),
    # A deployment whose time can pass, with a replay verification: the two places an episode's budget is suspended
    # (parked at a boundary, in a replay step) both meet time passing. New deployments go last: keys never change.
    DeploymentSpec("slow", "replay", time_jumps=True),
    # Two workers on every server (Gym's multi-worker e2e): the cut scenario's deployment with the environment,
    # agent and resources servers behind one port each as well; the checker places every attempt on a worker.
    DeploymentSpec("native", token_capture=True, generation_cuts=True, policy_workers=2, server_workers=2),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_model.model.spec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault-free", action="store_true", required=True, help="print FAULT_FREE, words a line")
    parser.parse_args(argv)
    sys.stdout.write("".join(spec.words + "\n" for spec in FAULT_FREE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
