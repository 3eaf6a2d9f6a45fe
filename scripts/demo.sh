#!/usr/bin/env bash
# The main job from the README: installs what it needs, builds the tiny model on first use, and trains
# the hello agent (supervised warm start, then GRPO through the proxy) on the CPU. Extra arguments go
# to examples/hello_qwen/train.py (try --help; --quick runs a few steps).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export LITELLM_LOCAL_MODEL_COST_MAP=True
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true
exec .venv/bin/python examples/hello_qwen/train.py "$@"
