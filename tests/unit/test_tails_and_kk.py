"""Issue 19 points 2 and 3: cost-equal packing within a rank (core/kk.py, step 7) and tails past the cap at
the micro-batches objective's own count (step 5)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from assertions import assert_invariants
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dpsched import DPSchedule, build_dp_schedule
from megatron_dpsched.core import StepTimeModel, rank_forward_times, simulate_step
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.kk import differencing_pack
from megatron_dpsched.core.objective import Candidate, StepTimer, cost_equal
from megatron_dpsched.core.packing import pack_into

FLOPS = 1e12


def workload(length: int) -> float:
    """verl's workload ``24576 L + L^2``."""
    return 24576.0 * length + float(length) * length


def workload_model(scale: float) -> StepTimeModel:
    """Forward = workload / 1e12 s, plus ``scale * c(2048)`` per micro-batch."""
    return StepTimeModel(seconds_per_token=24576 / FLOPS, seconds_per_token_pair=1 / FLOPS,
                         seconds_per_microbatch=scale * workload(2048) / FLOPS)


def heavy_tail(count: int, rng: random.Random) -> list[int]:
    """Log-normal body (median 700) with a 10% Pareto tail, up to 32k tokens."""
    return [max(16, min(32768, int(2000 * rng.paretovariate(1.2) if rng.random() < 0.1
                                   else rng.lognormvariate(math.log(700), 0.9)))) for _ in range(count)]


def step_seconds(schedule: DPSchedule, step: int, model: StepTimeModel) -> float:
    """The step's simulated time from the public model."""
    lengths = schedule.lengths
    per_rank = [rank_forward_times([[lengths[i] for i in mb] for mb in schedule.rank_step_micro_batches(r, step)],
                                   model=model) for r in range(schedule.dp_size)]
    return simulate_step(per_rank, layout=schedule.config.layout, model=model).seconds


# --- core/kk.py ---------------------------------------------------------------------------------------------------

def test_differencing_pack_by_hand():
    """Costs 8, 7, 6, 5 into two: differencing pairs 8 with 7 and 6 with 5 (differences 1 and 1), then merges
    the two dearest-with-cheapest: 8 + 5 and 7 + 6 (13 each). Costs 5, 4, 3, 3, 3 (ids 0-4): 5 - 4 -> (5 | 4),
    3 - 3 -> (3 | 3) (ids 2, 3), the last 3 (id 4) with (5 | 4) -> (4 + 3 | 5) = (7 | 5), with (3 | 3) ->
    (7 + 3 | 5 + 3): {1, 4, 3} and {0, 2}, 10 / 8 (largest differencing is a heuristic: 9 / 9 exists)."""
    sizes = [10] * 5
    assert sorted(differencing_pack(range(4), sizes=sizes, costs=[8, 7, 6, 5], cap=100, num_bins=2)) == [[0, 3], [1, 2]]
    packed = differencing_pack(range(5), sizes=sizes, costs=[5, 4, 3, 3, 3], cap=100, num_bins=2)
    assert packed == [[1, 3, 4], [0, 2]]


def test_differencing_pack_three_ways_by_hand():
    """Costs 6, 5, 4, 3, 2, 1 into three: 6+1, 5+2, 4+3 (7 each), the only perfect split with two per part."""
    packed = differencing_pack(range(6), sizes=[1] * 6, costs=[6, 5, 4, 3, 2, 1], cap=100, num_bins=3)
    assert sorted(sorted(b) for b in packed) == [[0, 5], [1, 4], [2, 3]]


def test_differencing_pack_keeps_the_cap_and_oversize_alone():
    """The pairing dearest-with-cheapest would put 60 + 50 tokens together under a cap of 100; the capped
    merge pairs again. A sample past the cap sits alone; one too many past the cap and there is no packing."""
    sizes, costs = [60, 50, 40, 30, 150], [1.0, 2.0, 3.0, 4.0, 9.0]
    packed = differencing_pack(range(5), sizes=sizes, costs=costs, cap=100, num_bins=3)
    assert [4] in packed
    assert all(sum(sizes[i] for i in b) <= 100 for b in packed if b != [4])
    assert sorted(i for b in packed for i in b) == [0, 1, 2, 3, 4]
    assert differencing_pack(range(5), sizes=[150] * 5, costs=costs, cap=100, num_bins=4) is None
    assert differencing_pack(range(3), sizes=[90, 90, 90], costs=[1, 1, 1], cap=100, num_bins=2) is None


