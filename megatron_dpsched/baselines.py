"""Micro-batch plans as frameworks commonly make them today, for comparison.

Written from their published descriptions, each returns a
:class:`~megatron_dpsched.DPSchedule` so the same ``stats()`` measure all:

- ``"megatron_fixed"``: Megatron's fixed micro-batch size; each rank takes a
  contiguous slice of the step, cut into micro-batches of ``micro_batch_size``
  samples padded to their longest sample. ``micro_batch_size`` is the most
  that keeps a padded micro-batch of the longest sample under the cap.
- ``"per_rank_first_fit"``: each rank first-fits its contiguous slice in
  arrival order under the cap; the micro-batch count is the all-reduced
  maximum, so lighter ranks run empty micro-batches.
- ``"global_first_fit"``: one first-fit of the whole step in arrival order,
  the fullest micro-batches split until the count is a multiple of the DP
  size (and legal), dealt to ranks round-robin.

All use the same VPP alignment as the planner so every plan is runnable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.packing import first_fit, split_to_count
from megatron_dpsched.core.schedule import DPSchedule, assemble_schedule
from megatron_dpsched.core.steps import split_steps

BASELINES = ("megatron_fixed", "per_rank_first_fit", "global_first_fit")


def build_baseline_schedule(
    name: str, lengths: Sequence[int], *, config: ScheduleConfig, costs: Sequence[float] | None = None
) -> DPSchedule:
    """Plan ``lengths`` the way baseline ``name`` would (token-capped config only)."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    if config.token_cap is None:
        raise ValueError("baselines compare token-capped plans: set max_tokens_per_gpu")
    sizes = tuple(int(n) for n in lengths)
    costs = tuple(float(n) for n in sizes) if costs is None else tuple(costs)
    steps, dropped = split_steps(
        len(sizes), global_batch_size=config.global_batch_size, groups=None, drop_last=config.drop_last
    )
    planner = {"megatron_fixed": _megatron_fixed, "per_rank_first_fit": _per_rank_first_fit,
               "global_first_fit": _global_first_fit}[name]
    plans = [planner(step, sizes, config) for step in steps]
    return assemble_schedule(plans, sizes=sizes, costs=costs, groups=None, config=config, dropped=dropped)


def padded_tokens(micro_batch: Sequence[int], sizes: Sequence[int]) -> int:
    """Tokens a micro-batch computes when padded to its longest sample."""
    return len(micro_batch) * max((sizes[i] for i in micro_batch), default=0)


def _rank_slices(step: Sequence[int], dp: int) -> list[list[int]]:
    count = len(step)
    return [list(step[r * count // dp : (r + 1) * count // dp]) for r in range(dp)]


def _megatron_fixed(step: list[int], sizes: Sequence[int], config: ScheduleConfig) -> list[RankPlan]:
    micro_batch_size = max(1, config.token_cap // max(sizes))
    slices = _rank_slices(step, config.dp_size)
    count = config.layout.align(max(math.ceil(len(s) / micro_batch_size) for s in slices))
    plans = []
    for items in slices:
        bins = [items[i : i + micro_batch_size] for i in range(0, len(items), micro_batch_size)]
        plans.append(bins + [[] for _ in range(count - len(bins))])
    return plans


def _per_rank_first_fit(step: list[int], sizes: Sequence[int], config: ScheduleConfig) -> list[RankPlan]:
    packed = [first_fit(items, sizes, config.token_cap) for items in _rank_slices(step, config.dp_size)]
    count = config.layout.align(max(len(bins) for bins in packed))
    return [bins + [[] for _ in range(count - len(bins))] for bins in packed]


def _global_first_fit(step: list[int], sizes: Sequence[int], config: ScheduleConfig) -> list[RankPlan]:
    dp = config.dp_size
    bins = first_fit(step, sizes, config.token_cap)
    count = config.layout.align(math.ceil(len(bins) / dp))
    bins = split_to_count(bins, sizes, count * dp)
    return [bins[r::dp] for r in range(dp)]
