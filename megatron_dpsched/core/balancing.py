"""Handing samples (or micro-batches) to data-parallel ranks, balanced by cost.

The main tool is longest-processing-time-first (LPT) with a capacity per rank:
items in decreasing cost go to the least-loaded rank that still has room.
Working on samples rather than on whole micro-batches leaves only the
smallest samples to settle the last differences, so the busiest rank ends
close to the mean.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from megatron_dpsched.core import padding
from megatron_dpsched.core.packing import target_bin


def lpt_assign(
    items: Sequence[int],
    *,
    costs: Sequence[float],
    weights: Sequence[float],
    capacity: float,
    num_ranks: int,
) -> list[list[int]] | None:
    """Assign ``items`` to ``num_ranks`` ranks, largest cost first, each to the lightest rank with room.

    A rank holds items whose ``weights`` sum to at most ``capacity``. Returns
    ``None`` when some item fits on no rank. A rank too full for the current
    item is parked until the items get small enough for it again, so the
    whole pass costs O(n log n) when weights fall with cost (any cost
    that grows with length).
    """
    order = sorted(items, key=lambda i: (-costs[i], -weights[i], i))
    smallest_left = _suffix_min([weights[i] for i in order])
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    used = [0.0] * num_ranks
    heap = [(0.0, r) for r in range(num_ranks)]
    parked: list[tuple[float, float, int]] = []  # (-room, load, rank)
    previous = float("inf")
    for position, item in enumerate(order):
        weight = weights[item]
        while parked and (weight > previous or -parked[0][0] >= weight):
            _, load, rank = heapq.heappop(parked)
            heapq.heappush(heap, (load, rank))
        previous = weight
        while heap and used[heap[0][1]] + weight > capacity:
            load, rank = heapq.heappop(heap)
            room = capacity - used[rank]
            if room >= smallest_left[position]:
                heapq.heappush(parked, (-room, load, rank))
        if not heap:
            return None
        load, rank = heapq.heappop(heap)
        ranks[rank].append(item)
        used[rank] += weight
        heapq.heappush(heap, (load + costs[item], rank))
    return ranks


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


def _suffix_min(values: list[float]) -> list[float]:
    """``out[k] = min(values[k:])``."""
    out = list(values)
    for k in range(len(out) - 2, -1, -1):
        out[k] = min(out[k], out[k + 1])
    return out


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
