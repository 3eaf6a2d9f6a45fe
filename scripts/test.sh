#!/usr/bin/env bash
# The test command from the README: installs what the suite needs, then runs the whole suite offline
# (slow end-to-end tests included), after the lint/type gate. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,postgres,ray  # store tests on PostgreSQL too (a throwaway server); the Ray runner's
bash scripts/lint.sh
export LITELLM_LOCAL_MODEL_COST_MAP=True HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true
# Two workers, a test file each at a time (module fixtures start their servers once): most tests spend
# their time on one core (process starts, imports, one event loop), so one worker left the other core
# idle — 45 min of pytest in CI, 23 min with two in a fresh clone here. AGL_TEST_WORKERS=0 runs in this process.
exec .venv/bin/python -m pytest -q -n "${AGL_TEST_WORKERS:-2}" --dist loadfile --durations=40 "$@"
