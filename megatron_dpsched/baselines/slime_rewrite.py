"""slime's rollout-side DP schedule: one first fit per step, split to an aligned count, strided or KK.

Read at THUDM/slime commit 624b824a898ab0ec1fcb4d373004c7f3852bf515:

- ``slime/utils/dp_schedule.py``, ``build_dp_schedule`` and ``_pack_step_into_mbs`` ("pack first,
  distribute second"): the step's samples are first-fit packed in arrival order under
  ``max_tokens_per_gpu * cp_size``; the count is raised to a multiple of
  ``dp * (microbatch_group_size_per_vp_stage if vpp > 1 else 1)`` (at least one such multiple)
  by splitting bins; rank ``r`` takes bins ``r, r + dp, ...`` (``balance_data`` off: ``"slime_strided"``)
  or a Karmarkar-Karp part with equal bin counts on the bins' FLOPs (``balance_data`` on:
  ``"slime_kk"``), its bins in index order.
- ``slime/utils/seqlen_balancing.py``, ``first_fit_pack``, ``expand_bins_by_splitting`` (split the
  bin with the most tokens, the later bin on ties, into two halves by LPT),
  ``get_seqlen_balanced_partitions`` / ``karmarkar_karp``.

The FLOPs are the plan's sample costs (``calculate_fwd_flops`` is a per-sample FLOPs model like
:class:`~megatron_dpsched.CostModel`). Where slime asserts (too few multi-sample bins to split to
the aligned count) this plan adds empty bins. The aligned count per rank is always legal.
Before commit 2f4bd0d8 (May 2026) slime planned per rank (``get_minimum_num_micro_batch_size``:
first-fit count, all-reduced MAX, uncapped KK), close to ``"per_rank_first_fit"``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from megatron_dpsched.baselines.partition import karmarkar_karp, pad_to_legal, round_up
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.packing import first_fit


def slime_strided_plan(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """``balance_data`` off: aligned first-fit bins dealt strided."""
    bins = _aligned_bins(step, sizes, config)
    dp = config.dp_size
    return pad_to_legal([[bins[b] for b in range(r, len(bins), dp)] for r in range(dp)], config.layout)


def slime_kk_plan(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """``balance_data`` on: aligned first-fit bins dealt by equal-count Karmarkar-Karp on their cost."""
    bins = _aligned_bins(step, sizes, config)
    parts = karmarkar_karp([sum(costs[i] for i in b) for b in bins], config.dp_size, equal_size=True)
    return pad_to_legal([[bins[b] for b in part] for part in parts], config.layout)


def _aligned_bins(step: list[int], sizes: Sequence[int], config: ScheduleConfig) -> list[list[int]]:
    layout = config.layout
    align_to = config.dp_size * (layout.group_size if layout.interleaved else 1)
    bins = first_fit(step, sizes, config.token_cap)
    target = round_up(len(bins), align_to)
    split_largest(bins, sizes, target)
    return bins + [[] for _ in range(target - len(bins))]


def split_largest(bins: list[list[int]], sizes: Sequence[int], target: int) -> None:
    """In place: split the multi-sample bin with the most tokens (the later one on ties) until
    there are ``target`` bins or none can be split."""
    heap = [(-sum(sizes[i] for i in b), -k) for k, b in enumerate(bins) if len(b) > 1]
    heapq.heapify(heap)
    while len(bins) < target and heap:
        k = -heapq.heappop(heap)[1]
        halves: list[list[int]] = [[], []]
        loads = [0, 0]
        for item in sorted(bins[k], key=lambda i: -sizes[i]):
            side = 0 if loads[0] <= loads[1] else 1
            halves[side].append(item)
            loads[side] += sizes[item]
        bins[k] = halves[0]
        bins.append(halves[1])
        for index, load in ((k, loads[0]), (len(bins) - 1, loads[1])):
            if len(bins[index]) > 1:
                heapq.heappush(heap, (-load, -index))
