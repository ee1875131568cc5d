"""How often a failure comes back: its reproduction rate over N replays, and how many tries a candidate gets.

A system under test that misbehaves only sometimes (a race the checker does not own, randomness in a participant)
fails the same steps on some replays and not on others. Such a failure is still the property it broke: it is
reported as "P5 in 3 of 10 replays", never as nothing found, and the minimiser judges its candidates by that rate
(`attempts_for`). Pure: the replays themselves are the caller's (`ckpt_model.search.minimise.rate_on`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

# Replays that measure a failure's rate (`ckpt-model check --replays`, `faultsearch.search(replays=...)`).
REPLAYS = 10
# A candidate that fails as often as the failure found is refused by mistake at most this often: it gets enough
# tries that all of them passing is this unlikely (`attempts_for`).
WRONGLY_REFUSED_CHANCE = 0.01
# The most tries one candidate gets, however rare the failure (1 in 10 would ask for 44): a bound on the cost of a
# minimisation of about three rate measurements per candidate refused.
ATTEMPTS_MAX = 30
RATE_ATTRIBUTE = "_ckpt_reproduction"


@attrs.frozen
class Rate:
    """`failing` of `replays` replays of one sequence failed the way it failed first (`label`: the property id,
    or the exception's class name for a harness error)."""

    label: str
    failing: int
    replays: int

    @property
    def always(self) -> bool:
        return self.failing == self.replays

    @property
    def share(self) -> float:
        return self.failing / self.replays if self.replays else 0.0

    @property
    def text(self) -> str:
        """ "P5 in 3 of 10 replays"."""
        return f"{self.label} in {self.failing} of {self.replays} replays"

    def document(self) -> dict[str, Any]:
        """As a regression file records it."""
        return {"label": self.label, "failing": self.failing, "replays": self.replays, "text": self.text}

    @classmethod
    def from_document(cls, document: object) -> Rate | None:
        """The rate a regression file recorded, or None if it holds none (a file written before rates were)."""
        if not isinstance(document, dict):
            return None
        label, failing, replays = (document.get(key) for key in ("label", "failing", "replays"))
        if not (isinstance(label, str) and isinstance(failing, int) and isinstance(replays, int) and replays > 0):
            return None
        return cls(label=label, failing=failing, replays=replays)


def attempts_for(rate: Rate | None) -> int:
    """How many replays a candidate gets before it counts as not failing (it counts as failing on its first
    failure): one for a failure that came back every time (or was not measured), else enough that a candidate
    failing at the measured share passes every try with at most `WRONGLY_REFUSED_CHANCE` (capped at
    `ATTEMPTS_MAX`). The measured share is used as it is; at 5 of 10 that is 7 tries, at 1 of 10 the cap."""
    if rate is None or rate.always:
        return 1
    if rate.failing == 0:
        return ATTEMPTS_MAX
    tries = math.log(WRONGLY_REFUSED_CHANCE) / math.log(1.0 - rate.share)
    return min(ATTEMPTS_MAX, math.ceil(tries - 1e-9))


def measure(label: str, replays: int, fails: Callable[[], bool]) -> Rate:
    """Replay `replays` times (`fails` replays once and answers whether it failed the expected way)."""
    return Rate(label=label, failing=sum(bool(fails()) for _ in range(replays)), replays=replays)


def record(error: BaseException, rate: Rate) -> None:
    """Put the rate on the error the failure report is about, where `rate_of` (and the verdicts) read it."""
    setattr(error, RATE_ATTRIBUTE, rate)


def rate_of(error: BaseException) -> Rate | None:
    found = getattr(error, RATE_ATTRIBUTE, None)
    return found if isinstance(found, Rate) else None
