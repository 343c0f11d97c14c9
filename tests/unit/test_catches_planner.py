"""Planner bugs of one line each that the rest of the suite let through: an unaligned count bound, an unaligned
bisection step, and cost-equal repacking of padded-row plans (issue 27, "Tests that catch")."""

from __future__ import annotations

from megatron_dpsched.core import StepTimeModel
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.objective import StepTimer, cost_equal, count_bound
from megatron_dpsched.core.planning import _first_fitting_count


def interleaved_accepts(count: int, *, pp: int, group: int) -> bool:
    """Megatron's interleaved-schedule rule, written out: ``group <= M`` and ``M % group`` is 0 or at least PP."""
    return count >= group and (count % group == 0 or count % group >= pp)


def smallest_accepted_from(count: int, *, pp: int, group: int) -> int:
    while not interleaved_accepts(count, pp=pp, group=group):
        count += 1
    return count


def test_the_count_bound_is_a_count_the_interleaved_schedule_accepts() -> None:
    """PP 3, VPP 2, group 5: a rank holding 11 samples needs up to 11 micro-batches, which the schedule refuses
    (11 % 5 = 1 < 3); the bound is the next accepted count, 13."""
    config = ScheduleConfig(dp_size=2, global_batch_size=16, max_tokens_per_gpu=100, pp_size=3, vpp_size=2,
                            microbatch_group_size_per_vp_stage=5)
    plan = [[[i] for i in range(11)], [[11, 12], [13, 14, 15]]]
    bound = count_bound(plan, config=config, lower_bound=5)
    assert bound == smallest_accepted_from(11, pp=3, group=5) == 13
    assert interleaved_accepts(bound, pp=3, group=5)


def test_the_first_fitting_count_bisects_on_accepted_counts_only() -> None:
    """Eleven samples of 51 tokens under a cap of 100 need one micro-batch each: 8 micro-batches (the lower
    bound) do not fit, 13 (the global packing's count, aligned) do; the bisection between them must not stop
    at 11, which fits but which the interleaved schedule (PP 3, group 5) refuses."""
    config = ScheduleConfig(dp_size=1, global_batch_size=11, max_tokens_per_gpu=100, pp_size=3, vpp_size=2,
                            microbatch_group_size_per_vp_stage=5, balance="tokens")
    sizes = [51] * 11
    count, plan = _first_fitting_count(sizes, [51.0] * 11, config=config, low=8, high=13)
    assert plan is not None
    assert count == smallest_accepted_from(11, pp=3, group=5) == 13
    assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(11))
    assert all(len(rank) == count for rank in plan)


def _workload(length: int) -> float:
    return 24576.0 * length + float(length) * length


def test_cost_equal_leaves_padded_row_plans_alone() -> None:
    """With padded rows a micro-batch's size is rows x longest; the differencing repack sums sizes, so on this
    step it would put 2500, 300, 300 and 100 tokens in one micro-batch: 4 x 2500 = 10000 positions under a cap
    of 8192. Cost-equal repacking is for packed micro-batches only: the plan comes back as it was."""
    sizes = [300, 4000, 300, 4000, 4000, 2500, 3000, 100]
    cap = 8192
    model = StepTimeModel(seconds_per_token=24576 / 1e12, seconds_per_token_pair=1 / 1e12,
                          seconds_per_microbatch=0.1 * _workload(2048) / 1e12)
    config = ScheduleConfig(dp_size=1, global_batch_size=len(sizes), max_tokens_per_gpu=cap, pp_size=2,
                            step_time_model=model, padded_rows=True)
    plan = [[[7], [1], [4, 6], [3], [0, 2, 5]]]
    for micro_batch in plan[0]:
        assert len(micro_batch) * max(sizes[i] for i in micro_batch) <= cap  # a legal padded-row plan
    timer = StepTimer(sizes=sizes, costs=[_workload(s) for s in sizes], config=config)
    chosen = timer.candidate(plan)
    result = cost_equal(chosen, timer)
    assert result.plan == chosen.plan
    for micro_batch in result.plan[0]:
        assert len(micro_batch) == 1 or len(micro_batch) * max(sizes[i] for i in micro_batch) <= cap
