"""Step 7's memory and time bounds (issue 28, planning speed): work in blocks or steps gives what one pass gives.

The vector simulation runs its rows in blocks (:data:`~megatron_dpsched.core.steptime.BLOCK_FLOATS`), the busiest
ranks' work is summed a block of ranks at a time or in Python (:func:`~megatron_dpsched.core.objective._python_sums`),
the plan's arrays are assembled step by step (:func:`~megatron_dpsched.core.schedule._assembled`), and with
``padded_rows`` each count's micro-batches are split on from the last count's
(:func:`~megatron_dpsched.core.objective.repacker`), and step 7 takes step 5's packings instead of packing those
counts again. Each is compared here with a plain reference: the one-rank simulator, Python's ``sum``,
``assemble_schedule`` on the steps' lists, ``split_chunks`` at each count and ``plan_at_count``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from plan_lists import plan_step

from megatron_dpsched.core import PipelineLayout, StepTimeModel, objective, planning, simulate_rank, steptime
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.packing import chunk_ranks, split_chunks
from megatron_dpsched.core.padding import array_tuple, step_sizes
from megatron_dpsched.core.schedule import assemble_schedule, plan_schedule
from megatron_dpsched.core.steps import split_steps


@pytest.mark.parametrize("seed", range(20))
def test_rows_simulated_in_blocks_as_one_by_one(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    layout = PipelineLayout(pp_size=rng.choice((2, 4)), vpp_size=rng.choice((1, 2)))
    count = layout.align(rng.randint(1, 40))
    model = StepTimeModel(seconds_per_token=1.0, backward_factor=2.0)
    times = np.array([[rng.choice((0.5, rng.random() * 9)) for _ in range(count)] for _ in range(rng.randint(1, 30))])
    monkeypatch.setattr(steptime, "BLOCK_FLOATS", rng.choice((1, 2 * count, 7 * count)))  # 1, 1 or 3 rows a block
    expected = [simulate_rank(tuple(rank), layout=layout, model=model).makespan for rank in times.tolist()]
    assert steptime.row_makespans(times, layout=layout, backward_factor=model.backward_factor) == expected


@pytest.mark.parametrize("seed", range(40))
def test_work_summed_in_blocks_as_python_sums(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 30, int(rng.integers(0, 50)))
    values = rng.random(500) * 10.0 ** rng.integers(-3, 10, 500)
    flat = rng.integers(0, 500, int(counts.sum()))
    monkeypatch.setattr(objective, "SUM_BLOCK", int(rng.integers(1, 600)))
    monkeypatch.setattr(objective, "PYTHON_SUM_RUNS", int(rng.integers(0, 4)))  # 0: always the NumPy blocks
    taken, ends = values[flat].tolist(), np.cumsum(counts).tolist()
    expected = [sum(taken[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
    assert objective._python_sums(values, flat, counts) == expected


@pytest.mark.parametrize("seed", range(10))
def test_steps_assembled_as_the_general_assembly(seed: int) -> None:
    """Many steps of a step-time plan at PP 4: the arrays filled step by step give ``assemble_schedule``'s plan."""
    rng = random.Random(seed)
    dp, per_step = rng.choice((2, 8, 16)), rng.choice((1, 3, 8))
    lengths = [rng.randint(1, 4096) for _ in range(dp * per_step * rng.randint(1, 7) + rng.randint(0, dp))]
    config = ScheduleConfig(dp_size=dp, global_batch_size=dp * per_step, max_tokens_per_gpu=4096, pp_size=4,
                            vpp_size=rng.choice((1, 2)), step_time_model=StepTimeModel(seconds_per_token=1e-6))
    schedule = plan_schedule(lengths, config=config)
    steps, dropped = split_steps(len(lengths), global_batch_size=config.global_batch_size, groups=None,
                                 drop_last=False)
    costs = array_tuple(list(schedule.costs), np.float64)
    plans = [plan_step(step, lengths=lengths, costs=costs, config=config) for step in steps]
    general = assemble_schedule(plans, lengths=tuple(lengths), costs=schedule.costs, groups=None, config=config,
                                dropped=dropped)
    assert (schedule.partitions, schedule.micro_batch_indices) == (general.partitions, general.micro_batch_indices)
    assert schedule == general


