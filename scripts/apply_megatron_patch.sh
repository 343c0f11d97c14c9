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
#   --patch FILE   the patch file (default: the one for the target's release, next to this script:
#                  patches/megatron_training_dpsched_0.17.patch or _0.18.patch for megatron-core 0.17 / 0.18,
#                  patches/megatron_training_dpsched.patch for 0.19 and main; the release is read from the
#                  target's megatron/core/package_info.py, else the one patch of the three that fits)
#
# Refuses to apply twice, and to revert a patch that is not applied. Exit status: 0 on
# success, 1 when the patch does not fit the target, 2 on bad usage.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCHES="$HERE/../patches"
PATCH=""
FILE="megatron/training/training.py"
TARGET=""
CHECK=0
REVERSE=0

die() { echo "apply_megatron_patch: error: $1" >&2; exit "${2:-1}"; }
say() { echo "apply_megatron_patch: $1"; }

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

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

# MAJOR.MINOR of the megatron-core under ROOT (megatron/core/package_info.py), empty if it has none.
release_of() {
  local info="$1/megatron/core/package_info.py"
  [[ -f "$info" ]] || return 0
  sed -n 's/^MAJOR = \([0-9]*\).*/\1/p; s/^MINOR = \([0-9]*\).*/\1/p' "$info" | paste -sd. -
}

# The patch for ROOT's release: megatron-core 0.17 and 0.18 have their own; without package_info.py (a copy of
# megatron/training alone), the one of the three that applies or reverts.
choose_patch() {
  local root="$1" main="$PATCHES/megatron_training_dpsched.patch" candidate
  case "$(release_of "$root")" in
    0.17|0.18) echo "$PATCHES/megatron_training_dpsched_$(release_of "$root").patch"; return ;;
    "") ;;
    *) echo "$main"; return ;;
  esac
  for candidate in "$main" "$PATCHES/megatron_training_dpsched_0.18.patch" "$PATCHES/megatron_training_dpsched_0.17.patch"; do
    PATCH="$candidate"
    if git_apply "$root" --check 2>/dev/null || git_apply "$root" --check --reverse 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  echo "$main"
}

main() {
  parse_args "$@"
  command -v git >/dev/null || die "git is required (git apply)" 2
  local root
  if [ -z "${TARGET:-}" ]; then TARGET="$(default_target)" || exit 2; fi
  root="$(resolve_root "$TARGET")"
  if [ -z "$PATCH" ]; then PATCH="$(choose_patch "$root")"; fi
  [[ -f "$PATCH" ]] || die "patch file '$PATCH' not found" 2
  PATCH="$(cd "$(dirname "$PATCH")" && pwd)/$(basename "$PATCH")"
  local forward=() undo=(--reverse) state="already applied" action="apply" done="applied"
  if [[ $REVERSE -eq 1 ]]; then forward=(--reverse); undo=(); state="not applied"; action="revert"; done="reverted"; fi
  if git_apply "$root" --check "${undo[@]}" 2>/dev/null; then
    die "$root/$FILE: the patch is $state; nothing to $action"
  fi
  local why
  if ! why="$(git_apply "$root" --check "${forward[@]}" 2>&1)"; then
    die "the patch $(basename "$PATCH") does not $action cleanly to $root/$FILE (megatron_training_dpsched.patch fits Megatron-LM core_r0.19.x / megatron-core 0.19.2 and main at 0.20.0, d98e8a6; megatron_training_dpsched_0.18.patch megatron-core 0.18.2 and megatron_training_dpsched_0.17.patch 0.17.1, picked from the target's megatron/core/package_info.py; elsewhere leave training.py as it is: setup_dp_schedule installs the same hooks at run time, the monkey-patch):
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
