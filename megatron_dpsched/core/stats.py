"""Per-step figures of a plan: the numbers the benchmark and the logs print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron_dpsched.core.padding import planned_sizes
from megatron_dpsched.core.planning import lower_bound_microbatches

if TYPE_CHECKING:
    from megatron_dpsched.core.schedule import DPSchedule


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """What one optimizer step of a plan costs and how evenly it is spread."""

    step: int
    """Step index."""
    num_samples: int
    """Samples trained in the step over all ranks."""
    num_microbatches: int
    """Micro-batches per rank."""
    lower_bound: int
    """Fewest legal micro-batches per rank any plan could run (aligned lower bound)."""
    empty_microbatches: int
    """Empty micro-batches over all ranks (zero-weight dummies)."""
    tokens: int
    """Real tokens in the step."""
    token_fill: float
    """Tokens that fit the cap / (micro-batches x token cap): an oversize sample counts as one
    full micro-batch. 0 for static batching."""
    rank_tokens: tuple[int, ...]
    """Tokens per rank."""
    rank_costs: tuple[float, ...]
    """Estimated cost per rank."""
    imbalance: float
    """Busiest rank's cost / mean rank cost."""
    imbalance_bound: float
    """No plan can beat ``max(1, dearest sample / mean rank cost)``."""
    token_imbalance: float
    """Busiest rank's tokens / mean rank tokens."""
    capacity_bound: float
    """No plan with this many micro-batches per rank can beat this ``token_imbalance``: under a
    binding cap, ranks reach the mean only through the excess of their oversize samples (see
    :func:`capacity_load_bound`)."""

    @property
    def relative_imbalance(self) -> float:
        """``imbalance / imbalance_bound``: 1.0 is the best possible."""
        return self.imbalance / self.imbalance_bound


def schedule_stats(schedule: DPSchedule) -> list[StepStats]:
    """Figures for every step of ``schedule``."""
    return [step_stats(schedule, step) for step in range(schedule.num_steps)]


def step_stats(schedule: DPSchedule, step: int) -> StepStats:
    """Figures for step ``step`` of ``schedule``."""
    config, lengths, costs = schedule.config, schedule.lengths, schedule.costs
    per_rank = [schedule.rank_step_micro_batches(r, step) for r in range(schedule.dp_size)]
    rank_tokens = tuple(sum(lengths[i] for mb in rank for i in mb) for rank in per_rank)
    rank_costs = tuple(sum(costs[i] for mb in rank for i in mb) for rank in per_rank)
    samples = [i for rank in per_rank for mb in rank for i in mb]
    count = schedule.num_microbatches[step]
    mean_cost = sum(rank_costs) / len(rank_costs)
    cap = config.token_cap
    tokens = sum(rank_tokens)
    return StepStats(
        step=step,
        num_samples=len(samples),
        num_microbatches=count,
        lower_bound=lower_bound_microbatches(
            planned_sizes([lengths[i] for i in samples], pad_multiple=config.pad_multiple), config=config
        ),
        empty_microbatches=sum(1 for rank in per_rank for mb in rank if not mb),
        tokens=tokens,
        token_fill=0.0 if cap is None else _capped_tokens(per_rank, lengths, cap) / (count * schedule.dp_size * cap),
        rank_tokens=rank_tokens,
        rank_costs=rank_costs,
        imbalance=max(rank_costs) / mean_cost,
        imbalance_bound=max(1.0, max(costs[i] for i in samples) / mean_cost),
        token_imbalance=max(rank_tokens) * schedule.dp_size / tokens,
        capacity_bound=capacity_load_bound(
            [lengths[i] for i in samples], dp_size=schedule.dp_size, num_microbatches=count, cap=cap
        ) * schedule.dp_size / tokens,
    )



def _capped_tokens(per_rank: list, lengths: tuple[int, ...], cap: int) -> int:
    return sum(min(cap, sum(lengths[i] for i in mb)) for rank in per_rank for mb in rank)


def capacity_load_bound(lengths: list[int], *, dp_size: int, num_microbatches: int, cap: int | None) -> float:
    """A lower bound on the busiest rank's tokens when every rank runs ``num_microbatches`` capped micro-batches.

    A rank carries at most ``M * cap`` tokens plus the excess ``length - cap`` of the oversize
    samples it holds, and excess beyond what lifts it to the level ``L`` is wasted. So ``L`` is
    feasible only if ``total - dp * M * cap <= sum(min(L - M * cap, excess))`` over oversize
    samples; the smallest such ``L`` (and at least the mean and the longest sample) is returned.
    """
    total = sum(lengths)
    level = max(total / dp_size, max(lengths))
    if cap is None:
        return level
    room = num_microbatches * cap
    shortfall = total - dp_size * room
    excess = [length - cap for length in lengths if length > cap]

    def feasible(candidate: float) -> bool:
        return shortfall <= sum(min(candidate - room, e) for e in excess)

    if shortfall <= 0 or feasible(level):
        return level
    low, high = level, level + total
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (low, middle) if feasible(middle) else (middle, high)
    return high
