"""Scenario tests of build_dp_schedule; every scenario ends in assert_invariants."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from assertions import assert_invariants

from megatron_dpsched import (
    CostModel,
    DPSchedule,
    ScheduleInvariantError,
    build_dp_schedule,
    compute_dynamic_global_batch_size,
)


def plan(lengths, **kwargs):
    groups = kwargs.get("groups")
    schedule = build_dp_schedule(lengths, **kwargs)
    assert_invariants(schedule, lengths, groups=groups)
    return schedule


def test_static_single_step_fills_every_micro_batch():
    lengths = [10, 20, 30, 40, 50, 60, 70, 80]
    schedule = plan(lengths, dp_size=2, global_batch_size=8, micro_batch_size=2)
    assert schedule.num_microbatches == (2,)
    assert schedule.step_num_samples == (8,)
    for rank in range(2):
        assert [len(mb) for mb in schedule.rank_step_micro_batches(rank, 0)] == [2, 2]


def test_static_multi_step_follows_input_order():
    lengths = list(range(1, 25))
    schedule = plan(lengths, dp_size=2, global_batch_size=8, micro_batch_size=2)
    assert schedule.num_microbatches == (2, 2, 2)
    assert schedule.step_num_samples == (8, 8, 8)
    for step in range(3):
        assert schedule.step_samples(step) == list(range(8 * step, 8 * step + 8))


def test_static_groups_similar_lengths_to_cut_padding():
    lengths = [100, 1, 100, 1, 100, 1, 100, 1]
    schedule = plan(lengths, dp_size=1, global_batch_size=8, micro_batch_size=4, balance="none")
    tokens = sorted(sum(lengths[i] for i in mb) for mb in schedule.rank_step_micro_batches(0, 0))
    assert tokens == [4, 400]


def test_dynamic_uniform_lengths_fill_the_cap():
    lengths = [100] * 64
    schedule = plan(lengths, dp_size=4, global_batch_size=64, max_tokens_per_gpu=400)
    assert schedule.num_microbatches == (4,)
    for rank in range(4):
        assert [len(mb) for mb in schedule.rank_step_micro_batches(rank, 0)] == [4, 4, 4, 4]
    (stats,) = schedule.stats()
    assert stats.token_fill == 1.0
    assert stats.imbalance == 1.0
    assert stats.empty_microbatches == 0


def test_oversize_sample_sits_alone():
    lengths = [5000, 100, 200, 300, 100, 200, 300, 100]
    schedule = plan(lengths, dp_size=2, global_batch_size=8, max_tokens_per_gpu=1000)
    batches = [mb for r in range(2) for mb in schedule.rank_step_micro_batches(r, 0)]
    assert (0,) in batches
    assert all(0 not in mb or len(mb) == 1 for mb in batches)


def test_cp_size_multiplies_the_cap():
    lengths = [600, 600, 600, 600]
    schedule = plan(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=600, cp_size=2)
    assert schedule.num_microbatches == (2,)


@pytest.mark.parametrize(
    ("pp", "group", "needed", "expected"),
    [
        (2, None, 1, 2),  # below the group: the group itself
        (2, None, 3, 4),  # group = pp = 2: 3 % 2 = 1 < 2 -> 4
        (4, None, 5, 8),  # group = pp = 4: 5 % 4 = 1, 6 % 4 = 2, 7 % 4 = 3 < 4 -> 8
        (2, 4, 5, 6),  # group > pp: 5 % 4 = 1 < 2 -> 6, not the multiple 8
        (2, 4, 6, 6),
        (2, 4, 7, 7),
        (3, 4, 9, 11),  # 9 % 4 = 1, 10 % 4 = 2 < 3, 11 % 4 = 3 >= 3
    ],
)
def test_vpp_alignment_picks_smallest_legal_count(pp, group, needed, expected):
    # `needed` micro-batches of exactly full samples on one rank
    lengths = [100] * needed
    schedule = plan(
        lengths,
        dp_size=1,
        global_batch_size=needed,
        max_tokens_per_gpu=100,
        pp_size=pp,
        vpp_size=2,
        microbatch_group_size_per_vp_stage=group,
    )
    assert schedule.num_microbatches == (expected,)
    (stats,) = schedule.stats()
    assert stats.empty_microbatches == expected - needed


def test_vpp_grows_static_count_to_a_legal_value():
    lengths = [10] * 6
    schedule = plan(lengths, dp_size=1, global_batch_size=6, micro_batch_size=2, pp_size=4, vpp_size=2)
    assert schedule.num_microbatches == (4,)  # 3 is below the group of 4
    assert sorted(len(mb) for mb in schedule.rank_step_micro_batches(0, 0)) == [1, 1, 2, 2]


def test_six_samples_on_four_ranks_get_empty_micro_batches():
    lengths = [100] * 6
    schedule = plan(lengths, dp_size=4, global_batch_size=6, max_tokens_per_gpu=1000, pp_size=2, vpp_size=2)
    assert schedule.num_microbatches == (2,)
    (stats,) = schedule.stats()
    assert stats.empty_microbatches == 2
    assert stats.num_samples == 6
    assert sorted(len(p) for p in schedule.partitions) == [1, 1, 2, 2]


def test_groups_never_straddle_steps():
    groups = ["a", "a", "b", "c", "c", "c", "b", "d", "e", "e"]
    lengths = [50] * len(groups)
    schedule = plan(lengths, dp_size=2, global_batch_size=2, max_tokens_per_gpu=100, groups=groups)
    assert schedule.num_steps == 3
    assert schedule.step_samples(0) == [0, 1, 2, 6]  # groups a, b
    assert schedule.step_samples(1) == [3, 4, 5, 7]  # groups c, d
    assert schedule.step_samples(2) == [8, 9]  # group e: a smaller trailing step
    assert schedule.step_num_samples == (4, 4, 2)


def test_trailing_partial_step_kept_as_smaller_step():
    lengths = [100] * 10
    schedule = plan(lengths, dp_size=2, global_batch_size=4, max_tokens_per_gpu=200)
    assert schedule.step_num_samples == (4, 4, 2)
    assert schedule.dropped == ()


def test_trailing_partial_step_dropped_and_reported():
    lengths = [100] * 10
    schedule = plan(lengths, dp_size=2, global_batch_size=4, max_tokens_per_gpu=200, drop_last=True)
    assert schedule.step_num_samples == (4, 4)
    assert schedule.dropped == (8, 9)


def test_lower_bound_counts_samples_over_half_the_cap():
    lengths = [600] * 4 + [10] * 4  # four > cap/2: four micro-batches at least
    schedule = plan(lengths, dp_size=1, global_batch_size=8, max_tokens_per_gpu=1000)
    assert schedule.num_microbatches == (4,)


def test_balances_cost_not_just_tokens():
    model = CostModel(hidden_size=64, num_layers=2, num_attention_heads=4)
    lengths = [4000] + [500] * 8 + [1000] * 4
    by_cost = plan(lengths, dp_size=2, global_batch_size=13, max_tokens_per_gpu=8000, cost_model=model)
    by_tokens = plan(lengths, dp_size=2, global_batch_size=13, max_tokens_per_gpu=8000, balance="tokens")
    flops = [model(n) for n in lengths]

    def spread(schedule):
        loads = [sum(flops[i] for i in part) for part in schedule.partitions]
        return max(loads) / min(loads)

    assert spread(by_cost) < spread(by_tokens)


def test_pipeline_order_puts_cheap_micro_batches_at_both_ends():
    lengths = [510, 600, 700, 800, 900]  # each over half the cap: one per micro-batch
    schedule = plan(lengths, dp_size=1, global_batch_size=5, max_tokens_per_gpu=1000, pp_size=2)
    loads = [sum(lengths[i] for i in mb) for mb in schedule.rank_step_micro_batches(0, 0)]
    peak = loads.index(max(loads))
    assert 0 < peak < len(loads) - 1
    assert loads[: peak + 1] == sorted(loads[: peak + 1])
    assert loads[peak:] == sorted(loads[peak:], reverse=True)


def test_json_round_trip_gives_an_equal_schedule():
    lengths = [37, 800, 5, 90, 1200, 64] * 5
    groups = [i // 3 for i in range(30)]
    schedule = plan(lengths, dp_size=3, global_batch_size=4, max_tokens_per_gpu=1000, groups=groups, pp_size=2)
    copy = DPSchedule.from_dict(json.loads(json.dumps(schedule.to_dict())))
    assert copy == schedule
    copy.check()


def test_same_inputs_give_the_same_plan():
    lengths = [(i * 7919) % 997 + 1 for i in range(300)]
    first = build_dp_schedule(lengths, dp_size=8, global_batch_size=64, max_tokens_per_gpu=2048)
    second = build_dp_schedule(list(lengths), dp_size=8, global_batch_size=64, max_tokens_per_gpu=2048)
    assert first == second


def _all_in_first(schedule):
    """Rank 0's samples all in its first micro-batch, the rest empty: breaks the token cap only."""
    return (tuple(range(len(schedule.partitions[0]))),) + ((),) * (schedule.num_microbatches[0] - 1)


