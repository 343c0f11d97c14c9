"""Cost-equal packing of one rank's samples into ``k`` micro-batches (largest differencing, under the token cap).

Step 4 packs a rank's samples by tokens (:func:`~megatron_dpsched.core.packing.pack_into`: worst fit
decreasing, the lightest micro-batch first), which evens tokens, not time: a micro-batch of one long
sample costs more than one of many short samples with the same tokens (attention is quadratic). With
pipeline parallelism a rank's step time depends on its micro-batches' times one by one, so step 7
(:mod:`~megatron_dpsched.core.objective`) also times the rank packed by :func:`differencing_pack`, which
equalises their costs.

The method is Karmarkar and Karp's largest differencing, ``k``-way: every sample starts as a partial
partition of ``k`` parts (its own and ``k - 1`` empty ones); the two partitions whose dearest and
cheapest parts differ most are merged, the dearest part of one with the cheapest of the other and so on,
until one partition is left. A merge that would put more than the cap's tokens in a part pairs the parts
again, most tokens first, each with the cheapest part that fits; if none fits the packing gives up
(``None``). Samples past the cap sit alone, one micro-batch each, and the rest share the other
micro-batches.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

_Part = tuple[float, int, tuple[int, ...]]
"""One part of a partial partition: its summed cost, its tokens and its samples (a plain tuple: the merges
build millions of them on 1M-sample steps)."""

_EMPTY: _Part = (0.0, 0, ())


def _join(a: _Part, b: _Part) -> _Part:
    """The part holding both parts' samples."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def differencing_pack(
    items: Sequence[int], *, sizes: Sequence[int], costs: Sequence[float], cap: int, num_bins: int
) -> list[list[int]] | None:
    """``items`` in exactly ``num_bins`` micro-batches of near-equal summed ``costs`` (largest differencing),
    each holding at most ``cap`` tokens of ``sizes`` or a single sample past the cap; ``None`` when the
    differencing finds no such packing or would leave a micro-batch empty while there are at least
    ``num_bins`` samples. Costs must be positive; micro-batches are sorted by sample id, dearest first."""
    assert num_bins >= 1
    oversize = [i for i in items if sizes[i] > cap]
    rest = [i for i in items if sizes[i] <= cap]
    ways = num_bins - len(oversize)
    if ways < 0 or (ways == 0 and rest):
        return None
    bins = [[i] for i in oversize]
    if ways:
        parts = _difference(rest, sizes=sizes, costs=costs, cap=cap, ways=ways)
        if parts is None:
            return None
        bins += [sorted(part[2]) for part in parts]
    if len(items) >= num_bins and any(not b for b in bins):
        return None
    return bins


def _difference(
    items: Sequence[int], *, sizes: Sequence[int], costs: Sequence[float], cap: int, ways: int
) -> list[_Part] | None:
    """The ``ways`` parts of the last partition (dearest first), or ``None`` when a merge cannot keep the cap."""
    heap: list[tuple[float, int, list[_Part]]] = []
    for item in items:
        parts = [(costs[item], sizes[item], (item,))] + [_EMPTY] * (ways - 1)
        heap.append((-costs[item], item, parts))
    if not heap:
        return [_EMPTY] * ways
    heapq.heapify(heap)
    tie = len(sizes)  # merged partitions order after every single sample of the same spread
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = _merge(first, second, cap=cap)
        if merged is None:
            return None
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], tie, merged))
        tie += 1
    return heap[0][2]


