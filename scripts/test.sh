#!/usr/bin/env bash
# The test command: sets up a Python 3.12 virtual environment (if needed) with torch, megatron-core and
# the test tools, then runs the linter, the pure unit/property tests and the multi-process gloo tests.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$PY" -m ruff check .
"$PY" -m pytest -q "$@"   # no arguments: every test under tests/ (pyproject testpaths)
