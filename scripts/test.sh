#!/usr/bin/env bash
# The test command: sets up a Python 3.12 virtual environment (if needed) with torch, megatron-core and
# the test tools, then runs the linter, the pure unit/property tests and the multi-process gloo tests.
# Usage: bash scripts/test.sh [--quick | extra pytest args]
#   no arguments (CI, .ci/run): every test under tests/ (pyproject testpaths), the slow ones included;
#   --quick: the quick check, ruff and tests/unit without the slow tests (no multi-process test);
#   with arguments (e.g. tests/unit): tests marked slow are skipped (-m "not slow"); a -m of your own
#   replaces that (-m "" runs them all).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  shift
  set -- tests/unit "$@"
fi
source scripts/setup_env.sh
# The other megatron-core releases CI trains on (tests/distributed/test_releases.py), each installed apart once,
# without dependencies (they run on this environment's torch), in DPSCHED_RELEASES_DIR/<version>.
export DPSCHED_RELEASES_DIR="${DPSCHED_RELEASES_DIR:-${VENV:-$PWD/.venv}/megatron-releases}"
for version in 0.17.1 0.18.2; do
  if [ ! -f "$DPSCHED_RELEASES_DIR/$version/megatron/training/training.py" ]; then
    echo "installing megatron-core $version apart into $DPSCHED_RELEASES_DIR/$version (--no-deps)"
    "$PY" -m pip install -q --no-deps --target "$DPSCHED_RELEASES_DIR/$version" "megatron-core==$version"
  fi
done
"$PY" -m ruff check .
if [ "$#" -gt 0 ]; then
  set -- -m "not slow" "$@"   # pytest keeps the last -m it is given
fi
"$PY" -m pytest -q "$@"
