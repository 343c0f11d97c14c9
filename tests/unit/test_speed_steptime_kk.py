"""Step 7's cost-equal packing (:func:`~megatron_dpsched.core.kk.differencing_pack`, issue 28, planning speed):
merges in NumPy with the parts' samples resolved once at the end, and the capped pairing from a heap, against the
one-part-at-a-time differencing it replaced, copied in below as the reference (tuples of cost, tokens and samples,
merged and sorted in Python), on random items with equal costs, tight caps and samples past the cap.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence

import pytest

from megatron_dpsched.core.kk import differencing_pack

_Part = tuple[float, int, tuple[int, ...]]
"""One part of a partial partition: its summed cost, its tokens and its samples (a plain tuple: the merges
build millions of them on 1M-sample steps)."""

_EMPTY: _Part = (0.0, 0, ())


def _join(a: _Part, b: _Part) -> _Part:
    """The part holding both parts' samples."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def reference_pack(
    items: Sequence[int], *, sizes: Sequence[int], costs: Sequence[float], cap: int, num_bins: int
) -> list[list[int]] | None:
    """The differencing before issue 28: samples past the cap alone, the rest in the other micro-batches by
    :func:`_difference` (``None`` where it fails, or where a micro-batch stays empty with ``num_bins`` samples)."""
    alone = [[i] for i in items if sizes[i] > cap]
    ways, rest = num_bins - len(alone), [i for i in items if sizes[i] <= cap]
    if ways < 0 or (rest and not ways):
        return None
    parts = _difference(rest, sizes=sizes, costs=costs, cap=cap, ways=ways) if ways else []
    if parts is None:
        return None
    bins = alone + [sorted(part[2]) for part in parts]
    return None if len(items) >= num_bins and not all(bins) else bins


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




@pytest.mark.parametrize("seed", range(200))
def test_differencing_pack_as_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((16, 100, 8192))
    count = rng.randint(0, 120)
    sizes = [rng.choice((1, cap // 4, cap // 3, rng.randint(1, cap // 2), rng.randint(1, cap // 2),
                         cap if rng.random() < 0.2 else 1, 2 * cap if rng.random() < 0.1 else 2))
             for _ in range(count + 5)]
    kind = rng.choice(("float", "ties", "int"))
    costs = [{"float": rng.random() * 10 + 1e-3, "ties": rng.choice((1.0, 2.0, 0.5)),
              "int": rng.randint(1, 9)}[kind] for _ in sizes]
    items = rng.sample(range(len(sizes)), count)
    fill = sum(min(sizes[i], cap) for i in items) / cap  # a few bins above the fewest, or fewer (None)
    num_bins = max(1, math.ceil(fill * rng.choice((0.9, 1.2, 1.5, 2.0, 3.0))) + rng.randint(0, 3))
    expected = reference_pack(items, sizes=sizes, costs=costs, cap=cap, num_bins=num_bins)
    assert differencing_pack(items, sizes=sizes, costs=costs, cap=cap, num_bins=num_bins) == expected
