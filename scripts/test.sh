#!/usr/bin/env bash
# The test command from the README: installs what the suite needs, then runs the whole suite offline
# (slow end-to-end tests included), after the lint/type gate. Extra arguments go to pytest.
#   bash scripts/test.sh --fast   the edit–test loop: no lint gate, no test marked `slow` (end-to-end runs)
# The run ends with every skipped group, how many, and the one command that enables it
# (tests/skip_groups.py); under CI=true a skip of something CI must provide fails the run instead.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = --fast ]; then
  fast=1
  shift
fi
bash scripts/setup.sh dev,postgres,ray  # store tests on PostgreSQL too (a throwaway server); the Ray runner's
[ "$fast" = 1 ] || bash scripts/lint.sh
export LITELLM_LOCAL_MODEL_COST_MAP=True HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true
# Two workers, a test file each at a time (module fixtures start their servers once): most tests spend
# their time on one core (process starts, imports, one event loop), so one worker left the other core
# idle — 45 min of pytest in CI, 23 min with two in a fresh clone here. AGL_TEST_WORKERS=0 runs in this process.
if [ "$fast" = 1 ]; then
  exec .venv/bin/python -m pytest -q -rs -n "${AGL_TEST_WORKERS:-2}" --dist loadfile -m "not slow" --durations=15 "$@"
fi
exec .venv/bin/python -m pytest -q -rs -n "${AGL_TEST_WORKERS:-2}" --dist loadfile --durations=40 "$@"
