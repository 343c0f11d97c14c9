"""Handing samples (or micro-batches) to data-parallel ranks, balanced by cost.

The main tool is longest-processing-time-first (LPT) with a capacity per rank:
items in decreasing cost go to the least-loaded rank that still has room.
Working on samples rather than on whole micro-batches leaves only the
smallest samples to settle the last differences, so the busiest rank ends
close to the mean.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from megatron_dpsched.core import padding
from megatron_dpsched.core.config import RankPlan
from megatron_dpsched.core.packing import small_int, target_bin


def lpt_assign(
    items: Sequence[int],
    *,
    costs: Sequence[float],
    weights: Sequence[float],
    capacity: float,
    num_ranks: int,
) -> list[list[int]] | None:
    """Assign ``items`` to ``num_ranks`` ranks, largest cost first, each to the lightest rank with room.

    A rank holds items whose ``weights`` sum to at most ``capacity``. Returns ``None`` when some item
    fits on no rank. Items of equal cost and weight come in index order; ties between ranks go to the
    lower rank. Each item goes to the rank with the smallest ``(load, rank)`` among those with room, a
    rank's load the running sum of its items' costs.

    Up to ``num_ranks`` items at a time are dealt with NumPy (:func:`_deal_block`: the next items to the
    lightest ranks in order, as far as that provably is what the rule does, with the same floating-point
    loads); when a block deals fewer than :data:`BLOCK_MIN`, the next :data:`STRETCH` items go one by one
    on a heap (:class:`_Heap`).
    """
    if isinstance(items, range):
        ids = np.arange(items.start, items.stop, items.step, dtype=np.int64)
    else:
        ids = np.fromiter(items, dtype=np.int64) if not isinstance(items, np.ndarray) else items.astype(np.int64)
    if len(ids) == 0:
        return [[] for _ in range(num_ranks)]
    item_costs = np.asarray(costs, dtype=np.float64)[ids]
    item_weights = np.asarray(weights, dtype=np.float64)[ids]
    order = dearest_first(ids, item_costs, item_weights)
    ids, item_costs, item_weights = ids[order], item_costs[order], item_weights[order]
    owners = _deal(item_costs, item_weights, capacity=float(capacity), num_ranks=num_ranks)
    if owners is None:
        return None
    by_rank = np.argsort(owners, kind="stable")
    flat = ids[by_rank].tolist()
    bounds = np.cumsum(np.bincount(owners, minlength=num_ranks)).tolist()
    return [flat[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]


def dearest_first(ids: np.ndarray, item_costs: np.ndarray, item_weights: np.ndarray) -> np.ndarray:
    """``np.lexsort((ids, -item_weights, -item_costs))``: by cost descending, then weight descending, then id.

    When ``ids`` ascend, equal costs have equal weights and there are at most 65,536 distinct costs (costs per
    distinct length), it is a stable radix sort of each item's dense rank among the distinct costs, descending."""
    count = len(ids)
    if count < 2 or not bool((ids[1:] > ids[:-1]).all()):
        return np.lexsort((ids, -item_weights, -item_costs))
    ascending = np.argsort(item_costs)
    sorted_costs = item_costs[ascending]
    new = sorted_costs[1:] != sorted_costs[:-1]  # NaN: never equal, so no shortcut below
    distinct = int(np.count_nonzero(new)) + 1
    sorted_weights = item_weights[ascending]
    if distinct > 2**16 or bool(np.isnan(sorted_costs[-1])) or bool(
            (sorted_weights[1:] != sorted_weights[:-1])[~new].any()):
        return np.lexsort((ids, -item_weights, -item_costs))
    rank = np.empty(count, dtype=np.uint16)
    rank[ascending] = distinct - 1 - np.concatenate(([0], np.cumsum(new))).astype(np.uint16)
    return np.argsort(rank, kind="stable")


BLOCK_MIN = 32
"""A block (:func:`_deal_block`) that deals fewer items than this hands the next :data:`STRETCH` to the heap."""
STRETCH = 256
"""Items dealt one by one on the heap after a short block."""


def _deal(item_costs: np.ndarray, item_weights: np.ndarray, *, capacity: float, num_ranks: int) -> np.ndarray | None:
    """The rank of each item (in the order given: dearest first), or ``None`` when one fits nowhere."""
    count = len(item_costs)
    smallest_left = np.minimum.accumulate(item_weights[::-1])[::-1]
    owners = np.empty(count, dtype=small_int(num_ranks))
    loads, used = np.zeros(num_ranks), np.zeros(num_ranks)
    block_ok = not bool(np.isnan(item_costs).any())
    position = 0
    while position < count:
        dealt = _deal_block(loads, used, owners, item_costs, item_weights, position=position,
                            capacity=capacity) if block_ok else 0
        position += dealt
        if dealt >= BLOCK_MIN or position == count:
            continue
        heap = _Heap(loads.tolist(), used.tolist(), capacity)
        stop = min(count, position + STRETCH)
        stretch = zip(item_costs[position:stop].tolist(), item_weights[position:stop].tolist(),
                      smallest_left[position:stop].tolist())
        for index, (cost, weight, smallest) in enumerate(stretch, start=position):
            rank = heap.take(cost, weight, smallest)
            if rank is None:
                return None
            owners[index] = rank
        loads, used, position = np.array(heap.loads), np.array(heap.used), stop
    return owners


