#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/demo.sh: creates .venv (Python 3.12) with torch 2.13.0,
# megatron-core 0.19.2 and this package (editable) unless it is already there. Sets VENV.
set -euo pipefail
VENV="${DPSCHED_VENV:-$PWD/.venv}"
find_python() {
  for candidate in python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && PYENV_VERSION="${PYENV_VERSION:-3.12.1}" "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "megatron-dpsched needs Python 3.12 (megatron-core 0.19 requires it); none found" >&2
  return 1
}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import megatron.core, torch, hypothesis, psutil, tensorboard, transformers, tokenizers, megatron_dpsched' 2>/dev/null; then
  PY="$(find_python)"
  echo "setting up $VENV with $PY (torch 2.13.0, megatron-core 0.19.2; a few minutes on a fresh machine)"
  PYENV_VERSION="${PYENV_VERSION:-3.12.1}" "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q torch==2.13.0 megatron-core==0.19.2
  "$VENV/bin/python" -m pip install -q -e ".[test,demo]"
fi
export VENV
