"""Step 7's candidate timing on many ranks at once (issue 28, planning speed) against the rank-by-rank path.

:meth:`StepTimer.candidate` orders and times ranks of one count in one NumPy pass (its micro-batches sorted by
Python's sum of their costs, every order by index arithmetic, every rank in every order simulated together with
recycled rows). Here it is compared, on random plans with unsorted, empty and shared-cost micro-batches, with the
same timer forced onto its rank-by-rank path (``arrangements`` per rank, Python sums, per-rank simulation), and the
simulation with recycled rows with the one-rank simulator.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from megatron_dpsched.core import PipelineLayout, StepTimeModel, objective, simulate_rank
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.objective import Candidate, StepTimer, cost_equal
from megatron_dpsched.core.ordering import PIPELINE_ORDERS, arrange_rows, arrangements
from megatron_dpsched.core.steptime import row_makespans

LAYOUTS = ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (3, 3))


def random_case(rng: random.Random) -> tuple[StepTimer, list[list[list[int]]]]:
    """A timer and a plan of 8-40 ranks of one legal count; some micro-batches empty, out of index order, or of
    equal cost (equal sizes), some ranks one sample per micro-batch."""
    pp, vpp = rng.choice(LAYOUTS)
    layout = PipelineLayout(pp_size=pp, vpp_size=vpp)
    count = layout.align(rng.randint(1, 12))
    ranks = rng.randint(8, 40)
    pool = [rng.choice((1, 64, 512, 4096, rng.randint(1, 8192))) for _ in range(ranks * count * 3)]
    ids = list(range(len(pool)))
    rng.shuffle(ids)
    plan = []
    for _ in range(ranks):
        rank: list[list[int]] = [[] for _ in range(count)]
        for _ in range(rng.choice((count, rng.randint(0, 3 * count)))):
            if ids:
                rng.choice(rank).append(ids.pop())
        plan.append(rank)
    model = StepTimeModel(seconds_per_token=rng.choice((1e-9, 2.4e-8)), seconds_per_token_pair=1e-12,
                          seconds_per_microbatch=rng.choice((0.0, 5e-5)), backward_factor=rng.choice((2.0, 1.5)))
    config = ScheduleConfig(dp_size=ranks, global_batch_size=len(pool), max_tokens_per_gpu=8192, pp_size=pp,
                            vpp_size=vpp, step_time_model=model,
                            microbatch_order=rng.choice(("pipeline", "pipeline", "none")))
    costs = [float(size) + size * size / rng.choice((2048.0, 1e9)) for size in pool]
    return StepTimer(sizes=pool, costs=costs, config=config), plan


def rank_by_rank(timer: StepTimer, plan: list[list[list[int]]], monkeypatch: pytest.MonkeyPatch) -> Candidate:
    with monkeypatch.context() as patch:
        patch.setattr(StepTimer, "_rows_apply", lambda self, plan: False)
        return timer.candidate(plan)


@pytest.mark.parametrize("seed", range(60))
def test_many_ranks_order_and_time_as_rank_by_rank(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    timer, plan = random_case(random.Random(seed))
    before = [[list(mb) for mb in rank] for rank in plan]
    expected = rank_by_rank(timer, plan, monkeypatch)
    found = timer.candidate(plan)
    assert timer._rows_apply(plan)  # the NumPy path, where the order is "pipeline"
    assert found == expected
    assert found.rank_seconds == timer.makespans(found.plan)
    # the same micro-batches; the NumPy path (the pipeline orders) sorts each list in place, as the candidate's
    assert [[sorted(mb) for mb in rank] for rank in plan] == [[sorted(mb) for mb in rank] for rank in before]


@pytest.mark.parametrize("seed", range(40))
def test_padded_rows_order_and_time_as_rank_by_rank(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """With ``padded_rows`` (a micro-batch runs its samples as rows of its longest) the NumPy path times each
    micro-batch as the rank-by-rank path's Python arithmetic does."""
    timer, plan = random_case(random.Random(seed))
    timer = StepTimer(sizes=timer.sizes, costs=timer.costs,
                      config=ScheduleConfig(**{**timer.config.__dict__, "padded_rows": True}))
    with monkeypatch.context() as patch:
        patch.setattr(objective, "VECTOR_RANKS", 10**9)  # every rank's times in Python (_forward_time)
        expected = rank_by_rank(timer, [[list(mb) for mb in rank] for rank in plan], monkeypatch)
        one_by_one = timer._batch_times(plan)
    assert timer._batch_times(plan) == one_by_one
    found = timer.candidate(plan)
    assert timer._rows_apply(plan)
    assert found == expected


