"""The global packers (issue 28, point 3: best-fit decreasing a size at a time with NumPy's help, the padded-rows
chunks a row count at a time, first fit in arrival order) against plain one-item-at-a-time references written
here: the same micro-batches, in the same order, with their samples in the same order, on random and
adversarial sizes (ties, sizes at the cap and past it, zeros, many equal sizes, huge caps)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dpsched.core.packing import best_fit_decreasing, chunk_count, chunk_decreasing, first_fit


def reference_first_fit(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """Each sample into the first micro-batch (scanning from the first opened) with room for it, else a new one;
    a sample over the cap fills its own."""
    bins: list[list[int]] = []
    rooms: list[int] = []
    for item in items:
        size = sizes[item]
        target = next((b for b, room in enumerate(rooms) if room >= size), None)
        if target is None:
            bins.append([item])
            rooms.append(cap - size if size <= cap else -1)
        else:
            bins[target].append(item)
            rooms[target] -= size
    return bins


def reference_best_fit_decreasing(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """Longest first (ties as given); each into the open micro-batch of least room that takes it (ties: the first
    opened), else a new one; a micro-batch is open while its room is above 0 and it holds nothing of the cap."""
    bins: list[list[int]] = []
    rooms: list[int] = []  # 0 for a closed micro-batch
    for item in sorted(items, key=lambda i: -sizes[i]):
        size = sizes[item]
        fitting = [b for b, room in enumerate(rooms) if room > 0 and room >= size and size < cap]
        if fitting:
            target = min(fitting, key=lambda b: (rooms[b], b))
            bins[target].append(item)
            rooms[target] -= size
        else:
            bins.append([item])
            rooms.append(max(0, cap - size) if size < cap else 0)
    return bins


def reference_chunks(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """Padded rows: samples by decreasing size (ties by id); a chunk is full once it holds as many rows as
    its first sample allows (``cap // size``, at least 1; a size of 0 counts as 1)."""
    chunks: list[list[int]] = []
    for item in sorted(items, key=lambda i: (-sizes[i], i)):
        if not chunks or len(chunks[-1]) == max(1, cap // max(1, sizes[chunks[-1][0]])):
            chunks.append([])
        chunks[-1].append(item)
    return chunks


def _sizes(rng: random.Random, count: int, cap: int) -> list[int]:
    """One of several shapes: around fractions of the cap (many ties), uniform to the cap or past it, small."""
    kind = rng.randrange(5)
    marks = (0, 1, cap // 2, cap // 2 + 1, cap // 3, cap // 4, cap - 1, cap, cap + 1, 2 * cap)
    draw = {0: lambda: rng.choice(marks), 1: lambda: rng.randint(0, 2 * cap), 2: lambda: rng.randint(1, cap),
            3: lambda: rng.randint(1, max(1, cap // 5)), 4: lambda: rng.choice((cap // 3, cap // 6, cap // 7))}[kind]
    return [max(0, draw()) for _ in range(count)]


def _items(rng: random.Random, count: int) -> list[int] | range:
    """All ids in order (a range), a shuffled subset, or a sorted subset."""
    shape = rng.randrange(3)
    if shape == 0:
        return range(rng.randint(0, count), count)
    items = rng.sample(range(count), rng.randint(0, count))
    return sorted(items) if shape == 1 else items


@pytest.mark.parametrize("seed", range(120))
def test_packers_match_the_one_by_one_references(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((1, 2, 3, 10, 64, 100, 4096, 8192, 2**31))
    count = rng.choice((0, 1, 2, 3, rng.randint(0, 60), rng.randint(0, 300)))
    sizes = _sizes(rng, count, cap)
    items = _items(rng, count)
    listed = list(items)
    assert first_fit(items, sizes, cap) == reference_first_fit(listed, sizes, cap)
    assert best_fit_decreasing(items, sizes, cap) == reference_best_fit_decreasing(listed, sizes, cap)
    assert chunk_decreasing(items, sizes, cap) == reference_chunks(listed, sizes, cap)
    assert best_fit_decreasing(items, sizes, cap, padded_rows=True) == reference_chunks(listed, sizes, cap)


@settings(max_examples=300)
@given(cap=st.integers(1, 40), sizes=st.lists(st.integers(0, 50), max_size=80), data=st.data())
def test_packers_match_the_references_on_small_caps(cap: int, sizes: list[int], data: st.DataObject) -> None:
    items = data.draw(st.permutations(range(len(sizes))).flatmap(lambda p: st.just(p[: data.draw(
        st.integers(0, len(p)))])))
    assert first_fit(items, sizes, cap) == reference_first_fit(items, sizes, cap)
    assert best_fit_decreasing(items, sizes, cap) == reference_best_fit_decreasing(items, sizes, cap)
    assert chunk_decreasing(items, sizes, cap) == reference_chunks(items, sizes, cap)


@pytest.mark.parametrize("cap", [60, 97, 1024])
def test_many_equal_sizes_fill_rooms_in_runs_as_one_by_one(cap: int) -> None:
    """Thousands of samples over few sizes: whole runs of one size go to one room's micro-batches at once."""
    rng = random.Random(cap)
    pool = [cap // 2, cap // 3, cap // 3 + 1, cap // 5, cap // 7, 1, cap - 1, cap]
    sizes = [rng.choice(pool) for _ in range(1500)]
    items = list(range(len(sizes)))
    assert best_fit_decreasing(items, sizes, cap) == reference_best_fit_decreasing(items, sizes, cap)
    assert chunk_decreasing(items, sizes, cap) == reference_chunks(items, sizes, cap)


def test_numpy_items_and_sizes_pack_as_lists() -> None:
    rng = random.Random(5)
    sizes = [rng.randint(1, 300) for _ in range(400)]
    items = rng.sample(range(400), 250)
    for packer in (best_fit_decreasing, chunk_decreasing):
        expected = packer(items, sizes, 256)
        assert packer(np.array(items), np.array(sizes), 256) == expected
        assert packer(np.array(items, dtype=np.int32), sizes, 256) == expected
    assert best_fit_decreasing(range(400), np.array(sizes), 256) == best_fit_decreasing(list(range(400)), sizes, 256)


def test_sizes_of_one_value_beyond_a_radix_sort_keep_their_order() -> None:
    """Sizes spanning more than 2**16 values sort by a comparison sort, still stable and decreasing."""
    sizes = [1, 70000, 5, 70000, 2**20, 5, 0, 2**20]
    expected = reference_best_fit_decreasing(list(range(8)), sizes, 2**21)
    assert best_fit_decreasing(range(8), sizes, 2**21) == expected
    assert chunk_decreasing(range(8), sizes, 2**21) == reference_chunks(list(range(8)), sizes, 2**21)


@pytest.mark.parametrize("low", [0, 2**16 - 40, 10**9])
def test_sizes_in_a_narrow_band_anywhere_sort_as_one_by_one(low: int) -> None:
    """A band of under 2**16 values sorts by radix wherever it lies; ties keep the order given."""
    rng = random.Random(low)
    sizes = [low + rng.randint(0, 60) for _ in range(300)]
    items = rng.sample(range(300), 200)
    cap = 3 * low + 100
    assert best_fit_decreasing(items, sizes, cap) == reference_best_fit_decreasing(items, sizes, cap)
    assert chunk_decreasing(items, sizes, cap) == reference_chunks(items, sizes, cap)


def test_a_range_past_the_sizes_is_refused_as_before() -> None:
    with pytest.raises(IndexError):
        best_fit_decreasing(range(3), [1, 2], 8)


@pytest.mark.parametrize("seed", range(30))
def test_chunk_count_counts_the_chunks(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice((1, 10, 4096))
    sizes = _sizes(rng, rng.randint(0, 200), cap)
    assert chunk_count(sizes, cap) == len(reference_chunks(list(range(len(sizes))), sizes, cap))
