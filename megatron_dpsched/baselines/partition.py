"""Shared pieces of the peer baselines: Karmarkar-Karp partitioning and padding to a legal count."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.config import RankPlan

Part = tuple[float, int, tuple[int, ...]]
"""One side of a partial partition: (weight, item count, items in the order they joined)."""


def karmarkar_karp(weights: Sequence[float], num_parts: int, *, equal_size: bool) -> list[list[int]]:
    """Split positions ``0..len(weights)-1`` into ``num_parts`` parts of near-equal weight.

    The largest differencing method: every item (or, with ``equal_size``, every run of
    ``num_parts`` items of ascending weight) starts a partial partition; the two partials
    with the largest spread (heaviest minus lightest part) are merged, heaviest part of one
    with lightest of the other, until one is left. With ``equal_size`` and a count that is
    not a multiple of ``num_parts`` the last (heaviest) run is shorter, so part sizes differ
    by at most one. Returns the parts heaviest first, each sorted.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    seeds = [order[s : s + num_parts] for s in range(0, len(order), num_parts)] if equal_size else [[i] for i in order]
    heap: list[tuple] = []
    for serial, seed in enumerate(seeds):
        parts = [(float(weights[i]), 1, (i,)) for i in seed] + [(0.0, 0, ())] * (num_parts - len(seed))
        heapq.heappush(heap, _keyed(parts, serial))
    serial = len(seeds)
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[-1], heapq.heappop(heap)[-1]
        merged = [(a[0] + b[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(first, reversed(second))]
        heapq.heappush(heap, _keyed(merged, serial))
        serial += 1
    final = heap[0][-1] if heap else [(0.0, 0, ())] * num_parts
    return [sorted(items) for _, _, items in final]


def _keyed(parts: list[Part], serial: int) -> tuple:
    """Heap entry: the largest spread first, then the largest top part (weight, item count, items)."""
    parts = sorted(parts, reverse=True)
    top = parts[0]
    return (-(top[0] - parts[-1][0]), -top[0], -top[1], tuple(-i for i in top[2]), serial, parts)


def pad_to_legal(ranks: list[RankPlan], layout: PipelineLayout) -> list[RankPlan]:
    """Give every rank the same, legal micro-batch count by appending empty micro-batches."""
    count = layout.align(max(len(rank) for rank in ranks))
    return [rank + [[] for _ in range(count - len(rank))] for rank in ranks]


def round_up(count: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``count`` (and at least ``multiple``)."""
    return max(1, math.ceil(count / multiple)) * multiple
