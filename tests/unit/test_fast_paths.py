"""The NumPy fast paths of the planner (issue 19, point 5) against plain references written here.

Each fast path is forced on (its threshold set to 1) and compared, on random inputs with many ties, with a
reference that follows the documented rule one item at a time: LPT with capacities (each item, dearest
first, to the lightest rank with room, ties to the lower rank), worst fit per rank (each sample, longest
first, to the lightest micro-batch), and the one-rank pipeline simulation.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import threading

import numpy as np
import pytest

from megatron_dpsched.core import (
    PipelineLayout,
    StepTimeModel,
    balancing,
    build_dp_schedule,
    objective,
    packing,
    simulate_rank,
    steptime,
)
from megatron_dpsched.core.balancing import lpt_assign
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.cost import distinct_values
from megatron_dpsched.core.packing import pack_into, pack_ranks
from megatron_dpsched.core.padding import collated_size
from megatron_dpsched.core.steptime import rank_makespans


def reference_lpt(costs: list[float], weights: list[int], capacity: int, num_ranks: int) -> list[list[int]] | None:
    """Items by (cost, weight) descending then index; each to the rank with the smallest (load, rank) that has
    room; loads summed one addition at a time."""
    loads, used = [0.0] * num_ranks, [0] * num_ranks
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    for item in sorted(range(len(costs)), key=lambda i: (-costs[i], -weights[i], i)):
        fitting = [r for r in range(num_ranks) if used[r] + weights[item] <= capacity]
        if not fitting:
            return None
        rank = min(fitting, key=lambda r: (loads[r], r))
        ranks[rank].append(item)
        loads[rank] += costs[item]
        used[rank] += weights[item]
    return ranks


def _lengths(rng: random.Random, count: int) -> list[int]:
    kind = rng.choice(("few", "equal", "spread"))
    if kind == "few":
        return [rng.choice((3, 7, 7, 20, 64)) for _ in range(count)]
    if kind == "equal":
        return [11] * count
    return [rng.randint(1, 300) for _ in range(count)]


@pytest.mark.parametrize(("block_min", "stretch"),
                         [(1, 1), (1, 3), (balancing.BLOCK_MIN, balancing.STRETCH), (10**9, 7)])
@pytest.mark.parametrize("seed", range(40))
def test_lpt_assign_deals_as_the_one_by_one_rule(monkeypatch: pytest.MonkeyPatch, block_min: int, stretch: int,
                                                 seed: int) -> None:
    monkeypatch.setattr(balancing, "BLOCK_MIN", block_min)
    monkeypatch.setattr(balancing, "STRETCH", stretch)
    rng = random.Random(seed)
    lengths = _lengths(rng, rng.randint(1, 400))
    num_ranks = rng.randint(1, 12)
    cost_of = rng.choice((lambda s: float(s), lambda s: s + s * s / 97.0, lambda s: float(s % 5 + 1), lambda s: 0.1))
    costs = [cost_of(s) for s in lengths]
    cap = rng.choice((64, 100, 300))
    weights = [min(s, cap) for s in lengths]
    total = sum(weights)
    capacity = cap * rng.randint(max(1, total // (cap * num_ranks)), total // (cap * num_ranks) + 3)
    expected = reference_lpt(costs, weights, capacity, num_ranks)
    assert lpt_assign(range(len(lengths)), costs=costs, weights=weights, capacity=capacity,
                      num_ranks=num_ranks) == expected


@pytest.mark.parametrize("seed", range(40))
def test_pack_ranks_packs_each_rank_as_pack_into(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(packing, "VECTOR_RANKS", 1)
    rng = random.Random(seed)
    cap = rng.choice((50, 128, 500))
    sizes = [rng.choice((rng.randint(1, cap), rng.randint(1, cap // 3), cap + 7, cap)) if rng.random() < 0.3
             else rng.randint(1, cap // 4) for _ in range(rng.randint(1, 300))]
    items = list(range(len(sizes)))
    rng.shuffle(items)
    cuts = sorted(rng.randint(0, len(items)) for _ in range(rng.randint(1, 9)))
    ranks = [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)])]
    count = rng.randint(1, 12)
    expected = [pack_into(rank, sizes, cap, count) for rank in ranks]
    assert pack_ranks(ranks, sizes, cap, count) == expected


def test_a_rank_whose_worst_fit_overflows_gets_best_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """6, 4, 4, 3, 3 under 10 in two micro-batches: worst fit puts 6+3 and 4+4+3 (11); best fit 6+4 and 4+3+3."""
    monkeypatch.setattr(packing, "VECTOR_RANKS", 1)
    sizes = [6, 4, 4, 3, 3]
    assert packing._worst_fit_packed([[0, 1, 2, 3, 4], [0]], sizes, 10, 2).lists() == [None, [[0], []]]
    assert pack_ranks([[0, 1, 2, 3, 4]], sizes, 10, 2) == [[[0, 1], [2, 3, 4]]]


@pytest.mark.parametrize("seed", range(30))
def test_many_ranks_simulate_as_one_rank_each(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(steptime, "VECTOR_RANKS", 1)
    rng = random.Random(seed)
    pp, vpp = rng.choice(((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (3, 3)))
    group = rng.choice((None, pp + 1)) if vpp > 1 else None
    layout = PipelineLayout(pp_size=pp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group)
    count = layout.align(rng.randint(1, 20))
    model = StepTimeModel(seconds_per_token=1.0, backward_factor=rng.choice((2.0, 1.5)))
    times = [tuple(rng.choice((0.5, 1.0, rng.random())) for _ in range(count)) for _ in range(rng.randint(1, 9))]
    expected = [simulate_rank(rank, layout=layout, model=model).makespan for rank in times]
    assert rank_makespans(times, layout=layout, backward_factor=model.backward_factor) == expected


@pytest.mark.parametrize("seed", range(20))
def test_step_timer_times_as_python_sums(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """The timer's makespans (forward times of all ranks in one NumPy pass) and per-sample times (elementwise)
    against forward times summed here in Python, one micro-batch at a time, and the one-rank simulator."""
    monkeypatch.setattr(objective, "VECTOR_RANKS", 1)
    rng = random.Random(seed)
    sizes = [rng.choice((1, 7, 300, 2048, rng.randint(1, 4096))) for _ in range(rng.randint(8, 200))]
    model = StepTimeModel(seconds_per_token=rng.choice((1e-9, 24576e-12, 0.3)), seconds_per_token_pair=1e-12,
                          seconds_per_microbatch=rng.choice((0.0, 4.3e-3)))
    config = ScheduleConfig(dp_size=1, global_batch_size=len(sizes), max_tokens_per_gpu=4096, pp_size=2,
                            step_time_model=model)
    timer = objective.StepTimer(sizes=sizes, costs=[float(s) for s in sizes], config=config)
    count = rng.randint(1, 6)
    plan = [[list(range(r, len(sizes), 3))[m::count] for m in range(count)] for r in range(3)]

    def forward(mb: list[int]) -> float:
        tokens, pairs = (sum(sizes[i] for i in mb), sum(sizes[i] ** 2 for i in mb)) if mb else (1, 1)
        return model.seconds_per_token * tokens + model.seconds_per_token_pair * pairs + model.seconds_per_microbatch

    expected = [simulate_rank(tuple(forward(mb) for mb in rank), layout=config.layout, model=model).makespan
                for rank in plan]
    assert timer.makespans(plan) == expected
    assert timer.sample_times() == [model.seconds_per_token * s + model.seconds_per_token_pair * s * s for s in sizes]


@pytest.mark.parametrize("seed", range(40))
def test_rank_maxima_as_pythons_max_with_empty_ranks_anywhere(seed: int) -> None:
    """Each rank's dearest sample (step 7's screen) in one NumPy pass, against Python's ``max``; ranks and
    micro-batches without samples first, in between and last."""
    rng = random.Random(seed)
    values = [rng.choice((0.0, 1.5, rng.random(), 1e9)) for _ in range(rng.randint(1, 60))]
    ids = list(range(len(values)))
    rng.shuffle(ids)
    plan = [[] for _ in range(rng.randint(1, 12))]
    for i in ids[:rng.randint(0, len(ids))]:
        rank = rng.choice(plan)
        if not rank or rng.random() < 0.3:
            rank.append([])
        rank[-1].append(i)
    expected = [max((values[i] for mb in rank for i in mb), default=0.0) for rank in plan]
    assert balancing.rank_maxima(plan, np.array(values)) == expected


@pytest.mark.parametrize("seed", range(40))
def test_dearest_first_sorts_by_cost_weight_and_id(seed: int) -> None:
    """The radix sort of dense cost ranks (and its fallback to a three-key sort) against Python's ``sorted``."""
    rng = random.Random(seed)
    count = rng.randint(1, 300)
    pool = rng.choice(([1.0, 2.5, 7.0], [0.0, -0.0, 3.0, math.inf], [rng.random() for _ in range(50)]))
    costs = [rng.choice(pool) for _ in range(count)]
    same_weight = rng.random() < 0.5  # equal costs, equal weights: the radix path; else the fallback
    weights = [float(int(c * 3) % 4) if same_weight and math.isfinite(c) else float(rng.randint(1, 3))
               for c in costs]
    ids = sorted(rng.sample(range(10 * count), count))
    if rng.random() < 0.25:
        rng.shuffle(ids)  # not ascending: the fallback
    order = balancing.dearest_first(np.array(ids, dtype=np.int64), np.array(costs), np.array(weights)).tolist()
    assert order == sorted(range(count), key=lambda k: (-costs[k], -weights[k], ids[k]))