@pytest.mark.parametrize("seed", range(40))
def test_chunks_split_on_from_the_last_count_as_split_afresh(seed: int) -> None:
    """With ``padded_rows`` the repacker splits each count on from the last one: the micro-batches of
    ``split_chunks`` at that count, also where a candidate sorted the last count's micro-batches in place."""
    rng = random.Random(seed)
    sizes = [rng.choice((rng.randint(1, 64), rng.randint(1, 1024), 1024)) for _ in range(rng.randint(8, 300))]
    ids = rng.sample(range(len(sizes)), len(sizes))
    cuts = sorted(rng.sample(range(1, len(sizes)), rng.randint(1, 7)))
    ranks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(sizes)])]
    config = ScheduleConfig(dp_size=len(ranks), global_batch_size=len(sizes), max_tokens_per_gpu=1024,
                            padded_rows=True, step_time_model=StepTimeModel(seconds_per_token=1e-6))
    repack = objective.repacker([[rank] for rank in ranks], sizes, config)
    chunks = chunk_ranks(ranks, sizes, 1024)
    for count in [rng.randint(1, 60) for _ in range(8)]:
        expected = split_chunks(chunks, sizes, count)
        found = repack(count)
        if any(bins is None for bins in expected):
            assert found is None
            continue
        assert found is not None
        assert [[sorted(mb) for mb in rank] for rank in found] == [[sorted(mb) for mb in rank] for rank in expected]
        if rng.random() < 0.5:
            for rank in found:
                for mb in rank:
                    mb.sort()


@pytest.mark.parametrize("seed", range(30))
def test_counts_step_5_packed_are_not_packed_again(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Step 7 takes step 5's packings (``tried``: the counts that did not fit, and the refined plans of those that
    did) instead of packing those counts again: the same plans as packing them again."""
    rng = random.Random(seed)
    dp = rng.choice((4, 8, 16))
    lengths = [rng.choice((rng.randint(1, 700), rng.randint(1500, 2048))) for _ in range(dp * rng.randint(2, 12))]
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(lengths), max_tokens_per_gpu=2048,
                            pp_size=rng.choice((1, 4)), padded_rows=rng.random() < 0.5,
                            step_time_model=StepTimeModel(seconds_per_token=1e-6, seconds_per_microbatch=1e-4))
    costs = array_tuple([float(n) for n in lengths], np.float64)
    replanned: list[int] = []
    plan_at_count = planning.plan_at_count

    def counted(*args: object, num_microbatches: int, **kwargs: object) -> object:
        replanned.append(num_microbatches)
        return plan_at_count(*args, num_microbatches=num_microbatches, **kwargs)

    monkeypatch.setattr(planning, "plan_at_count", counted)
    found = plan_step(range(len(lengths)), lengths=lengths, costs=costs, config=config)
    with_notes = len(replanned)
    with monkeypatch.context() as patch:  # step 5 keeps nothing: step 7 packs every count again
        attempt = planning._attempt
        patch.setattr(planning, "_attempt", lambda *args, tried=None, **kwargs: attempt(*args, **kwargs))
        patch.setattr(planning, "KEPT_SAMPLES", -1)
        replanned.clear()
        assert plan_step(range(len(lengths)), lengths=lengths, costs=costs, config=config) == found
    assert len(replanned) >= with_notes
    if seed in (1, 2, 5, 18):  # cases where step 7 would pack again a count step 5 packed (fitting or not)
        assert len(replanned) > with_notes


@pytest.mark.parametrize("seed", range(40))
def test_step_5_packings_are_plan_at_count(seed: int) -> None:
    """Each count step 5 notes in ``tried`` holds what :func:`plan_at_count` makes there: ``None`` where steps 3-4
    do not fit, else their plan refined the same way."""
    rng = random.Random(seed)
    dp = rng.choice((4, 8, 16))
    lengths = [rng.choice((rng.randint(1, 700), rng.randint(1500, 2048), rng.randint(3000, 6000)))
               for _ in range(dp * rng.randint(2, 12))]
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(lengths), max_tokens_per_gpu=2048,
                            pp_size=rng.choice((1, 2, 4)), padded_rows=rng.random() < 0.3)
    sizes, costs = step_sizes(lengths, pad_multiple=1), array_tuple([n + n * n / 4096 for n in lengths], np.float64)
    tried: planning.Packings = {}
    planning._plan_dynamic(sizes, costs, config=config, tried=tried)
    assert tried
    for count, plan in tried.items():
        assert plan == planning.plan_at_count(sizes, costs, config=config, num_microbatches=count), count
