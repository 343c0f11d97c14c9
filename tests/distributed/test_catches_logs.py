"""What the logs and the step records say, each against a one-line bug the rest of the suite let through
(issue 27, "Tests that catch"): the tokens-per-rank mean, the over-cap count by planned size, and the step
records' padded-tokens figures that ``calibrate --lengths padded`` fits. One process, real torch tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from megatron_dpsched import build_dp_schedule
from megatron_dpsched.calibration import samples_from_records
from megatron_dpsched.megatron.collate import CollateConfig
from megatron_dpsched.megatron.feeds import StepBatches
from megatron_dpsched.megatron.plan_log import step_figures
from megatron_dpsched.megatron.step_recorder import StepRecorder

pytestmark = pytest.mark.distributed

LENGTHS = [35, 10, 12, 5, 33, 20, 8, 16]
"""Under a cap of 36 with a pad multiple of 8: samples 0 (35 -> 40) and 4 (33 -> 40) fit the cap by their real
length, not by their planned (padded) one; 168 planned tokens over 2 ranks need at least 3 micro-batches each."""


def _figures() -> dict[str, float]:
    plan = build_dp_schedule(LENGTHS, dp_size=2, global_batch_size=len(LENGTHS), max_tokens_per_gpu=36,
                             pad_multiple=8)
    step = StepBatches(step=0, micro_batches=plan.rank_step_micro_batches(0, 0), num_samples=len(LENGTHS),
                       fingerprint=0, plan=plan)
    return step_figures(step, CollateConfig(format="thd", pad_multiple=8))


def test_the_tokens_per_rank_mean_is_the_steps_real_tokens_over_the_ranks() -> None:
    figures = _figures()
    assert figures["micro-batches"] >= 3
    assert figures["tokens-per-rank-mean"] == sum(LENGTHS) / 2 == 69.5
    assert figures["tokens-per-rank-min"] <= 69.5 <= figures["tokens-per-rank-max"]
    assert figures["tokens-per-rank-min"] + figures["tokens-per-rank-max"] == sum(LENGTHS)


def test_the_over_cap_count_is_by_planned_size() -> None:
    figures = _figures()
    assert figures["over-cap-samples"] == 2  # 35 and 33 real tokens, 40 planned each, over 36
    assert figures["over-cap-longest"] == 35


def _bshd_batch(lengths: list[int], *, width: int, loss: list[int]) -> dict[str, torch.Tensor]:
    """A padded-row micro-batch: one row per sample, ``width`` wide; ``loss[i]`` loss tokens in row ``i``."""
    rows = len(lengths)
    padding = torch.ones(rows, width, dtype=torch.bool)
    loss_mask = torch.zeros(rows, width)
    for row, (length, trained) in enumerate(zip(lengths, loss, strict=True)):
        padding[row, :length] = False
        loss_mask[row, :trained] = 1.0
    return {"tokens": torch.zeros(rows, width, dtype=torch.long), "loss_mask": loss_mask, "padding_mask": padding,
            "sample_ids": torch.arange(rows)}


def test_step_records_hold_padded_positions_and_loss_tokens_apart(tmp_path: Path) -> None:
    """Two micro-batches: rows of 5 and 7 tokens padded to 8 (10 loss tokens), then one row of 3 padded to 4 (2
    loss tokens). Padded tokens are the tensors' positions (16 + 4), loss tokens the mask's (12), and
    ``calibrate --lengths padded`` reads the positions."""
    recorder = StepRecorder(tmp_path, rank=0, ranks={})
    recorder.on_batch(_bshd_batch([5, 7], width=8, loss=[4, 6]))
    recorder.on_batch(_bshd_batch([3], width=4, loss=[2]))
    recorder.write_step(1.5, {}, None, position={"iteration": 0, "consumed_samples": 0})
    (record,) = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert record["tokens"] == 12 and record["padded_tokens"] == 20
    assert record["real_tokens"] == 15 and record["sum_sq_lengths"] == 25 + 49 + 9
    assert record["padded_sum_sq"] == 64 + 64 + 16
    assert record["micro_batch_figures"] == [[12, 74, 16, 128], [3, 9, 4, 16]]
    fitted = {**record, "pp_size": 1, "compute_s": 1.0, "micro_batch_seconds": None}
    (sample,) = samples_from_records([fitted], warmup_steps=0, lengths="padded")
    assert (sample.tokens, sample.sum_sq) == (20, 144)
