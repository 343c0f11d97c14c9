"""Quiet mode (``--quiet``, ``DPSCHED_QUIET=1``): Megatron's argument dump and per-step lines are hidden; the
plugin's lines, warnings, errors and the last step's line are kept. A real ``torchrun --nproc-per-node 2`` job of
the entry point (gloo, ``--cpu-dry-run``) and the line filter itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from entry import corpus_rows, errors, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron.quiet import kept

pytestmark = pytest.mark.distributed

ARGUMENT_DUMP = "------------------------ arguments ------------------------"


@pytest.mark.parametrize(("line", "shown"), [
    (ARGUMENT_DUMP, False),
    ("  accumulate_allreduce_grads_in_fp32 .............. False", False),
    (" [2026-12-05 09:00:00] iteration        1/       2 | consumed samples: 8 |", False),
    (" [2026-12-05 09:00:00] iteration        2/       2 | consumed samples: 16 |", True),
    (" dp-schedule step 0: 4 micro-batches | tokens/rank mean 40", False),
    ("dp-schedule: every rank agrees on the job (--dp-schedule) in 3 ms", True),
    ("dp-schedule: WARNING: 2 sample(s) of the train dataset are over the token cap", True),
    ("  [2026-12-05 09:00:00] successfully saved checkpoint from iteration       2 to /c", True),
    ("  error_injection_rate ............................ 0", False),
    ("rollout 0: 20 samples", False),
])
def test_the_quiet_filter_keeps_our_lines_warnings_and_the_last_step(line: str, shown: bool) -> None:
    assert kept(line) is shown
    assert kept("rollout 0: 20 samples", keep=("rollout ",))


def test_the_entry_point_runs_quiet(tmp_path: Path) -> None:
    corpus = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows(48))
    argv = [*tiny_gpt_argv(), "--data-path", str(corpus), "--split", "100,0,0", "--global-batch-size", "8",
            "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--dp-schedule",
            "--dp-schedule-max-tokens-per-gpu", "32", "--dp-schedule-collate-format", "bshd"]
    loud = torchrun(argv, nproc=2)
    proc = torchrun([*argv, "--quiet"], nproc=2)
    assert loud.returncode == 0 and proc.returncode == 0, errors(proc.stdout + proc.stderr)
    assert ARGUMENT_DUMP in loud.stdout and ARGUMENT_DUMP not in proc.stdout
    assert "iteration        1/       2" in loud.stdout and "iteration        1/       2" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert any("iteration        2/       2 |" in line for line in lines), proc.stdout
    assert any(line.startswith("dp-schedule: every rank agrees on the job") for line in lines), proc.stdout
    assert any(line.startswith("dp-schedule: WARNING: 2 sample(s) of the train dataset are over the token cap")
               for line in lines), proc.stdout
    assert not any(line.lstrip().startswith("dp-schedule step ") for line in lines), proc.stdout
    assert not any(" ....... " in line for line in lines), proc.stdout
    assert len(lines) < 12 < len(loud.stdout.splitlines()) // 20, proc.stdout


def test_the_rl_example_runs_quiet(tmp_path: Path) -> None:
    """``examples/rl_controller.py --quiet``: the spawned trainers inherit ``DPSCHED_QUIET`` and drop Megatron's
    argument dump; the controller's own lines stay."""
    import os
    import subprocess
    import sys

    from entry import REPO

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "rl_controller.py"), "--out", str(tmp_path / "out"),
                           "--rollouts", "1", "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, errors(proc.stdout + proc.stderr)
    lines = proc.stdout.splitlines()
    assert ARGUMENT_DUMP not in proc.stdout and not any(" ....... " in line for line in lines), proc.stdout
    ours = [line for line in lines if "WARNING" not in line]  # Megatron's warnings stay
    assert [line.split(" ")[:2] for line in ours] == [["dp-schedule:", "every"], ["dp-schedule:", "train"],
                                                      ["rollout", "0:"], ["trained", "rollouts"],
                                                      ["saved:", "plans"]], proc.stdout
