"""The shortcuts of steps with no more samples than ranks: LPT and packing are then
determined, and the shortcut's plan is the general deal's (LPT on every sample, then each rank packed) on many
random small cases, the whole step's plan that of the general search, and the lower bound the bin bound; costs
it cannot decide (zero, NaN, inf) go the general way. Also the sliced step arrays."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from plan_lists import plan_step

from megatron_dpsched.core import planning
from megatron_dpsched.core.balancing import lpt_ranks
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.packing import bin_lower_bound, pack_ranks
from megatron_dpsched.core.padding import ArrayTuple, array_slice, array_tuple, step_sizes
from megatron_dpsched.core.steptime import StepTimeModel


def general_deal(sizes: list[int], costs: list[float], *, config: ScheduleConfig, num_microbatches: int) -> list:
    """LPT on every sample, then every rank packed into ``num_microbatches`` (the general steps 3-4)."""
    cap = config.token_cap
    ranks = lpt_ranks(range(len(sizes)), costs=costs, weights=np.minimum(np.asarray(sizes), cap),
                      capacity=num_microbatches * cap, num_ranks=config.dp_size)
    assert ranks is not None
    return pack_ranks(ranks, sizes, cap, num_microbatches, padded_rows=config.padded_rows)


def random_case(rng: random.Random) -> tuple[list[int], list[float], ScheduleConfig]:
    dp = rng.choice((1, 2, 3, 8, 15, 16, 17, 64, 512))
    cap = rng.choice((7, 100, 4096))
    count = rng.randint(1, dp)
    sizes = [rng.choice((rng.randint(1, cap), rng.randint(1, 3), cap, cap + rng.randint(1, 9))) for _ in range(count)]
    kind = rng.randrange(3)
    if kind == 0:  # costs of the sizes: ties between equal sizes
        costs = [float(s) ** 1.5 for s in sizes]
    elif kind == 1:  # few distinct costs: ties across different sizes
        costs = [rng.choice((0.5, 1.0, 3.0)) for _ in sizes]
    else:
        costs = [rng.random() + 1e-9 for _ in sizes]
    config = ScheduleConfig(dp_size=dp, global_batch_size=count, max_tokens_per_gpu=cap,
                            padded_rows=rng.random() < 0.3)
    return sizes, costs, config


@pytest.mark.parametrize("seed", range(300))
def test_one_sample_per_rank_plan_is_the_general_deals(seed: int) -> None:
    rng = random.Random(seed)
    sizes, costs, config = random_case(rng)
    num_microbatches = rng.randint(1, 6)
    step, step_costs = step_sizes(sizes, pad_multiple=1), array_tuple(costs, np.float64)
    fast = planning._one_per_rank(step, step_costs, config=config, num_microbatches=num_microbatches)
    assert fast == general_deal(sizes, costs, config=config, num_microbatches=num_microbatches)
    assert fast == planning._assign_and_pack(step, step_costs, config=config, num_microbatches=num_microbatches)
    assert sorted(i for rank in fast for mb in rank for i in mb) == list(range(len(sizes)))
    assert all(len(rank) == num_microbatches for rank in fast) and len(fast) == config.dp_size


def test_equal_costs_go_larger_capped_size_first_then_by_id() -> None:
    config = ScheduleConfig(dp_size=4, global_batch_size=4, max_tokens_per_gpu=10)
    sizes, costs = [3, 12, 11, 1], [1.0, 1.0, 1.0, 2.0]  # 12 and 11 both weigh the cap: a tie, id 1 first
    plan = planning._one_per_rank(sizes, costs, config=config, num_microbatches=2)
    assert plan == [[[3], []], [[1], []], [[2], []], [[0], []]]
    assert plan == general_deal(sizes, costs, config=config, num_microbatches=2)


@pytest.mark.parametrize("costs", [[0.0, 1.0, 1.0], [1.0, float("nan"), 2.0], [float("inf"), 1.0, 1.0], []])
def test_costs_it_cannot_decide_take_the_general_path(costs: list[float]) -> None:
    config = ScheduleConfig(dp_size=4, global_batch_size=3, max_tokens_per_gpu=10)
    assert planning._one_per_rank([1, 2, 3][: len(costs)], costs, config=config, num_microbatches=2) is None


def test_array_slice_keeps_the_items_and_slices_the_array() -> None:
    values = array_tuple([1.5, 2.0, 3.25, 4.0], np.float64)
    part = array_slice(values, 1, 3)
    assert isinstance(part, ArrayTuple) and part == (2.0, 3.25)
    assert part.values.tolist() == [2.0, 3.25] and not part.values.flags.writeable
    assert array_slice([1, 2, 3], 1, 3) == [2, 3]


@pytest.mark.parametrize("seed", range(60))
def test_small_step_plans_are_those_of_the_general_search(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    dp = rng.choice((2, 5, 16, 40))
    lengths = [rng.choice((rng.randint(1, 300), rng.randint(301, 700))) for _ in range(3 * dp)]
    costs = array_tuple([float(n) ** 1.2 for n in lengths], np.float64)
    model = StepTimeModel(seconds_per_token=1e-6, seconds_per_token_pair=1e-9, seconds_per_microbatch=1e-3)
    config = ScheduleConfig(dp_size=dp, global_batch_size=dp, max_tokens_per_gpu=512, pp_size=rng.choice((1, 2, 4)),
                            padded_rows=rng.random() < 0.3, step_time_model=model if rng.random() < 0.5 else None)
    count = rng.randint(1, dp)
    samples = range(start := rng.randint(0, len(lengths) - count), start + count)
    step_sizes_of = [lengths[i] for i in samples]
    bound = config.layout.align(math.ceil(bin_lower_bound(step_sizes_of, 512, padded_rows=config.padded_rows) / dp))
    assert planning.lower_bound_microbatches(step_sizes_of, config=config) == bound
    fast = plan_step(samples, lengths=lengths, costs=costs, config=config)
    monkeypatch.setattr(planning, "_one_per_rank", lambda *args, **kwargs: None)
    monkeypatch.setattr(planning, "lower_bound_microbatches", lambda sizes, *, config: bound)
    assert fast == plan_step(samples, lengths=lengths, costs=costs, config=config)


@pytest.mark.parametrize("seed", range(30))
def test_lower_bound_of_small_and_larger_steps_is_the_bin_bound(seed: int) -> None:
    rng = random.Random(seed)
    dp, cap = rng.choice((1, 3, 8)), rng.choice((10, 512))
    config = ScheduleConfig(dp_size=dp, global_batch_size=dp, max_tokens_per_gpu=cap, pp_size=rng.choice((1, 3)),
                            padded_rows=rng.random() < 0.3)
    for count in range(1, 3 * dp + 2):
        sizes = [rng.randint(1, 2 * cap) for _ in range(count)]
        needed = math.ceil(bin_lower_bound(sizes, cap, padded_rows=config.padded_rows) / dp)
        assert planning.lower_bound_microbatches(sizes, config=config) == config.layout.align(needed)