def _merge(first: list[_Part], second: list[_Part], *, cap: int) -> list[_Part] | None:
    """Two partitions (each dearest first) merged part by part, dearest with cheapest; under the cap, else
    :func:`_merge_capped`. The result is dearest first."""
    merged = [(a[0] + b[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(first, reversed(second))]
    if any(part[1] > cap for part in merged):
        merged = _merge_capped(first, second, cap=cap)
        if merged is None:
            return None
    return sorted(merged, key=_dearest_first)


def _dearest_first(part: _Part) -> tuple[float, tuple[int, ...]]:
    return -part[0], part[2]


def _merge_capped(first: list[_Part], second: list[_Part], *, cap: int) -> list[_Part] | None:
    """The parts of ``first`` with the most tokens first, each joined with the cheapest unused part of
    ``second`` it fits with; ``None`` if one fits with none."""
    unused = sorted(second)  # by cost, tokens, samples
    merged = []
    for part in sorted(first, key=lambda part: (-part[1], -part[0], part[2])):
        match = next((j for j, other in enumerate(unused) if part[1] + other[1] <= cap), None)
        if match is None:
            return None
        merged.append(_join(part, unused.pop(match)))
    return merged


def kk_deal(
    items: Sequence[int], *, costs: Sequence[float], num_parts: int, equal_counts: bool = True
) -> list[list[int]]:
    """``items`` dealt to ``num_parts`` ranks of near-equal summed ``costs`` by largest differencing: the samples,
    dearest first, in runs of ``num_parts`` (``equal_counts``: one per part, so the ranks' sample counts differ by
    at most one) or one by one, start the partial partitions; the two with the largest spread merge, dearest part
    of one with the cheapest of the other. Each merge is one NumPy pass over the parts; which samples a part holds
    is resolved once at the end from the merges: ``O(len(items) log)`` work with equal counts, ``O(len(items) *
    num_parts)`` without."""
    assert num_parts >= 1
    ids = np.asarray(items, dtype=np.int64)
    if not len(ids):
        return [[] for _ in range(num_parts)]
    every = np.asarray(costs, dtype=np.float64)
    ordered = ids[np.lexsort((ids, -every[ids]))]
    width = num_parts if equal_counts else 1
    runs = math.ceil(len(ordered) / width)
    grid = np.full((runs, num_parts), -1, dtype=np.int64)  # row r: run r, its j-th sample in part j (-1: empty)
    grid[:, :width].reshape(-1)[:len(ordered)] = ordered
    seed = np.where(grid >= 0, every[np.maximum(grid, 0)], 0.0)
    sums = list(seed)
    merges: list[tuple[int, int, np.ndarray]] = []  # node runs + k: merged part i = raw part order[i] of merge k
    heap = [(-(row[0] - row[-1]), r) for r, row in enumerate(sums)]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[1], heapq.heappop(heap)[1]
        raw = sums[first] + sums[second][::-1]
        order = np.argsort(-raw, kind="stable")
        sums.append(raw[order])
        merges.append((first, second, order))
        heapq.heappush(heap, (-(sums[-1][0] - sums[-1][-1]), len(sums) - 1))
    labels = _resolve(runs, merges, root=heap[0][1], num_parts=num_parts)
    keep = grid >= 0
    owners, members = labels[keep], grid[keep]
    by_part = np.lexsort((members, owners))
    bounds = np.searchsorted(owners[by_part], np.arange(num_parts + 1))
    flat = members[by_part].tolist()
    return [flat[bounds[p]:bounds[p + 1]] for p in range(num_parts)]


def _resolve(runs: int, merges: list[tuple[int, int, np.ndarray]], *, root: int, num_parts: int) -> np.ndarray:
    """Per run of :func:`kk_deal` (rows), the final part of each of its samples (columns), from the
    merges: node ``runs + k`` is merge ``k``; a node's ``labels[i]`` is the final part its part ``i`` ends in."""
    out = np.empty((runs, num_parts), dtype=np.int64)
    stack = [(root, np.arange(num_parts))]
    while stack:
        node, labels = stack.pop()
        if node < runs:
            out[node] = labels
            continue
        first, second, order = merges[node - runs]
        first_labels, second_labels = np.empty_like(labels), np.empty_like(labels)
        first_labels[order] = labels
        second_labels[num_parts - 1 - order] = labels
        stack += [(first, first_labels), (second, second_labels)]
    return out


def spread_pack(
    ranks: Sequence[Sequence[int]], *, sizes: Sequence[int], costs: Sequence[float], cap: int, num_bins: int
) -> list[list[list[int]] | None]:
    """Each rank's samples in ``num_bins`` micro-batches of near-equal summed ``costs`` under the cap: dearest
    first, each into its rank's cheapest micro-batch with room (a sample past the cap only into an empty one),
    all ranks at once in NumPy, one pass per sample position. A rank where a sample finds no room is ``None``.
    Micro-batches hold their samples dearest first; with at least ``num_bins`` samples none is empty."""
    width = max(map(len, ranks), default=0)
    every_cost, every_size = np.asarray(costs, dtype=np.float64), np.asarray(sizes, dtype=np.int64)
    grid = np.full((len(ranks), width), -1, dtype=np.int64)
    for r, rank in enumerate(ranks):
        grid[r, :len(rank)] = sorted(rank, key=lambda i: (-costs[i], i))
    loads = np.zeros((len(ranks), num_bins))
    tokens = np.zeros((len(ranks), num_bins), dtype=np.int64)
    where = np.full((len(ranks), width), -1, dtype=np.int64)
    rows = np.arange(len(ranks))
    for k in range(width):
        items = grid[:, k]
        live = items >= 0
        size = every_size[np.maximum(items, 0)]
        room = np.where((size > cap)[:, None], tokens == 0, tokens + size[:, None] <= cap)
        choice = np.argmin(np.where(room, loads, np.inf), axis=1)
        placed = live & room[rows, choice]
        where[placed, k] = choice[placed]
        loads[rows[placed], choice[placed]] += every_cost[items[placed]]
        tokens[rows[placed], choice[placed]] += size[placed]
    failed = ((grid >= 0) & (where < 0)).any(axis=1)
    out: list[list[list[int]] | None] = []
    for r in range(len(ranks)):
        if failed[r]:
            out.append(None)
            continue
        bins: list[list[int]] = [[] for _ in range(num_bins)]
        for item, b in zip(grid[r].tolist(), where[r].tolist()):
            if item >= 0:
                bins[b].append(item)
        out.append(bins)
    return out