@settings(deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.integers(1, 10), st.integers(1000, 8000))
def test_differencing_pack_properties(sizes, num_bins, cap):
    """Every sample once, exactly ``num_bins`` micro-batches, each under the cap or a single sample past it,
    none empty while there are enough samples; with room to spare (every sample at most a tenth of the cap
    and the tokens under half the bins' room), a packing is always found."""
    costs = [workload(s) for s in sizes]
    packed = differencing_pack(range(len(sizes)), sizes=sizes, costs=costs, cap=cap, num_bins=num_bins)
    roomy = max(sizes) * 10 <= cap and sum(sizes) * 2 <= cap * num_bins
    if packed is None:
        assert not roomy
        return
    assert len(packed) == num_bins
    assert sorted(i for b in packed for i in b) == list(range(len(sizes)))
    for b in packed:
        assert len(b) == 1 or sum(sizes[i] for i in b) <= cap
    if len(sizes) >= num_bins:
        assert all(packed)


def test_differencing_pack_balances_costs_where_token_packing_does_not():
    """Long and short samples of equal tokens in total: cost-equal micro-batches (max/min near 1)."""
    rng = random.Random(3)
    sizes = [rng.choice([300, 400, 3000, 3500]) for _ in range(32)]
    costs = [workload(s) for s in sizes]
    packed = differencing_pack(range(32), sizes=sizes, costs=costs, cap=16384, num_bins=4)
    loads = [sum(costs[i] for i in b) for b in packed]
    assert max(loads) / min(loads) < 1.02


# --- step 7: the cost-equal candidate ----------------------------------------------------------------------------

def test_cost_equal_packing_wins_in_the_simulator_and_is_chosen():
    """PP=4, one rank, four micro-batches: step 4's token packing gives {6000, 1000}, {4000, 2000} twice and
    {3000, 3000} (7000 / 6000 / 6000 / 6000 tokens; the first costs 209M of workload, the others 165-168M);
    differencing gives {6000} alone and 167-191M in the others, which the simulator runs faster: it is taken."""
    sizes = [6000, 2000, 3000, 3000, 1000, 4000, 4000, 2000]
    config = ScheduleConfig(dp_size=1, global_batch_size=8, max_tokens_per_gpu=8192, pp_size=4,
                            step_time_model=workload_model(0.1))
    timer = StepTimer(sizes=sizes, costs=[workload(s) for s in sizes], config=config)
    today = timer.candidate([pack_into(range(8), sizes, 8192, 4)])
    chosen = cost_equal(today, timer)
    loads = [sum(workload(sizes[i]) for i in mb) for mb in chosen.plan[0]]
    today_loads = [sum(workload(sizes[i]) for i in mb) for mb in today.plan[0]]
    assert max(loads) < max(today_loads)
    assert [0] in chosen.plan[0] and sorted(i for mb in chosen.plan[0] for i in mb) == list(range(8))
    assert all(sum(sizes[i] for i in mb) <= 8192 for mb in chosen.plan[0])
    independent = simulate_step([rank_forward_times([[sizes[i] for i in mb] for mb in chosen.plan[0]],
                                                    model=config.step_time_model)], layout=config.layout,
                                model=config.step_time_model).seconds
    assert independent == pytest.approx(chosen.seconds)
    assert chosen.seconds < 0.99 * today.seconds


def test_cost_equal_repacks_every_rank_that_sets_the_step():
    """40 ranks holding the same samples as the one-rank case above: every rank is as slow as the others, so the
    step is faster only when all 40 are repacked (more than COST_EQUAL_RANKS; their 320 samples are within
    COST_EQUAL_SAMPLES): each rank gets cost-equal micro-batches and the step the one-rank case's time."""
    from megatron_dpsched.core.objective import COST_EQUAL_RANKS, COST_EQUAL_SAMPLES

    one = [6000, 2000, 3000, 3000, 1000, 4000, 4000, 2000]
    dp = 40
    assert COST_EQUAL_RANKS < dp and dp * len(one) <= COST_EQUAL_SAMPLES
    sizes = one * dp
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(sizes), max_tokens_per_gpu=8192, pp_size=4,
                            step_time_model=workload_model(0.1))
    timer = StepTimer(sizes=sizes, costs=[workload(s) for s in sizes], config=config)
    ranks = [range(8 * r, 8 * r + 8) for r in range(dp)]
    today = timer.candidate([pack_into(items, sizes, 8192, 4) for items in ranks])
    chosen = cost_equal(today, timer)
    assert chosen.seconds < 0.99 * today.seconds
    for r, rank in enumerate(chosen.plan):
        assert sorted(i for mb in rank for i in mb) == list(ranks[r])
        assert [8 * r] in rank  # the 6000-token sample alone, as differencing packs the one-rank case
    times = [rank_forward_times([[sizes[i] for i in mb] for mb in rank], model=config.step_time_model)
             for rank in chosen.plan]
    assert simulate_step(times, layout=config.layout, model=config.step_time_model).seconds == pytest.approx(
        chosen.seconds)


