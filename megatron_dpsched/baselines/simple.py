"""Megatron's fixed micro-batches and two first-fit plans (this project's earlier comparison baselines)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.packing import first_fit, split_to_count


def rank_slices(step: Sequence[int], dp: int) -> list[list[int]]:
    """Contiguous, near-equal slices of a step, one per rank (how a sampler deals a global batch)."""
    count = len(step)
    return [list(step[r * count // dp : (r + 1) * count // dp]) for r in range(dp)]


def fixed_micro_batch_size(sizes: Sequence[int], *, config: ScheduleConfig) -> int:
    """The micro-batch size a Megatron user would pick: the largest that Megatron accepts
    (``global_batch_size % (micro_batch_size x dp_size) == 0``) and that keeps a micro-batch of
    the longest sample, padded, under the cap; 1 when none does (a sample longer than half the
    cap, or a global batch that is not a multiple of DP, which Megatron refuses at any size)."""
    limit = max(1, config.token_cap // max(sizes))
    per_rank = config.global_batch_size // config.dp_size
    if config.global_batch_size % config.dp_size:
        return 1
    return max(size for size in range(1, min(limit, per_rank) + 1) if per_rank % size == 0)


def megatron_fixed(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig,
    micro_batch_size: int | None = None,
) -> list[RankPlan]:
    """Megatron's fixed micro-batch size: each rank cuts its contiguous slice into micro-batches
    of ``micro_batch_size`` samples (default: :func:`fixed_micro_batch_size`)."""
    micro_batch_size = micro_batch_size or fixed_micro_batch_size(sizes, config=config)
    slices = rank_slices(step, config.dp_size)
    count = config.layout.align(max(math.ceil(len(s) / micro_batch_size) for s in slices))
    plans = []
    for items in slices:
        bins = [items[i : i + micro_batch_size] for i in range(0, len(items), micro_batch_size)]
        plans.append(bins + [[] for _ in range(count - len(bins))])
    return plans


def per_rank_first_fit(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """Each rank first-fits its contiguous slice in arrival order; the count is the all-reduced maximum."""
    packed = [(short_first_fit if len(items) <= SHORT_SLICE else first_fit)(items, sizes, config.token_cap)
              for items in rank_slices(step, config.dp_size)]
    count = config.layout.align(max(len(bins) for bins in packed))
    return [bins + [[] for _ in range(count - len(bins))] for bins in packed]


SHORT_SLICE = 256
"""Up to this many samples, :func:`short_first_fit` packs a slice (faster than the segment tree there)."""


def short_first_fit(items: Sequence[int], sizes: Sequence[int], cap: int) -> list[list[int]]:
    """:func:`~megatron_dpsched.core.packing.first_fit`'s micro-batches, found by scanning the open ones' rooms
    in order (a sample over the cap gets its own micro-batch, which stays full)."""
    bins: list[list[int]] = []
    rooms: list[int] = []
    for item in items:
        size = sizes[item]
        for position, room in enumerate(rooms):
            if room >= size:
                bins[position].append(item)
                rooms[position] = room - size
                break
        else:
            bins.append([item])
            rooms.append(cap - size if size <= cap else -1)
    return bins


def global_first_fit(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """One first fit of the whole step, the fullest micro-batches split to a legal multiple of
    the DP size, dealt round-robin."""
    dp = config.dp_size
    bins = first_fit(step, sizes, config.token_cap)
    count = config.layout.align(math.ceil(len(bins) / dp))
    bins = split_to_count(bins, sizes, count * dp)
    return [bins[r::dp] for r in range(dp)]
