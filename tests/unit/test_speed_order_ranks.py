"""``order_ranks`` (every rank's micro-batches sorted in place, the pipeline orders in one NumPy pass) gives what
``order_micro_batches`` gives rank by rank, for every order: ties in cost, empty micro-batches, single samples,
samples given out of order, and float costs whose sums differ only in their last bits (or only in how Python's
``sum`` rounds them)."""

from __future__ import annotations

import copy
import math
from itertools import chain

from hypothesis import given
from hypothesis import strategies as st

from megatron_dpsched.core.balancing import run_sums
from megatron_dpsched.core.ordering import PIPELINE_ORDERS, order_micro_batches, order_ranks
from megatron_dpsched.core.padding import array_tuple

ORDERS = ("none", *PIPELINE_ORDERS)
NEAR_TIES = (0.0, 0.1, 0.2, 0.3, 0.1 + 0.2, math.nextafter(0.3, 1.0), 1.0, 1e16, 1e-16, 3.0, 7.5)
"""Costs whose sums tie, or miss a tie by the last bit, in many orders of addition."""


@st.composite
def rank_plans(draw: st.DrawFn) -> tuple[list[list[list[int]]], list[float]]:
    """Ranks of micro-batches (some empty, some of one sample) holding a shuffled range of sample ids once each,
    and a cost per sample drawn from :data:`NEAR_TIES` or anywhere."""
    count = draw(st.integers(0, 40))
    samples = draw(st.permutations(range(count)))
    num_ranks = draw(st.integers(1, 5))
    same_count = draw(st.booleans())
    fixed = draw(st.integers(1, 6))
    ranks, start = [], 0
    for _ in range(num_ranks):
        sizes = [draw(st.integers(0, 4)) for _ in range(fixed if same_count else draw(st.integers(0, 6)))]
        ranks.append([list(samples[start : (start := min(start + size, count))]) for size in sizes])
    if start < count:  # the rest: one more micro-batch on the last rank
        ranks[-1].append(list(samples[start:]))
    cost = st.sampled_from(NEAR_TIES) | st.floats(0.0, 1e6, allow_nan=False)
    return ranks, draw(st.lists(cost, min_size=count, max_size=count))


@given(rank_plans())
def test_order_ranks_matches_rank_by_rank(plan: tuple[list[list[list[int]]], list[float]]) -> None:
    ranks, costs = plan
    values = array_tuple(costs, float)
    for order in ORDERS:
        expected = [order_micro_batches(rank, values, order) for rank in ranks]
        assert order_ranks(copy.deepcopy(ranks), values, order, run_sums=run_sums) == expected, order
        assert order_ranks(copy.deepcopy(ranks), costs, order, run_sums=run_sums) == expected, order
    for order in ("none", "pipeline"):  # the given lists, sorted in place, not copies
        given_lists = copy.deepcopy(ranks)
        ordered = order_ranks(given_lists, values, order, run_sums=run_sums)
        assert sorted(map(id, chain.from_iterable(ordered))) == sorted(map(id, chain.from_iterable(given_lists)))


def test_near_ties_keep_their_order() -> None:
    # [0.1, 0.2] sums to 0.30000000000000004, above [0.3]: the ordering sees the last bit; equal sums go by first sample
    ranks = [[[5, 1], [0], [3, 4], [2], []], [[], [7], [6]]]
    costs = [0.3, 0.1, 0.3, 0.2, 0.1, 0.2, 1.0, 1.0]
    assert order_ranks(copy.deepcopy(ranks), costs, "ascending", run_sums=run_sums) == [
        [[], [0], [2], [1, 5], [3, 4]], [[], [6], [7]]]
    assert order_ranks(copy.deepcopy(ranks), costs, "none") == [[[0], [1, 5], [2], [3, 4], []], [[6], [7], []]]
    for order in ORDERS:
        assert order_ranks(copy.deepcopy(ranks), costs, order, run_sums=run_sums) == [
            order_micro_batches(rank, costs, order) for rank in ranks]
    # Python's sum of [0.1, 0.2, 0.3] is 0.6 (added left to right it would be 0.6000000000000001): a tie with [3]
    ranks, costs = [[[3], [2, 0, 1]]], [0.1, 0.2, 0.3, sum([0.1, 0.2, 0.3])]
    expected = [order_micro_batches(rank, costs, "ascending") for rank in ranks]
    assert order_ranks(ranks, costs, "ascending", run_sums=run_sums) == expected == [[[0, 1, 2], [3]]]


def test_integer_costs_and_no_summer_go_rank_by_rank() -> None:
    # costs past 2**53 that float64 cannot tell apart, and no run_sums: the same orders as rank by rank
    ranks = [[[0], [1], [2, 3]], [[4, 5], [6]]]
    costs = [2**60 + 1, 2**60, 2**59, 2**59, 1, 2, 3]
    for order in ORDERS:
        expected = [order_micro_batches(rank, costs, order) for rank in ranks]
        assert order_ranks(copy.deepcopy(ranks), costs, order, run_sums=run_sums) == expected
        assert order_ranks(copy.deepcopy(ranks), costs, order) == expected
    assert order_ranks(ranks, costs, "ascending", run_sums=run_sums)[0] == [[1], [2, 3], [0]]