@pytest.mark.parametrize(
    ("tamper", "number"),
    [
        (lambda s: {"num_microbatches": (s.num_microbatches[0] + 1,)}, 1),
        (lambda s: {"partitions": (s.partitions[0][:-1],) + s.partitions[1:]}, 3),
        (lambda s: {"micro_batch_indices": (_all_in_first(s),) + s.micro_batch_indices[1:]}, 2),
        (lambda s: {"step_num_samples": (s.step_num_samples[0] - 1,)}, 5),
        (lambda s: {"dropped": (0,)}, 3),
    ],
)
def test_checker_catches_a_broken_plan(tamper, number):
    lengths = [300] * 12
    schedule = build_dp_schedule(lengths, dp_size=2, global_batch_size=12, max_tokens_per_gpu=600)
    broken = dataclasses.replace(schedule, **tamper(schedule))
    with pytest.raises(ScheduleInvariantError, match=f"invariant {number}"):
        broken.check()


def test_checker_catches_an_illegal_vpp_count():
    schedule = build_dp_schedule([100] * 8, dp_size=1, global_batch_size=8, max_tokens_per_gpu=100,
                                 pp_size=4, vpp_size=2)
    parts = schedule.micro_batch_indices[0]
    broken = dataclasses.replace(
        schedule, num_microbatches=(5,),
        micro_batch_indices=(parts[:4] + ((parts[4] + parts[5] + parts[6] + parts[7]),),),
    )
    with pytest.raises(ScheduleInvariantError, match="invariant [24]"):
        broken.check()


