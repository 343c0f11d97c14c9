"""Save at step N, resume through the entry point: steps N+1.. equal an uninterrupted run.

Real ``torchrun`` jobs of ``scripts/pretrain_gpt_dpsched.py --cpu-dry-run`` with dropout on:
an uninterrupted run of 4 steps, a run that saves a checkpoint at step 2 and exits, and a
run that loads it (so Megatron's provider hands the feed ``consumed_train_samples > 0``)
and trains steps 3 and 4. Per global rank, the resumed steps must train the same sample ids
with the same losses, learning rate, ``consumed_train_samples`` and plan fingerprints, for
DP=2 and PP=2 x VPP=2, with both checkpoint formats, without ``--no-load-rng``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from entry import assert_resumed_like_uninterrupted, corpus_rows, errors, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron.step_recorder import load_step_records

pytestmark = pytest.mark.distributed

TRAIN_ITERS, SAVE_AT, GLOBAL_BATCH = 4, 2, 8
LAYOUTS = {
    "dp2": [],
    "pp2_vpp2": ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"],
}


def _argv(layout: str, corpus: Path, stats: Path, *extra: str) -> list[str]:
    return [*tiny_gpt_argv(num_layers=4), *LAYOUTS[layout], "--data-path", str(corpus),
            "--global-batch-size", str(GLOBAL_BATCH), "--train-iters", str(TRAIN_ITERS), "--lr", "1e-3",
            "--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--eval-iters", "0",
            "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", "--step-stats-dir", str(stats), *extra]


def _run(argv: list[str]) -> str:
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    return log


def _by_rank_and_iteration(stats: Path) -> dict[tuple[int, int], dict]:
    return {(r["rank"], r["iteration"]): r for r in load_step_records(stats)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows(48))


@pytest.fixture(scope="module")
def uninterrupted(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each layout's uninterrupted run, trained on first use."""
    runs: dict[str, dict] = {}

    def get(layout: str) -> dict:
        if layout not in runs:
            stats = tmp_path_factory.mktemp(f"full_{layout}")
            _run(_argv(layout, corpus, stats))
            runs[layout] = _by_rank_and_iteration(stats)
        return runs[layout]

    return get


@pytest.mark.parametrize("ckpt_format", ["torch_dist", "torch"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_resumed_steps_equal_the_uninterrupted_run(corpus, uninterrupted, tmp_path, layout, ckpt_format) -> None:
    checkpoint = tmp_path / "checkpoint"
    first = _run(_argv(layout, corpus, tmp_path / "first", "--save", str(checkpoint), "--save-interval",
                       str(SAVE_AT), "--exit-interval", str(SAVE_AT), "--ckpt-format", ckpt_format))
    assert f"successfully saved checkpoint from iteration {SAVE_AT:7d}" in first
    resumed_log = _run(_argv(layout, corpus, tmp_path / "resumed", "--load", str(checkpoint),
                             "--ckpt-format", ckpt_format))
    full, resumed = uninterrupted(layout), _by_rank_and_iteration(tmp_path / "resumed")
    assert_resumed_like_uninterrupted(full, resumed, save_at=SAVE_AT)
    assert resumed[0, SAVE_AT]["consumed_samples"] == SAVE_AT * GLOBAL_BATCH
    line = re.search(r"dp-schedule: train feed resumes at step (\d+) \(consumed_samples=(\d+)\); .* "
                     r"plan fingerprint (0x[0-9a-f]+)", resumed_log)
    assert line, "the resumed run must say where it resumes"
    assert (int(line.group(1)), int(line.group(2))) == (SAVE_AT, SAVE_AT * GLOBAL_BATCH)
    assert int(line.group(3), 16) == full[0, SAVE_AT]["fingerprint"]


def test_a_load_that_finds_no_checkpoint_says_it_starts_from_scratch(corpus, tmp_path) -> None:
    """A checkpoint whose save failed leaves nothing to load: the run must not look like a resume."""
    (tmp_path / "empty").mkdir()
    log = _run(_argv("dp2", corpus, tmp_path / "stats", "--load", str(tmp_path / "empty")))
    assert f"--load {tmp_path / 'empty'} was given but no checkpoint was loaded (iteration 0)" in log
    assert "dp-schedule: train feed starts at step 0 (consumed_samples=0)" in log
    assert "resumes" not in log
