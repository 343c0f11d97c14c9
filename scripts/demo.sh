#!/usr/bin/env bash
# CPU demo: a real Megatron training job (torchrun, 2 processes, gloo) on a tiny GPT, once with
# --dp-schedule and once without, on sample lengths from GSM8K. A few minutes on 2 cores.
# Creates .venv on a fresh machine (scripts/setup_env.sh). Options: scripts/demo.py --help.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
exec "$PY" scripts/demo.py "$@"
