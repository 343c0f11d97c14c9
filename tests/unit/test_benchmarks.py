"""The benchmarks run from a clone (shipped length files only), report, exit 0, and write files only when asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / script), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("script,argv", [
    ("bench_schedule.py", ["--dp", "8", "--caps", "4096", "--steps", "1", "--samples-per-rank", "8"]),
    ("bench_steptime.py", ["--dp", "8", "--caps", "4096", "--steps", "1", "--samples-per-rank", "8"]),
    ("bench_steptime.py", ["--model", "workload", "--dp", "8", "--caps", "4096", "--steps", "1", "--samples-per-rank",
                           "8", "--overhead-scales", "0.1", "--strict", "--no-planning-time", "--kk-reference"]),
])
def test_benchmark_runs_from_a_clone_and_exits_0(tmp_path: Path, script: str, argv: list[str]) -> None:
    before = {p: p.stat().st_mtime_ns for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    proc = _run(script, *argv, "--lengths-dir", str(tmp_path / "absent"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("gsm8k_train", "mt_bench_answers"):  # the shipped files
        assert name in proc.stdout
    assert "alpaca_eval_outputs" not in proc.stdout
    assert "targets" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in before} == before, "a benchmark rewrote README/docs without --markdown"


@pytest.mark.parametrize("script", ["bench_schedule.py", "bench_steptime.py", "bench_baselines.py"])
def test_benchmarks_never_write_the_readme(tmp_path: Path, script: str) -> None:
    help_text = _run(script, "--help", cwd=tmp_path).stdout
    assert "--markdown" in help_text and "--readme" not in help_text
    proc = _run(script, "--readme", str(REPO / "README.md"), cwd=tmp_path)
    assert proc.returncode == 2 and "unrecognized arguments: --readme" in proc.stderr