@np.errstate(over="ignore", invalid="ignore")  # as Python floats: inf, no warning
def _deal_block(loads: np.ndarray, used: np.ndarray, owners: np.ndarray, item_costs: np.ndarray,
                item_weights: np.ndarray, *, position: int, capacity: float) -> int:
    """Deal items from ``position`` on, one to each of the lightest ranks in ``(load, rank)`` order, as long as
    the rule provably picks that rank (in place); returns how many were dealt.

    Item ``i`` of the block goes to the ``i``-th lightest rank ``s_i`` (among ranks with room for the block's
    lightest item) when ``s_i`` has room for it and every rank dealt earlier in the block is now strictly
    heavier than ``s_i``: the ranks after ``s_i`` are no lighter and untouched, the others lack room.
    """
    weights = item_weights[position:position + len(loads)]
    fits = np.flatnonzero(used + weights.min() <= capacity)
    ranks = fits[np.argsort(loads[fits], kind="stable")][:len(weights)]
    if len(ranks) == 0:
        return 0
    weights = weights[:len(ranks)]
    start = loads[ranks]
    new = start + item_costs[position:position + len(ranks)]
    ok = used[ranks] + weights <= capacity
    ok[1:] &= np.minimum.accumulate(new[:-1]) > start[1:]
    dealt = len(ranks) if bool(ok.all()) else int(np.argmin(ok))
    chosen = ranks[:dealt]
    owners[position:position + dealt] = chosen
    loads[chosen] = new[:dealt]
    used[chosen] += weights[:dealt]
    return dealt


class _Heap:
    """The ranks' loads and used capacity, and a heap of ``(load, rank)`` that yields the lightest rank with
    room. A rank too full for the current item is parked until the items get small enough for it again, so
    a pass costs O(n log n) when weights fall with cost."""

    def __init__(self, loads: list[float], used: list[float], capacity: float) -> None:
        self.capacity = capacity
        self.loads = loads
        self.used = used
        self.heap = [(load, rank) for rank, load in enumerate(self.loads)]
        heapq.heapify(self.heap)
        self.parked: list[tuple[float, float, int]] = []  # (-room, load, rank)
        self.previous = float("inf")

    def take(self, cost: float, weight: float, smallest_left: float) -> int | None:
        """The rank an item of ``cost`` and ``weight`` goes to (its load and use updated); ``None`` if none has
        room. ``smallest_left``: the smallest weight of this and every later item."""
        heap, parked, used, capacity = self.heap, self.parked, self.used, self.capacity
        while parked and (weight > self.previous or -parked[0][0] >= weight):
            _, load, rank = heapq.heappop(parked)
            heapq.heappush(heap, (load, rank))
        self.previous = weight
        while heap and used[heap[0][1]] + weight > capacity:
            load, rank = heapq.heappop(heap)
            room = capacity - used[rank]
            if room >= smallest_left:
                heapq.heappush(parked, (-room, load, rank))
        if not heap:
            return None
        load, rank = heapq.heappop(heap)
        used[rank] += weight
        self.loads[rank] = load = load + cost
        heapq.heappush(heap, (load, rank))
        return rank


def assign_bins(
    bins: Sequence[Sequence[int]],
    *,
    costs: Sequence[float],
    num_ranks: int,
    balance: bool,
) -> list[list[int]]:
    """Assign whole micro-batches to ranks, the same count to each.

    With ``balance`` it is LPT with a count limit; without, micro-batch ``i``
    goes to rank ``i % num_ranks``. Returns bin ids per rank.
    """
    assert len(bins) % num_ranks == 0, (len(bins), num_ranks)
    per_rank = len(bins) // num_ranks
    bin_ids = range(len(bins))
    if not balance:
        return [list(bin_ids[r::num_ranks]) for r in range(num_ranks)]
    bin_costs = [sum(costs[i] for i in b) for b in bins]
    return lpt_assign(
        bin_ids, costs=bin_costs, weights=[1.0] * len(bins), capacity=per_rank, num_ranks=num_ranks
    )


