"""Each planted fault is found by a random search, by the property the catalogue names, and shrunk short.

The fault-free stack is the control: `test_contract.py` runs the same machine against it and must pass. A search
and its minimising cost a minute or more per fault (every example starts processes), so these run in the nightly
(`pytest -m search`, with `HYPOTHESIS_PROFILE=ci`). The default run searches for one fault end to end through the
command a user runs (`tests/cli/test_cli.py`: `ckpt-model check --faults resume_deletes_records`, the same machine,
search without Hypothesis's shrink, and minimiser), and `test_fixed_scenarios.py` checks every fault against its
property.

`pytest -m search --ckpt-max-time 5m` bounds each search by time: a fault the search did not reach within it fails
its test as "not found within the time limit", which says what ran out, never that the fault is not there.
"""

from __future__ import annotations

import pytest

from ckpt_model.search.faultsearch import harness_for, search
from fakes.faults import CATALOGUE, Fault

SHRUNK_STEPS_MAX = 10


FAULTS = [pytest.param(fault, id=fault.name, marks=pytest.mark.search) for fault in CATALOGUE]


@pytest.mark.parametrize("fault", FAULTS)
def test_the_checker_finds_the_planted_fault(fault: Fault, request: pytest.FixtureRequest) -> None:
    max_time_s = request.config.getoption("ckpt_max_time")
    with harness_for(fault.name) as harness:
        finding = search(harness, max_time_s=max_time_s)

    assert finding.violation is not None, (
        f"{fault.name} ({fault.description}): {finding.headline}, after {finding.examples} examples"
    )
    caught = set(finding.property_ids) & set(fault.shows_as)
    steps = "\n".join(f"  {number}. {step}" for number, step in enumerate(finding.shrunk_steps, 1))
    assert caught, f"caught by {finding.property_ids}:\n{finding.violation}\nminimal steps:\n{steps}"
    assert 0 < len(finding.shrunk_steps) <= SHRUNK_STEPS_MAX, finding.shrunk_steps
    assert finding.first is not None
    assert finding.first.kind == "violation"  # an intermittent fault too: never a checker outcome
    assert finding.rate is not None
    assert finding.rate.failing > 0, finding.headline  # the reported steps fail again, if only sometimes
    print(
        f"\n{fault.name}: {finding.headline} after {finding.examples} examples, first failure at "
        f"{finding.first_failure_s:.1f} s, shrunk to {len(finding.shrunk_steps)} steps in {finding.total_s:.1f} s: "
        + "; ".join(finding.shrunk_steps)
    )
