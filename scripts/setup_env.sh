#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/demo.sh. Sets PY, the interpreter they run:
# * DPSCHED_PYTHON=/path/to/python: an environment you already have (e.g. an NGC PyTorch container with
#   megatron-core installed). Nothing heavy is installed into it: torch and megatron-core must already
#   import; this package (editable) and its small test/demo extras are pip-installed when missing.
# * otherwise a virtual environment at DPSCHED_VENV (default: .venv in the checkout), created on first
#   use with Python 3.12, torch 2.13.0 (a CUDA build that also runs on the CPU), megatron-core 0.19.2
#   and this package.
set -euo pipefail
NEEDED='import megatron.core, torch, hypothesis, psutil, tensorboard, matplotlib, transformers, tokenizers, scipy, megatron_dpsched'
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
if [ -n "${DPSCHED_PYTHON:-}" ]; then
  PY="$DPSCHED_PYTHON"
  if ! "$PY" -c 'import torch, megatron.core' 2>/dev/null; then
    echo "DPSCHED_PYTHON=$PY: torch and megatron-core must already be installed there" >&2
    return 1 2>/dev/null || exit 1
  fi
  if ! "$PY" -c "$NEEDED" 2>/dev/null; then
    echo "installing megatron-dpsched (editable, test and demo extras; no torch, no megatron-core) into $PY"
    "$PY" -m pip install -q -e ".[test,demo]"
  fi
else
  VENV="${DPSCHED_VENV:-$PWD/.venv}"
  PY="$VENV/bin/python"
  if [ ! -x "$PY" ] || ! "$PY" -c "$NEEDED" 2>/dev/null; then
    BASE="$(find_python)"
    echo "setting up $VENV with $BASE (torch 2.13.0, megatron-core 0.19.2; a few minutes on a fresh machine)"
    PYENV_VERSION="${PYENV_VERSION:-3.12.1}" "$BASE" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q torch==2.13.0 megatron-core==0.19.2
    "$PY" -m pip install -q -e ".[test,demo]"
  fi
  # megatron-core appends "+<git hash>" to its __version__ when its folder lies in a git checkout (its
  # package_info.py runs "git rev-parse HEAD" there): in this venv it would report our commit. NO_VCS_VERSION=1
  # is megatron-core's own switch for that; a .pth file sets it whenever this venv's Python starts.
  PTH="$VENV/lib/python3.12/site-packages/megatron_core_no_vcs_version.pth"
  if [ ! -f "$PTH" ]; then
    echo 'import os; os.environ.setdefault("NO_VCS_VERSION", "1")' > "$PTH"
  fi
  export VENV
fi
export PY
