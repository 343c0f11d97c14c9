"""Step 7's exact shortcuts (issue 28, planning speed) against the full search they skip.

- :func:`cost_equal` does not repack a rank whose micro-batches hold one sample at most and that already runs its
  fastest order (:func:`~megatron_dpsched.core.objective._dealt_alike`): the differencing would deal it the same
  micro-batches. Compared with the full search (the shortcut turned off) on random plans of such ranks, and on
  whole schedules of one sample per rank (the steps where every rank holds one sample).
- With one sample per rank no rank is tail-heavy, so the tail counts are not searched.
- Ranks of one sample are timed once per planned size, order, count, layout and model, and looked up after
  (``objective._ONE_SAMPLE_SPANS``): compared with the candidate timed rank by rank and with schedules planned with
  the table off.
"""

from __future__ import annotations

import random

import pytest

from megatron_dpsched.core import StepTimeModel, build_dp_schedule, objective
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.objective import StepTimer, cost_equal, tail_heavy


def full_search(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objective, "_dealt_alike", lambda rank, times: False)


def model(rng: random.Random) -> StepTimeModel:
    return StepTimeModel(seconds_per_token=rng.choice((1e-9, 2.4e-8)), seconds_per_token_pair=rng.choice((0, 1e-12)),
                         seconds_per_microbatch=rng.choice((0.0, 5e-5)), backward_factor=rng.choice((2.0, 1.5)))


@pytest.mark.parametrize("seed", range(60))
def test_cost_equal_skips_only_ranks_it_would_keep(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    pp, vpp = rng.choice(((2, 1), (4, 1), (2, 2), (4, 2)))
    ranks = rng.choice((3, 8, 20))
    config = ScheduleConfig(dp_size=ranks, global_batch_size=ranks, max_tokens_per_gpu=8192, pp_size=pp,
                            vpp_size=vpp, step_time_model=model(rng))
    count = config.layout.align(rng.randint(1, 6))
    sizes = [rng.choice((1, 512, 4096, rng.randint(1, 8192))) for _ in range(ranks * count)]
    plan = []
    for r in range(ranks):  # at most one sample per micro-batch; some ranks pairs
        held = rng.randint(0, count)
        rank = [[r * count + m] if m < held else [] for m in range(count)]
        if rng.random() < 0.2 and held >= 2:
            rank[0] += rank[1]
            rank[1] = []
        rng.shuffle(rank)
        plan.append(rank)
    timer = StepTimer(sizes=sizes, costs=[float(s) for s in sizes], config=config)
    chosen = timer.candidate(plan)
    found = cost_equal(chosen, timer)
    with monkeypatch.context() as patch:
        full_search(patch)
        expected = cost_equal(chosen, timer)
    assert (found.seconds, found.plan) == (expected.seconds, expected.plan)


@pytest.mark.parametrize("seed", range(12))
def test_schedules_of_one_sample_per_rank_as_with_the_full_search(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    dp = rng.choice((8, 16, 64))
    lengths = [rng.choice((1, 4096, rng.randint(1, 8191))) for _ in range(dp * rng.randint(1, 5))]
    kwargs = dict(dp_size=dp, global_batch_size=dp, max_tokens_per_gpu=8192, pp_size=4,
                  vpp_size=rng.choice((1, 2)), step_time_model=model(rng))
    found = build_dp_schedule(lengths, **kwargs)
    with monkeypatch.context() as patch:
        full_search(patch)
        expected = build_dp_schedule(lengths, **kwargs)
    assert found.micro_batch_indices == expected.micro_batch_indices
    assert found.partitions == expected.partitions


@pytest.mark.parametrize("seed", range(10))
def test_one_sample_per_rank_is_never_tail_heavy(seed: int) -> None:
    rng = random.Random(seed)
    costs = [rng.choice((1.0, 1e6, rng.random())) for _ in range(rng.randint(1, 40))]
    plan = [[[i], []] for i in range(len(costs))] + [[[], []]] * rng.randint(0, 3)
    assert not tail_heavy(plan, costs)


def one_sample_timer(rng: random.Random, ranks: int) -> StepTimer:
    sizes = [rng.choice((1, 7, 4096, 8192, rng.randint(1, 8192))) for _ in range(ranks)]
    config = ScheduleConfig(dp_size=ranks, global_batch_size=ranks, max_tokens_per_gpu=8192, pp_size=4,
                            vpp_size=rng.choice((1, 2)), step_time_model=model(rng))
    return StepTimer(sizes=sizes, costs=[float(s) + s * s / 4096 for s in sizes], config=config)


@pytest.mark.parametrize("seed", range(30))
def test_ranks_of_one_sample_from_the_table_as_timed_rank_by_rank(monkeypatch: pytest.MonkeyPatch,
                                                                 seed: int) -> None:
    rng = random.Random(seed)
    objective._ONE_SAMPLE_SPANS.clear()
    ranks = rng.choice((8, 16, 40))
    for _ in range(3):  # later steps find some sizes in the table
        timer = one_sample_timer(random.Random(rng.randint(0, 3)), ranks)
        count = timer.config.layout.align(rng.randint(1, 6))
        order = list(range(ranks))
        rng.shuffle(order)
        plan = [[[r] if m == r % count else [] for m in range(count)] for r in order]
        found = timer.candidate(plan)
        with monkeypatch.context() as patch:
            patch.setattr(StepTimer, "_rows_apply", lambda self, plan: False)
            expected = timer.candidate(plan)
        assert found == expected
    assert objective._ONE_SAMPLE_SPANS


@pytest.mark.parametrize("seed", range(8))
def test_schedules_of_one_sample_per_rank_as_without_the_table(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    dp = rng.choice((8, 32))
    lengths = [rng.choice((1, 4096, rng.randint(1, 8191))) for _ in range(dp * rng.randint(2, 6))]
    kwargs = dict(dp_size=dp, global_batch_size=dp, max_tokens_per_gpu=8192, pp_size=4,
                  vpp_size=rng.choice((1, 2)), step_time_model=model(rng))
    found = [build_dp_schedule(lengths, **kwargs) for _ in range(2)]  # the second from a full table
    with monkeypatch.context() as patch:
        patch.setattr(objective, "ONE_SAMPLE_LIMIT", 0)
        expected = build_dp_schedule(lengths, **kwargs)
    for schedule in found:
        assert schedule.micro_batch_indices == expected.micro_batch_indices
        assert schedule.partitions == expected.partitions
