#!/usr/bin/env bash
# The lint/type gate (run by scripts/test.sh before the tests): ruff lint + import order, ruff's format
# check, and mypy over the package. Assumes .venv exists (scripts/setup.sh dev).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "[lint] ruff check, ruff format --check, mypy"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy --no-error-summary
