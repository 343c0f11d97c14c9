"""A step's plan as nested lists, by the general path: the planner's lists (``laid_out=False``) ordered by
:func:`~megatron_dpsched.core.ordering.order_ranks`, rank by rank. Tests compare the product path,
:func:`~megatron_dpsched.core.planning.plan_step_layout` (arrays, NumPy ordering), with it."""

from __future__ import annotations

from collections.abc import Sequence

from megatron_dpsched.core import planning
from megatron_dpsched.core.balancing import run_sums
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.ordering import order_ranks


def plan_step(
    samples: Sequence[int], *, lengths: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """Per rank, its micro-batches (global sample ids) in run order."""
    ranks, local_costs, _ = planning._plan_positions(samples, lengths=lengths, costs=costs, config=config)
    if config.step_time_model is None:  # step 7 returns its plan in run order
        ranks = order_ranks(ranks, local_costs, config.microbatch_order, run_sums=run_sums)
    return [[[samples[i] for i in mb] for mb in rank] for rank in ranks]


def layout_lists(layout: planning.StepLayout) -> list[RankPlan]:
    """A :data:`~megatron_dpsched.core.planning.StepLayout` as nested lists."""
    per_rank, counts, flat = (part.tolist() for part in layout)
    batches, start = [], 0
    for count in counts:
        batches.append(flat[start:start + count])
        start += count
    ranks, first = [], 0
    for micro_batches in per_rank:
        ranks.append(batches[first:first + micro_batches])
        first += micro_batches
    return ranks
