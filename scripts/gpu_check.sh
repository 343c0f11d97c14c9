#!/usr/bin/env bash
# GPU check: trains the GPT entry point (scripts/pretrain_gpt_dpsched.py) on one CUDA GPU for a few dozen
# steps with --dp-schedule and with Megatron's fixed micro-batches on the same samples, then prints
# tokens/s, median step time, peak GPU memory and the loss difference (scripts/gpu_check.py does the work).
#
#   bash scripts/gpu_check.sh [--python PY] [--wheels DIR] [--out DIR] [--steps N] [--cpu] [...]
#
# --python PY  the interpreter whose environment has torch (default: $DPSCHED_PYTHON, else python3);
#              every other option goes to scripts/gpu_check.py (--help lists them). --wheels DIR installs
#              megatron-core and megatron-dpsched from DIR first (no network; torch is never reinstalled).
# Exit status: 0 on success; 2 for a bad option or no CUDA device (before any training); 1 when a run
# fails or the runs disagree. The last line of a failure says why.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${DPSCHED_PYTHON:-python3}"
ARGS=()
die() { echo "gpu_check: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python)   [ $# -ge 2 ] || die "--python needs an interpreter"; PY="$2"; shift 2 ;;
    --python=*) PY="${1#--python=}"; shift ;;
    *)          ARGS+=("$1"); shift ;;
  esac
done
command -v "$PY" >/dev/null 2>&1 || die "--python $PY: no such interpreter (or \$DPSCHED_PYTHON / python3)"
exec "$PY" "$HERE/gpu_check.py" ${ARGS[@]+"${ARGS[@]}"}
