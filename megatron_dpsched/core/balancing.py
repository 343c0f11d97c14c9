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

import numpy as np

from megatron_dpsched.core import padding
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

    Runs of at least :data:`BATCH_RUN` items of equal cost and weight (samples of one length) are dealt at
    once with NumPy (:func:`_deal_run`, the same choices and the same floating-point loads); the other
    items one by one on a heap (:class:`_Heap`). Integral weights and capacity only (token counts, micro-batch
    slots); others go one by one throughout.
    """
    ids = np.fromiter(items, dtype=np.int64) if not isinstance(items, np.ndarray) else items.astype(np.int64)
    if len(ids) == 0:
        return [[] for _ in range(num_ranks)]
    item_costs = np.asarray(costs, dtype=np.float64)[ids]
    item_weights = np.asarray(weights, dtype=np.float64)[ids]
    order = np.lexsort((ids, -item_weights, -item_costs))
    ids, item_costs, item_weights = ids[order], item_costs[order], item_weights[order]
    integral = float(capacity).is_integer() and bool(np.all(item_weights == np.floor(item_weights)))
    changes = np.flatnonzero((item_costs[1:] != item_costs[:-1]) | (item_weights[1:] != item_weights[:-1])) + 1
    starts = np.concatenate(([0], changes, [len(ids)])).tolist()
    smallest_left = np.minimum.accumulate(item_weights[::-1])[::-1]
    owners = np.empty(len(ids), dtype=small_int(num_ranks))
    heap = _Heap(num_ranks, capacity)
    for start, stop in zip(starts[:-1], starts[1:]):
        cost, weight = float(item_costs[start]), float(item_weights[start])
        if not (integral and stop - start >= BATCH_RUN and _deal_run(heap, owners, start, stop, cost=cost,
                                                                     weight=weight)):
            for position in range(start, stop):
                rank = heap.take(cost, weight, float(smallest_left[position]))
                if rank is None:
                    break
                owners[position] = rank
        if heap.failed:
            return None
    by_rank = np.argsort(owners, kind="stable")
    flat = ids[by_rank].tolist()
    bounds = np.cumsum(np.bincount(owners, minlength=num_ranks)).tolist()
    return [flat[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]


BATCH_RUN = 192
"""Runs of at least this many items of equal cost and weight are dealt by :func:`_deal_run`."""


class _Heap:
    """The ranks' loads and used capacity, and a heap of ``(load, rank)`` that yields the lightest rank with
    room. A rank too full for the current item is parked until the items get small enough for it again, so
    a pass costs O(n log n) when weights fall with cost."""

    def __init__(self, num_ranks: int, capacity: float) -> None:
        self.capacity = capacity
        self.loads = [0.0] * num_ranks
        self.used = [0.0] * num_ranks
        self.failed = False
        self.reset()

    def reset(self) -> None:
        """Rebuild the heap from :attr:`loads` (after :func:`_deal_run` changed them)."""
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
            self.failed = True
            return None
        load, rank = heapq.heappop(heap)
        used[rank] += weight
        self.loads[rank] = load = load + cost
        heapq.heappush(heap, (load, rank))
        return rank


@np.errstate(over="ignore", invalid="ignore")  # as Python floats: inf and nan, no warning
def _deal_run(heap: _Heap, owners: np.ndarray, start: int, stop: int, *, cost: float, weight: float) -> bool:
    """Deal items ``start .. stop - 1`` (equal ``cost`` and ``weight``) as :meth:`_Heap.take` would, one after
    the other; ``False`` (nothing changed) when the batch does not apply.

    Taking the lightest rank with room again and again merges the ranks' load sequences ``load, load + cost,
    load + cost + cost, ...`` (as many terms as the rank has room for), so the run's items go to the ``k``
    smallest ``(load, rank)`` terms in order. Each rank's terms are summed one addition at a time, as the
    heap does, and only the few terms around the ``k``-th of an estimated level are generated; if a rank's
    generated terms all got taken (the estimate was short), the run goes item by item instead.
    """
    count = stop - start
    loads, used = np.array(heap.loads), np.array(heap.used)
    slots = np.maximum(np.floor_divide(heap.capacity - used, weight), 0).astype(np.int64)
    if int(np.minimum(slots, count).sum()) < count:
        heap.failed = True  # some item of the run fits nowhere
        return True
    terms = np.minimum(slots, _terms_below(_level(loads, slots, count, cost), loads, slots, cost) + 2)
    width = int(terms.max())
    if width * len(loads) > 4 * count + 8 * len(loads) + 4096:
        return False
    grid = np.full((len(loads), width + 1), cost)
    grid[:, 0] = loads
    np.add.accumulate(grid, axis=1, out=grid)
    mask = np.arange(width)[None, :] < terms[:, None]
    rank_of = np.broadcast_to(np.arange(len(loads))[:, None], mask.shape)[mask]
    chosen = rank_of[np.lexsort((rank_of, grid[:, :width][mask]))[:count]]
    taken = np.bincount(chosen, minlength=len(loads))
    if bool(np.any((taken == terms) & (terms < slots))):
        return False
    owners[start:stop] = chosen
    heap.loads = grid[np.arange(len(loads)), taken].tolist()
    heap.used = (used + taken * weight).tolist()
    heap.reset()
    return True


def _terms_below(level: float, loads: np.ndarray, slots: np.ndarray, cost: float) -> np.ndarray:
    """Per rank, about how many of its terms ``load + t * cost`` are at most ``level`` (within its slots)."""
    below = np.floor((level - loads) / cost) + 1
    return np.clip(below, 0, slots).astype(np.int64)


def _level(loads: np.ndarray, slots: np.ndarray, count: int, cost: float) -> float:
    """A level at which about ``count`` terms are at most it (bisection, to within one term per rank)."""
    low, high = float(loads.min()) - cost, float(loads.max()) + count * cost
    for _ in range(64):
        middle = 0.5 * (low + high)
        below = int(_terms_below(middle, loads, slots, cost).sum())
        if below < count:
            low = middle
        elif below > count + len(loads) and middle != high:
            high = middle
        else:
            return middle
    return high


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
