"""The what-if comparison's figures (computed for a whole plan at once) equal a micro-batch-at-a-time restatement:
each micro-batch's collated sizes, its forward time by ``StepTimeModel.forward_time``, every step simulated by
``simulate_step``; planning in several processes gives the plan of one."""

from __future__ import annotations

import random

import pytest

from megatron_dpsched.core import ScheduleConfig, plan_schedule, simulate_step
from megatron_dpsched.core.validation import ArgumentError
from megatron_dpsched.whatif.analysis import (
    OURS,
    Simulation,
    _raised,
    compare,
    is_padded,
    plan_ours,
    plan_strategies,
)
from megatron_dpsched.whatif.model import DEFAULT_MODEL


def _reference(schedule, step: int, *, simulation: Simulation, padded: bool) -> dict:
    """One strategy's figures of one step, micro-batch by micro-batch."""
    config, lengths = schedule.config, schedule.lengths
    model = simulation.timing(cp_size=config.cp_size)
    multiple = 2 * config.cp_size if config.cp_size > 1 else 1  # the what-if tool has no sequence parallelism
    ranks = [[[lengths[i] for i in mb] for mb in schedule.rank_step_micro_batches(r, step)]
             for r in range(config.dp_size)]

    def collated(mb: list[int]) -> list[int]:
        sizes = [-(-n // multiple) * multiple for n in mb]
        return [max(sizes)] * len(sizes) if padded and sizes else sizes

    result = simulate_step([[model.forward_time(collated(mb)) for mb in rank] for rank in ranks],
                           layout=config.layout, model=model)
    tokens = [sum(map(sum, rank)) for rank in ranks]
    costs = [sum(DEFAULT_MODEL(n) for mb in rank for n in mb) for rank in ranks]
    cap = config.token_cap
    count = len(ranks[0])
    return {"micro_batches": count, "rank_tokens": tuple(tokens),
            "rank_padding": tuple(sum(sum(collated(mb)) for mb in rank) - t for rank, t in zip(ranks, tokens)),
            "token_fill": sum(min(cap, sum(mb)) for rank in ranks for mb in rank) / (count * config.dp_size * cap),
            "seconds": result.seconds, "slowest_rank": result.slowest_rank,
            "imbalance": max(costs) * config.dp_size / sum(costs) - 1.0}


@pytest.mark.parametrize(("layout", "collate"), [
    ({"dp_size": 4, "pp_size": 1}, "thd"),
    ({"dp_size": 8, "pp_size": 2}, "bshd"),
    ({"dp_size": 16, "pp_size": 4, "vpp_size": 2}, "thd"),  # 16 ranks: simulated all at once
    ({"dp_size": 8, "pp_size": 2, "cp_size": 2}, "bshd"),
    ({"dp_size": 2, "pp_size": 3}, "thd"),
])
def test_every_step_of_every_strategy_matches_the_restatement(layout: dict, collate: str) -> None:
    rng = random.Random(len(layout) * 31 + layout["dp_size"])
    lengths = [rng.choice([rng.randint(1, 300), rng.randint(300, 2500)]) for _ in range(700)]
    lengths[17] = 5000  # one sample over the cap
    config = ScheduleConfig(global_batch_size=64, max_tokens_per_gpu=4096 // layout.get("cp_size", 1), **layout)
    schedules = plan_strategies(lengths, config=config, cost_model=DEFAULT_MODEL)
    simulation = Simulation(cost_model=DEFAULT_MODEL, seconds_per_microbatch=0.002, collate_format=collate)
    steps = compare(schedules, simulation=simulation)
    assert len(steps) == schedules[OURS].num_steps == 11
    for name, schedule in schedules.items():
        for step in steps:
            row = step.strategies[name]
            expected = _reference(schedule, step.step, simulation=simulation, padded=is_padded(name, simulation))
            got = {key: getattr(row, key) for key in expected}
            floats = ("token_fill", "seconds", "imbalance")
            assert {k: v for k, v in got.items() if k not in floats} == {
                k: v for k, v in expected.items() if k not in floats}, (name, step.step)
            assert [got[k] for k in floats] == pytest.approx([expected[k] for k in floats], rel=1e-12, abs=1e-15)
            assert row.tokens == sum(expected["rank_tokens"]) and row.padding == sum(expected["rank_padding"])


def test_planning_in_several_processes_gives_the_same_plan() -> None:
    rng = random.Random(5)
    lengths = [rng.randint(1, 3000) for _ in range(64 * 40 + 17)]  # 40 steps and a ragged tail
    config = ScheduleConfig(dp_size=8, global_batch_size=64, max_tokens_per_gpu=4096, pp_size=2)
    alone = plan_schedule(lengths, config=config, cost_model=DEFAULT_MODEL)
    ticks: list[int] = []
    shared = plan_ours(lengths, config=config, cost_model=DEFAULT_MODEL, jobs=2, tick=ticks.append)
    assert shared.to_dict() == alone.to_dict()
    assert sum(ticks) == alone.num_steps == 41 and len(ticks) > 1


def test_a_workers_planner_error_is_raised_as_the_planner_raised_it() -> None:
    with pytest.raises(ArgumentError, match="^dp_size=9 is larger") as caught:
        _raised(("dp_size=9 is larger than the 8 samples of the largest step", "dp_size"))
    assert caught.value.argument == "dp_size"
    with pytest.raises(ValueError, match="^lengths holds"):
        _raised(("lengths holds 3 samples", None))
