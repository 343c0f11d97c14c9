#!/usr/bin/env bash
# Apply (or revert) the megatron-dpsched source patch to Megatron's megatron/training/training.py.
#
# Usage: scripts/apply_megatron_patch.sh [--target DIR] [--check] [--reverse] [--patch FILE]
#
#   --target DIR   a Megatron-LM checkout, a site-packages directory holding megatron/,
#                  or an installed megatron package directory itself
#                  (default: where the interpreter $PYTHON, else $DPSCHED_PYTHON, else the checkout's
#                  .venv/bin/python, else python3, imports megatron.training from)
#   --check        dry run: report whether the patch would apply (or revert), change nothing
#   --reverse      revert a previously applied patch
#   --patch FILE   the patch file (default: patches/megatron_training_dpsched.patch next to this script)
#
# Refuses to apply twice, and to revert a patch that is not applied. Exit status: 0 on
# success, 1 when the patch does not fit the target, 2 on bad usage.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCH="$HERE/../patches/megatron_training_dpsched.patch"
FILE="megatron/training/training.py"
TARGET=""
CHECK=0
REVERSE=0

die() { echo "apply_megatron_patch: error: $1" >&2; exit "${2:-1}"; }
say() { echo "apply_megatron_patch: $1"; }

usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

parse_args() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --target) [[ $# -ge 2 ]] || die "--target needs a directory" 2; TARGET="$2"; shift 2 ;;
      --patch) [[ $# -ge 2 ]] || die "--patch needs a file" 2; PATCH="$2"; shift 2 ;;
      --check) CHECK=1; shift ;;
      --reverse) REVERSE=1; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown argument '$1' (see --help)" 2 ;;
    esac
  done
}

default_target() {
  local python="${PYTHON:-${DPSCHED_PYTHON:-}}" repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
  fi
  command -v "$python" >/dev/null || die "no --target given and '$python' not found (set PYTHON or pass --target)" 2
  "$python" -c 'import os, megatron.training as t; print(os.path.dirname(os.path.dirname(os.path.dirname(t.__file__))))' \
    2>/dev/null || die "no --target given and '$python' cannot import megatron.training (set PYTHON to your Megatron environment's interpreter, or pass --target)" 2
}

# The directory that holds megatron/training/training.py (the patch's paths are relative to it).
resolve_root() {
  local dir="$1"
  [[ -d "$dir" ]] || die "target '$dir' is not a directory" 2
  dir="$(cd "$dir" && pwd)"
  if [[ -f "$dir/$FILE" ]]; then
    echo "$dir"
  elif [[ "$(basename "$dir")" == megatron && -f "$dir/training/training.py" ]]; then
    dirname "$dir"
  else
    die "no $FILE under '$dir' (expected a Megatron-LM checkout, a site-packages directory or a megatron package directory)"
  fi
}

# git apply in ROOT, never in an enclosing repository (a venv inside a git work tree is common).
git_apply() {
  local root="$1"; shift
  (cd "$root" && GIT_CEILING_DIRECTORIES="$(dirname "$root")" git apply "$@" "$PATCH")
}

main() {
  parse_args "$@"
  command -v git >/dev/null || die "git is required (git apply)" 2
  [[ -f "$PATCH" ]] || die "patch file '$PATCH' not found" 2
  PATCH="$(cd "$(dirname "$PATCH")" && pwd)/$(basename "$PATCH")"
  local root
  if [ -z "${TARGET:-}" ]; then TARGET="$(default_target)" || exit 2; fi
  root="$(resolve_root "$TARGET")"
  local forward=() undo=(--reverse) state="already applied" action="apply" done="applied"
  if [[ $REVERSE -eq 1 ]]; then forward=(--reverse); undo=(); state="not applied"; action="revert"; done="reverted"; fi
  if git_apply "$root" --check "${undo[@]}" 2>/dev/null; then
    die "$root/$FILE: the patch is $state; nothing to $action"
  fi
  local why
  if ! why="$(git_apply "$root" --check "${forward[@]}" 2>&1)"; then
    die "the patch does not $action cleanly to $root/$FILE (it fits Megatron-LM core_r0.19.x / megatron-core 0.19.2 and main at 0.20.0, d98e8a6; on megatron-core 0.17.1 and 0.18.2 leave training.py as it is: setup_dp_schedule installs the same hooks at run time, the monkey-patch):
$why"
  fi
  if [[ $CHECK -eq 1 ]]; then
    say "check: the patch would $action cleanly to $root/$FILE"
    return 0
  fi
  git_apply "$root" "${forward[@]}"
  say "$done: $root/$FILE"
}

main "$@"