def test_cost_equal_keeps_todays_plan_at_pp1():
    sizes = [4000, 1000, 1000, 1000, 1000, 3000]
    config = ScheduleConfig(dp_size=1, global_batch_size=6, max_tokens_per_gpu=8192,
                            step_time_model=workload_model(0.1))
    timer = StepTimer(sizes=sizes, costs=[workload(s) for s in sizes], config=config)
    today = timer.candidate([[[0, 1], [2, 3, 4, 5]]])
    assert cost_equal(today, timer) is today


@settings(deadline=None, max_examples=40)
@given(st.lists(st.integers(16, 9000), min_size=8, max_size=48), st.sampled_from([(2, 1), (4, 1), (4, 2)]),
       st.sampled_from([4096, 16384]), st.sampled_from([1.0, 0.1]))
def test_step_time_plans_are_never_slower_than_without_cost_equal_packing(lengths, layout, cap, scale):
    """The plan with the cost-equal candidate is never slower in the simulator than the same search's plan
    without it (its choice before :func:`cost_equal`), and keeps every invariant."""
    import megatron_dpsched.core.objective as objective

    kwargs = dict(dp_size=2, global_batch_size=len(lengths), max_tokens_per_gpu=cap, pp_size=layout[0],
                  vpp_size=layout[1], cost_model=workload, step_time_model=workload_model(scale))
    original, deals = objective.cost_equal, objective.kk_deals
    objective.kk_deals = lambda *args, **kw: []  # the KK deals after it: test_tails_kk_deal.py
    try:
        with_kk = build_dp_schedule(lengths, **kwargs)
        objective.cost_equal = lambda chosen, timer: chosen
        without = build_dp_schedule(lengths, **kwargs)
    finally:
        objective.cost_equal, objective.kk_deals = original, deals
    assert_invariants(with_kk, lengths)
    assert with_kk.num_microbatches == without.num_microbatches
    for step in range(with_kk.num_steps):
        assert step_seconds(with_kk, step, kwargs["step_time_model"]) <= step_seconds(
            without, step, kwargs["step_time_model"]) * (1 + 1e-9)


def test_candidate_type_is_the_objectives():
    """cost_equal returns a Candidate whose seconds is its plan's step time."""
    sizes = [2000, 100, 100, 100, 1500, 600]
    config = ScheduleConfig(dp_size=1, global_batch_size=6, max_tokens_per_gpu=4096, pp_size=2,
                            step_time_model=workload_model(1.0))
    timer = StepTimer(sizes=sizes, costs=[workload(s) for s in sizes], config=config)
    chosen = cost_equal(timer.candidate([[[0, 1, 2], [3, 4, 5]]]), timer)
    assert isinstance(chosen, Candidate) and chosen.num_microbatches == 2


# --- step 5: tails past the cap at the micro-batches objective -----------------------------------------------------

def reference_best(lengths: list[int], *, dp: int, cap: int, model: StepTimeModel) -> float:
    """Written apart from the planner: at PP=1 a rank's time is its samples' forward times plus the per-micro-
    batch time for each of the step's ``k`` micro-batches. For every ``k`` from one to the most samples a rank
    could need, its own plan (forward seconds; a step's backward is ``backward_factor`` times that on every
    rank, so the ratio is the step time's): samples dearest first, each to the rank with the least cost that keeps room
    (``k`` micro-batches: at most ``k`` samples past the cap and ``k * cap`` tokens counting a sample past the
    cap as ``cap``), then each rank packed first-fit decreasing (past the cap alone); a ``k`` whose packing
    needs more than ``k`` on a rank is skipped. The fastest over ``k``."""
    forward = [model.seconds_per_token * n + model.seconds_per_token_pair * n * n for n in lengths]
    best = math.inf
    for k in range(1, len(lengths) + 1):
        ranks: list[list[int]] = [[] for _ in range(dp)]
        load, tokens, big = [0.0] * dp, [0] * dp, [0] * dp
        for i in sorted(range(len(lengths)), key=lambda i: -forward[i]):
            weight, over = min(lengths[i], cap), int(lengths[i] > cap)
            room = [r for r in range(dp) if tokens[r] + weight <= k * cap and big[r] + over <= k]
            if not room:
                break
            r = min(room, key=lambda r: (load[r], r))
            ranks[r].append(i)
            load[r] += forward[i]
            tokens[r] += weight
            big[r] += over
        else:
            if all(_first_fit_count(rank, lengths, cap) <= k for rank in ranks):
                best = min(best, max(load) + k * model.seconds_per_microbatch)
        if k > max(1, math.ceil(len(lengths) / dp)) and best < math.inf:
            break  # from here every rank has more micro-batches than samples: only slower
    return best


