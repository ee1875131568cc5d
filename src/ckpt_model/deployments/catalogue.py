"""The planted faults a system under test catalogues (`ckpt_model.deployments.seam.system`): what each is, which
property catches it, the deployment it shows in; and the same for its rollout collection program. The CLI, the
pytest plugin, the fault searches and the fixed scenarios pick faults from here by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from ckpt_model.deployments.seam import system
from ckpt_model.model.spec import FaultNeeds


class PlantedFault(FaultNeeds, Protocol):
    """A catalogued fault of a system under test, as the checker reads it: what it is, which property catches it,
    and (`FaultNeeds`) the deployment it shows in."""

    @property
    def server(self) -> str: ...

    @property
    def caught_by(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def shows_as(self) -> tuple[str, ...]: ...


def fault_catalogue() -> tuple[PlantedFault, ...]:
    """The embedded stack's planted faults."""
    return tuple(system().catalogue)


class CollectorFault(Protocol):
    """A catalogued fault of a system's rollout collection program, and the property that catches it (a collection
    property, or a server property judged on the collection's own calls)."""

    @property
    def name(self) -> str: ...

    @property
    def caught_by(self) -> str: ...

    @property
    def description(self) -> str: ...


def collection_fault_catalogue() -> tuple[CollectorFault, ...]:
    """The embedded stack's planted collector faults (none if its system offers no collection program)."""
    return tuple(getattr(system(), "collection_catalogue", ()))


def planted(name: str) -> PlantedFault:
    (fault,) = faults_named(name)
    return fault


class UnknownFaults(LookupError):
    """Fault names the catalogue does not hold; the message names them and every known one."""

    def __init__(self, unknown: Sequence[str], known: Sequence[str]) -> None:
        self.unknown, self.known = tuple(unknown), tuple(known)
        super().__init__(f"unknown fault(s) {', '.join(map(repr, unknown))}; known faults: {', '.join(known)}")


def faults_named(text: str) -> tuple[PlantedFault, ...]:
    """The planted faults a comma-separated list names, each once, in the order named; `UnknownFaults` if the
    catalogue lacks any."""
    return named_in(text, fault_catalogue())


class HasName(Protocol):
    @property
    def name(self) -> str: ...


Named = TypeVar("Named", bound=HasName)


def named_in(text: str, catalogue: Sequence[Named]) -> tuple[Named, ...]:
    """The entries of `catalogue` a comma-separated list names, each once, in the order named; `UnknownFaults` if
    the catalogue lacks any."""
    by_name = {entry.name: entry for entry in catalogue}
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise UnknownFaults(unknown, list(by_name))
    return tuple(by_name[name] for name in names)
