"""The CPU demo (``scripts/demo.py``) at a very small size: two real Megatron jobs on gloo.

Runs the demo in a subprocess (3 steps of 8 samples, DP=2) and checks what it measured:
both runs trained every step, the dp-schedule run's micro-batch count varies and equals the
plan (sample ids per rank and step), the loss curves agree, and the PNG was written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
LOSS_RTOL = 1e-4


def _run_demo(out: Path, *extra: str) -> tuple[dict, str]:
    cmd = [sys.executable, str(REPO / "scripts" / "demo.py"), "--out", str(out), "--steps", str(STEPS),
           "--global-batch-size", "8", "--max-tokens-per-gpu", "96", "--baseline-micro-batch-size", "2", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text()), proc.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    return _run_demo(tmp_path_factory.mktemp("demo"))


def test_indexed_dataset_corpus_trains_the_same_as_jsonl(demo, tmp_path: Path) -> None:
    """The same corpus written as Megatron's indexed dataset (.bin/.idx) trains identically."""
    indexed, _ = _run_demo(tmp_path, "--data-format", "indexed")
    assert (tmp_path / "corpus.idx").is_file() and not (tmp_path / "corpus.jsonl").exists()
    summary, _ = demo
    assert indexed["plan_matches"]
    assert indexed["micro_batch_counts"] == summary["micro_batch_counts"]
    for run in ("dp-schedule", "baseline"):
        ours = [s["loss"] for s in indexed["results"][run]]
        assert ours == pytest.approx([s["loss"] for s in summary["results"][run]], rel=1e-6), run


def test_both_runs_train_every_step(demo) -> None:
    summary, _ = demo
    for run in ("dp-schedule", "baseline"):
        steps = summary["results"][run]
        assert len(steps) == STEPS, run
        assert all(s["samples"] == 8 for s in steps), run
    tokens = [[sum(s["tokens"]) for s in summary["results"][run]] for run in ("dp-schedule", "baseline")]
    assert tokens[0] == tokens[1], "both runs must train the same loss tokens per step"


def test_dp_schedule_micro_batch_counts_vary_and_follow_the_plan(demo) -> None:
    summary, stdout = demo
    assert summary["plan_matches"], "trained micro-batches differ from the plan"
    counts = summary["micro_batch_counts"]
    assert len(set(counts)) > 1, f"micro-batch count should vary between steps, got {counts}"
    assert [s["micro_batches"][0] for s in summary["results"]["dp-schedule"]] == counts
    assert all(s["micro_batches"] == [2, 2] for s in summary["results"]["baseline"])
    assert "match the plan" in stdout


def test_losses_agree(demo) -> None:
    summary, stdout = demo
    assert summary["max_relative_loss_difference"] < LOSS_RTOL
    assert "max relative loss difference" in stdout


def test_png_written(demo) -> None:
    summary, _ = demo
    png = Path(summary["png"])
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_example_recipes_pass_megatron_validation() -> None:
    """Every examples/ layout passes Megatron's validate_args and the dp-schedule validation."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "check_recipes.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.stdout.count("OK ") == 7
    assert len(proc.stdout.splitlines()) == 7, proc.stdout[-3000:]  # one line per recipe, Megatron's tables muted


def test_runtime_check_benchmark_prints_its_figures() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_runtime_checks.py"), "--samples", "2048",
                           "--dp-size", "16", "--repeats", "1", "--world-sizes", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for label in ("DPSchedule.check()", "DPSchedule.step_fingerprint", "sample check, per sample",
                  "2 processes: all-reduce of 2 integers", "content digest in every step's fingerprint",
                  "per 4k-token sample, a JSONL corpus", "per step of the demo (32 samples, every rank)",
                  "job identity of the demo's arguments", "exchange on 2 processes (all-reduce of 14 integers)"):
        assert label in proc.stdout, proc.stdout
