#!/usr/bin/env bash
# Builds (once) the folder tinker-cookbook runs from, for the Tinker API server's contract tests: the
# cookbook and what its recipes import that .venv lacks, installed with --no-deps into a --target folder
# that goes on PYTHONPATH in front of .venv (which gives torch, transformers and the tinker SDK).
# --no-deps because tinker-cookbook 0.6.1 requires tml-renderers>=0.4.1, which is not on PyPI (0.2.1 is);
# the recipes tested (sl_loop, rl_loop, the capture proxy with Qwen renderers) never import it.
#
#   bash scripts/tinker_cookbook_env.sh          # build if missing, print the folder
#   bash scripts/tinker_cookbook_env.sh --path   # print where the folder is (or would be); build nothing
#
# The folder lives in $AGL_BRIDGE_CACHE (default ~/.cache/agl_bridge) under a name holding a hash of the
# pins below: changing one builds a new one. First build: ~1 min, ~60 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
  tinker-cookbook==0.6.1
  chz==0.4.0 blobfile==3.3.0 cloudpickle==3.1.3 pyrage==1.4.0 pycryptodomex==3.24.2 lxml==6.1.3 pillow==13.0.0
  datasets==5.2.0 pandas==3.1.1 dill==0.4.1 multiprocess==0.70.19
  # rl_loop grades answers with the math_rl recipe's grader
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 pylatexenc==2.11 antlr4-python3-runtime==4.13.2
)
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
hash=$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-12)
root="${AGL_BRIDGE_CACHE:-$HOME/.cache/agl_bridge}"
site="$root/tinker-cookbook-$hash"
if [ "${1:-}" = "--path" ] || [ -f "$site/.agl-ready" ]; then
  echo "$site"
  exit 0
fi
rm -rf "$site"
mkdir -p "$root"
echo "[tinker-cookbook] installing into $site" >&2
"$python_bin" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$site" "${PINS[@]}" 2>&1 \
  | { grep -v "is ignored" || true; } >&2
touch "$site/.agl-ready"
echo "$site"
