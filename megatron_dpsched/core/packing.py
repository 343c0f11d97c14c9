"""Packing samples into micro-batches under a token cap.

Items are sample ids; ``sizes[i]`` is sample ``i``'s token count. A sample
longer than the cap always sits alone in its own micro-batch; every other
micro-batch holds at most ``cap`` tokens.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence


def bin_lower_bound(sizes: Sequence[int], cap: int) -> int:
    """Fewest micro-batches any packing can use.

    Oversize samples (> cap) sit alone. Among the rest, the tokens need
    ``ceil(total / cap)``, and no micro-batch holds ``k + 1`` samples longer than
    ``cap / (k + 1)``, so the ``n_k`` samples longer than that need ``ceil(n_k / k)``
    (``k = 1``: no two samples over half the cap share one; ``k = 2``: at most two
    over a third, ...). The bound is the oversize count plus the largest of these.
    """
    oversize = sum(1 for size in sizes if size > cap)
    rest = sorted(size for size in sizes if size <= cap)
    bound = math.ceil(sum(rest) / cap)
    k = 1
    while math.ceil(len(rest) / k) > bound:
        longer = len(rest) - bisect_right(rest, cap // (k + 1))  # sizes with size * (k + 1) > cap
        bound = max(bound, math.ceil(longer / k))
        k += 1
    return oversize + bound


def best_fit_decreasing(items: Sequence[int], sizes: Sequence[int], cap: int) -> list[list[int]]:
    """Pack ``items`` by best-fit decreasing (the 11/9 OPT + 6/9 bound of FFD) in O(n log n)."""
    bins: list[list[int]] = []
    open_bins: list[tuple[int, int]] = []  # (residual, bin id), ascending
    for item in sorted(items, key=lambda i: -sizes[i]):
        size = sizes[item]
        if size >= cap:
            bins.append([item])
            continue
        pos = bisect_left(open_bins, (size, -1))
        if pos == len(open_bins):
            bins.append([item])
            insort(open_bins, (cap - size, len(bins) - 1))
            continue
        residual, bin_id = open_bins.pop(pos)
        bins[bin_id].append(item)
        if residual > size:
            insort(open_bins, (residual - size, bin_id))
    return bins


def first_fit(items: Sequence[int], sizes: Sequence[int], cap: int) -> list[list[int]]:
    """First fit in arrival order (O(n log n)); a sample over the cap gets its own micro-batch."""
    bins: list[list[int]] = []
    tree = _ResidualTree(len(items))
    for item in items:
        size = sizes[item]
        b = tree.leftmost_at_least(size) if size <= cap else None
        if b is None:  # a new micro-batch (an oversize sample's stays full: its residual is never set)
            bins.append([item])
            if size <= cap:
                tree.set(len(bins) - 1, cap - size)
            continue
        bins[b].append(item)
        tree.set(b, tree.get(b) - size)
    return bins


class _ResidualTree:
    """Max segment tree over bin residuals: finds the first bin with room in O(log n)."""

    def __init__(self, capacity: int) -> None:
        self._size = 1
        while self._size < max(1, capacity):
            self._size *= 2
        self._tree = [-1] * (2 * self._size)

    def get(self, index: int) -> int:
        return self._tree[self._size + index]

    def set(self, index: int, value: int) -> None:
        tree = self._tree
        node = self._size + index
        tree[node] = value
        node >>= 1
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            best = left if left >= right else right
            if tree[node] == best:
                return  # nothing above changes either
            tree[node] = best
            node >>= 1

    def leftmost_at_least(self, value: int) -> int | None:
        tree, size = self._tree, self._size
        if tree[1] < value:
            return None
        node = 1
        while node < size:
            node = 2 * node if tree[2 * node] >= value else 2 * node + 1
        return node - size


def worst_fit_decreasing(
    items: Sequence[int], sizes: Sequence[int], cap: int, num_bins: int
) -> list[list[int]] | None:
    """Spread ``items`` over exactly ``num_bins`` micro-batches, each to the lightest; ``None`` if one overflows.

    Balanced micro-batches shorten pipeline stalls, so this is tried before
    best-fit, which fills micro-batches unevenly.
    """
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    heap = [(0, b) for b in range(num_bins)]
    for item in sorted(items, key=lambda i: -sizes[i]):
        load, b = heapq.heappop(heap)
        size = sizes[item]
        if size > cap:
            if load:
                return None
            load = math.inf
        elif load + size > cap:
            return None
        else:
            load += size
        bins[b].append(item)
        heapq.heappush(heap, (load, b))
    return bins


def split_to_count(bins: list[list[int]], sizes: Sequence[int], num_bins: int) -> list[list[int]]:
    """Split the fullest multi-sample bins in two until there are ``num_bins``; pad with empty bins."""
    assert len(bins) <= num_bins, (len(bins), num_bins)
    out = [list(b) for b in bins]
    heap = [(-_tokens(b, sizes), i) for i, b in enumerate(out) if len(b) > 1]
    heapq.heapify(heap)
    while len(out) < num_bins and heap:
        _, i = heapq.heappop(heap)
        first, second = _halve(out[i], sizes)
        out[i] = first
        out.append(second)
        for j in (i, len(out) - 1):
            if len(out[j]) > 1:
                heapq.heappush(heap, (-_tokens(out[j], sizes), j))
    out.extend([] for _ in range(num_bins - len(out)))
    return out


def pack_into(
    items: Sequence[int], sizes: Sequence[int], cap: int, num_bins: int
) -> list[list[int]] | None:
    """Pack ``items`` into exactly ``num_bins`` capped micro-batches, or ``None`` if they need more."""
    bins = worst_fit_decreasing(items, sizes, cap, num_bins)
    if bins is not None:
        return bins
    bins = best_fit_decreasing(items, sizes, cap)
    if len(bins) > num_bins:
        return None
    return split_to_count(bins, sizes, num_bins)


def _tokens(items: Sequence[int], sizes: Sequence[int]) -> int:
    return sum(sizes[i] for i in items)


def _halve(items: Sequence[int], sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """Split a bin into two of near-equal tokens (greedy on sizes, largest first)."""
    first: list[int] = []
    second: list[int] = []
    load_first = load_second = 0
    for item in sorted(items, key=lambda i: -sizes[i]):
        if load_first <= load_second:
            first.append(item)
            load_first += sizes[item]
        else:
            second.append(item)
            load_second += sizes[item]
    return first, second


def target_bin(fills: Sequence[int], room: Sequence[int], size: int) -> int:
    """Where a sample of ``size`` tokens joins a rank's micro-batches: the first empty one (empties are
    only for ranks short of samples), else the first with ``room`` for it."""
    empty = next((b for b, fill in enumerate(fills) if fill == 0), None)
    return empty if empty is not None else next(b for b, r in enumerate(room) if r >= size)
