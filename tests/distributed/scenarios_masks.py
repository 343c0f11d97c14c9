"""Masked samples: a JSONL corpus with loss masks (``{"tokens", "loss_mask"}`` and ``{"input_ids", "labels"}``
rows) read by the project's reader, trained with Megatron's real ``train()`` (bshd and thd), against a
one-process whole-batch reference whose micro-batch is built here by hand from the same mask lists.

The reference goes through neither the project's reader nor its collate: its tokens come from
``harness.make_sample`` and its loss mask from :func:`token_mask`, written out per position.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import harness
import torch
from harness import GLOBAL_BATCH, LENGTHS, TRAIN_ITERS, Layout
from registry import scenario
from scenarios import FeedCase, run_training
from scenarios_layouts import ROPE


def token_mask(sample_id: int) -> list[int]:
    """Which of the ``LENGTHS[i] + 1`` tokens of sample ``i`` are targets: every third is not, and sample 5
    (two positions) trains none."""
    count = LENGTHS[sample_id] + 1
    if sample_id == 5:
        return [0] * count
    return [0 if (j + sample_id) % 3 == 0 else 1 for j in range(count)]


def _row(sample_id: int) -> dict[str, list[int]]:
    """Even samples as ``tokens`` + ``loss_mask``, odd ones as Hugging Face ``input_ids`` + ``labels``."""
    sample = harness.make_sample(sample_id)
    ids = [*sample["tokens"].tolist(), int(sample["labels"][-1])]
    mask = token_mask(sample_id)
    if sample_id % 2 == 0:
        return {"tokens": ids, "loss_mask": mask}
    return {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask, strict=True)]}


def masked_corpus() -> Any:
    """The project's reader on a JSONL file of every sample (one file per process)."""
    from megatron_dpsched.data import TokenJsonlDataset, write_token_jsonl

    folder = Path(tempfile.mkdtemp(prefix=f"masked-rank{torch.distributed.get_rank()}-{os.getpid()}-"))
    return TokenJsonlDataset(write_token_jsonl(folder / "masked.jsonl", [_row(i) for i in range(len(LENGTHS))]))


def scheduled_feed(args: Any, num_chunks: int) -> Any:
    """The dp-schedule feed over :func:`masked_corpus`, as ``build_feed`` makes it."""
    from megatron.core import parallel_state

    from megatron_dpsched.megatron import ScheduledDatasetLoader, plan_setup_from_args
    from megatron_dpsched.megatron.provider import collate_config_from_args

    data = masked_corpus()
    setup = plan_setup_from_args(args, data_parallel_size=parallel_state.get_data_parallel_world_size())
    return ScheduledDatasetLoader(
        data, lengths=data.lengths, rank=parallel_state.get_data_parallel_rank(), config=setup.config,
        cost_model=setup.cost_model,
        num_chunks=num_chunks, collate=collate_config_from_args(args), verify=args.dp_schedule_verify)


def hand_made_batch(sample_ids: list[int]) -> dict[str, Any]:
    """One padded micro-batch of ``sample_ids``, its loss mask written position by position from the masks."""
    width = max(LENGTHS[i] for i in sample_ids)
    tokens = torch.zeros(len(sample_ids), width, dtype=torch.long)
    labels = torch.zeros_like(tokens)
    mask = torch.zeros(len(sample_ids), width)
    for row, sample_id in enumerate(sample_ids):
        sample, targets = harness.make_sample(sample_id), token_mask(sample_id)
        for position in range(LENGTHS[sample_id]):
            tokens[row, position] = sample["tokens"][position]
            labels[row, position] = sample["labels"][position]
            mask[row, position] = float(targets[position + 1])  # position j predicts token j + 1
    return {"tokens": tokens, "labels": labels, "loss_mask": mask, "attention_mask": None,
            "padding_mask": torch.arange(width)[None] >= torch.tensor([LENGTHS[i] for i in sample_ids])[:, None],
            "position_ids": torch.arange(width).expand(len(sample_ids), width).clone(),
            "sample_ids": torch.tensor(sample_ids)}


def reference_feed(args: Any, num_chunks: int) -> Any:
    """Every step one micro-batch of all its samples, built by :func:`hand_made_batch`."""
    from megatron_dpsched.megatron.feeds import StepBatches, StepFeed

    class _Reference(StepFeed):
        dp_size = 1
        start_position = 0

        def __init__(self) -> None:
            super().__init__(verify="strict")
            self.next_step = 0

        def load_sample(self, sample_id: int) -> Any:
            raise AssertionError("the reference builds its micro-batches by hand")

        def planned_length(self, sample_id: int) -> int:
            return LENGTHS[sample_id]

        def micro_batch(self, index: int) -> dict[str, Any]:
            assert self.current is not None and index == 0
            return hand_made_batch(list(self.current.micro_batches[0]))

        def _plan_next_step(self) -> StepBatches:
            step, self.next_step = self.next_step, self.next_step + 1
            assert step < TRAIN_ITERS
            ids = tuple(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))
            return StepBatches(step=step, micro_batches=(ids,), num_samples=GLOBAL_BATCH, fingerprint=step)

    return _Reference()


MASKED_LAYOUTS = {"masked_bshd_dp2": Layout(), "masked_thd_dp2": Layout(collate="thd", extra=ROPE)}
MASKED_REFERENCES = {"masked_reference": Layout(), "masked_reference_rope": Layout(extra=ROPE)}


@scenario(world_size=2, launch="masked2", cases=MASKED_LAYOUTS, tags={"masked"})
def train_masked(layout: Layout) -> dict[str, Any]:
    """Tag ``masked``: the project's reader and collate on the masked corpus."""
    return run_training(FeedCase(layout=layout, make_feed=scheduled_feed))


@scenario(world_size=1, launch="masked1", cases=MASKED_REFERENCES)
def reference_masked(layout: Layout) -> dict[str, Any]:
    """One process, every step one hand-made micro-batch of all its samples."""
    return run_training(FeedCase(layout=layout, feed="whole_batch", make_feed=reference_feed))
