#!/usr/bin/env bash
# The whole loop on a lent GPU machine, in one call (see docs/scaling.md, "On a GPU"): the trainer's
# tokens/s and time to new weights on a Qwen3-0.6B-shaped model (bench/trainer_throughput.py), the
# sampler/trainer exactness checks (bench/gpu_check.py), and the hello demo (--quick, then a full run
# for as long as the budget allows). Each part has its own time limit and writes under $OUT, so a part
# cut short still leaves the others' figures.
#
# That machine has its own python3 (3.12) with torch and CUDA, and no registry: the packages agl_bridge
# needs beyond its image travel as cp312 manylinux wheels in .whl (git-ignored): transformers 5.23 and
# peft 0.21 (the image's transformers is older than the sampler needs), and for the demo what the proxy
# imports and the image lacks (litellm, pydantic, fastapi, uvicorn, aiosqlite, opentelemetry, openai,
# soundfile, ...). litellm's wheel, without its admin UI's static files, keeps the carry under 64 MiB.
# Run it through the device tool, with `.whl` carried:
#     bash bench/device_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" \
  | tee -a "$OUT/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2
  shift 2
  local began=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "[device_run] $name: exit $? after $((SECONDS - began)) s" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log"
}

step throughput "${THROUGHPUT_S:-180}" python3 bench/trainer_throughput.py --steps 4 --syncs 5
step gpu_check "${GPU_CHECK_S:-100}" python3 bench/gpu_check.py
step demo_quick "${DEMO_QUICK_S:-120}" python3 examples/hello_qwen/train.py --quick --run-dir runs/device-quick
step demo "${DEMO_S:-120}" python3 examples/hello_qwen/train.py --run-dir runs/device-demo
cp runs/device-quick/metrics.jsonl "$OUT/demo_quick_metrics.jsonl" 2>/dev/null || true
cp runs/device-demo/metrics.jsonl "$OUT/demo_metrics.jsonl" 2>/dev/null || true
