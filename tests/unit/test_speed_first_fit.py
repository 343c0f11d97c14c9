"""First fit in arrival order (its segment tree inlined in one loop, issue 28, point 3) against the plain
reference: each sample into the first micro-batch, scanning from the first, whose room takes it."""

from __future__ import annotations

import random

import pytest

from megatron_dpsched.core.packing import first_fit


def reference_first_fit(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    bins: list[list[int]] = []
    rooms: list[int] = []
    for item in items:
        size = sizes[item]
        fitting = [b for b, room in enumerate(rooms) if size <= cap and room >= size]
        if fitting:
            bins[fitting[0]].append(item)
            rooms[fitting[0]] -= size
        else:
            bins.append([item])
            rooms.append(cap - size if size <= cap else -1)
    return bins


@pytest.mark.parametrize("seed", range(300))
def test_first_fit_places_each_sample_in_the_first_micro_batch_with_room(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((1, 10, 100, 4096))
    count = rng.choice((0, 1, 2, 3, 4, 5, rng.randint(0, 300)))
    kind = rng.randrange(3)
    sizes = [rng.choice((0, 1, cap // 2, cap // 3, cap, cap + 1, 2 * cap)) if kind == 0
             else rng.randint(0, 2 * cap) if kind == 1 else rng.randint(1, cap) for _ in range(count)]
    items = list(range(count))
    rng.shuffle(items)
    items = items[:rng.randint(0, count)]
    assert first_fit(items, sizes, cap) == reference_first_fit(items, sizes, cap)
