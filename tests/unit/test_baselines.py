"""Peer baselines on hand-made steps: the expected micro-batches are worked out by hand from each
peer's algorithm (see the module docstrings in megatron_dpsched/baselines/) and written literally."""

from __future__ import annotations

import pytest
from assertions import assert_invariants

from megatron_dpsched import ScheduleConfig
from megatron_dpsched.baselines import (
    BASELINES,
    build_baseline_schedule,
    cap_violations,
    padded_tokens,
    step_cap_violations,
)
from megatron_dpsched.baselines.megatron_lm_rl_rewrite import next_fit_decreasing
from megatron_dpsched.baselines.nemo_rl_rewrite import modified_first_fit_decreasing
from megatron_dpsched.baselines.partition import karmarkar_karp
from megatron_dpsched.core.invariants import ScheduleInvariantError


def plan(name, lengths, *, dp, cap=100, costs=None, **layout):
    config = ScheduleConfig(dp_size=dp, global_batch_size=len(lengths), max_tokens_per_gpu=cap, **layout)
    schedule = build_baseline_schedule(name, lengths, config=config, costs=costs)
    return schedule, [list(map(list, schedule.rank_step_micro_batches(r, 0))) for r in range(dp)]


def test_names_keep_the_existing_three_and_add_the_peers():
    assert BASELINES == ("megatron_fixed", "per_rank_first_fit", "global_first_fit",
                         "verl", "nemo_rl", "slime_strided", "slime_kk", "megatron_lm_rl")
    assert padded_tokens([0, 1], [5, 7]) == 14


def test_karmarkar_karp_by_hand():
    # {5},{4} and {3},{2} merge to {5,2},{4,3}; then {1} joins the lighter-indexed side: 1+4+3 | 5+2
    assert karmarkar_karp([1, 2, 3, 4, 5], 2, equal_size=False) == [[0, 2, 3], [1, 4]]
    # runs (1,2) (3,4) (5,6): {6,3},{5,4}, then (2,1): {2}+{5,4} = 11 | {1}+{6,3} = 10
    assert karmarkar_karp([1, 2, 3, 4, 5, 6], 2, equal_size=True) == [[1, 3, 4], [0, 2, 5]]


def test_verl_by_hand():
    # workloads 24576*s + s*s. DP: KK on runs (10,20) (30,40) (50,60) -> {20,50,40} | {10,60,30};
    # rank 0 (110 tokens) asks for 2 micro-batches, rank 1 (100) for 1, MAX = 2. Rank 0's samples in
    # the driver's order 20,50,40 split {20,40} | {50}; rank 1's 10,60,30 split {60} | {10,30};
    # heaviest first, then parts[::2][::-1] + parts[1::2] keeps two parts in place.
    schedule, ranks = plan("verl", [10, 20, 30, 40, 50, 60], dp=2)
    assert ranks == [[[1, 3], [4]], [[5], [0, 2]]]
    assert_invariants(schedule, schedule.lengths, baseline=True)


def test_verl_breaks_the_cap_as_verl_does_and_the_plan_is_still_built():
    # 200 tokens under cap 100: 2 micro-batches. Driver order 20,60,60,60 (ascending, odd positions
    # reversed); KK pairs the two later 60s, then 60 | 20, merged {60,60} | {20,60}.
    schedule, ranks = plan("verl", [60, 60, 60, 20], dp=1)
    assert ranks == [[[1, 2], [3, 0]]]
    assert cap_violations(schedule) == 1
    with pytest.raises(ScheduleInvariantError, match="invariant 2"):
        schedule.check()
    assert schedule.stats()[0].num_microbatches == 2


def test_cap_violations_are_counted_per_step():
    # step 0 as above ({60, 60} over 100); step 1's 40 tokens fit one micro-batch; a lone 150 is not counted
    config = ScheduleConfig(dp_size=1, global_batch_size=4, max_tokens_per_gpu=100)
    schedule = build_baseline_schedule("verl", [60, 60, 60, 20, 10, 10, 10, 10, 150, 1, 1, 1], config=config)
    assert step_cap_violations(schedule) == (1, 0, 0)
    assert cap_violations(schedule) == 1


def test_verl_rounds_up_to_the_vpp_group_and_pads_ranks_short_of_samples():
    schedule, ranks = plan("verl", [10, 20, 30, 40, 50, 60], dp=2, pp_size=4, vpp_size=2)
    assert schedule.num_microbatches == (4,)  # MAX 2 rounded up to the group size 4
    assert [sum(1 for mb in rank if not mb) for rank in ranks] == [1, 1]  # 3 samples, 4 micro-batches


NEMO_LENGTHS = [70, 40, 20, 60, 35, 25, 10, 30, 5, 45]


