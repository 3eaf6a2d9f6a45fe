#!/usr/bin/env bash
# Creates .venv (once) and installs agl_bridge with the given extras ("core": none), offline-friendly and pinned:
# torch first (the CPU build), then the safety pins hash-checked (safety-pins.txt: pip verifies every
# file against its sha256), then everything else under constraints.txt so nothing backtracks.
# Re-running is cheap: the install is skipped while pyproject.toml and the pin files are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
package="."
[ "$extras" = core ] || package=".[$extras]"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($python_bin --version)"
  "$python_bin" -m venv .venv
fi
# --no-compile: byte-compiling every module of torch, transformers and litellm at install time was a
# large part of the first install; Python compiles the modules a run imports, once, on first import.
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile)
stamp=".venv/.agl-installed-$extras-$(cat pyproject.toml constraints.txt safety-pins.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing torch (CPU build) and agl_bridge ($extras) — a few minutes on first run"
  "${pip[@]}" "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  # Not filtered or masked like the others: a hash mismatch must stop the install.
  "${pip[@]}" --require-hashes --no-deps -r safety-pins.txt
  "${pip[@]}" -c constraints.txt -e "$package" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import agl_bridge, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  rm -f .venv/.agl-installed-"$extras"-*
  touch "$stamp"
fi
