"""scripts/kk_reference.py, the benchmark's Karmarkar-Karp-dealt plans: by hand on small inputs, and on random steps
(empty ranks included) the equal-count deal's sizes differ by at most one and every plan keeps every sample once,
the cap and a legal count."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kk_reference import kk_dealt_plans, largest_differencing, split_under_cap  # noqa: E402

from megatron_dpsched.core.alignment import PipelineLayout  # noqa: E402


def test_largest_differencing_by_hand() -> None:
    # 8-7 -> {8 | 7}, 6-5 -> {6 | 5}; 4 joins 7: {4,7 | 8}; then {6 | 5} reversed: {4,7,5 | 8,6}: 16 vs 14
    assert largest_differencing(range(5), [8, 7, 6, 5, 4], 2) == [[4, 1, 3], [0, 2]]
    # plain: 9 alone against five 1s; equal counts: runs (9, 1) (1, 1) (1, 1) give three samples a side
    assert largest_differencing(range(6), [9, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert largest_differencing(range(6), [9, 1, 1, 1, 1, 1], 2, equal_count=True) == [[0, 3, 5], [1, 2, 4]]
    assert largest_differencing([], [], 3) == [[], [], []]


def test_split_under_cap_moves_the_shortest_sample_out_or_gives_up() -> None:
    sizes = [6, 6, 3, 3]
    # by cost {0, 3 | 1, 2}: both 9 tokens; a cap of 9 keeps them, a cap of 8 cannot be met in 2
    assert split_under_cap(range(4), sizes=sizes, costs=[6, 6, 3, 3], count=2, cap=9) == [[0, 3], [1, 2]]
    assert split_under_cap(range(4), sizes=sizes, costs=[6, 6, 3, 3], count=2, cap=8) is None
    # by cost {2 | 3 | 0, 1}: the two long samples share 12 tokens; the first of them (the shortest, lower id)
    # moves to the micro-batch with the least tokens that takes it
    assert split_under_cap(range(4), sizes=sizes, costs=[1, 1, 10, 10], count=3, cap=9) == [[2, 0], [3], [1]]


@pytest.mark.parametrize("seed", range(20))
def test_every_dealt_plan_keeps_every_sample_the_cap_and_a_legal_count(seed: int) -> None:
    rng = random.Random(seed)
    cap, dp = rng.choice((64, 200)), rng.randint(1, 5)
    layout = PipelineLayout(pp_size=rng.choice((1, 2)), vpp_size=rng.choice((1, 2)))
    sizes = [rng.randint(1, cap + 20) if rng.random() < 0.1 else rng.randint(1, cap // 2)
             for _ in range(rng.randint(1, 40))]  # fewer samples than ranks too: empty ranks
    costs = [s + s * s / 100 for s in sizes]
    equal = largest_differencing(range(len(sizes)), costs, dp, equal_count=True)
    assert max(map(len, equal)) - min(map(len, equal)) <= 1
    plans = list(kk_dealt_plans(sizes, costs, dp_size=dp, cap=cap, layout=layout, lower_bound=layout.align(1)))
    assert plans, "one sample per micro-batch always fits"
    for plan in plans:
        assert len(plan) == dp and len({len(rank) for rank in plan}) == 1 and layout.is_legal(len(plan[0]))
        assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(len(sizes)))
        assert all(len(mb) < 2 or sum(sizes[i] for i in mb) <= cap for rank in plan for mb in rank)
