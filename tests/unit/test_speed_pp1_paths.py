"""The PP 1 shortcuts of issue 28 (point 3) against plain references: padded-rows chunks counted per distinct
size and cut for all ranks at once, the repair's early "fails for certain" (never said of a repair that
succeeds), the fallback deal's flattened layout, and the step's sizes and costs as one NumPy array each."""

from __future__ import annotations

import copy
import pickle
import random
from itertools import chain

import numpy as np
import pytest
from test_speed_fits import reference_best_fit_decreasing

from megatron_dpsched.core import planning
from megatron_dpsched.core.balancing import assign_costed, lpt_assign, python_sums
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.packing import (
    PackedRanks,
    _chunk_ranks,
    _worst_fit_packed,
    best_fit_ranks,
    chunk_count,
    pack_ranks,
    split_to_count,
    worst_fit_decreasing,
)
from megatron_dpsched.core.padding import ArrayTuple, all_floats, collated_sizes, step_sizes


def reference_chunks(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """Padded rows, one chunk at a time: longest first (ties: the smaller id), as many rows as the first allows."""
    ordered = sorted(items, key=lambda i: (-sizes[i], i))
    chunks = []
    while ordered:
        rows = max(1, cap // sizes[ordered[0]])
        chunks.append(ordered[:rows])
        ordered = ordered[rows:]
    return chunks


def random_lengths(rng: random.Random, count: int, cap: int) -> list[int]:
    kind = rng.randrange(3)
    if kind == 0:
        return [rng.randint(1, cap) for _ in range(count)]
    if kind == 1:
        return [rng.choice((1, cap // 3 + 1, cap // 2, cap // 2 + 1, cap)) for _ in range(count)]
    return [rng.randint(1, cap) if rng.random() > 0.05 else rng.randint(cap + 1, 3 * cap) for _ in range(count)]


@pytest.mark.parametrize("seed", range(200))
def test_padded_rows_chunks_of_all_ranks_at_once_are_each_ranks_own(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((7, 64, 100, 4096))
    sizes = random_lengths(rng, rng.randint(0, 300), cap)
    ids = list(range(len(sizes)))
    rng.shuffle(ids)
    cuts = sorted(rng.randint(0, len(ids)) for _ in range(rng.randint(0, 9)))
    ranks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]
    chunked = _chunk_ranks(ranks, sizes, cap)
    assert len(chunked) == len(ranks)
    for items, bins in zip(ranks, chunked, strict=True):
        expected = reference_chunks(items, sizes, cap)
        assert bins.bins() == expected and bins.counts.tolist() == [len(b) for b in expected]
        assert bins.loads.tolist() == [len(b) * max(sizes[i] for i in b) for b in expected]
    assert chunk_count(sizes, cap) == len(reference_chunks(ids, sizes, cap))


def overflowing(rng: random.Random) -> tuple[list, list, ArrayTuple, ArrayTuple, ScheduleConfig, int, dict]:
    """A step packed at its lower-bound count where some rank does not fit: what the repair starts from."""
    while True:
        cap, dp = rng.choice((16, 64, 100)), rng.randint(2, 24)
        rows = rng.random() < 0.3
        lengths = random_lengths(rng, rng.randint(dp, 40 * dp), cap)
        config = ScheduleConfig(dp_size=dp, global_batch_size=len(lengths), max_tokens_per_gpu=cap, padded_rows=rows)
        sizes = step_sizes(lengths, pad_multiple=1)
        costs = ArrayTuple([float(s) + s * s / 50 for s in lengths], np.array([s + s * s / 50 for s in lengths]))
        count = planning.lower_bound_microbatches(sizes, config=config) + rng.randint(0, 1)
        weights = np.minimum(np.asarray(sizes), cap)
        ranks = lpt_assign(range(len(sizes)), costs=costs, weights=weights, capacity=count * cap, num_ranks=dp)
        if ranks is None:
            continue
        refits: dict = {}
        packed = pack_ranks(ranks, sizes, cap, count, padded_rows=rows, refits=refits)
        if any(bins is None for bins in packed):
            return ranks, packed, sizes, costs, config, count, refits


@pytest.mark.parametrize("seed", range(150))
def test_a_repair_said_to_fail_for_certain_fails(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks, packed, sizes, costs, config, count, refits = overflowing(random.Random(seed))
    said = []

    def never_certain(*args: object, **kwargs: object) -> bool:
        said.append(certain(*args, **kwargs))
        return False

    certain = planning._rehome_fails
    monkeypatch.setattr(planning, "_rehome_fails", never_certain)
    repaired = planning._repair_overflow(ranks, PackedRanks(copy.deepcopy(packed)), sizes, costs, config=config,
                                         num_microbatches=count, refits=copy.deepcopy(refits))
    assert said and (repaired is None or not said[0])
    monkeypatch.setattr(planning, "_rehome_fails", certain)
    again = planning._repair_overflow(ranks, PackedRanks(copy.deepcopy(packed)), sizes, costs, config=config,
                                      num_microbatches=count, refits=copy.deepcopy(refits))
    assert again == repaired


@pytest.mark.parametrize("seed", range(60))
def test_the_fallback_deal_is_the_split_and_dealt_packing_with_its_layout(seed: int) -> None:
    rng = random.Random(seed)
    cap, dp = rng.choice((16, 100)), rng.randint(1, 12)
    rows, balance = rng.random() < 0.3, rng.choice(("cost", "none"))
    lengths = random_lengths(rng, rng.randint(dp, 30 * dp), cap)
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(lengths), max_tokens_per_gpu=cap, padded_rows=rows,
                            balance=balance)
    sizes = step_sizes(lengths, pad_multiple=1)
    costs = ArrayTuple([float(s) for s in lengths], np.array(lengths, dtype=np.float64))
    bins = planning._global_packing(sizes, config)
    count = config.layout.align(-(-len(bins) // dp))
    split = split_to_count(bins, list(sizes), count * dp, padded_rows=rows)
    bin_costs = python_sums(list(costs), split) if balance != "none" else None
    owners = assign_costed(len(split), num_ranks=dp, bin_costs=bin_costs)
    expected = [[split[b] for b in owned.tolist()] for owned in owners]
    per_rank, counts, flat = planning._deal_bins(bins, sizes, costs, config=config)
    plan = planning._plan_of((per_rank, counts, flat))
    assert per_rank.tolist() == [count] * dp
    assert plan == expected
    assert counts.tolist() == [len(mb) for mb in chain.from_iterable(plan)]
    assert flat.tolist() == list(chain.from_iterable(chain.from_iterable(plan)))
    assert collated_sizes(list(chain.from_iterable(plan)), list(sizes), padded_rows=rows) == [
        len(mb) * max(sizes[i] for i in mb) if rows else sum(sizes[i] for i in mb) if mb else 0
        for mb in chain.from_iterable(plan)]


def test_step_sizes_and_costs_are_read_by_numpy_from_one_read_only_array() -> None:
    sizes = step_sizes([5, 17, 3], pad_multiple=8)
    assert sizes == (8, 24, 8) and all(type(s) is int for s in sizes)
    assert np.asarray(sizes) is sizes.values and np.asarray(sizes, dtype=np.int64) is sizes.values
    assert np.asarray(sizes, dtype=np.float64).tolist() == [8.0, 24.0, 8.0]
    copied = np.array(sizes)
    copied[0] = 1
    assert sizes.values[0] == 8 and sizes[0] == 8
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(sizes)[0] = 1
    plain = step_sizes([5, 17, 3], pad_multiple=1)
    assert plain == (5, 17, 3) and np.asarray(plain).tolist() == [5, 17, 3]


def test_an_array_tuple_survives_pickling_and_knows_whether_its_items_are_floats() -> None:
    costs = ArrayTuple((1.5, 2.0), np.array([1.5, 2.0]))
    again = pickle.loads(pickle.dumps(costs))
    assert type(again) is ArrayTuple and again == (1.5, 2.0) and np.asarray(again).tolist() == [1.5, 2.0]
    assert all_floats(costs) and all_floats([1.0, 2.0])
    assert not all_floats(ArrayTuple((1, 2.0), np.array([1.0, 2.0]))) and not all_floats([1, 2.0])


@pytest.mark.parametrize("seed", range(40))
def test_worst_fit_of_all_ranks_drops_failed_ranks_and_packs_the_others_as_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    cap, dp, count = 100, rng.randint(16, 48), rng.randint(2, 6)
    sizes = [rng.randint(1, cap + 20 if rng.random() < 0.2 else cap) for _ in range(dp * 8 * count)]
    ids = list(range(len(sizes)))
    rng.shuffle(ids)
    ranks = [ids[r::dp] for r in range(dp)]
    ranks[0] = [i for i in ranks[0] if sizes[i] <= cap][:count]  # one rank that always fits
    got = _worst_fit_packed(ranks, sizes, cap, count).lists()
    assert got == [worst_fit_decreasing(items, sizes, cap, count) for items in ranks]
    assert got[0] is not None and sum(bins is None for bins in got) >= dp // 2


@pytest.mark.parametrize("seed", range(60))
def test_best_fit_of_all_ranks_skips_only_steps_where_no_item_fits(seed: int) -> None:
    rng = random.Random(seed)
    cap, dp = rng.choice((10, 64, 100)), rng.randint(16, 30)
    sizes = [rng.choice((0, cap // 2, cap // 2 + 1, cap, cap + 3, rng.randint(cap // 2, cap), rng.randint(1, cap)))
             for _ in range(dp * rng.randint(1, 12))]
    ids = list(range(len(sizes)))
    rng.shuffle(ids)
    ranks = [ids[r::dp] for r in range(dp)]
    got = best_fit_ranks(ranks, sizes, cap)
    assert [bins for bins, _ in got] == [reference_best_fit_decreasing(items, sizes, cap) for items in ranks]
