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


def differencing_pack(
    items: Sequence[int], *, sizes: Sequence[int], costs: Sequence[float], cap: int, num_bins: int
) -> list[list[int]] | None:
    """``items`` in exactly ``num_bins`` micro-batches of near-equal summed ``costs`` (largest differencing),
    each holding at most ``cap`` tokens of ``sizes`` or a single sample past the cap; ``None`` when the
    differencing finds no such packing or would leave a micro-batch empty while there are at least
    ``num_bins`` samples. Costs must be positive (and exact as float64); micro-batches are sorted by sample id,
    dearest first."""
    assert num_bins >= 1
    oversize = [i for i in items if sizes[i] > cap]
    rest = [i for i in items if sizes[i] <= cap]
    ways = num_bins - len(oversize)
    if ways < 0 or (ways == 0 and rest):
        return None
    bins = [[i] for i in oversize]
    if ways:
        parts = _Differencing(rest, sizes=sizes, costs=costs, cap=cap, ways=ways).parts()
        if parts is None:
            return None
        bins += parts
    if len(items) >= num_bins and any(not b for b in bins):
        return None
    return bins


class _Partition:
    """A partial partition of :func:`differencing_pack`: its ``ways`` parts dearest first (ties: the part whose
    first sample comes first, an empty part before any), as arrays of summed cost, tokens and first sample (-1:
    empty); ``node`` names it in the merge record of :class:`_Differencing`."""

    __slots__ = ("cost", "tokens", "first", "node")

    def __init__(self, cost: np.ndarray, tokens: np.ndarray, first: np.ndarray, node: int) -> None:
        self.cost, self.tokens, self.first, self.node = cost, tokens, first, node


class _Differencing:
    """The ``ways``-way largest differencing of ``items`` under the cap: each merge in one NumPy pass over the
    parts; which samples a part holds is resolved once at the end from the merges (node ``k < len(items)``: item
    ``k`` alone in part 0; node ``len(items) + m``: merge ``m``, its part ``i`` the join of its first partition's
    part ``p[i]`` and its second's part ``q[i]``)."""

    def __init__(self, items: Sequence[int], *, sizes: Sequence[int], costs: Sequence[float], cap: int,
                 ways: int) -> None:
        self.items, self.sizes, self.costs, self.cap, self.ways = list(items), sizes, costs, cap, ways
        self.merges: list[tuple[int, int, np.ndarray, np.ndarray]] = []

    def parts(self) -> list[list[int]] | None:
        """The samples of each part of the last partition (dearest first, each sorted), or ``None`` when a merge
        cannot keep the cap. Partitions merge in order of spread, largest first (ties: single samples by id,
        then merges in the order made)."""
        if not self.items:
            return [[] for _ in range(self.ways)]
        heap = [(-self.costs[item], item, k) for k, item in enumerate(self.items)]
        heapq.heapify(heap)
        pending: dict[int, _Partition] = {}
        tie = len(self.sizes)  # merged partitions order after every single sample of the same spread
        while len(heap) > 1:
            first, second = (pending.pop(k) if k in pending else self._leaf(k) for k in
                             (heapq.heappop(heap)[2], heapq.heappop(heap)[2]))
            merged = self._merge(first, second)
            if merged is None:
                return None
            pending[merged.node] = merged
            heapq.heappush(heap, (float(merged.cost[-1] - merged.cost[0]), tie, merged.node))
            tie += 1
        return self._resolve(heap[0][2])

    def _leaf(self, k: int) -> _Partition:
        item, ways = self.items[k], self.ways
        cost, tokens, first = np.zeros(ways), np.zeros(ways, dtype=np.int64), np.full(ways, -1, dtype=np.int64)
        cost[0], tokens[0], first[0] = self.costs[item], self.sizes[item], item
        return _Partition(cost, tokens, first, k)

    def _merge(self, a: _Partition, b: _Partition) -> _Partition | None:
        """``a``'s parts joined with ``b``'s, dearest with cheapest; under the cap, else :meth:`_capped`."""
        p, q = np.arange(self.ways), np.arange(self.ways - 1, -1, -1)
        if bool((a.tokens + b.tokens[q] > self.cap).any()):
            pairs = self._capped(a, b)
            if pairs is None:
                return None
            p, q = pairs
        cost, tokens = a.cost[p] + b.cost[q], a.tokens[p] + b.tokens[q]
        first = np.where(a.first[p] >= 0, a.first[p], b.first[q])
        order = np.lexsort((first, -cost))
        self.merges.append((a.node, b.node, p[order], q[order]))
        return _Partition(cost[order], tokens[order], first[order], len(self.items) + len(self.merges) - 1)

    def _capped(self, a: _Partition, b: _Partition) -> tuple[np.ndarray, np.ndarray] | None:
        """The parts of ``a`` with the most tokens first (ties: dearer, then first sample), each paired with the
        cheapest unused part of ``b`` it fits with (ties: fewer tokens, then first sample); ``None`` if one fits
        with none. As ``a``'s parts come with ever more room, the parts of ``b`` that fit only grow: a heap of
        them by their place in the cheapest-first order yields each pairing."""
        unused = np.lexsort((b.first, b.tokens, b.cost))  # place -> part of b
        by_tokens = np.argsort(b.tokens[unused], kind="stable")  # places, fewest tokens first
        tokens, places = b.tokens[unused][by_tokens].tolist(), by_tokens.tolist()
        p = np.lexsort((a.first, -a.cost, -a.tokens))
        fits: list[int] = []
        q, added = [], 0
        for room in (self.cap - a.tokens[p]).tolist():
            while added < len(tokens) and tokens[added] <= room:
                heapq.heappush(fits, places[added])
                added += 1
            if not fits:
                return None
            q.append(heapq.heappop(fits))
        return p, unused[q]

    def _resolve(self, root: int) -> list[list[int]]:
        """Each final part's samples in index order, from the merge record (labels pushed down from the root)."""
        count = len(self.items)
        owner = np.empty(count, dtype=np.int64)
        stack = [(root, np.arange(self.ways))]
        while stack:
            node, labels = stack.pop()
            if node < count:
                owner[node] = labels[0]
                continue
            first, second, p, q = self.merges[node - count]
            first_labels, second_labels = np.empty_like(labels), np.empty_like(labels)
            first_labels[p], second_labels[q] = labels, labels
            stack += [(first, first_labels), (second, second_labels)]
        ids = np.asarray(self.items, dtype=np.int64)
        by_part = np.lexsort((ids, owner))
        bounds = np.searchsorted(owner[by_part], np.arange(self.ways + 1)).tolist()
        flat = ids[by_part].tolist()
        return [flat[bounds[w]:bounds[w + 1]] for w in range(self.ways)]


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
