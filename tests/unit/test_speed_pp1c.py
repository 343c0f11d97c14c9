"""Step 5's fallback plan kept as arrays: ``refine_laid_out``'s layout is that of the refined lists, and
``sorted_runs`` sorts each micro-batch as ``sorted`` does; padded sizes share one int object per value; the
pending packings' figures are those of their lists; the lengths, steps and costs of a run made once, as arrays."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from plan_lists import layout_lists, plan_step

from megatron_dpsched.core import padding, planning
from megatron_dpsched.core.balancing import dearest_first, lpt_ranks, peak_cost, refine_by_moves, refine_laid_out
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.cost import DEFAULT_COST_MODEL, sample_costs
from megatron_dpsched.core.ordering import sorted_runs
from megatron_dpsched.core.packing import bin_lower_bound, pack_into, pack_rank_arrays, pack_ranks
from megatron_dpsched.core.padding import ArrayTuple, shared_ints, step_sizes
from megatron_dpsched.core.steps import split_steps, step_ranges
from megatron_dpsched.core.validation import checked_lengths, require_lengths


def _plan(rng: random.Random, *, cap: int, padded_rows: bool) -> tuple[list[list[list[int]]], list[int]]:
    ranks, bins = rng.randint(1, 12), rng.randint(1, 5)
    sizes = [rng.choice((rng.randint(1, cap // 4), cap // 5, cap // 10)) for _ in range(ranks * bins * 3)]
    plan: list[list[list[int]]] = [[[] for _ in range(bins)] for _ in range(ranks)]
    for item in rng.sample(range(len(sizes)), len(sizes)):  # lopsided: the first ranks get the most
        mb = plan[min(int(rng.expovariate(0.5)), ranks - 1)][rng.randrange(bins)]
        fits = cap - sum(sizes[i] for i in mb) >= sizes[item] if not padded_rows else \
            (len(mb) + 1) * max([sizes[item], *(sizes[i] for i in mb)]) <= cap
        if fits:
            mb.append(item)
    return plan, sizes


def _layout(plan: list[list[list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    batches = [mb for rank in plan for mb in rank]
    return (np.array([len(mb) for mb in batches], dtype=np.int64),
            np.array([i for mb in batches for i in mb], dtype=np.int64))


@pytest.mark.parametrize("seed", range(40))
def test_refine_laid_out_is_refine_by_moves_with_the_refined_layout(seed: int) -> None:
    rng = random.Random(f"laid-out-{seed}")
    cap, padded_rows = rng.choice((100, 1000)), seed % 3 == 0
    plan, sizes = _plan(rng, cap=cap, padded_rows=padded_rows)
    costs = [float(s) + (s * s) / 500 if seed % 2 else float(rng.randint(1, 4)) for s in sizes]
    expected = [[list(mb) for mb in rank] for rank in plan]
    kwargs = {"sizes": sizes, "costs": costs, "cap": cap, "max_moves": 4 * len(plan), "padded_rows": padded_rows}
    expected_peak = refine_by_moves(expected, **kwargs)
    per_rank = np.array([len(rank) for rank in plan], dtype=np.int64)
    unlisted = refine_laid_out(None, **kwargs, layout=(per_rank, *_layout(plan)))  # no lists: the layout alone
    peak, (ranks, counts, flat) = refine_laid_out(plan, **kwargs, layout=(per_rank, *_layout(plan)))
    assert plan == expected
    assert peak == expected_peak == unlisted[0]
    assert ranks.tolist() == per_rank.tolist() == unlisted[1][0].tolist()
    assert counts.tolist() == _layout(expected)[0].tolist() == unlisted[1][1].tolist()
    assert flat.tolist() == _layout(expected)[1].tolist() == unlisted[1][2].tolist()


@pytest.mark.parametrize("seed", range(30))
def test_sorted_runs_sorts_each_micro_batch(seed: int) -> None:
    rng = random.Random(f"runs-{seed}")
    ids = rng.sample(range(rng.randint(0, 300) * rng.choice((1, 3))), rng.randint(0, 60))  # gaps in the ids
    batches: list[list[int]] = [[] for _ in range(rng.randint(1, 20))]
    for i in ids:
        rng.choice(batches).append(i)
    counts, flat = _layout([batches])
    assert sorted_runs(counts, flat).tolist() == [i for mb in batches for i in sorted(mb)]


@pytest.mark.parametrize("values", [[], [0], [8, 16, 8, 4096, 16], [3, 2**40, 3], list(range(0, 100000, 8))])
def test_shared_ints_are_the_values_one_object_per_distinct_value(values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    shared = shared_ints(array)
    assert shared == values and all(type(v) is int for v in shared)
    if len(values) and max(values) < 2**20:  # a table of the values: equal values are one object
        assert len({id(v) for v in shared}) == len(set(values))


def test_step_sizes_with_a_pad_multiple_share_one_int_per_size() -> None:
    sizes = step_sizes([5, 17, 3, 16, 300, 301], pad_multiple=8)
    assert sizes == (8, 24, 8, 16, 304, 304) and sizes.values.tolist() == list(sizes)
    assert sizes[4] is sizes[5]


def _figures(bins: list[list[int]], sizes: list[int]) -> list[tuple[int, int, int]]:
    return sorted((len(b), sum(sizes[i] for i in b), max((sizes[i] for i in b), default=0)) for b in bins)


@pytest.mark.parametrize("seed", range(80))
def test_packed_ranks_figures_are_those_of_their_lists(seed: int) -> None:
    rng = random.Random(f"packed-{seed}")
    cap, dp, rows = rng.choice((16, 64, 100)), rng.randint(16, 40), seed % 4 == 0
    sizes = [rng.choice((rng.randint(1, cap), rng.randint(1, cap // 3), cap // 2 + 1)) for _ in
             range(rng.randint(dp, 12 * dp))]
    count, ranks = max(1, -(-bin_lower_bound(sizes, cap, padded_rows=rows) // dp) + seed % 3 - 1), None
    while ranks is None:  # the first count whose LPT deal fits
        ranks = lpt_ranks(range(len(sizes)), costs=[float(s) for s in sizes], weights=np.minimum(sizes, cap),
                          capacity=count * cap, num_ranks=dp)
        count += ranks is None
    packed = pack_rank_arrays(ranks, sizes, cap, count, padded_rows=rows)
    counts, fills, longest = packed.figures(np.array(sizes, dtype=np.int64))
    failing = packed.failing()
    lists = packed.lists()
    assert pack_ranks(ranks, sizes, cap, count, padded_rows=rows) == lists
    assert lists == [pack_into(items.tolist(), sizes, cap, count, padded_rows=rows) for items in ranks]
    assert failing == [r for r, bins in enumerate(lists) if bins is None]
    fitting = [b for bins in lists if bins is not None for b in bins]
    assert sorted(zip(counts.tolist(), fills.tolist(), longest.tolist(), strict=True)) == _figures(fitting, sizes)


@pytest.mark.parametrize("lengths", [[5, 1, 7], (3,) * 4, [2**31 - 1, 1], [0, 4], [2**70, 3], [True, 2]])
def test_checked_lengths_are_require_lengths_with_their_array(lengths: list[int]) -> None:
    try:
        expected = require_lengths(lengths)
    except ValueError as error:
        with pytest.raises(ValueError, match=re.escape(str(error))):
            checked_lengths(lengths)
        return
    values, array = checked_lengths(lengths)
    assert values == expected and array is not None and array.tolist() == list(expected)


def test_checked_lengths_of_numpy_ints_are_python_ints_without_an_array() -> None:
    values, array = checked_lengths(np.array([4, 9], dtype=np.int32))
    assert values == (4, 9) and all(type(v) is int for v in values) and array is None


@pytest.mark.parametrize("count", [1, 7, 8, 9, 24])
@pytest.mark.parametrize("drop_last", [False, True])
def test_step_ranges_are_split_steps(count: int, drop_last: bool) -> None:
    steps, dropped = split_steps(count, global_batch_size=8, groups=None, drop_last=drop_last)
    ranges, dropped_range = step_ranges(count, global_batch_size=8, drop_last=drop_last)
    assert [list(r) for r in ranges] == steps and list(dropped_range) == dropped
    assert all(isinstance(r, range) for r in ranges)


def test_sample_costs_come_with_their_array_and_equal_without_the_lengths_array() -> None:
    lengths = [3, 9, 3, 4096, 9]
    costs = sample_costs(lengths, DEFAULT_COST_MODEL)
    given = sample_costs(lengths, DEFAULT_COST_MODEL, array=np.array(lengths, dtype=np.int64))
    assert costs == given == tuple(DEFAULT_COST_MODEL(n) for n in lengths)
    assert isinstance(given, ArrayTuple) and given.values.tolist() == list(given)
    assert all(type(c) is float for c in given)


@pytest.mark.parametrize("seed", range(4))
def test_dearest_first_of_many_distinct_costs_is_the_lexsort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = 70_000 + int(rng.integers(0, 30_000))  # more than 65,536 distinct costs, with ties
    costs = np.round(rng.random(count) * 2 * count) / 3
    costs[rng.integers(0, count, 50)] = rng.choice([0.0, -0.0, np.inf], 50)
    weights = np.floor(costs / 5) if seed % 2 else np.ones(count)  # equal costs, equal weights
    ids = np.arange(count) * 3 + seed
    assert len(np.unique(costs)) > 2**16
    assert dearest_first(ids, costs, weights).tolist() == np.lexsort((ids, -weights, -costs)).tolist()


@pytest.mark.parametrize("even_ranks", [0, 3, 12])
def test_best_fit_on_every_rank_when_most_overflow_worst_fit(even_ranks: int) -> None:
    # 6, 5, 4, 3, 2 under a cap of 10 in 2 micro-batches: worst fit overflows, best fit fits (6+4, 5+3+2)
    sizes, ranks = [], []
    for r in range(24):
        shape = (5, 5, 5, 5) if r < even_ranks else (6, 5, 4, 3, 2)  # 5s: worst fit fits
        ranks.append(np.arange(len(sizes), len(sizes) + len(shape), dtype=np.int64))
        sizes += shape
    packed = pack_rank_arrays(ranks, sizes, 10, 2)
    assert packed.worst.sum() == even_ranks and not packed.failing()
    lists = packed.lists()
    assert lists == [pack_into(items.tolist(), sizes, 10, 2) for items in ranks]
    assert lists[-1] == [[ranks[-1][0], ranks[-1][2]], [ranks[-1][1], ranks[-1][3], ranks[-1][4]]]


@pytest.mark.parametrize("seed", range(30))
def test_layout_peak_is_the_plans_peak_cost(seed: int) -> None:
    rng = random.Random(f"peak-{seed}")
    plan = [[[] for _ in range(rng.randint(0, 4))] for _ in range(rng.randint(1, 9))]
    count = rng.randint(0, 80)
    for i in range(count):
        rank = rng.choice([r for r in plan if r] or [[[]]])
        rng.choice(rank).append(i)
    costs = [rng.choice((0.1, 0.7, 1e-9, 3.3)) * rng.randint(1, 9) for _ in range(count)]
    batches = [mb for rank in plan for mb in rank]
    layout = (np.array([len(rank) for rank in plan], dtype=np.int64),
              np.array([len(mb) for mb in batches], dtype=np.int64),
              np.array([i for mb in batches for i in mb], dtype=np.int64))
    assert planning._layout_peak(layout, costs) == peak_cost(plan, costs)
    assert planning._plan_of(layout) == plan


@pytest.mark.parametrize("seed", range(24))
def test_step_layout_is_the_step_plan_on_many_ranks(seed: int) -> None:
    rng = random.Random(f"many-{seed}")
    cap, dp = rng.choice((64, 100)), rng.choice((16, 24, 40))
    kind = seed % 4  # short, near the cap, uniform, a few past the cap
    lengths = [rng.randint(1, cap // 4) if kind == 0 else rng.randint(cap // 2, cap) if kind == 1 else
               rng.randint(1, cap) if kind == 2 or rng.random() > 0.03 else rng.randint(cap + 1, 3 * cap)
               for _ in range(rng.randint(dp, 30 * dp))]
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(lengths), max_tokens_per_gpu=cap,
                            padded_rows=seed % 5 == 0, balance="none" if seed % 7 == 6 else "cost")
    costs = ArrayTuple([float(n) + n * n / 50 for n in lengths], np.array([n + n * n / 50 for n in lengths]))
    kwargs = {"lengths": lengths, "costs": costs, "config": config}
    plan = layout_lists(planning.plan_step_layout(range(len(lengths)), **kwargs))
    assert plan == plan_step(range(len(lengths)), **kwargs)


@pytest.mark.parametrize("seed", range(30))
def test_widest_rooms_is_each_ranks_largest_room(seed: int) -> None:
    rng = random.Random(f"widest-{seed}")
    per_rank = [rng.choice((0, 0, 1, 3, 7)) for _ in range(rng.randint(1, 12))]
    rooms = np.array([rng.randint(-50, 100) for _ in range(sum(per_rank))], dtype=np.int64)
    first = [0]
    for count in per_rank:
        first.append(first[-1] + count)
    expected = [max([0, *rooms[a:b].tolist()]) for a, b in zip(first, first[1:])]
    assert padding.widest_rooms(rooms, first).tolist() == expected
