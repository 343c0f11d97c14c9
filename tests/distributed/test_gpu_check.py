"""``scripts/gpu_check.sh`` as a CPU dry run (``--cpu``: gloo, 2 processes, a tiny GPT), and its refusal to
start without a GPU.

The dry run goes through the same flow as on a GPU (corpus from GSM8K lengths, the entry point trained
with ``--dp-schedule`` and with Megatron's fixed micro-batches on the same samples, figures from the step
records, ``summary.json``); only the model size, the device and the process count differ.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = 3
RUNS = ("dp-schedule", "baseline")


def _gpu_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    python = () if env else ("--python", sys.executable)
    return subprocess.run(["bash", str(SCRIPT), *python, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    root = tmp_path_factory.mktemp("gpu_check")
    wheels = root / "wheels"
    wheels.mkdir()
    proc = _gpu_check("--cpu", "--steps", str(STEPS), "--out", str(root / "out"), "--wheels", str(wheels))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((root / "out" / "summary.json").read_text()), proc.stdout, wheels


def test_summary_has_finite_figures_for_both_runs(cpu_run) -> None:
    summary, _, _ = cpu_run
    for run in RUNS:
        figures = summary["runs"][run]
        for name in ("tokens_per_s", "median_step_time_s", "wall_s"):
            assert math.isfinite(figures[name]) and figures[name] > 0, (run, name, figures[name])
        assert len(figures["losses"]) == STEPS and all(math.isfinite(x) for x in figures["losses"]), run
        assert figures["peak_memory_bytes"] is None, "the CPU dry run has no CUDA memory to report"
    assert summary["transformer_impl"] == "local" and summary["collate_format"] == "bshd"


def test_both_runs_train_the_same_loss_tokens(cpu_run) -> None:
    summary, _, _ = cpu_run
    sched, base = (summary["runs"][run] for run in RUNS)
    assert sched["loss_tokens_per_step"] == base["loss_tokens_per_step"]
    assert all(t > 0 for t in sched["loss_tokens_per_step"])
    assert base["micro_batches_per_step"] == [4] * STEPS  # 8 samples, 2 ranks, one sample per micro-batch
    assert sched["padding"] < base["padding"]


def test_losses_agree_and_the_plan_was_trained(cpu_run) -> None:
    summary, _, _ = cpu_run
    assert summary["max_relative_loss_difference"] < 1e-4
    assert summary["plan_matches"]
    assert summary["failures"] == []


def test_prints_the_table(cpu_run) -> None:
    _, stdout, _ = cpu_run
    for label in ("tokens/s (real tokens)", "median step time", "peak GPU memory", "n/a (no CUDA)",
                  "max relative per-step loss difference", "summary.json"):
        assert label in stdout, stdout


def test_wheels_folder_is_not_used_when_the_packages_import(cpu_run) -> None:
    _, stdout, wheels = cpu_run
    assert "already importable; nothing installed" in stdout
    assert list(wheels.iterdir()) == []


def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    env = {**os.environ, "DPSCHED_PYTHON": sys.executable}  # the interpreter from the environment this time
    proc = _gpu_check("--steps", str(STEPS), "--out", str(tmp_path / "out"), env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("gpu_check: error: no CUDA device: torch.cuda.is_available() is False")
    assert len(proc.stderr.splitlines()) == 1 and "--cpu" in proc.stderr
    assert not (tmp_path / "out").exists()