def test_compute_dynamic_global_batch_size():
    assert compute_dynamic_global_batch_size(100, 8) == 96
    assert compute_dynamic_global_batch_size(5, 8) == 8
    assert compute_dynamic_global_batch_size(64, 8) == 64
    with pytest.raises(ValueError, match="dp_size"):
        compute_dynamic_global_batch_size(10, 0)
    with pytest.raises(ValueError, match="num_samples"):
        compute_dynamic_global_batch_size(0, 4)


def test_cost_model_is_linear_plus_quadratic():
    model = CostModel(hidden_size=1024, num_layers=4, num_attention_heads=16, num_query_groups=4, vocab_size=1000)
    linear, quad = model.linear_flops_per_token, model.quadratic_flops_per_token_pair
    assert model(1000) == pytest.approx(3 * (1000 * linear + 1000**2 * quad))
    assert model(2000) > 2 * model(1000)
    mha = CostModel(hidden_size=1024, num_layers=4, num_attention_heads=16, vocab_size=1000)
    assert mha(1000) > model(1000)  # GQA shrinks the K/V projections


def test_core_imports_without_torch_or_megatron():
    code = (
        "import sys, megatron_dpsched, megatron_dpsched.core, megatron_dpsched.cli, megatron_dpsched.baselines; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_balance_growth_spends_micro_batches_to_balance_when_the_cap_binds():
    lengths = [115] + [10] * 30  # the oversize sample fills one micro-batch, its rank has one left
    tight = plan(lengths, dp_size=2, global_batch_size=31, max_tokens_per_gpu=100, balance="tokens")
    grown = plan(lengths, dp_size=2, global_batch_size=31, max_tokens_per_gpu=100, balance="tokens",
                 balance_growth=0.5)
    assert tight.num_microbatches == (2,)  # the lower bound, as a global first fit would
    assert tight.stats()[0].imbalance == pytest.approx(215 / 207.5)  # 3.6%: under the tail's 5%, kept
    assert tight.stats()[0].capacity_bound == pytest.approx(215 / 207.5)  # no plan with 2 does better
    assert grown.num_microbatches == (3,)
    assert grown.stats()[0].imbalance <= 210 / 207.5  # one 10-token sample from perfect


def test_a_tail_past_the_cap_spends_micro_batches_without_balance_growth():
    """The busiest rank more than TAIL_IMBALANCE above max(mean, dearest sample) at the count of one global
    packing: step 5 reaches past it by itself (up to the most samples a rank holds)."""
    lengths = [150] + [10] * 30  # at 2 micro-batches the oversize sample's rank has one left: 250 vs 200
    tail = plan(lengths, dp_size=2, global_batch_size=31, max_tokens_per_gpu=100, balance="tokens")
    assert tail.num_microbatches == (3,)
    assert tail.stats()[0].imbalance <= 230 / 225  # one 10-token sample from perfect (250 / 225 at 2)


def test_balance_growth_must_be_sane():
    with pytest.raises(ValueError, match="balance_growth"):
        build_dp_schedule([10], dp_size=1, global_batch_size=1, max_tokens_per_gpu=10, balance_growth=-1)


def test_refine_moves_samples_off_the_busiest_rank_within_the_cap():
    from megatron_dpsched.core.balancing import refine_by_moves

    sizes = [50, 40, 10, 10, 30, 60]
    plan = [[[0, 1], [2, 3]], [[4], [5]]]  # loads 110 and 90; rank 1 has room 70 and 40
    refine_by_moves(plan, sizes=sizes, costs=[float(s) for s in sizes], cap=100, max_moves=10)
    loads = [sum(sizes[i] for mb in rank for i in mb) for rank in plan]
    assert loads == [100, 100]
    assert all(mb for rank in plan for mb in rank)  # no micro-batch emptied
    assert all(sum(sizes[i] for i in mb) <= 100 for rank in plan for mb in rank)


@pytest.mark.parametrize(("count", "dp"), [(100, 8), (64, 8), (9, 4), (1000, 7)])
def test_one_step_per_rollout_trains_a_multiple_of_dp_and_reports_the_rest(count, dp):
    lengths = [(i * 37) % 500 + 1 for i in range(count)]
    gbs = compute_dynamic_global_batch_size(count, dp)
    schedule = plan(lengths, dp_size=dp, global_batch_size=gbs, max_tokens_per_gpu=1024, drop_last=True)
    assert schedule.num_steps == 1
    assert schedule.step_num_samples[0] % dp == 0
    assert list(schedule.dropped) == list(range(gbs, count))


def test_numpy_arguments_and_tuple_group_ids_survive_json():
    np = pytest.importorskip("numpy")
    schedule = plan([np.int64(5)] * 8, dp_size=np.int64(2), global_batch_size=np.int64(8),
                    max_tokens_per_gpu=np.int64(10))
    json.dumps(schedule.to_dict())
    groups = [(i // 2, "r") for i in range(8)]
    grouped = plan([5] * 8, dp_size=2, global_batch_size=2, max_tokens_per_gpu=10, groups=groups)
    copy = DPSchedule.from_dict(json.loads(json.dumps(grouped.to_dict())))
    copy.check()
    assert copy == grouped


def test_round_robin_plans_never_use_more_than_a_global_first_fit():
    lengths = [9, 3, 9, 10, 2, 9, 9, 5, 3, 4, 3]  # best-fit decreasing needs 8 here, first fit 7
    schedule = plan(lengths, dp_size=1, global_batch_size=11, max_tokens_per_gpu=10, balance="none")
    assert schedule.num_microbatches == (7,)


def test_unbalanceable_steps_stop_growing_the_count_quickly():
    lengths = [100] * 9  # 9 equal samples on 8 ranks: no count balances them
    schedule = plan(lengths, dp_size=8, global_batch_size=9, max_tokens_per_gpu=100, balance_growth=10.0)
    assert schedule.num_microbatches[0] <= 3


def test_cli_check_reports_a_broken_plan_cleanly(tmp_path, capsys):
    from megatron_dpsched.cli import main

    schedule = build_dp_schedule([300] * 12, dp_size=2, global_batch_size=12, max_tokens_per_gpu=600)
    data = schedule.to_dict()
    data["step_num_samples"] = [11]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert main(["check", str(tmp_path / "plan.json")]) == 2
    assert "invariant 5" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["check", str(tmp_path / "bad.json")]) == 2


def test_no_empty_micro_batch_on_a_rank_that_has_samples_to_split():
    """Refinement moves a sample into a lighter rank's empty micro-batch before a full one (spec step 4)."""
    lengths = [2468, 7942, 2954, 1991, 2153, 2651, 2268, 11572, 6741, 9876, 942, 1556, 11660, 972, 1880, 2460,
               2875, 1390, 5128, 5756, 1589, 11876, 12516]
    plan(lengths, dp_size=8, global_batch_size=len(lengths), max_tokens_per_gpu=4096)


def test_equal_samples_over_a_third_of_the_cap_plan_fast_at_the_bound():
    """Two per micro-batch: the lower bound counts samples over cap/3 (at most two share one)."""
    from megatron_dpsched.core.packing import bin_lower_bound

    assert bin_lower_bound([1366] * 4096, 4096) == 2048
    assert bin_lower_bound([1025] * 30, 4096) == 10  # over a quarter: at most three per micro-batch
    assert bin_lower_bound([0, 0, 0], 4096) == 1  # samples of 0 tokens (planned sizes only) still need one
    assert bin_lower_bound([0, 5000], 4096) == 2
    schedule = plan([1366] * 4096, dp_size=2, global_batch_size=4096, max_tokens_per_gpu=4096)
    assert schedule.num_microbatches == (1024,)
