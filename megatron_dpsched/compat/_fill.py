"""No empty micro-batches: what slime's and verl's trainers need (this package runs empties as dummies)."""

from __future__ import annotations

from collections.abc import Sequence

from megatron_dpsched.core import DPSchedule
from megatron_dpsched.core.schedule import assemble_schedule


def fill_empty_micro_batches(schedule: DPSchedule) -> DPSchedule:
    """``schedule`` with no empty micro-batch; ``ValueError`` where a step has fewer samples than micro-batches.

    Each empty micro-batch gets the cheapest sample of the micro-batch with the most samples of its own
    rank, else of the busiest rank that has a multi-sample micro-batch; a lone sample, or a subset of a
    micro-batch under the cap, keeps invariant 2.
    """
    if not any(len(mb) == 0 for rank in schedule.micro_batch_indices for mb in rank):
        return schedule
    plans = []
    for step in range(schedule.num_steps):
        ranks = [[list(mb) for mb in schedule.rank_step_micro_batches(r, step)] for r in range(schedule.dp_size)]
        _fill_step(ranks, costs=schedule.costs, step=step)
        plans.append(ranks)
    filled = assemble_schedule(plans, lengths=schedule.lengths, costs=schedule.costs, groups=schedule.groups,
                               config=schedule.config, dropped=list(schedule.dropped))
    filled.check()
    return filled


def _fill_step(ranks: list[list[list[int]]], *, costs: Sequence[float], step: int) -> None:
    """Move samples into the empty micro-batches of one step, in place."""
    for rank in ranks:
        for empty in (mb for mb in rank if not mb):
            donors = [r for r in ranks if any(len(mb) > 1 for mb in r)]
            if not donors:
                total = sum(len(mb) for r in ranks for mb in r)
                raise ValueError(
                    f"step {step} has {total} samples, fewer than the {len(ranks) * len(rank)} micro-batches "
                    f"of its {len(ranks)} data-parallel ranks (dp_size), and every micro-batch must hold one"
                )
            donor = rank if any(r is rank for r in donors) else max(donors, key=lambda r: _load(r, costs))
            source = max((mb for mb in donor if len(mb) > 1), key=len)
            sample = min(source, key=lambda i: costs[i])
            source.remove(sample)
            empty.append(sample)


def _load(rank: list[list[int]], costs: Sequence[float]) -> float:
    return sum(costs[i] for mb in rank for i in mb)
