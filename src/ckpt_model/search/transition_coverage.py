"""Transition coverage: the share of the contract model's explored transitions a run's drawn rules took.

A run keeps each drawn rule's abstract transition (`ckpt_model.steps.steplog`, by digest:
`ckpt_model.model.abstract`); this module sets them against the transitions the explorer enumerates to a depth
(`ckpt_model.search.explore`): per depth, how many of the transitions that leave a state first reached at that
depth - 1 the run took; per family, how many it left; and every transition the run took from an explored state
that the explorer did not predict (`unmodelled`: the move table, `ckpt_model.trainer.moves`, disagrees with the
rule's body, or the abstraction, `ckpt_model.model.abstract`, merged states the rule tells apart: a checker bug the
contract runs of the test suite require none of).

Exploring to depth 5 takes a few seconds, so the explored transitions of each deployment and depth are kept in
`.ckpt-model/explored/` (or `$CKPT_MODEL_EXPLORED`), named by a digest of the checker's model, rules and moves
source: a changed checker explores again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

import ckpt_model
from ckpt_model.model.abstract import COVERAGE_DEPTH, EXPLORED_ROLLOUTS
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.steps.checkable import Capabilities

EXPLORED_ENV = "CKPT_MODEL_EXPLORED"
DEFAULT_ROOT = Path(".ckpt-model/explored")
# The checker's sources whose change changes what is explored: the model, the rules and their moves.
SOURCES = ("model", "trainer", "steps")
# How many rules the words name for each family's transitions left.
RULES_NAMED = 3


@attrs.frozen
class Explored:
    """The transitions explored to `depth`, each with the depth it is taken at (its source's depth + 1) and the
    arguments of the first rule call that took it (what an aimed tour replays, `ckpt_model.search.paths`)."""

    depth: int
    transitions: Mapping[tuple[str, str, str], int]
    families: Mapping[str, str]
    arguments: Mapping[tuple[str, str, str], Mapping[str, Any]] = attrs.field(factory=dict, eq=False)

    @property
    def sources(self) -> set[str]:
        return {source for source, _, _ in self.transitions}


@attrs.frozen
class DepthShare:
    depth: int
    taken: int
    explored: int

    def words(self) -> str:
        share = 100 * self.taken / self.explored if self.explored else 0.0
        return f"depth {self.depth}: {self.taken} of {self.explored} ({share:.1f}%)"


@attrs.frozen
class TransitionCoverage:
    """What a run's transitions cover of the explored ones (see the module)."""

    depth: int
    shares: tuple[DepthShare, ...]
    taken: int  # distinct transitions the run's drawn rules took
    beyond: int  # of those, from states the exploration did not expand (deeper than depth - 1)
    unmodelled: tuple[tuple[str, str, str], ...]
    left_by_family: Mapping[str, int]
    left_by_rule: Mapping[str, int]
    families_of_rule: Mapping[str, str] = attrs.field(factory=dict)

    def lines(self) -> list[str]:
        total = DepthShare(self.depth, sum(s.taken for s in self.shares), sum(s.explored for s in self.shares))
        lines = [
            f"transitions: {total.words().replace(f'depth {self.depth}', f'to depth {self.depth}')}; "
            + ", ".join(share.words() for share in self.shares)
            + f"; {self.beyond} more taken beyond it"
        ]
        if self.left_by_family:
            left = []
            for family, count in sorted(self.left_by_family.items(), key=lambda item: -item[1]):
                rules = [rule for rule in self.left_by_rule if self.families_of_rule.get(rule) == family]
                left.append(f"{family} {count} ({', '.join(rules[:RULES_NAMED])})")
            lines.append(f"  never taken, by family: {'; '.join(left)}")
        if self.unmodelled:
            lines.append(
                f"  {len(self.unmodelled)} taken that the explorer did not predict (a checker bug: its move table or "
                f"abstraction disagrees with the rule): {', '.join(r for _, r, _ in self.unmodelled[:5])}"
            )
        return lines

    def document(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "by_depth": [attrs.asdict(share) for share in self.shares],
            "taken": self.taken,
            "beyond_depth": self.beyond,
            "unmodelled": [list(transition) for transition in self.unmodelled],
            "never_taken_by_family": dict(self.left_by_family),
            "never_taken_by_rule": dict(self.left_by_rule),
        }


def coverage_of(explored: Explored, taken: Iterable[tuple[str, str, str]]) -> TransitionCoverage:
    """How much of `explored` the transitions `taken` cover."""
    taken = set(taken)
    sources = explored.sources
    covered = {t for t in taken if t in explored.transitions}
    shares = []
    for depth in range(1, explored.depth + 1):
        at_depth = [t for t, d in explored.transitions.items() if d == depth]
        shares.append(DepthShare(depth, sum(1 for t in at_depth if t in covered), len(at_depth)))
    left = [t for t in explored.transitions if t not in covered]
    by_rule = Counter(rule for _, rule, _ in left)
    return TransitionCoverage(
        depth=explored.depth,
        shares=tuple(shares),
        taken=len(taken),
        beyond=sum(1 for t in taken if t[0] not in sources),
        unmodelled=tuple(sorted(t for t in taken if t[0] in sources and t not in explored.transitions)),
        left_by_family=dict(Counter(explored.families[rule] for _, rule, _ in left)),
        left_by_rule=dict(by_rule.most_common()),
        families_of_rule=dict(explored.families),
    )


def explored(spec: DeploymentSpec, depth: int = COVERAGE_DEPTH, capabilities: Capabilities | None = None) -> Explored:
    """The transitions of `spec`'s model to `depth` (with the rules `capabilities` allow, the look-alike stack's
    by default), from the cache if this checker explored them before."""
    spec = attrs.evolve(spec, faults=())  # the faults planted change the system, never the model
    capabilities = capabilities or Capabilities.of_look_alike(spec)
    root = Path(os.environ.get(EXPLORED_ENV) or DEFAULT_ROOT)
    words = f"{spec.key}|{depth}|{EXPLORED_ROLLOUTS}|{capabilities!r}|{_sources_digest()}"
    path = root / f"{hashlib.blake2b(words.encode(), digest_size=10).hexdigest()}.json"
    try:
        document = json.loads(path.read_text())
        return Explored(
            document["depth"],
            {(s, r, t): d for s, r, t, d, _ in document["transitions"]},
            document["families"],
            {(s, r, t): arguments for s, r, t, _, arguments in document["transitions"]},
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from ckpt_model.search.explore import explore, families

    found = explore(spec, depth, capabilities=capabilities)
    keys = {t: (t.source, t.rule, t.target) for t in found.transitions}
    result = Explored(
        depth,
        {keys[t]: found.depths[t.source] + 1 for t in found.transitions},
        families(found.by_rule()),
        {keys[t]: dict(found.calls[t].arguments) for t in found.transitions},
    )
    rows = [[*key, result.transitions[key], result.arguments[key]] for key in result.transitions]
    _write(path, {"depth": depth, "families": dict(result.families), "transitions": rows})
    return result


def _write(path: Path, document: dict[str, Any]) -> None:
    """Written whole, in one rename (parallel workers may write the same file); a cache that cannot be written is
    explored again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump(document, handle)
        os.replace(handle.name, path)
    except OSError:
        return


@functools.cache
def _sources_digest() -> str:
    """A digest of the checker's sources that decide what is explored, read once per process."""
    package = Path(ckpt_model.__file__).parent
    digest = hashlib.blake2b(digest_size=10)
    for source in sorted(path for part in SOURCES for path in (package / part).rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()
