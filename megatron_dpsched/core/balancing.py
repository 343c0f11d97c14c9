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
from collections.abc import Sequence
from itertools import chain

import numpy as np

from megatron_dpsched.core import padding
from megatron_dpsched.core.config import RankPlan
from megatron_dpsched.core.packing import small_int


def lpt_assign(
    items: Sequence[int],
    *,
    costs: Sequence[float],
    weights: Sequence[float],
    capacity: float,
    num_ranks: int,
) -> list[list[int]] | None:
    """:func:`lpt_ranks` with each rank's items as a list."""
    ranks = lpt_ranks(items, costs=costs, weights=weights, capacity=capacity, num_ranks=num_ranks)
    return None if ranks is None else [rank.tolist() for rank in ranks]


def lpt_ranks(
    items: Sequence[int],
    *,
    costs: Sequence[float],
    weights: Sequence[float],
    capacity: float,
    num_ranks: int,
) -> list[np.ndarray] | None:
    """Assign ``items`` to ``num_ranks`` ranks, largest cost first, each to the lightest rank with room; each
    rank's items in the order dealt, as an int64 array (views of one array).

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
        return [ids[:0] for _ in range(num_ranks)]
    item_costs, item_weights = np.asarray(costs, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    whole = isinstance(items, range) and items.start == 0 and items.step == 1
    if not (whole and len(ids) == len(item_costs) == len(item_weights)):
        item_costs, item_weights = item_costs[ids], item_weights[ids]  # else: every item, in order (no copies)
    order = dearest_first(ids, item_costs, item_weights)
    ids, item_costs, item_weights = ids[order], item_costs[order], item_weights[order]
    owners = _deal(item_costs, item_weights, capacity=float(capacity), num_ranks=num_ranks)
    if owners is None:
        return None
    flat = ids[np.argsort(owners, kind="stable")]
    bounds = np.cumsum(np.bincount(owners, minlength=num_ranks)).tolist()
    return [flat[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]


def dearest_first(ids: np.ndarray, item_costs: np.ndarray, item_weights: np.ndarray) -> np.ndarray:
    """``np.lexsort((ids, -item_weights, -item_costs))``: by cost descending, then weight descending, then id.

    When ``ids`` ascend and equal costs have equal weights, it is by cost descending, then position: with at most
    65,536 distinct costs (costs per distinct length) a stable radix sort of each item's dense rank among the
    distinct costs, descending; with more, the positions by descending cost (ties in any order) put in order
    within each run of equal costs by one sort of ``run * count + position``, which is nearly sorted already."""
    count = len(ids)
    if count < 2 or not bool((ids[1:] > ids[:-1]).all()):
        return np.lexsort((ids, -item_weights, -item_costs))
    ascending = np.argsort(item_costs)
    sorted_costs = item_costs[ascending]
    new = sorted_costs[1:] != sorted_costs[:-1]  # NaN: never equal, so no shortcut below
    distinct = int(np.count_nonzero(new)) + 1
    sorted_weights = item_weights[ascending]
    if bool(np.isnan(sorted_costs[-1])) or bool((sorted_weights[1:] != sorted_weights[:-1])[~new].any()):
        return np.lexsort((ids, -item_weights, -item_costs))
    if distinct > 2**16:
        runs = np.concatenate(([0], np.cumsum(new[::-1]))) * count  # along the descending order
        keyed = np.sort(runs + ascending[::-1])
        keyed -= runs
        return keyed
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


def assign_costed(count: int, *, num_ranks: int, bin_costs: np.ndarray | None) -> list[np.ndarray]:
    """Assign ``count`` whole micro-batches to ranks, the same count to each: LPT on their ``bin_costs`` (each a
    :func:`python_sums` of its samples' costs) with a count limit, or (``None``) micro-batch ``i`` to rank
    ``i % num_ranks``. Returns each rank's micro-batch ids as an int64 array."""
    assert count % num_ranks == 0, (count, num_ranks)
    if bin_costs is None:
        return [np.arange(r, count, num_ranks, dtype=np.int64) for r in range(num_ranks)]
    owned = lpt_ranks(range(count), costs=bin_costs, weights=np.ones(count), capacity=count // num_ranks,
                      num_ranks=num_ranks)
    assert owned is not None, "every rank has room for its share of micro-batches"
    return owned


def refine_by_moves(
    plan: list[list[list[int]]],
    *,
    sizes: Sequence[int],
    costs: Sequence[float],
    cap: int,
    max_moves: int,
    padded_rows: bool = False,
) -> float:
    """Move single samples off the busiest rank while that lowers its cost (in place); returns the refined plan's
    :func:`peak_cost` (:func:`refine_laid_out` where the plan's layout is known).

    Each move takes, from the busiest rank, the sample whose move to one of the :data:`TARGETS` lightest ranks
    (ties: the lower rank) lowers the pair's peak most; ties go to the lighter target, then to the sample that
    comes first in the rank's micro-batches. It joins the target's first empty micro-batch, else its first
    with room under ``cap`` (with ``padded_rows``: one more row at the longer of its size and the micro-batch's
    longest). A sample never leaves its micro-batch empty, so micro-batch counts, the cap and oversize samples
    (always alone) are untouched. Every candidate sample is weighed against every target at once with NumPy
    (:class:`_Moves`); loads are running sums, as a one-by-one search keeps them.
    """
    return _refined(plan, sizes=sizes, costs=costs, cap=cap, max_moves=max_moves, padded_rows=padded_rows,
                    layout=None).peak()


PlanLayout = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A plan laid out: each rank's micro-batch count, each micro-batch's sample count and all samples, in plan order."""


def refine_laid_out(
    plan: list[list[list[int]]] | None,
    *,
    sizes: Sequence[int],
    costs: Sequence[float],
    cap: int,
    max_moves: int,
    padded_rows: bool = False,
    layout: PlanLayout,
) -> tuple[float, PlanLayout]:
    """:func:`refine_by_moves` of a plan given as its :data:`PlanLayout` (``plan``: its lists, moved alike, or
    ``None``: none made); returns the refined plan's peak cost and layout."""
    moves = _refined(plan, sizes=sizes, costs=costs, cap=cap, max_moves=max_moves, padded_rows=padded_rows,
                     layout=layout)
    flat = np.concatenate(moves.members) if moves.members else np.zeros(0, dtype=np.int64)
    return moves.peak(flat), (layout[0], moves.counts, flat)


def _refined(
    plan: list[list[list[int]]] | None, *, sizes: Sequence[int], costs: Sequence[float], cap: int, max_moves: int,
    padded_rows: bool, layout: PlanLayout | None,
) -> _Moves:
    """The state of :func:`refine_by_moves` once its moves are made."""
    moves = _Moves(plan, sizes=sizes, costs=costs, cap=cap, padded_rows=padded_rows, layout=layout)
    for _ in range(max_moves):
        if not moves.step():
            break
    return moves


TARGETS = 8
""":func:`refine_by_moves` looks for a move into each of this many lightest ranks."""


class _Moves:
    """:func:`refine_by_moves`' state. Micro-batches are numbered over the whole plan, rank by rank (rank
    ``r``'s from ``first[r]``); per micro-batch its sample count, fill and longest sample; per rank its samples
    in micro-batch order (``members``), its load and its widest room (the largest sample it still takes). The
    plan's lists (``plan``), where given, are moved alike; else the plan is its :data:`PlanLayout` alone."""

    def __init__(self, plan: list[list[list[int]]] | None, *, sizes: Sequence[int], costs: Sequence[float],
                 cap: int, padded_rows: bool, layout: PlanLayout | None) -> None:
        self.plan, self.costs, self.cap, self.padded_rows = plan, costs, cap, padded_rows
        self.size_array = np.asarray(sizes, dtype=np.int64)
        self.cost_array = np.asarray(costs, dtype=np.float64)
        if layout is None:
            assert plan is not None, "a plan or its layout"
            self.first = np.concatenate(([0], np.cumsum([len(rank) for rank in plan]))).tolist()
            self.counts, flat, self.fills, self.longest = padding.micro_batch_arrays(
                list(chain.from_iterable(plan)), self.size_array)
        else:
            self.first = np.concatenate(([0], np.cumsum(layout[0]))).tolist()
            self.counts, flat = layout[1].copy(), layout[2]
            self.fills, self.longest = padding.bin_figures(self.counts, self.size_array[flat])
        per_rank = np.concatenate(([0], np.cumsum(self.counts)))[self.first].tolist()  # each rank's first sample
        self.members = [flat[a:b] for a, b in zip(per_rank[:-1], per_rank[1:])]
        self.loads = run_sums(costs, flat, np.diff(per_rank))
        self.widest = padding.widest_rooms(
            padding.rooms(counts=self.counts, fills=self.fills, longest=self.longest, cap=cap, padded_rows=padded_rows),
            self.first)

    def rooms(self, rank: int) -> np.ndarray:
        """The largest size each micro-batch of ``rank`` still takes (0 or less: none)."""
        at = slice(self.first[rank], self.first[rank + 1])
        return padding.rooms(counts=self.counts[at], fills=self.fills[at], longest=self.longest[at], cap=self.cap,
                             padded_rows=self.padded_rows)

    def peak(self, flat: np.ndarray | None = None) -> float:
        """:func:`peak_cost` of the plan: each rank's ``members`` are its samples in plan order (``flat``: them
        laid end to end, where made)."""
        counts = np.fromiter(map(len, self.members), dtype=np.int64, count=len(self.members))
        flat = np.concatenate(self.members) if flat is None else flat
        return float(run_sums(self.costs, flat, counts).max(initial=0.0))

    def step(self) -> bool:
        """Make the best move off the busiest rank; ``False`` when none lowers its cost."""
        loads = self.loads
        source = int(np.argmax(loads))
        targets = lightest(loads, TARGETS)
        members = self.members[source]
        item_costs, source_load, target_loads = self.cost_array[members], float(loads[source]), loads[targets]
        bins = self.bin_of(source, members)
        # a move needs ``target load + cost < source load``: true for some target only if for the lightest (sums
        # round monotonically), so only those samples are weighed, in their order
        movable = np.flatnonzero((self.counts[self.first[source] + bins] > 1)
                                 & (target_loads[0] + item_costs < source_load))
        if not len(movable):
            return False
        items, item_costs = members[movable], item_costs[movable]
        peaks = np.maximum(source_load - item_costs, target_loads[:, None] + item_costs)
        allowed = (peaks < source_load) & (self.size_array[items] <= self.widest[targets][:, None])
        if not allowed.any():
            return False
        best = int(np.argmin(np.where(allowed, peaks, np.inf)))
        position = int(movable[best % len(items)])
        self.move(source, int(targets[best // len(items)]), position=position, source_bin=int(bins[position]))
        return True

    def bin_of(self, rank: int, items: np.ndarray) -> np.ndarray:
        """The micro-batch (of ``rank``) of each of ``rank``'s ``members``."""
        counts = self.counts[self.first[rank]:self.first[rank + 1]]
        return np.repeat(np.arange(len(counts)), counts)[:len(items)]

    def move(self, source: int, target: int, *, position: int, source_bin: int) -> None:
        """Move the sample at ``position`` of ``source``'s members (in its micro-batch ``source_bin``) into
        ``target``'s first empty micro-batch, else its first with room."""
        members = self.members[source]
        item = int(members[position])
        size, cost = int(self.size_array[item]), self.costs[item]
        fills = self.fills[self.first[target]:self.first[target + 1]]
        empty = np.flatnonzero(fills == 0)
        into = int(empty[0]) if len(empty) else int(np.argmax(self.rooms(target) >= size))
        if self.plan is not None:
            self.plan[source][source_bin].remove(item)
            self.plan[target][into].append(item)
        self.members[source] = np.concatenate((members[:position], members[position + 1:]))
        end = int(self.counts[self.first[target]:self.first[target] + into + 1].sum())
        into_members = self.members[target]
        self.members[target] = np.concatenate((into_members[:end], members[position:position + 1], into_members[end:]))
        for rank, b, sign in ((source, source_bin, -1), (target, into, 1)):
            at = self.first[rank] + b
            self.counts[at] += sign
            self.fills[at] += sign * size
        at = self.first[target] + into
        self.longest[at] = max(int(self.longest[at]), size)
        at = self.first[source] + source_bin
        if size >= self.longest[at]:  # the longest left: its micro-batch's samples read again
            start = int(self.counts[self.first[source]:at].sum())
            self.longest[at] = int(self.size_array[self.members[source][start:start + self.counts[at]]].max())
        self.loads[source] = float(self.loads[source]) - cost
        self.loads[target] = float(self.loads[target]) + cost
        for rank in (source, target):
            self.widest[rank] = int(self.rooms(rank).max(initial=0))


def lightest(loads: np.ndarray, count: int) -> np.ndarray:
    """``np.argsort(loads, kind="stable")[:count]`` without sorting every load: the ranks at or under the
    ``count``-th smallest load, sorted stably (the full sort where fewer than ``count`` loads are comparable)."""
    if len(loads) > count:
        candidates = np.flatnonzero(loads <= np.partition(loads, count - 1)[count - 1])
        if len(candidates) >= count:
            return candidates[np.argsort(loads[candidates], kind="stable")[:count]]
    return np.argsort(loads, kind="stable")[:count]


COMPENSATED_SUM = sum([1e16, 1.0, -1e16]) == 1.0
"""Whether this interpreter's ``sum`` of floats is compensated (Neumaier's, CPython 3.12 on) or sequential."""
WIDEST_RUN = 4096
""":func:`python_sums` sums run by run in Python when a run is longer than this (one NumPy pass per position)."""


def python_sums(values: Sequence[float], runs: Sequence[Sequence[int]]) -> np.ndarray:
    """``[sum(map(values.__getitem__, run)) for run in runs]``, bit for bit, with NumPy: every run's ``k``-th
    value added at once (sequentially, or with Neumaier's compensation as this interpreter's ``sum``). Values
    that are not all Python floats, or a run longer than :data:`WIDEST_RUN`, are summed by Python."""
    counts = np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))
    return run_sums(values, np.fromiter(chain.from_iterable(runs), dtype=np.int64, count=int(counts.sum())), counts)


def run_sums(values: Sequence[float], flat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`python_sums` of runs laid end to end in ``flat`` (``counts``: their lengths)."""
    width = int(counts.max(initial=0))
    if width > WIDEST_RUN or not padding.all_floats(values):
        items, bounds = flat.tolist(), np.cumsum(counts).tolist()
        return np.array([sum(map(values.__getitem__, items[a:b])) for a, b in zip([0, *bounds[:-1]], bounds)],
                        dtype=np.float64)
    flat_values = np.asarray(values, dtype=np.float64)[flat]
    order = np.argsort(-counts, kind="stable")  # longest first: the runs still going at ``k`` are a prefix
    starts, lengths = (np.cumsum(counts) - counts)[order], counts[order]
    total, compensation = np.zeros(len(counts)), np.zeros(len(counts))
    active = np.searchsorted(-lengths, -np.arange(width), side="left")  # how many runs are longer than k
    for k in range(width):
        live = int(active[k])
        x = flat_values[starts[:live] + k]
        if k == 0:
            total[:live] = x
            continue
        head = total[:live]
        t = head + x
        if COMPENSATED_SUM:
            compensation[:live] += np.where(np.abs(head) >= np.abs(x), (head - t) + x, (x - t) + head)
        total[:live] = t
    fix = (compensation != 0) & np.isfinite(compensation)
    total[fix] += compensation[fix]
    out = np.empty(len(counts))
    out[order] = total
    return out


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
    counts, flat = flat_ranks(plan)
    values = np.asarray(costs, dtype=np.float64)
    if not values.size or not values.min() >= 0:
        return range(len(plan))
    totals = np.bincount(np.repeat(np.arange(len(plan)), counts), weights=values[flat], minlength=len(plan))
    peak = totals.max()
    if not math.isfinite(peak):
        return range(len(plan))
    slack = max(1e-9, 8.9e-16 * (int(counts.max()) + 1))  # 4x the error bound of a sequential float64 sum, each side
    return np.flatnonzero(totals >= peak * (1 - slack)).tolist()


def rank_maxima(
    plan: list[RankPlan], values: np.ndarray, *, flat: tuple[np.ndarray, np.ndarray] | None = None
) -> list[float]:
    """Each rank's largest ``values[i]`` over its samples ``i`` (0.0 for a rank without samples); ``flat``:
    :func:`flat_ranks` of ``plan`` where known."""
    counts, flat = flat_ranks(plan) if flat is None else flat
    maxima = np.zeros(len(plan))
    filled = counts > 0
    if flat.size:  # each non-empty rank's samples run from its start to the next non-empty rank's
        maxima[filled] = np.maximum.reduceat(values[flat], (np.cumsum(counts) - counts)[filled])
    return maxima.tolist()


def flat_ranks(plan: list[RankPlan]) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's sample count and every sample of ``plan``, rank by rank, in plan order."""
    counts = np.fromiter(map(sum, map(map, [len] * len(plan), plan)), dtype=np.int64, count=len(plan))
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(plan)), dtype=np.int64, count=int(counts.sum()))
    return counts, flat