def test_nemo_rl_mffd_by_hand():
    # large 70, 60 open bins; 60 takes medium 40 (45 does not fit); 70 has no room for two smalls
    # (20 + 25 > 30) and greedily takes 30. Leftovers 45 35 25 20 10 5 go to the least-filled bin:
    # {45,35} = 80, then 25 opens a bin that takes 20, 10 and 5 (first fit would put 10 beside 80).
    assert modified_first_fit_decreasing(NEMO_LENGTHS, 100) == [[0, 7], [3, 1], [5, 2, 6, 8], [9, 4]]
    schedule, ranks = plan("nemo_rl", NEMO_LENGTHS, dp=2)
    assert ranks == [[[0, 7], [5, 2, 6, 8]], [[3, 1], [9, 4]]]  # round-robin in packer order
    assert_invariants(schedule, NEMO_LENGTHS, baseline=True)


def test_nemo_rl_adjusts_the_bin_count_by_moving_single_sequences():
    # 4 bins, dp 3 -> 6: the bin with most sequences ([5, 2, 6, 8]) gives its last two, one each.
    schedule, ranks = plan("nemo_rl", NEMO_LENGTHS, dp=3)
    assert ranks == [[[0, 7], [9, 4]], [[3, 1], [8]], [[5, 2], [6]]]
    assert_invariants(schedule, NEMO_LENGTHS, baseline=True)


SLIME_LENGTHS = [60, 50, 30, 40, 20, 70]


def test_slime_strided_by_hand():
    # first fit: {60,30} {50,40} {20,70}, all 90 tokens; to 4 bins the later tied bin splits (LPT): {70} {20}
    schedule, ranks = plan("slime_strided", SLIME_LENGTHS, dp=2)
    assert ranks == [[[0, 2], [5]], [[1, 3], [4]]]
    assert_invariants(schedule, SLIME_LENGTHS, baseline=True)


def test_slime_kk_by_hand():
    # first fit of 60 30 20 50 40 70: {60,30}=90 {20,50}=70 {40} {70}; KK runs (40,70) (70,90)
    # merge to {70,70} | {40,90}: rank 0 takes bins 1 and 3
    lengths = [60, 30, 20, 50, 40, 70]
    assert plan("slime_strided", lengths, dp=2)[1] == [[[0, 1], [4]], [[2, 3], [5]]]
    schedule, ranks = plan("slime_kk", lengths, dp=2)
    assert ranks == [[[2, 3], [5]], [[0, 1], [4]]]
    assert_invariants(schedule, lengths, baseline=True)


def test_slime_aligns_to_dp_times_the_vpp_group():
    schedule, ranks = plan("slime_strided", SLIME_LENGTHS, dp=1, pp_size=2, vpp_size=2)
    assert ranks == [[[0, 2], [1, 3], [5], [4]]]
    assert_invariants(schedule, SLIME_LENGTHS, baseline=True)


MEGATRON_LENGTHS = [30, 80, 50, 20, 60, 10, 40]


def test_megatron_lm_rl_by_hand():
    # next fit of 80 60 50 40 30 20 10: {80} {60} {50,40} {30,20,10} (10 never goes back to {80});
    # FIFO over 3 ranks: rank 0 takes 2 bins, the others 1 and pad with an empty one.
    schedule, ranks = plan("megatron_lm_rl", MEGATRON_LENGTHS, dp=3)
    assert ranks == [[[1], [4]], [[2, 6], []], [[0, 3, 5], []]]
    assert next_fit_decreasing(range(7), MEGATRON_LENGTHS, 100, max_per_bin=2) == [[1], [4], [2, 6], [0, 3], [5]]
    assert_invariants(schedule, MEGATRON_LENGTHS, baseline=True)


def test_megatron_lm_rl_pads_an_illegal_vpp_count():
    schedule, ranks = plan("megatron_lm_rl", MEGATRON_LENGTHS, dp=3, pp_size=3, vpp_size=2)
    assert schedule.num_microbatches == (3,)  # 2 is below the group size 3
    assert ranks[0] == [[1], [4], []]


@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_schedules_each_sample_once_with_equal_counts(name):
    lengths = [70, 40, 20, 60, 35, 25, 10, 30, 5, 45, 90, 15, 55, 65, 80, 12]
    config = ScheduleConfig(dp_size=3, global_batch_size=8, max_tokens_per_gpu=100, pp_size=2, vpp_size=2)
    schedule = build_baseline_schedule(name, lengths, config=config)
    assert sorted(i for part in schedule.partitions for i in part) == list(range(len(lengths)))
    assert len({len(batches) for batches in schedule.micro_batch_indices}) == 1
    assert all(config.layout.is_legal(count) for count in schedule.num_microbatches)
