#!/usr/bin/env bash
# The main job from the README: installs what it needs, builds the tiny model on first use, runs the demo.
# Extra arguments go to `agl-bridge demo` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export LITELLM_LOCAL_MODEL_COST_MAP=True
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true
exec .venv/bin/agl-bridge demo "$@"
