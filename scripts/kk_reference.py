"""Karmarkar-Karp-dealt plans for the exhaustive reference of ``bench_steptime.py --kk-reference``.

Written here apart from the planner's cost-equal packing (``megatron_dpsched.core.kk``), so that the reference
does not share the code it measures:

1. Deal a step's samples to the data-parallel ranks by largest differencing on cost (multi-way Karmarkar-Karp:
   every partial solution is a tuple of ``k`` parts; the two with the largest spread merge, the heaviest part of
   one with the lightest of the other), plainly and with equal counts (samples, dearest first, in runs of ``k``:
   one per part, so part sizes differ by at most one). The plain deal is left out where ``samples * k`` passes
   :data:`PLAIN_LIMIT` (its partial solutions would not fit in a benchmark's time).
2. For every legal count ``M`` from ``lower_bound`` to one sample per micro-batch on the fullest rank, split each
   rank's samples into ``M`` micro-batches by largest differencing on cost; while a micro-batch of two or more
   samples holds more than the cap, its shortest sample moves to the micro-batch with the most room that takes it.
   A plan where that fails is dropped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from megatron_dpsched.baselines import breaks_cap
from megatron_dpsched.core.alignment import PipelineLayout

PLAIN_LIMIT = 2_000_000
"""Samples times parts above which the plain deal (one partial solution per sample) is skipped."""


def largest_differencing(ids: Sequence[int], costs: Sequence[float], parts: int, *,
                         equal_count: bool = False) -> list[list[int]]:
    """``ids`` in ``parts`` groups of near-equal summed ``costs`` (indexed by id), by multi-way largest
    differencing; with ``equal_count`` the group sizes differ by at most one."""
    dearest = sorted(ids, key=lambda i: (-costs[i], i))
    step = parts if equal_count else 1
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for tie, start in enumerate(range(0, len(dearest), step)):
        run = dearest[start:start + step]
        solution = sorted([(costs[i], [i]) for i in run] + [(0.0, []) for _ in range(parts - len(run))],
                          key=lambda part: -part[0])
        heap.append((solution[-1][0] - solution[0][0], tie, solution))
    if not heap:
        return [[] for _ in range(parts)]
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        merged = sorted(((a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second), strict=True)),
                        key=lambda part: -part[0])
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], tie, merged))
        tie += 1
    return [group for _, group in heap[0][2]]


def split_under_cap(ids: Sequence[int], *, sizes: Sequence[int], costs: Sequence[float], count: int,
                    cap: int) -> list[list[int]] | None:
    """A rank's samples in ``count`` micro-batches by :func:`largest_differencing`, then shortest samples moved out
    of micro-batches that break ``cap`` (:func:`~megatron_dpsched.baselines.breaks_cap`); ``None`` when that does
    not bring every one under it."""
    batches = largest_differencing(ids, costs, count)
    tokens = [sum(sizes[i] for i in batch) for batch in batches]
    for _ in range(4 * len(ids) + 8):
        over = next((b for b, batch in enumerate(batches) if breaks_cap(batch, sizes, cap)), None)
        if over is None:
            return batches
        shortest = min(batches[over], key=lambda i: (sizes[i], i))
        target = next((b for b in sorted(range(count), key=tokens.__getitem__)
                       if b != over and (not batches[b] or tokens[b] + sizes[shortest] <= cap)), None)
        if target is None:
            return None
        batches[over].remove(shortest)
        batches[target].append(shortest)
        tokens[over] -= sizes[shortest]
        tokens[target] += sizes[shortest]
    return None


def kk_dealt_plans(sizes: Sequence[int], costs: Sequence[float], *, dp_size: int, cap: int, layout: PipelineLayout,
                   lower_bound: int) -> Iterator[list[list[list[int]]]]:
    """Every plan of steps 1-2 of the module docstring that keeps the cap: per rank, its micro-batches."""
    samples = range(len(sizes))
    deals = [largest_differencing(samples, costs, dp_size, equal_count=True)]
    if len(sizes) * dp_size <= PLAIN_LIMIT:
        deals.append(largest_differencing(samples, costs, dp_size))
    for ranks in deals:
        for count in range(lower_bound, layout.align(max(lower_bound, *map(len, ranks))) + 1):
            if not layout.is_legal(count):
                continue
            plan = [split_under_cap(rank, sizes=sizes, costs=costs, count=count, cap=cap) for rank in ranks]
            if all(batches is not None for batches in plan):
                yield plan
