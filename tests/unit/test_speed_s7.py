"""Pure-Python paths for small inputs: planning's ``_rehome`` against a reference written here, and
:func:`~megatron_dpsched.core.packing.split_owned` for few micro-batches against its NumPy path (forced on by
setting :data:`~megatron_dpsched.core.packing.SMALL_BINS` to 0), its row split against a reference (longest
first, ties by id, the first cut with the smallest larger part)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from megatron_dpsched.core import StepTimeModel, objective, ordering, packing, planning
from megatron_dpsched.core.config import ScheduleConfig


def _sizes(rng: random.Random, count: int) -> list[int]:
    """Planned sizes with many ties."""
    pool = [rng.randint(1, 400) for _ in range(rng.randint(1, 6))]
    return [rng.choice(pool) if rng.random() < 0.7 else rng.randint(1, 400) for _ in range(count)]


def _bins(rng: random.Random, count: int) -> list[list[int]]:
    items = list(range(count))
    rng.shuffle(items)
    cuts = sorted(rng.randint(0, count) for _ in range(rng.randint(0, 20)))
    return [b for b in (items[a:b] for a, b in zip([0, *cuts], [*cuts, count], strict=True)) if b]


def _reference_split_rows(items: list[int], sizes: list[int]) -> tuple[list[int], list[int]]:
    ordered = sorted(items, key=lambda i: (-sizes[i], i))
    parts = [max(j * sizes[ordered[0]], (len(ordered) - j) * sizes[ordered[j]]) for j in range(1, len(ordered))]
    cut = 1 + parts.index(min(parts))
    return ordered[:cut], ordered[cut:]


@pytest.mark.parametrize("seed", range(60))
def test_split_owned_small_path_matches_numpy_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    sizes = _sizes(rng, rng.randint(1, 150))
    bins = _bins(rng, len(sizes))
    num_bins = len(bins) + rng.choice((0, 1, 2, 5, 30))
    padded_rows = rng.random() < 0.5
    given = rng.choice((None, "list", "array"))
    loads = None if given is None else [packing.collated_size(b, sizes, padded_rows=padded_rows) for b in bins]
    if given == "array":
        loads = np.asarray(loads, dtype=np.int64)
    python = packing.split_owned([list(b) for b in bins], sizes, num_bins, padded_rows=padded_rows, loads=loads)
    assert len(bins) <= packing.SMALL_BINS
    monkeypatch.setattr(packing, "SMALL_BINS", 0)
    vector = packing.split_owned([list(b) for b in bins], sizes, num_bins, padded_rows=padded_rows, loads=loads)
    assert python == vector
    assert sorted(i for b in python for i in b) == list(range(len(sizes)))
    assert len(python) == num_bins


@pytest.mark.parametrize("seed", range(60))
def test_split_rows_matches_reference(seed: int) -> None:
    rng = random.Random(seed)
    sizes = _sizes(rng, rng.randint(2, 60))
    items = rng.sample(range(len(sizes)), rng.randint(2, len(sizes)))
    assert packing._split_rows(items, sizes) == _reference_split_rows(items, sizes)
    assert packing._split_rows(items, np.asarray(sizes)) == _reference_split_rows(items, sizes)


def test_fullest_small_path_keeps_ties_in_bin_order(monkeypatch: pytest.MonkeyPatch) -> None:
    bins = [[0, 1], [2], [3, 4], [5, 6], [7, 8]]
    loads = [10, 50, 30, 10, 30]
    python = packing._fullest(bins, loads, 2)
    monkeypatch.setattr(packing, "SMALL_BINS", 0)
    assert python == packing._fullest(bins, loads, 2)
    assert sorted(python) == [(-30, 2), (-30, 4)]


def _reference_rehome(homeless: list[int], ranks: list[list[list[int]]], loads: list[float], *, sizes: list[int],
                      costs: list[float], cap: int, padded_rows: bool) -> bool:
    """Each sample to the lightest rank (ties: the lower) with a micro-batch it fits in: the first empty one there,
    else the first it fits in; a micro-batch fits a sample when its collated size with it stays under the cap."""
    def fits(mb: list[int], size: int) -> bool:
        if padded_rows:
            return (len(mb) + 1) * max([size, *(sizes[i] for i in mb)]) <= cap
        return sum(sizes[i] for i in mb) + size <= cap

    for item in homeless:
        size = sizes[item]
        open_ranks = [r for r, rank in enumerate(ranks) if any(fits(mb, size) for mb in rank)]
        if not open_ranks:
            return False
        r = min(open_ranks, key=lambda r: loads[r])
        empty = [b for b, mb in enumerate(ranks[r]) if not mb]
        b = empty[0] if empty else next(b for b, mb in enumerate(ranks[r]) if fits(mb, size))
        ranks[r][b].append(item)
        loads[r] += costs[item]
    return True


@pytest.mark.parametrize("seed", range(80))
def test_rehome_matches_reference(seed: int) -> None:
    rng = random.Random(seed)
    cap, padded_rows, dp = rng.choice((64, 200, 400)), rng.random() < 0.5, rng.randint(1, 6)
    sizes = [min(size, cap) for size in _sizes(rng, rng.randint(dp, 80))]
    costs = [float(rng.choice((1, 2, 3))) if rng.random() < 0.5 else rng.random() for _ in sizes]
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(sizes), max_tokens_per_gpu=cap, padded_rows=padded_rows)
    items = list(range(len(sizes)))
    rng.shuffle(items)
    homeless = sorted(items[: rng.randint(0, len(items))], key=lambda i: -sizes[i])
    ranks: list[list[list[int]]] = [[[] for _ in range(rng.randint(1, 4))] for _ in range(dp)]
    for i in items[len(homeless):]:
        rank = rng.choice(ranks)
        mb = rng.choice(rank)
        longest = max([sizes[i], *(sizes[j] for j in mb)])
        if (len(mb) + 1) * longest <= cap and sum(sizes[j] for j in mb) + sizes[i] <= cap:
            mb.append(i)
    loads = [sum(costs[i] for mb in rank for i in mb) for rank in ranks]
    expected_ranks, expected_loads = [[list(mb) for mb in rank] for rank in ranks], list(loads)
    expected = _reference_rehome(homeless, expected_ranks, expected_loads, sizes=sizes, costs=costs, cap=cap,
                                 padded_rows=padded_rows)
    got = planning._rehome(homeless, ranks, loads, sizes=sizes, costs=costs, config=config)
    assert got == expected
    if expected:
        assert ranks == expected_ranks


@pytest.mark.parametrize("seed", range(40))
def test_repacker_matches_repack_ranks(seed: int) -> None:
    rng = random.Random(seed)
    dp, padded_rows = rng.randint(1, 6), rng.random() < 0.7
    sizes = _sizes(rng, rng.randint(dp, 120))
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(sizes), max_tokens_per_gpu=rng.choice((400, 900)),
                            padded_rows=padded_rows)
    items = list(range(len(sizes)))
    rng.shuffle(items)
    plan = [[items[r::dp][m::2] for m in range(2)] for r in range(dp)]
    repack = objective.repacker(plan, sizes, config)
    for count in sorted(rng.sample(range(1, 40), 6)):
        assert repack(count) == objective.repack_ranks(plan, sizes, config, count)


@pytest.mark.parametrize("seed", range(30))
def test_padded_times_are_rows_times_the_longest(seed: int) -> None:
    rng = random.Random(seed)
    sizes = _sizes(rng, rng.randint(1, 60))
    model = StepTimeModel(seconds_per_token=rng.choice((1e-9, 0.3)), seconds_per_token_pair=rng.choice((0.0, 1e-12)),
                          seconds_per_microbatch=rng.choice((0.0, 1e-3)))
    config = ScheduleConfig(dp_size=1, global_batch_size=len(sizes), max_tokens_per_gpu=10_000, padded_rows=True,
                            step_time_model=model)
    timer = objective.StepTimer(sizes=sizes, costs=[1.0] * len(sizes), config=config)
    items = list(range(len(sizes)))
    rng.shuffle(items)
    rank = [items[a:b] for a, b in ((0, 0), (0, len(items) // 2), (len(items) // 2, len(items)))]
    a, b, c = model.seconds_per_token, model.seconds_per_token_pair, model.seconds_per_microbatch
    longest = [max((sizes[i] for i in mb), default=0) for mb in rank]  # every row as long as the longest
    expected = [a * (len(mb) * top) + b * (len(mb) * top * top) + c if mb else a + b + c  # an empty one: one token
                for mb, top in zip(rank, longest, strict=True)]
    assert timer._batch_times([rank]) == [expected]


@pytest.mark.parametrize("seed", range(30))
def test_arrangements_sort_by_cost_then_first_sample_empty_first(seed: int) -> None:
    rng = random.Random(seed)
    costs = [float(rng.choice((0, 1, 2))) for _ in range(30)]
    items = list(range(30))
    rng.shuffle(items)
    cuts = sorted(rng.randint(0, 30) for _ in range(rng.randint(0, 12)))
    batches = [items[a:b] for a, b in zip([0, *cuts], [*cuts, 30], strict=True)]
    ordered, (positions,) = ordering.arrangements(batches, costs, ("ascending",))
    expected = sorted(map(sorted, batches), key=lambda mb: (sum(costs[i] for i in mb), mb[:1]))
    assert [ordered[b] for b in positions] == expected
