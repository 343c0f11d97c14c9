"""Our resume checks run before Megatron's asserts: resuming a ``--dp-schedule`` checkpoint with another
``--global-batch-size`` is refused by the state-file comparison (one line per job naming the planner's change,
exit code 2), before Megatron's ``load_checkpoint`` would assert on its learning-rate scheduler's saved steps.
Real ``torchrun --nproc-per-node 2`` jobs of the entry point (gloo, ``--cpu-dry-run``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from entry import MODEL_BUILT, corpus_rows, errors, tiny_gpt_argv, torchrun
from test_jobline_flags import assert_once_per_job

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed


def _argv(corpus: Path, *extra: str) -> list[str]:
    return [*tiny_gpt_argv(), "--data-path", str(corpus), "--split", "100,0,0", "--lr", "1e-3", "--eval-iters", "0",
            "--ckpt-format", "torch", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", *extra]


def test_resuming_with_another_global_batch_size_is_our_one_line_before_megatrons_assert(tmp_path: Path) -> None:
    corpus = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows(48))
    checkpoint = tmp_path / "checkpoint"
    saved = torchrun(_argv(corpus, "--global-batch-size", "8", "--train-iters", "4", "--save", str(checkpoint),
                           "--save-interval", "2", "--exit-interval", "2"), nproc=2)
    assert saved.returncode == 0, errors(saved.stdout + saved.stderr)
    resumed = torchrun(_argv(corpus, "--global-batch-size", "16", "--train-iters", "3", "--load", str(checkpoint)),
                       nproc=2)
    log = resumed.stdout + resumed.stderr
    (line,) = [text for text in log.splitlines() if text.startswith("dp-schedule: rank 0: resuming iteration 2")]
    assert_once_per_job(resumed, line)
    assert f"resuming iteration 2 of {checkpoint} with other data or options: planner config: " in line
    assert "planner config: 'global_batch_size=8' -> 'global_batch_size=16'. Resume with" in line, line
    assert line.endswith("Resume with what the checkpoint was saved with, or give --dp-schedule-changed-resume "
                         "allow to go on with the changes")
    assert "AssertionError" not in log and "do not match" not in log and "loading checkpoint from" not in log
    assert MODEL_BUILT not in log  # checked where the model is set up, before it is built and Megatron loads
