#!/usr/bin/env bash
# The test command: sets up a Python 3.12 virtual environment (if needed) with torch, megatron-core and
# the test tools, then runs the linter, the pure unit/property tests and the multi-process gloo tests.
# Usage: bash scripts/test.sh [extra pytest args]
#   no arguments (CI, .ci/run): every test under tests/ (pyproject testpaths), the slow ones included;
#   with arguments (e.g. tests/unit): tests marked slow are skipped (-m "not slow"); a -m of your own
#   replaces that (-m "" runs them all).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$PY" -m ruff check .
if [ "$#" -gt 0 ]; then
  set -- -m "not slow" "$@"   # pytest keeps the last -m it is given
fi
"$PY" -m pytest -q "$@"