def _first_fit_count(items: list[int], lengths: list[int], cap: int) -> int:
    bins: list[int] = []
    for i in sorted(items, key=lambda i: -lengths[i]):
        if lengths[i] > cap:
            bins.append(cap + 1)
            continue
        for b, fill in enumerate(bins):
            if fill + lengths[i] <= cap:
                bins[b] += lengths[i]
                break
        else:
            bins.append(lengths[i])
    return len(bins)


@pytest.mark.parametrize(("dp", "cap", "seed"), [(8, 4096, 1), (8, 4096, 2), (8, 4096, 5), (64, 4096, 1),
                                                 (8, 16384, 3)])
@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_pp1_default_reaches_the_best_count_on_a_heavy_tail(dp, cap, seed, scale):
    """Without a step-time model (the micro-batches objective, PP=1's default) a heavy tail past the cap is
    planned within 1% of the fastest plan the reference finds over every count (its own plans), timed by the
    PP=1 step time written out here: the busiest rank's forward times plus ``k`` per-micro-batch times."""
    model = workload_model(scale)
    lengths = heavy_tail(32 * dp, random.Random(seed))
    schedule = build_dp_schedule(lengths, dp_size=dp, global_batch_size=32 * dp, max_tokens_per_gpu=cap,
                                 cost_model=workload)
    assert_invariants(schedule, lengths)
    forward = [model.seconds_per_token * n + model.seconds_per_token_pair * n * n for n in lengths]
    dummy = model.seconds_per_token + model.seconds_per_token_pair  # an empty micro-batch runs one token
    ours = max(sum(sum(forward[i] for i in mb) if mb else dummy for mb in schedule.rank_step_micro_batches(r, 0))
               for r in range(dp)) + schedule.num_microbatches[0] * model.seconds_per_microbatch
    assert (1 + model.backward_factor) * ours == pytest.approx(step_seconds(schedule, 0, model))
    assert ours <= 1.01 * reference_best(lengths, dp=dp, cap=cap, model=model)


def test_reference_finds_the_exact_best_on_a_tiny_case():
    """The reference above against brute force over every assignment of six samples to two ranks."""
    lengths, cap, model = [5000, 3000, 1000, 900, 700, 200], 4096, workload_model(0.1)
    forward = [model.seconds_per_token * n + model.seconds_per_token_pair * n * n for n in lengths]
    exact = math.inf
    for owners in itertools.product(range(2), repeat=len(lengths)):
        ranks = [[i for i in range(6) if owners[i] == r] for r in range(2)]
        k = max(1, *(_first_fit_count(rank, lengths, cap) for rank in ranks))
        exact = min(exact, max(sum(forward[i] for i in rank) for rank in ranks) + k * model.seconds_per_microbatch)
    assert reference_best(lengths, dp=2, cap=cap, model=model) <= exact * 1.01


@pytest.mark.parametrize(("dp", "seed"), [(8, 2), (8, 4), (64, 4)])
def test_step_time_looks_past_where_step_5_reach_stopped(dp, seed):
    """A dense 8B GPT's FLOPs at 400 TFLOP/s plus 10 ms per micro-batch, PP=1, cap 4096: step 5 reaches past
    ``U`` for the tail and stops where one more count cuts the busiest rank by less than its tolerance, with that
    rank within TAIL_IMBALANCE of the least; the plan at the next fewer count is tail-heavy, so step 7 still looks
    at more counts and ends within 1% of the reference's fastest (the default, which does not, is > 1% off)."""
    from megatron_dpsched import CostModel

    cost_model = CostModel(hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
                           ffn_hidden_size=14336, vocab_size=128256, swiglu=True)
    model = StepTimeModel.from_cost_model(cost_model, flops_per_second=400e12, seconds_per_microbatch=0.01)
    lengths = heavy_tail(32 * dp, random.Random(seed))
    kwargs = dict(dp_size=dp, global_batch_size=32 * dp, max_tokens_per_gpu=4096, cost_model=cost_model)
    forward = [model.seconds_per_token * n + model.seconds_per_token_pair * n * n for n in lengths]

    def seconds(schedule: DPSchedule) -> float:  # PP=1: the busiest rank's forward times plus k per micro-batch
        busiest = max(sum(forward[i] for mb in schedule.rank_step_micro_batches(r, 0) for i in mb) for r in range(dp))
        return busiest + schedule.num_microbatches[0] * model.seconds_per_microbatch

    best = reference_best(lengths, dp=dp, cap=4096, model=model)
    ours = build_dp_schedule(lengths, **kwargs, step_time_model=model)
    assert_invariants(ours, lengths)
    assert seconds(build_dp_schedule(lengths, **kwargs)) > 1.01 * best
    assert seconds(ours) <= 1.01 * best
