#!/usr/bin/env bash
# The nightly deep search: the state machine with the `ci` profile over every fault-free deployment (each must also
# reach every coverage goal that applies to it, `ckpt_model.steps.goals`; the JUnit report holds each one's coverage
# table), then the tests the default run leaves to it (`pytest -m deep`), then the full fault search (`pytest -m
# search`: every planted fault found and shrunk). Installs nothing: run it in the project's environment
# (`pip install -e '.[test]'` done).
#
# Keeps Hypothesis's example database in .hypothesis/ at the repository root (the workflow caches it between runs,
# so a failure found one night replays first the next) and writes to nightly-artifacts/ (or $NIGHTLY_ARTIFACTS):
#   junit-stateful.xml, junit-deep.xml, junit-search.xml   pytest's JUnit reports
#   regressions/                           the regression files failing runs wrote (`ckpt-model replay FILE`), each
#                                          with its timeline picture (.html)
#   console.log                            everything printed to the console
# Every step runs even when one fails; the exit status is 1 if any step failed, else 0.
#
# Every core: each step runs its tests on pytest-xdist workers, $NIGHTLY_WORKERS of them (default `auto`, one per
# core plus one, tests/conftest.py; 0 runs them in one process). Each worker starts its own deployments; they share the example database (or the
# Redis one `CKPT_MODEL_REDIS_URL` names, docs/parallel.md). `CKPT_MODEL_EXAMPLES=N` sizes the machine tests.
set -euo pipefail

cd "$(dirname "$0")/.."
python="${PYTHON:-python}"
artifacts="${NIGHTLY_ARTIFACTS:-nightly-artifacts}"
regressions=".ckpt-model/regressions"

mkdir -p "$artifacts"
: >"$artifacts/console.log"
started="$(mktemp)"  # regression files newer than this are tonight's (a local run may hold older ones)
trap 'rm -f "$started"' EXIT
export HYPOTHESIS_PROFILE=ci
export CKPT_MODEL_REGRESSIONS="$regressions"
workers="${NIGHTLY_WORKERS:-auto}"

failed=()

# Runs one pytest step, its output to the console and to console.log; records it in `failed` if it fails.
run_step() {
  local name="$1"
  shift
  echo "=== nightly: $name: $*" | tee -a "$artifacts/console.log"
  local status=0
  "$@" 2>&1 | tee -a "$artifacts/console.log" || status="${PIPESTATUS[0]}"
  echo "=== nightly: $name: exit $status" | tee -a "$artifacts/console.log"
  if [ "$status" -ne 0 ]; then
    failed+=("$name (exit $status)")
  fi
}

# tests/stateful runs the machine against every fault-free deployment (`ckpt_model.model.spec.FAULT_FREE`, read from the
# package, so this list is never declared twice) and the fixed scenarios.
deployments="$("$python" -m ckpt_model.model.spec --fault-free)"
echo "=== nightly: fault-free deployments: ${deployments//$'\n'/ }" | tee -a "$artifacts/console.log"
run_step stateful "$python" -m pytest tests/stateful -p no:cacheprovider -n "$workers" \
  --junitxml="$artifacts/junit-stateful.xml"
# What the default run leaves out as a repeat on another deployment or end to end (`deep`: scenarios of the native
# set on the other deployments, the contract on the deployments a larger one includes, the minimiser on a P14
# failure, two HypoFuzz workers sharing a Redis database).
run_step deep "$python" -m pytest -m deep -p no:cacheprovider -n "$workers" \
  --junitxml="$artifacts/junit-deep.xml"
run_step search "$python" -m pytest -m search -p no:cacheprovider -n "$workers" \
  --junitxml="$artifacts/junit-search.xml"

mkdir -p "$artifacts/regressions"
if [ -d "$regressions" ]; then
  find "$regressions" -type f \( -name '*.json' -o -name '*.html' \) -newer "$started" \
    -exec cp {} "$artifacts/regressions/" \;
fi

if [ "${#failed[@]}" -ne 0 ]; then
  echo "nightly: FAILED: ${failed[*]}" | tee -a "$artifacts/console.log"
  exit 1
fi
echo "nightly: passed" | tee -a "$artifacts/console.log"
