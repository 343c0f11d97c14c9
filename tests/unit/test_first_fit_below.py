"""First fit cut short (issue 28, point 3): ``first_fit_below`` returns first fit's micro-batches when there are
fewer than its limit, else ``None``, and may stop after a prefix once a floor on first fit's count reaches the
limit. Checked against a plain first fit written here (each sample scans the micro-batches from the first) on
random and adversarial sizes, at every limit around the true count and with probes as small as one sample, so
each prefix's floor is put to the test."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dpsched.core.packing import best_fit_decreasing, first_fit, first_fit_below


def plain_first_fit(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """Each sample into the first micro-batch with room for it, else a new one; one over the cap fills its own."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for item in items:
        size = sizes[item]
        for b, load in enumerate(loads):
            if size <= cap and load + size <= cap:
                bins[b].append(item)
                loads[b] += size
                break
        else:
            bins.append([item])
            loads.append(size)
    return bins


def _sizes(rng: random.Random, count: int, cap: int) -> list[int]:
    kind = rng.randrange(4)
    if kind == 0:  # ties, the cap's halves and thirds, zeros and oversize
        return [rng.choice((0, 1, cap // 2, cap // 2 + 1, cap // 3, cap - 1, cap, cap + 1, 2 * cap))
                for _ in range(count)]
    if kind == 1:
        return [rng.randint(0, 2 * cap) for _ in range(count)]
    if kind == 2:  # mostly short: first fit's floor from long samples stays low
        return [rng.randint(1, max(1, cap // 4)) if rng.random() < 0.8 else rng.randint(1, cap) for _ in range(count)]
    return [rng.randint(1, cap) for _ in range(count)]


def _check(items: list[int], sizes: list[int], cap: int, probe: int) -> None:
    expected = plain_first_fit(items, sizes, cap)
    assert first_fit(items, sizes, cap) == expected
    for limit in range(max(0, len(expected) - 2), len(expected) + 3):
        found = first_fit_below(items, sizes, cap, limit=limit, probe=probe)
        assert found == (expected if len(expected) < limit else None), (limit, probe)


@pytest.mark.parametrize("seed", range(200))
def test_first_fit_below_returns_first_fit_exactly_when_it_is_under_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((1, 2, 3, 10, 64, 100, 4096, 8192))
    count = rng.choice((0, 1, 2, 3, rng.randint(0, 80), rng.randint(0, 400)))
    sizes = _sizes(rng, count, cap)
    items = rng.sample(range(count), rng.randint(0, count))
    _check(items, sizes, cap, probe=rng.choice((1, 2, 3, 5, 16, 4096)))


@settings(max_examples=300)
@given(cap=st.integers(1, 40), sizes=st.lists(st.integers(0, 90), max_size=120), probe=st.integers(1, 9))
def test_first_fit_below_never_gives_up_on_a_first_fit_under_the_limit(cap: int, sizes: list[int], probe: int) -> None:
    _check(list(range(len(sizes))), sizes, cap, probe)


class Slices(list):
    """A list of ids that records the slices taken of it (first fit places samples one slice at a time)."""

    def __init__(self, items: list[int]) -> None:
        super().__init__(items)
        self.taken: list[tuple[int, int]] = []

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, slice):
            self.taken.append((key.start, key.stop))
        return super().__getitem__(key)


def test_first_fit_below_stops_once_the_long_samples_alone_reach_the_limit() -> None:
    sizes = [60] * 100  # over half of 100 each: 100 micro-batches
    items = Slices(list(range(100)))
    assert first_fit_below(items, sizes, 100, limit=100, probe=4) is None
    assert items.taken == [(0, 4)]  # 4 opened + 96 long to come: the floor is 100 after the first probe
    items = Slices(list(range(100)))
    assert first_fit_below(items, sizes, 100, limit=101, probe=4) == [[i] for i in range(100)]
    assert items.taken == [(0, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128)]


def test_first_fit_below_counts_the_rooms_that_can_still_take_a_long_sample() -> None:
    # 10 samples of 10 (one micro-batch, room 0), 9 of 40 (four micro-batches of two, one of one with room 60):
    # the floor after them is 6 opened + 5 long to come - 1 with room over half = 10, what first fit makes
    sizes = [10] * 10 + [40] * 9 + [60] * 5
    items = Slices(list(range(len(sizes))))
    expected = plain_first_fit(items, sizes, 100)
    assert len(expected) == 10
    assert first_fit_below(items, sizes, 100, limit=11, probe=19) == expected
    items.taken.clear()
    assert first_fit_below(items, sizes, 100, limit=10, probe=19) is None
    assert items.taken == [(0, 19)]


def test_first_fit_below_on_long_inputs_where_best_fit_wins_and_where_first_fit_does() -> None:
    """Long enough for the default probe's prefixes to decide; the segment-tree first fit (checked against the
    plain one above) gives the full counts."""
    cap = 8192
    uniform = np.random.default_rng(5).integers(1, cap, 60_000).tolist()  # best fit wins, known from a prefix
    items = range(len(uniform))
    full, best_fit = first_fit(items, uniform, cap), best_fit_decreasing(items, uniform, cap)
    assert len(full) > len(best_fit)
    assert first_fit_below(items, uniform, cap, limit=len(best_fit)) is None
    assert first_fit_below(items, uniform, cap, limit=len(full) + 1) == full
    filled = [4, 5, 3] * 5000  # first fit fills one micro-batch of 12 per three samples; best fit 13 per 12
    items = range(len(filled))
    full, best_fit = first_fit(items, filled, 12), best_fit_decreasing(items, filled, 12)
    assert len(full) == 5000 < len(best_fit)
    assert first_fit_below(items, filled, 12, limit=len(best_fit)) == full