@pytest.mark.parametrize("seed", range(30))
def test_distinct_values_as_a_dictionary_of_first_appearances(seed: int) -> None:
    rng = random.Random(seed)
    low = rng.choice((-50, 0, 1, 10**12))
    spread = rng.choice((1, 5, 3000, 10**9))  # 10**9: wider than the table, np.unique's sort
    values = [low + rng.randint(0, spread) for _ in range(rng.randint(0, 500))]
    distinct, first, inverse = distinct_values(np.array(values, dtype=np.int64))
    firsts: dict[int, int] = {}
    for index, value in enumerate(values):
        firsts.setdefault(value, index)
    expected = sorted(firsts)
    assert distinct.tolist() == expected
    assert first.tolist() == [firsts[v] for v in expected]
    assert [expected[j] for j in inverse.tolist()] == values


def reference_best_fit(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """Best-fit decreasing as a sorted list of (room, bin id): the smallest room that fits, else a new bin
    (a copy of packing.best_fit_decreasing before the NumPy pass over all ranks)."""
    from bisect import bisect_left, insort
    bins: list[list[int]] = []
    open_bins: list[tuple[int, int]] = []
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


@pytest.mark.parametrize("seed", range(40))
def test_best_fit_of_all_ranks_as_the_sorted_list(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((50, 128, 500, 32766, 40000, 2**31))  # rooms of 16 bits at most, of 32, of 64
    sizes = [rng.choice((rng.randint(0, cap), cap // 2, cap // 4, cap + 7, cap, cap - 1)) if rng.random() < 0.4
             else rng.randint(1, cap // 3) for _ in range(rng.randint(1, 600))]
    items = list(range(len(sizes)))
    rng.shuffle(items)
    cuts = sorted(rng.randint(0, len(items)) for _ in range(rng.randint(packing.VECTOR_RANKS - 1, 40)))
    ranks = [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)])]
    got = packing.best_fit_ranks(ranks, sizes, cap)
    assert [bins for bins, _ in got] == [reference_best_fit(rank, sizes, cap) for rank in ranks]
    assert [loads for _, loads in got] == [[sum(sizes[i] for i in b) for b in bins] for bins, _ in got]


@pytest.mark.parametrize("seed", range(20))
def test_pack_ranks_of_overflowing_ranks_as_pack_into(seed: int) -> None:
    """Ranks of nearly full micro-batches: worst fit overflows on some, which then get best fit and splits."""
    rng = random.Random(seed)
    cap, count = 1000, rng.randint(3, 8)
    sizes: list[int] = []
    ranks: list[list[int]] = []
    for _ in range(rng.randint(packing.VECTOR_RANKS, 24)):
        rank = [rng.randint(230, 250) if rng.random() < 0.12 else rng.randint(5, 60) for _ in range(4 * count)]
        while sum(rank) < count * cap - rng.randint(0, 30):
            rank.append(rng.randint(5, 60))
        ranks.append(list(range(len(sizes), len(sizes) + len(rank))))
        sizes.extend(rank)
    assert pack_ranks(ranks, sizes, cap, count) == [pack_into(rank, sizes, cap, count) for rank in ranks]
    assert any(bins is None for bins in packing._worst_fit_packed(ranks, sizes, cap, count).lists())


def reference_peak_cost(plan: list[list[list[int]]] | None, costs: list[float]) -> float:
    """The rule before the NumPy pre-pass: every rank's Python ``sum`` of its costs in plan order, the largest."""
    if plan is None:
        return math.inf
    return max(sum(costs[i] for mb in rank for i in mb) for rank in plan)


@pytest.mark.parametrize("seed", range(40))
def test_peak_cost_as_the_python_sum_of_every_rank(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(balancing, "PEAK_VECTOR_RANKS", 1)
    rng = random.Random(seed)
    count = rng.randint(1, 600)
    kind = rng.choice(("spread", "tiny", "huge", "zero", "negative"))
    costs = [{"spread": rng.random() * 1e7, "tiny": 0.1 + rng.random() * 1e-12, "huge": 1e15 + rng.random() * 7,
              "zero": 0.0, "negative": rng.uniform(-1, 1)}[kind] for _ in range(count)]
    num_ranks = rng.randint(1, 20)
    base = list(range(count))
    ranks = []
    for _ in range(num_ranks):  # the same samples in other orders: sums equal or a few ulps apart
        items = base[:] if rng.random() < 0.7 else rng.sample(base, rng.randint(0, count))
        rng.shuffle(items)
        cuts = sorted(rng.randint(0, len(items)) for _ in range(rng.randint(0, 5)))
        ranks.append([items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)])
    assert balancing.peak_cost(ranks, costs) == reference_peak_cost(ranks, costs)
    assert balancing.peak_cost(None, costs) == math.inf


def reference_split_to_count(bins: list[list[int]], sizes: list[int], num_bins: int, *,
                             padded_rows: bool = False) -> list[list[int]]:
    """split_to_count before its early exit and in-place variant, copied in."""
    out = [list(b) for b in bins]
    loads = [collated_size(b, sizes, padded_rows=padded_rows) for b in out]
    heap = [(-load, i) for i, (b, load) in enumerate(zip(out, loads, strict=True)) if len(b) > 1]
    heapq.heapify(heap)
    halve = packing._split_rows if padded_rows else packing._halve
    while len(out) < num_bins and heap:
        _, i = heapq.heappop(heap)
        first, second = halve(out[i], sizes)
        out[i] = first
        out.append(second)
        for j in (i, len(out) - 1):
            if len(out[j]) > 1:
                heapq.heappush(heap, (-collated_size(out[j], sizes, padded_rows=padded_rows), j))
    out.extend([] for _ in range(num_bins - len(out)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_split_to_count_as_before_and_leaves_its_input(seed: int) -> None:
    rng = random.Random(seed)
    sizes = _lengths(rng, rng.randint(1, 200))
    items = list(range(len(sizes)))
    rng.shuffle(items)
    cuts = sorted(rng.randint(0, len(items)) for _ in range(rng.randint(0, 12)))
    bins = [b for b in (items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)) if b]
    num_bins = len(bins) + rng.choice((0, 0, 1, 3, 40))
    padded_rows = rng.random() < 0.3
    before = [list(b) for b in bins]
    expected = reference_split_to_count(bins, sizes, num_bins, padded_rows=padded_rows)
    assert packing.split_to_count(bins, sizes, num_bins, padded_rows=padded_rows) == expected
    assert bins == before
    owned = [list(b) for b in bins]
    assert packing.split_owned(owned, sizes, num_bins, padded_rows=padded_rows) == expected


@pytest.mark.parametrize("ones", [2, 4, 9, 100])
def test_peak_cost_where_a_float64_running_sum_picks_another_rank(monkeypatch: pytest.MonkeyPatch,
                                                                  ones: int) -> None:
    monkeypatch.setattr(balancing, "PEAK_VECTOR_RANKS", 1)
    costs = [1e16, 2.0, *[1.0] * ones, 1e16]  # 1e16 + 1.0 rounds back to 1e16 one addition at a time
    plan = [[[len(costs) - 1, 1]], [[0], list(range(2, 2 + ones))]]
    assert balancing.peak_cost(plan, costs) == reference_peak_cost(plan, costs) == 1e16 + max(2, ones)


def test_the_main_thread_plans_with_the_cyclic_collector_paused_and_restores_it() -> None:
    """A cost model called while planning sees the collector off on the main thread and on in another thread;
    after a plan, and after one that fails on bad input, it is on again; one already off stays off."""
    seen: list[bool] = []

    def cost(length: int) -> float:
        seen.append(gc.isenabled())
        return float(length)

    def plan(lengths: list[int]) -> None:
        build_dp_schedule(lengths, dp_size=2, global_batch_size=4, max_tokens_per_gpu=16, cost_model=cost)

    assert gc.isenabled()
    plan([5, 3, 9, 2])
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(ValueError, match=r"lengths\[2\] must be a positive integer"):
        plan([5, 3, -9, 2])
    assert gc.isenabled()
    seen.clear()
    failed: list[BaseException] = []

    def plan_in_worker() -> None:
        try:
            plan([5, 3, 9, 2])
        except BaseException as error:  # noqa: BLE001 -- asserted below on the main thread
            failed.append(error)

    worker = threading.Thread(target=plan_in_worker)
    worker.start()
    worker.join()
    assert not failed and seen and all(seen) and gc.isenabled()
    gc.disable()
    try:
        plan([5, 3, 9, 2])
        assert not gc.isenabled()
    finally:
        gc.enable()
