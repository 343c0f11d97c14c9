"""The NumPy layout of a step's plan (``plan_step_layout``, ``ordered_layout``) and the schedule assembled from it
against the general path: the planner's lists ordered by ``order_ranks`` (``plan_lists.plan_step``) and
``assemble_schedule``."""

from __future__ import annotations

import random

import numpy as np
import pytest
from plan_lists import layout_lists, plan_step

from megatron_dpsched.core import balancing, planning
from megatron_dpsched.core.balancing import run_sums
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.ordering import order_ranks, ordered_layout
from megatron_dpsched.core.padding import array_tuple
from megatron_dpsched.core.schedule import assemble_schedule, plan_schedule
from megatron_dpsched.core.steps import split_steps


def _config(rng: random.Random, order: str) -> ScheduleConfig:
    return ScheduleConfig(dp_size=rng.choice((1, 2, 4)), global_batch_size=rng.choice((8, 16, 40)),
                          max_tokens_per_gpu=100, pp_size=1 if order == "none" else 2, microbatch_order=order,
                          padded_rows=rng.random() < 0.5, pad_multiple=rng.choice((1, 8)))


@pytest.mark.parametrize("order", ["none", "pipeline"])
@pytest.mark.parametrize("seed", range(12))
def test_step_layout_is_the_step_plan(order: str, seed: int) -> None:
    rng = random.Random(f"{order}-{seed}")
    lengths = [rng.choice((rng.randint(1, 30), rng.randint(1, 130))) for _ in range(rng.randint(8, 80))]
    costs = array_tuple([float(n) ** 1.5 for n in lengths], np.float64)
    config = _config(rng, order)
    count = min(len(lengths), rng.randint(config.dp_size, 40))
    start = rng.randint(0, len(lengths) - count)
    for samples in (range(count), range(start, start + count), sorted(rng.sample(range(len(lengths)), count))):
        kwargs = {"lengths": lengths, "costs": costs, "config": config}
        plan = plan_step(samples, **kwargs)
        assert layout_lists(planning.plan_step_layout(samples, **kwargs)) == plan


@pytest.mark.parametrize("order", ["none", "pipeline"])
@pytest.mark.parametrize("seed", range(12))
def test_schedule_from_layouts_is_the_assembled_schedule(order: str, seed: int) -> None:
    rng = random.Random(f"whole-{order}-{seed}")
    lengths = [rng.randint(1, 130) for _ in range(rng.randint(40, 200))]
    config = _config(rng, order)
    schedule = plan_schedule(lengths, config=config)
    steps, dropped = split_steps(len(lengths), global_batch_size=config.global_batch_size, groups=None,
                                 drop_last=config.drop_last)
    costs = array_tuple(list(schedule.costs), np.float64)
    plans = [plan_step(step, lengths=lengths, costs=costs, config=config) for step in steps]
    general = assemble_schedule(plans, lengths=tuple(lengths), costs=schedule.costs, groups=None, config=config,
                                dropped=dropped)
    assert schedule == general
    assert schedule.micro_batch_indices == general.micro_batch_indices
    assert schedule.partitions == general.partitions


@pytest.mark.parametrize("order", ["none", "pipeline", "verl", "descending", "ascending"])
@pytest.mark.parametrize("seed", range(20))
def test_ordered_layout_is_order_ranks(order: str, seed: int) -> None:
    rng = random.Random(f"order-{order}-{seed}")
    count = rng.randint(1, 60)
    ids = rng.sample(range(count), count)
    per_rank = rng.randint(1, 6)
    ranks = [[[] for _ in range(per_rank)] for _ in range(rng.randint(1, 5))]
    for i in ids:  # micro-batches unsorted, some left empty
        rng.choice(rng.choice(ranks)).append(i)
    costs: list[float] | list[int] = [rng.choice((1.0, 2.5, float(rng.randint(1, 9)))) for _ in range(count)]
    if seed % 4 == 3:  # not all Python floats: the rank-by-rank path
        costs = [int(c) for c in costs]
    copy = [[list(mb) for mb in rank] for rank in ranks]
    expected = order_ranks(copy, costs, order, run_sums=run_sums)
    assert layout_lists(ordered_layout(ranks, costs, order, run_sums=run_sums)) == expected


@pytest.mark.parametrize("seed", range(60))
def test_lightest_is_the_stable_sorts_head(seed: int) -> None:
    rng = np.random.default_rng(seed)
    loads = rng.integers(0, 4, size=int(rng.integers(1, 40))).astype(np.float64)  # many ties
    if seed % 3 == 0:
        loads[rng.integers(0, len(loads), size=3)] = np.nan
    if seed % 5 == 0:
        loads[rng.integers(0, len(loads), size=2)] = np.inf
    for count in (1, 3, 8):
        expected = np.argsort(loads, kind="stable")[:count]
        assert balancing.lightest(loads, count).tolist() == expected.tolist()
