"""The planner's per-size and NumPy paths for 1M-sample steps (issue 28, point 3) against plain references
that go one item at a time: best-fit decreasing on a sorted list of (room, bin id) (test_fast_paths'), the
refinement's move search over every (target, sample) pair in turn, and the collated sizes of micro-batches."""

from __future__ import annotations

import copy
import heapq
import random

import numpy as np
import pytest
from test_fast_paths import reference_best_fit

from megatron_dpsched.core.balancing import python_sums, refine_by_moves
from megatron_dpsched.core.packing import best_fit_decreasing, first_fit, split_to_count
from megatron_dpsched.core.padding import collated_size, collated_sizes, micro_batch_arrays


def random_sizes(rng: random.Random, cap: int) -> list[int]:
    """Sizes with many ties: uniform, a few values (exact divisors of the cap among them), small, or long."""
    count = rng.randint(0, 400)
    kind = rng.randrange(4)
    if kind == 0:
        return [rng.randint(1, cap) for _ in range(count)]
    if kind == 1:
        return [rng.choice((1, 2, cap // 3, cap // 2, cap, cap + 5, cap // 4)) for _ in range(count)]
    if kind == 2:
        return [rng.randint(1, max(1, cap // 7)) for _ in range(count)]
    return [rng.randint(cap // 3, 2 * cap) for _ in range(count)]


@pytest.mark.parametrize("seed", range(300))
def test_best_fit_decreasing_places_each_item_as_one_by_one_best_fit(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((10, 100, 1000, 4096))
    sizes = random_sizes(rng, cap)
    items = list(range(len(sizes)))
    rng.shuffle(items)
    items = items[:rng.randint(0, len(items))]
    assert best_fit_decreasing(items, sizes, cap) == reference_best_fit(items, sizes, cap)


def test_best_fit_decreasing_of_no_items_is_no_bins() -> None:
    assert best_fit_decreasing([], [5], 10) == []
    assert best_fit_decreasing(range(0), [], 10) == []


def reference_refine(plan: list[list[list[int]]], *, sizes: list[int], costs: list[float], cap: int,
                     max_moves: int, padded_rows: bool) -> None:
    """The busiest rank's sample whose move into one of the 8 lightest ranks (stable by load) lowers the
    pair's peak most, first found on ties (targets lightest first, then the rank's micro-batches in order);
    it joins the target's first empty micro-batch, else the first with room."""
    loads = [sum(costs[i] for mb in rank for i in mb) for rank in plan]

    def room(mb: list[int]) -> int:
        if not padded_rows:
            return cap - sum(sizes[i] for i in mb)
        rows, longest = len(mb) + 1, max((sizes[i] for i in mb), default=0)
        return cap // rows if rows * longest <= cap else 0

    for _ in range(max_moves):
        source = max(range(len(loads)), key=loads.__getitem__)
        best, best_peak = None, loads[source]
        for target in heapq.nsmallest(8, range(len(loads)), key=loads.__getitem__):
            widest = max((room(mb) for mb in plan[target]), default=0)
            for b, mb in enumerate(plan[source]):
                for item in mb if len(mb) > 1 else ():
                    peak = max(loads[source] - costs[item], loads[target] + costs[item])
                    if peak < best_peak and sizes[item] <= widest:
                        best, best_peak = (b, item, target), peak
        if best is None:
            return
        b, item, target = best
        empty = [k for k, mb in enumerate(plan[target]) if not mb]
        into = empty[0] if empty else next(k for k, mb in enumerate(plan[target]) if room(mb) >= sizes[item])
        plan[source][b].remove(item)
        plan[target][into].append(item)
        loads[source] -= costs[item]
        loads[target] += costs[item]


@pytest.mark.parametrize("seed", range(60))
def test_refine_by_moves_makes_the_moves_of_the_one_by_one_search(seed: int) -> None:
    rng = random.Random(seed)
    cap, padded_rows = rng.choice((100, 1000)), seed % 3 == 0
    ranks, bins = rng.randint(1, 20), rng.randint(1, 5)
    sizes = [rng.choice((rng.randint(1, cap // 4), cap // 5, cap // 10)) for _ in range(ranks * bins * 3)]
    costs = [float(s) + (s * s) / 500 if seed % 2 else float(rng.randint(1, 4)) for s in sizes]
    order = list(range(len(sizes)))
    plan: list[list[list[int]]] = [[[] for _ in range(bins)] for _ in range(ranks)]
    for item in order:  # a lopsided start: the first ranks get the most
        rank = min(int(rng.expovariate(0.5)), ranks - 1)
        mb = plan[rank][rng.randrange(bins)]
        fits = cap - sum(sizes[i] for i in mb) >= sizes[item] if not padded_rows else \
            (len(mb) + 1) * max([sizes[item], *(sizes[i] for i in mb)]) <= cap
        if fits:
            mb.append(item)
    expected = copy.deepcopy(plan)
    reference_refine(expected, sizes=sizes, costs=costs, cap=cap, max_moves=4 * ranks, padded_rows=padded_rows)
    peak = refine_by_moves(plan, sizes=sizes, costs=costs, cap=cap, max_moves=4 * ranks, padded_rows=padded_rows)
    assert plan == expected
    assert peak == max(sum(costs[i] for mb in rank for i in mb) for rank in expected)


@pytest.mark.parametrize("padded_rows", [False, True])
def test_collated_sizes_are_those_of_each_micro_batch(padded_rows: bool) -> None:
    rng = random.Random(5)
    sizes = [rng.randint(1, 900) for _ in range(300)]
    bins = [[rng.randrange(300) for _ in range(rng.choice((0, 0, 1, 2, 5)))] for _ in range(80)]
    assert collated_sizes(bins, sizes, padded_rows=padded_rows) == [
        collated_size(b, sizes, padded_rows=padded_rows) for b in bins]
    assert collated_sizes([], sizes, padded_rows=padded_rows) == []


def test_split_to_count_splits_the_fullest_whatever_computes_the_sizes() -> None:
    sizes = [60, 50, 40, 30, 20, 10]
    bins = first_fit(range(6), sizes, 100)
    assert split_to_count(bins, sizes, 4) == split_to_count(
        bins, sizes, 4, loads=[collated_size(b, sizes, padded_rows=False) for b in bins])


def test_micro_batch_arrays_hold_each_micro_batch_count_samples_fill_and_longest() -> None:
    rng = random.Random(6)
    sizes = [rng.randint(1, 900) for _ in range(300)]
    bins = [[rng.randrange(300) for _ in range(rng.choice((0, 0, 1, 2, 5)))] for _ in range(80)]
    counts, flat, fills, longest = micro_batch_arrays(bins, np.array(sizes))
    assert counts.tolist() == [len(b) for b in bins]
    assert flat.tolist() == [i for b in bins for i in b]
    assert fills.tolist() == [sum(sizes[i] for i in b) for b in bins]
    assert longest.tolist() == [max((sizes[i] for i in b), default=0) for b in bins]


@pytest.mark.parametrize("seed", range(6))
def test_python_sums_equal_pythons_sum_bit_for_bit(seed: int) -> None:
    """Runs of costs summed with NumPy equal Python's ``sum`` of each run, cancellation and empty runs included."""
    rng = random.Random(seed)
    pool = [1e16, 1.0, -1e16, 0.1, 3.3e-5, 7e12] if seed % 2 else None
    values = [rng.choice(pool) if pool else rng.uniform(0, 1e6) for _ in range(2000)]
    ids = rng.sample(range(len(values)), len(values))
    runs: list[list[int]] = [[]]
    while ids:
        take = rng.choice([0, 1, 2, 5, 30, 300])
        runs.append(ids[:take])
        ids = ids[take:]
    expected = [float(sum(values[i] for i in run)) for run in runs]
    assert python_sums(values, runs).tolist() == expected
    assert python_sums([int(v) for v in values], runs).tolist() == [float(sum(int(values[i]) for i in run))
                                                                    for run in runs]