def refine_by_moves(
    plan: list[list[list[int]]],
    *,
    sizes: Sequence[int],
    costs: Sequence[float],
    cap: int,
    max_moves: int,
    padded_rows: bool = False,
) -> None:
    """Move single samples off the busiest rank while that lowers its cost (in place).

    A sample moves into a micro-batch of one of the lightest ranks that has room
    for it under ``cap`` (with ``padded_rows``: one more row at the longer of its size and the
    micro-batch's longest); it never leaves its micro-batch empty, so micro-batch
    counts, the cap and oversize samples (always alone) are untouched.
    """
    loads = [sum(costs[i] for mb in rank for i in mb) for rank in plan]
    fills = [[sum(sizes[i] for i in mb) for mb in rank] for rank in plan]
    for _ in range(max_moves):
        place = _placer(plan, fills, sizes=sizes, cap=cap, padded_rows=padded_rows)
        move = _best_move(plan, loads, sizes=sizes, costs=costs, place=place)
        if move is None:
            return
        source, source_bin, item, target, target_bin = move
        plan[source][source_bin].remove(item)
        plan[target][target_bin].append(item)
        fills[source][source_bin] -= sizes[item]
        fills[target][target_bin] += sizes[item]
        loads[source] -= costs[item]
        loads[target] += costs[item]


Placer = Callable[[int], Callable[[int], "int | None"]]
"""``place(rank)(size)``: the micro-batch of ``rank`` a sample of ``size`` would join, or ``None``."""


def _placer(
    plan: list[list[list[int]]], fills: list[list[int]], *, sizes: Sequence[int], cap: int, padded_rows: bool
) -> Placer:
    def place(rank: int) -> Callable[[int], int | None]:
        if padded_rows:
            room = [padding.room(count=len(mb), fill=fill, longest=max((sizes[i] for i in mb), default=0), cap=cap,
                                 padded_rows=True) for mb, fill in zip(plan[rank], fills[rank])]
        else:
            room = [cap - fill for fill in fills[rank]]
        widest = max(room, default=0)
        return lambda size: target_bin(fills[rank], room, size) if size <= widest else None

    return place


def _best_move(
    plan: list[list[list[int]]],
    loads: list[float],
    *,
    sizes: Sequence[int],
    costs: Sequence[float],
    place: Placer,
) -> tuple[int, int, int, int, int] | None:
    """The move from the busiest rank to one of the 8 lightest that lowers the pair's peak most."""
    source = max(range(len(loads)), key=loads.__getitem__)
    best, best_peak = None, loads[source]
    for target in heapq.nsmallest(8, range(len(loads)), key=loads.__getitem__):
        into_target = place(target)
        for source_bin, mb in enumerate(plan[source]):
            if len(mb) < 2:
                continue
            for item in mb:
                peak = max(loads[source] - costs[item], loads[target] + costs[item])
                if peak < best_peak:
                    into = into_target(sizes[item])
                    if into is not None:
                        best, best_peak = (source, source_bin, item, target, into), peak
    return best


def peak_cost(plan: list[RankPlan] | None, costs: Sequence[float]) -> float:
    """The costliest rank's summed cost (Python's ``sum`` of its samples' costs, in plan order)."""
    if plan is None:
        return math.inf
    candidates = _peak_candidates(plan, costs) if len(plan) >= PEAK_VECTOR_RANKS else range(len(plan))
    return max(sum(map(costs.__getitem__, chain.from_iterable(plan[r]))) for r in candidates)


PEAK_VECTOR_RANKS = 64
""":func:`peak_cost` sums every rank with NumPy first from this many ranks."""


def _peak_candidates(plan: list[RankPlan], costs: Sequence[float]) -> Sequence[int]:
    """The ranks whose NumPy-summed cost is within the summation error of the largest: the costliest by
    Python's ``sum`` is among them (costs non-negative and finite, else all ranks)."""
    counts, flat = _flat_ranks(plan)
    values = np.asarray(costs, dtype=np.float64)
    if not values.size or not values.min() >= 0:
        return range(len(plan))
    totals = np.bincount(np.repeat(np.arange(len(plan)), counts), weights=values[flat], minlength=len(plan))
    peak = totals.max()
    if not math.isfinite(peak):
        return range(len(plan))
    slack = max(1e-9, 8.9e-16 * (int(counts.max()) + 1))  # 4x the error bound of a sequential float64 sum, each side
    return np.flatnonzero(totals >= peak * (1 - slack)).tolist()


def rank_maxima(plan: list[RankPlan], values: np.ndarray) -> list[float]:
    """Each rank's largest ``values[i]`` over its samples ``i`` (0.0 for a rank without samples)."""
    counts, flat = _flat_ranks(plan)
    maxima = np.zeros(len(plan))
    filled = counts > 0
    if flat.size:  # each non-empty rank's samples run from its start to the next non-empty rank's
        maxima[filled] = np.maximum.reduceat(values[flat], (np.cumsum(counts) - counts)[filled])
    return maxima.tolist()


def _flat_ranks(plan: list[RankPlan]) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's sample count and every sample of ``plan``, rank by rank, in plan order."""
    counts = np.fromiter((sum(map(len, rank)) for rank in plan), dtype=np.int64, count=len(plan))
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(plan)), dtype=np.int64, count=int(counts.sum()))
    return counts, flat
