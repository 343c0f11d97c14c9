"""Megatron-LM RL's sequence packing: next-fit decreasing into bins, bins dealt FIFO.

Read at NVIDIA/Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553:

- ``megatron/rl/sequence_packing_utils.py``, ``SequencePacker.pack_sequences``: sequences sorted by
  length descending go into the current bin while it has room (``bin_size`` tokens) and fewer
  than ``max_sequences_per_bin`` sequences (``--rl-sequence-packing-max-sequences-per-bin``,
  default 50 in ``megatron/training/arguments.py``), else start a new bin: next-fit decreasing.
- ``distribute_packed_bins`` with ``--rl-sequence-packing-algo fifo`` (the default): rank ``r``
  takes a contiguous run of bins, the first ``bins % dp`` ranks one more, and every rank pads
  with empty bins to ``ceil(bins / dp)``.

Megatron-LM packs the whole rollout at once and then slices each rank's bins into steps; here
each step is packed on its own, so every plan trains the same samples in each step. Not
modelled: every bin is a ``bin_size`` tensor, so Megatron-LM also computes its padding. The
count is not VPP-aware there; where it is not legal, ranks run empty micro-batches at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_dpsched.baselines.partition import pad_to_legal
from megatron_dpsched.core.config import RankPlan, ScheduleConfig

MAX_SEQUENCES_PER_BIN = 50
"""Megatron-LM's default ``--rl-sequence-packing-max-sequences-per-bin``."""


def megatron_lm_rl_plan(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """Next-fit decreasing bins, dealt FIFO, padded to the same legal count (module docstring)."""
    bins = next_fit_decreasing(step, sizes, config.token_cap)
    return pad_to_legal(fifo(bins, config.dp_size), config.layout)


def next_fit_decreasing(
    items: Sequence[int], sizes: Sequence[int], cap: int, *, max_per_bin: int = MAX_SEQUENCES_PER_BIN
) -> list[list[int]]:
    """Longest first into the open bin while it has room and fewer than ``max_per_bin`` items."""
    bins: list[list[int]] = []
    fill = 0
    for item in sorted(items, key=lambda i: -sizes[i]):
        if bins and fill + sizes[item] <= cap and len(bins[-1]) < max_per_bin:
            bins[-1].append(item)
            fill += sizes[item]
        else:
            bins.append([item])
            fill = sizes[item]
    return bins


def fifo(bins: list[list[int]], dp: int) -> list[list[list[int]]]:
    """Contiguous runs of bins per rank, the first ``len(bins) % dp`` ranks one bin more."""
    base, extra = divmod(len(bins), dp)
    out, start = [], 0
    for rank in range(dp):
        stop = start + base + (rank < extra)
        out.append(bins[start:stop])
        start = stop
    return out
