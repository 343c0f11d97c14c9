"""``scripts/gpu_check.sh`` refuses bad options with one line naming the option and exit status 2, before it
imports torch or trains anything (the driver parses its options with the standard library only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"

BAD = [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--steps", "x"], "argument --steps: invalid int value"),
    (["--steps", "3", "--warmup-steps", "3"], "--warmup-steps"),
    (["--steps", "1000"], "--steps x --global-batch-size must be at most 7473"),
    (["--cpu", "--global-batch-size", "7"], "--global-batch-size must be a multiple of 2"),
    (["--seq-length", "4"], "--seq-length must be >= 8"),
    (["--max-tokens-per-gpu", "0"], "--max-tokens-per-gpu must be >= 1"),
    (["--loss-rtol", "nan"], "--loss-rtol"),
    (["--transformer-impl", "fast"], "argument --transformer-impl: invalid choice"),
    (["--cpu", "--transformer-impl", "transformer_engine"], "--transformer-impl transformer_engine needs a GPU"),
    (["--wheels", "MISSING"], "--wheels"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--step", "3"], "unrecognized arguments: --step 3"),  # no abbreviations
    (["--python", "/nonexistent/python3"], "--python /nonexistent/python3: no such interpreter"),
    (["--python"], "--python needs an interpreter"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(args) for args, _ in BAD])
def test_bad_option_exits_2_with_one_line_naming_it(args: list[str], message: str, tmp_path: Path) -> None:
    args = [str(tmp_path / "no-such-folder") if a == "MISSING" else a for a in args]
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, "--out", str(out), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("gpu_check: error: ") and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_help_lists_the_options() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for option in ("--cpu", "--wheels", "--out", "--steps", "--seq-length", "--loss-rtol", "--python PY"):
        assert option in proc.stdout
