"""What the collection machine predicts of its runs, as a frozen value: the attempt each unfinished row is sent as,
the script call each attempt starts from (P4), and the rows' finishing attempts (P25).

The continuation rules (reference Appendix C, docs/collection.md): a rerun restores `LATEST` and sends each row it
continues as that row's exported attempt + 1, from the boundary the attempt had when the checkpoint was taken (where
it started, plus the calls it had delivered by then); a row the dispatch log names otherwise starts over as its
logged attempt + 1; any other starts at attempt 0. A crash of the whole Gym while a run waits makes every unfinished
row start over as its next attempt. Restoring a checkpoint again sends its continued attempts again under the same
capture keys, so each key's calls are counted per execution: the calls its earlier executions made are left out.

Pure: each transition takes what the machine read (the output's rows, `LATEST`, the dispatch log, the backend's
calls) and returns the next value, so a unit test builds every case by hand
(`tests/unit/checker/test_collection_prediction.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ckpt_model.model.contract import ScriptCall, capture_key

# A mapping kept as sorted (key, count) pairs, so the value stays frozen and hashable.
Counts = tuple[tuple[str, int], ...]


def counts(mapping: Mapping[str, int]) -> Counts:
    return tuple(sorted(mapping.items()))


@attrs.frozen
class Prediction:
    """The machine's prediction after its last step.

    `attempts`: each unfinished row of the current run and the attempt it goes as; `starts`: each capture key and the
    script call its current execution starts from; `made_before`: each key's calls made by its earlier executions;
    `boundaries`: per checkpoint, the calls each key had delivered when it was taken; `finished_as`: each finished row
    and the attempt predicted for the run in which it finished; `restores`: the checkpoint each rerun continued, in
    order; `exits`: each run's exit code, in order; `runs` started and Gym `crashes` (a rerun's included)."""

    rows: tuple[str, ...]
    runs: int = 0
    crashes: int = 0
    attempts: Counts = ()
    starts: Counts = ()
    made_before: Counts = ()
    boundaries: tuple[tuple[str, Counts], ...] = ()
    finished_as: Counts = ()
    restores: tuple[str, ...] = ()
    exits: tuple[int, ...] = ()

    # -- views ------------------------------------------------------------------------------------------------

    @property
    def unfinished(self) -> list[str]:
        """The rows no run has finished, in input order."""
        finished = dict(self.finished_as)
        return [row for row in self.rows if row not in finished]

    def boundary(self, checkpoint_id: str | None) -> dict[str, int]:
        """The calls each capture key had delivered when `checkpoint_id` was taken (none for a checkpoint not seen)."""
        return dict(dict(self.boundaries).get(checkpoint_id or "", ()))

    def expected_calls(self, script: Sequence[ScriptCall]) -> dict[str, tuple[ScriptCall, ...]]:
        """P4: each predicted attempt's calls, its script from where it starts."""
        return {key: tuple(script[start:]) for key, start in self.starts}

    def this_execution(self, observed: Mapping[str, Sequence[ScriptCall]]) -> dict[str, tuple[ScriptCall, ...]]:
        """The backend's calls of each predicted key (`observed`: all of its calls so far) since its current
        execution began."""
        made_before, starts = dict(self.made_before), dict(self.starts)
        return {key: tuple(calls[made_before.get(key, 0) :]) for key, calls in observed.items() if key in starts}

    # -- transitions ------------------------------------------------------------------------------------------

    def started(
        self,
        finished: Collection[str],
        latest: str | None,
        continued: Mapping[str, int],
        logged: Mapping[str, int],
        made: Mapping[str, int],
    ) -> Prediction:
        """A run starts (after the first, a rerun on fresh servers: the job restarted, a crash of the whole Gym
        first). Read before it starts: the rows in the output, `LATEST` and the attempts its `collection.json`
        continues, the highest attempt the dispatch log names per row, and the backend's calls so far per key."""
        exported_starts, boundary = dict(self.starts), self.boundary(latest)
        attempts: dict[str, int] = {}
        starts: dict[str, int] = {}
        for rollout in self.rows:
            if rollout in finished:
                continue
            if rollout in continued:
                attempts[rollout] = continued[rollout] + 1
                exported = capture_key(rollout, continued[rollout])  # from where it started, plus what it delivered
                start = exported_starts.get(exported, 0) + boundary.get(exported, 0)
            else:
                attempts[rollout] = logged[rollout] + 1 if rollout in logged else 0
                start = 0
            starts[capture_key(rollout, attempts[rollout])] = start
        restores = self.restores + ((latest,) if self.runs and latest is not None else ())
        rerun = attrs.evolve(
            self,
            runs=self.runs + 1,
            crashes=self.crashes + bool(self.runs),
            attempts=counts(attempts),
            restores=restores,
        )
        return rerun.executing(starts, made)

    def crashed(self, made: Mapping[str, int]) -> Prediction:
        """Every Gym server killed while the run waits on them: each unfinished row starts over as its next attempt,
        from the first call (`made`: the backend's calls so far per key, read before the crash)."""
        attempts = {rollout: attempt + 1 for rollout, attempt in self.attempts}
        again = attrs.evolve(self, crashes=self.crashes + 1, attempts=counts(attempts))
        return again.executing({capture_key(rollout, attempt): 0 for rollout, attempt in attempts.items()}, made)

    def executing(self, starts: Mapping[str, int], made: Mapping[str, int]) -> Prediction:
        """The attempts `starts` names (capture key: the script call each starts from) are sent now; the calls their
        keys made before (`made`) are other executions'."""
        return attrs.evolve(
            self,
            starts=counts(dict(self.starts) | dict(starts)),
            made_before=counts(dict(self.made_before) | {key: made.get(key, 0) for key in starts}),
        )

    def finished(self, output: Iterable[str]) -> Prediction:
        """Rows that replied since (`output`: the rollouts in the output): each finished at the attempt predicted for
        the current run."""
        attempts, finished_as = dict(self.attempts), dict(self.finished_as)
        for rollout in output:
            if rollout in attempts:
                finished_as[rollout] = attempts.pop(rollout)
        return attrs.evolve(self, attempts=counts(attempts), finished_as=counts(finished_as))

    def exited(self, exit_code: int) -> Prediction:
        return attrs.evolve(self, exits=(*self.exits, exit_code))

    def taken(self, checkpoint_id: str, calls: Iterable[Mapping[str, Any]]) -> Prediction:
        """`checkpoint_id` shows as `LATEST` for the first time: how many calls each key's current execution had
        delivered (`calls`: the backend's, each with its capture key and whether it waits or was cancelled), the
        boundary a continuation of it starts from. The machine released none since it was taken, and every
        unfinished row waits on a held call. A checkpoint seen before keeps the boundary it had."""
        if checkpoint_id in dict(self.boundaries):
            return self
        made_before = dict(self.made_before)
        made: dict[str, int] = {}
        delivered: dict[str, int] = {}
        for call in calls:
            key = call.get("capture_key")
            if key is None:
                continue
            made[key] = made.get(key, 0) + 1
            this_execution = made[key] > made_before.get(key, 0)
            if this_execution and not call["waiting"] and not call["cancelled"]:
                delivered[key] = delivered.get(key, 0) + 1
        return attrs.evolve(self, boundaries=(*self.boundaries, (checkpoint_id, counts(delivered))))