@pytest.mark.parametrize("seed", range(10))
def test_few_ranks_of_many_micro_batches_order_and_time_as_rank_by_rank(monkeypatch: pytest.MonkeyPatch,
                                                                       seed: int) -> None:
    rng = random.Random(seed)
    timer, _ = random_case(rng)
    count, ranks = timer.config.layout.align(rng.randint(80, 300)), rng.randint(1, 3)
    sizes = [rng.choice((1, 512, rng.randint(1, 4096))) for _ in range(2 * count * ranks)]
    timer = StepTimer(sizes=sizes, costs=[float(s) for s in sizes], config=timer.config)
    pool = iter(rng.sample(range(len(sizes)), len(sizes)))
    plan = [[[next(pool) for _ in range(rng.randint(0, 2))] for _ in range(count)] for _ in range(ranks)]
    assert timer._rows_apply(plan) == (ranks * count >= objective.ROWS_MICRO_BATCHES)
    assert timer.candidate(plan) == rank_by_rank(timer, plan, monkeypatch)


@pytest.mark.parametrize("seed", range(20))
def test_cost_equal_from_the_candidates_makespans_as_from_a_fresh_simulation(seed: int) -> None:
    timer, plan = random_case(random.Random(seed))
    timer = StepTimer(sizes=timer.sizes, costs=timer.costs,
                      config=ScheduleConfig(**{**timer.config.__dict__, "microbatch_order": "pipeline"}))
    chosen = timer.candidate(plan)
    unsimulated = Candidate(num_microbatches=chosen.num_microbatches, seconds=chosen.seconds, plan=chosen.plan)
    found, expected = cost_equal(chosen, timer), cost_equal(unsimulated, timer)
    assert (found.num_microbatches, found.seconds, found.plan) == (
        expected.num_microbatches, expected.seconds, expected.plan)


@pytest.mark.parametrize("seed", range(20))
def test_arranging_rows_as_arranging_each_rank(seed: int) -> None:
    rng = random.Random(seed)
    count, ranks = rng.randint(1, 9), rng.randint(1, 6)
    costs = [rng.choice((1.0, 2.0, rng.random())) for _ in range(count * ranks)]
    plan = [[[r * count + m] for m in range(count)] for r in range(ranks)]
    arranged = [arrangements(rank, costs, PIPELINE_ORDERS)[1] for rank in plan]
    ascending = np.array([arrangements(rank, costs, ("ascending",))[1][0] for rank in plan])
    for k, order in enumerate(PIPELINE_ORDERS):
        assert arrange_rows(ascending, order).tolist() == [positions[k] for positions in arranged]


@pytest.mark.parametrize("seed", range(30))
def test_rows_simulate_as_the_one_rank_simulator_at_many_micro_batches(seed: int) -> None:
    """Long schedules, where the table's rows are reused many times over."""
    rng = random.Random(seed)
    pp, vpp = rng.choice(LAYOUTS)
    group = rng.choice((None, pp + 1)) if vpp > 1 else None
    layout = PipelineLayout(pp_size=pp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group)
    count = layout.align(rng.randint(1, 300))
    model = StepTimeModel(seconds_per_token=1.0, backward_factor=rng.choice((2.0, 1.5)))
    times = np.array([[rng.choice((0.5, 1.0, rng.random() * 9)) for _ in range(count)]
                      for _ in range(rng.randint(1, 5))])
    expected = [simulate_rank(tuple(rank), layout=layout, model=model).makespan for rank in times.tolist()]
    assert row_makespans(times, layout=layout, backward_factor=model.backward_factor) == expected


def test_a_rank_of_one_sample_per_micro_batch_keeps_its_order_choice() -> None:
    """The steps of one sample per rank: every rank runs its sample among dummies in the fastest order."""
    timer, _ = random_case(random.Random(0))
    config = ScheduleConfig(dp_size=16, global_batch_size=16, max_tokens_per_gpu=8192, pp_size=4, vpp_size=2,
                            step_time_model=timer.config.step_time_model)
    sizes = [64 * (r + 1) for r in range(16)]
    timer = StepTimer(sizes=sizes, costs=[float(s) for s in sizes], config=config)
    found = timer.candidate([[[r], [], [], []] for r in range(16)])
    assert sorted(len(mb) for rank in found.plan for mb in rank) == [0] * 48 + [1] * 16
    assert found.seconds == max(found.rank_seconds or []) == max(timer.makespans(found.plan))
    assert objective.VECTOR_RANKS <= 16
