"""The slime drop-in against slime's documented contract (``slime/utils/dp_schedule.py``).

What slime documents for ``build_dp_schedule(args, train_parallel_config, total_lengths, *,
global_batch_size, rollout_indices)`` and what its callers rely on:

* it returns ``(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)``, lists;
* every DP rank runs the same ``num_microbatches[s]`` in step ``s`` (``len(micro_batch_indices[r]) ==
  sum(num_microbatches)``);
* with dynamic batching every micro-batch holds at most ``max_tokens_per_gpu * cp_size`` tokens, or is
  one longer sample alone;
* partitions are disjoint and cover every sample kept after trimming trailing rollouts that do not
  fill a step (``num_rollouts // global_batch_size`` steps of ``global_batch_size`` rollouts each);
* flattening ``micro_batch_indices[r]`` gives ``range(len(partitions[r]))``;
* samples of one rollout stay in one step; ``global_batch_sizes[s]`` is the rollout count of step ``s``;
* with VPP the per-rank count suits Megatron's interleaved schedule (a multiple of the group size);
* every micro-batch is non-empty (slime's trainer collates each one);
* failures are assertions (here: ``ValueError`` naming the argument, also an ``AssertionError``).
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from megatron_dpsched.compat.slime import (
    SLIME_CONTRACT,
    SlimeScheduleError,
    build_dp_schedule,
    plan_slime_schedule,
)


def make_args(*, micro_batch_size=1, use_dynamic_batch_size=False, max_tokens_per_gpu=None, balance_data=False,
              **extra):
    return SimpleNamespace(micro_batch_size=micro_batch_size, use_dynamic_batch_size=use_dynamic_batch_size,
                           max_tokens_per_gpu=max_tokens_per_gpu, balance_data=balance_data,
                           balance_by_flops=False, **extra)


def make_tp(dp_size=1, cp_size=1, vpp_size=1, microbatch_group_size_per_vp_stage=1):
    return {"dp_size": dp_size, "cp_size": cp_size, "vpp_size": vpp_size,
            "microbatch_group_size_per_vp_stage": microbatch_group_size_per_vp_stage}


def step_of_each_micro_batch(num_microbatches):
    return [step for step, count in enumerate(num_microbatches) for _ in range(count)]


def assert_slime_contract(result, *, total_lengths, rollout_indices, global_batch_size, dp_size, cap=None,
                          group=1):
    partitions, mbi, nmb, gbs_per_step = result
    assert all(isinstance(x, list) for x in (partitions, mbi, nmb, gbs_per_step))
    rollouts = list(dict.fromkeys(rollout_indices))
    num_steps = len(rollouts) // global_batch_size
    assert len(nmb) == num_steps and gbs_per_step == [global_batch_size] * num_steps
    assert len(partitions) == len(mbi) == dp_size
    kept_rollouts = {r: step for step in range(num_steps)
                     for r in rollouts[step * global_batch_size:(step + 1) * global_batch_size]}
    kept = {i for i, r in enumerate(rollout_indices) if r in kept_rollouts}
    seen: set[int] = set()
    for rank in range(dp_size):
        assert len(mbi[rank]) == sum(nmb), f"rank {rank}: micro-batch count"
        assert [i for mb in mbi[rank] for i in mb] == list(range(len(partitions[rank])))
        assert seen.isdisjoint(partitions[rank])
        seen.update(partitions[rank])
        for step, mb in zip(step_of_each_micro_batch(nmb), mbi[rank], strict=True):
            assert mb, f"rank {rank}: empty micro-batch in step {step}"
            samples = [partitions[rank][p] for p in mb]
            assert all(kept_rollouts[rollout_indices[i]] == step for i in samples), "rollout in the wrong step"
            tokens = sum(total_lengths[i] for i in samples)
            assert cap is None or tokens <= cap or len(samples) == 1, f"{tokens} tokens > cap {cap}"
    assert seen == kept
    assert all(count % group == 0 for count in nmb)


def test_contract_source_is_recorded():
    assert SLIME_CONTRACT.startswith("THUDM/slime@") and SLIME_CONTRACT.endswith("slime/utils/dp_schedule.py")


def test_static_single_step():
    lengths, rollouts = [10] * 16, list(range(16))
    result = build_dp_schedule(make_args(micro_batch_size=2), make_tp(dp_size=4), lengths,
                               global_batch_size=16, rollout_indices=rollouts)
    assert result[2] == [2] and result[3] == [16]
    assert_slime_contract(result, total_lengths=lengths, rollout_indices=rollouts, global_batch_size=16, dp_size=4)
    assert all(len(mb) <= 2 for rank in result[1] for mb in rank)


def slime_static_path_raises(step_sizes, *, micro_batch_size, dp_size, vpp_size, group):
    """slime's static path, as its ``build_dp_schedule`` reads: a step of ``n`` samples packs into
    ``ceil(n / micro_batch_size)`` micro-batches and raises unless that is a multiple of dp_size (times G with VPP)."""
    align = dp_size * (group if vpp_size > 1 else 1)
    return any(math.ceil(n / micro_batch_size) % align != 0 for n in step_sizes)


@pytest.mark.parametrize(("samples", "raises"), [(6, True), (10, True), (5, True), (7, False), (8, False)])
def test_static_step_not_splitting_evenly_raises_as_slime_does(samples, raises):
    args, tp, lengths = make_args(micro_batch_size=2), make_tp(dp_size=2), [10 + i for i in range(samples)]
    assert raises == slime_static_path_raises([samples], micro_batch_size=2, dp_size=2, vpp_size=1, group=1)
    if not raises:
        build_dp_schedule(args, tp, lengths, global_batch_size=samples, rollout_indices=list(range(samples)))
        return
    with pytest.raises(AssertionError, match=r"args\.micro_batch_size=2.*'dp_size'") as info:
        build_dp_schedule(args, tp, lengths, global_batch_size=samples, rollout_indices=list(range(samples)))
    assert isinstance(info.value, SlimeScheduleError) and isinstance(info.value, ValueError)
    assert f"step 0 has {samples} samples" in str(info.value)


def test_static_step_with_vpp_must_split_evenly_over_the_groups_too():
    tp = make_tp(dp_size=2, vpp_size=2, microbatch_group_size_per_vp_stage=2)
    with pytest.raises(AssertionError, match="not a multiple of 4"):  # 6 micro-batches, dp 2 x G 2
        build_dp_schedule(make_args(micro_batch_size=2), tp, [5] * 12, 12, list(range(12)))
    build_dp_schedule(make_args(micro_batch_size=2), tp, [5] * 16, 16, list(range(16)))


def test_trims_trailing_rollouts_that_do_not_fill_a_step():
    lengths, rollouts = [3] * 8, [0, 0, 1, 2, 2, 3, 4, 4]
    result = build_dp_schedule(make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=12), make_tp(), lengths,
                               global_batch_size=2, rollout_indices=rollouts)
    assert result[3] == [2, 2]
    assert sorted(result[0][0]) == list(range(6))  # rollout 4 (samples 6 and 7) is left out
    assert_slime_contract(result, total_lengths=lengths, rollout_indices=rollouts, global_batch_size=2,
                          dp_size=1, cap=12)


def test_positional_call_as_the_issue_writes_it_equals_slimes_keyword_call():
    args, tp, lengths, rollouts = make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=64), make_tp(2), \
        [5, 60, 7, 33, 21, 9, 44, 12], [0, 0, 1, 1, 2, 2, 3, 3]
    assert build_dp_schedule(args, tp, lengths, 2, rollouts) == build_dp_schedule(
        args, tp, lengths, global_batch_size=2, rollout_indices=rollouts)


def test_cap_scales_with_context_parallelism_and_a_long_sample_runs_alone():
    lengths, rollouts = [300, 90, 80, 70, 60, 50, 40, 30], [0, 0, 1, 1, 2, 2, 3, 3]
    result = build_dp_schedule(make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=50), make_tp(2, cp_size=2),
                               lengths, global_batch_size=4, rollout_indices=rollouts)
    assert_slime_contract(result, total_lengths=lengths, rollout_indices=rollouts, global_batch_size=4,
                          dp_size=2, cap=100)
    assert [0] in [[result[0][r][p] for p in mb] for r in range(2) for mb in result[1][r]]


@pytest.mark.parametrize("pp", [None, 2])
def test_vpp_counts_are_multiples_of_the_group(pp):
    rng = random.Random(3)
    lengths = [rng.randint(1, 200) for _ in range(64)]
    rollouts = [i // 4 for i in range(64)]
    args = make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=256,
                     **({} if pp is None else {"pipeline_model_parallel_size": pp}))
    result = build_dp_schedule(args, make_tp(2, vpp_size=2, microbatch_group_size_per_vp_stage=2), lengths,
                               global_batch_size=8, rollout_indices=rollouts)
    assert_slime_contract(result, total_lengths=lengths, rollout_indices=rollouts, global_batch_size=8,
                          dp_size=2, cap=256, group=2)


def test_balance_data_balances_a_flops_model_of_args():
    args = make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=128, balance_data=True, hidden_size=16,
                     num_layers=2, num_attention_heads=2, num_query_groups=2, ffn_hidden_size=64, vocab_size=32)
    plan = plan_slime_schedule(args, make_tp(2), [10, 100, 20, 90], global_batch_size=2, rollout_indices=[0, 0, 1, 1])
    assert plan.schedule.config.balance == "cost"
    tokens = plan_slime_schedule(make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=128), make_tp(2),
                                 [10, 100, 20, 90], global_batch_size=2, rollout_indices=[0, 0, 1, 1])
    assert tokens.schedule.config.balance == "tokens"
    assert plan.as_slime()[0] and plan.schedule.to_dict()["partitions"] == [list(p) for p in plan.partitions]


def test_no_empty_micro_batch_where_the_planner_would_leave_one():
    # one long sample fills a rank's share: its other micro-batch would be empty
    lengths, rollouts = [190, 10, 10, 10, 10, 10], [0, 1, 2, 3, 4, 5]
    result = build_dp_schedule(make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=100), make_tp(2), lengths,
                               global_batch_size=6, rollout_indices=rollouts)
    assert_slime_contract(result, total_lengths=lengths, rollout_indices=rollouts, global_batch_size=6,
                          dp_size=2, cap=100)


def test_random_rollouts_keep_the_contract():
    rng = random.Random(12)
    for case in range(300):
        dp, n = rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8])
        prompts = rng.randint(2, 12)
        rollouts = [i // n for i in range(prompts * n)]
        lengths = [rng.randint(1, 600) for _ in rollouts]
        gbs = rng.randint(1, prompts)
        vpp, group = rng.choice([(1, 1), (2, 2), (2, 4)])
        dynamic = rng.random() < 0.8
        cap = rng.choice([64, 256, 1024])
        args = make_args(use_dynamic_batch_size=dynamic, max_tokens_per_gpu=cap, micro_batch_size=rng.randint(1, 4))
        tp = make_tp(dp, cp_size=rng.choice([1, 2]), vpp_size=vpp, microbatch_group_size_per_vp_stage=group)
        step_sizes = [sum(rollouts.count(r) for r in range(s * gbs, (s + 1) * gbs)) for s in range(prompts // gbs)]
        static_raises = not dynamic and slime_static_path_raises(
            step_sizes, micro_batch_size=args.micro_batch_size, dp_size=dp, vpp_size=vpp, group=group)
        try:
            result = build_dp_schedule(args, tp, lengths, gbs, rollouts)
        except SlimeScheduleError as error:
            assert "samples" in str(error), f"case {case}: {error}"  # too few samples for the step's ranks
            assert static_raises or "micro_batch_size" not in str(error), f"case {case}: {error}"
            continue
        assert not static_raises, f"case {case}: slime's static path raises here"
        assert_slime_contract(result, total_lengths=lengths, rollout_indices=rollouts, global_batch_size=gbs,
                              dp_size=dp, cap=cap * tp["cp_size"] if dynamic else None, group=group)


@pytest.mark.parametrize(("call", "names"), [
    (lambda: build_dp_schedule(make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=8), make_tp(), [3, 4, 5],
                               1, [0, 1]), "rollout_indices"),
    (lambda: build_dp_schedule(make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=0), make_tp(), [3, 4],
                               1, [0, 1]), "args.max_tokens_per_gpu"),
    (lambda: build_dp_schedule(make_args(use_dynamic_batch_size=True), make_tp(), [3, 4], 1, [0, 1]),
     "args.max_tokens_per_gpu"),
    (lambda: build_dp_schedule(make_args(micro_batch_size=0), make_tp(), [3, 4], 1, [0, 1]), "args.micro_batch_size"),
    (lambda: build_dp_schedule(make_args(), make_tp(), [3, 0], 1, [0, 1]), "total_lengths[1]"),
    (lambda: build_dp_schedule(make_args(), make_tp(), [3, 4], 0, [0, 1]), "global_batch_size"),
    (lambda: build_dp_schedule(make_args(), make_tp(), [3, 4], 4, [0, 0]), "num_rollouts"),
    (lambda: build_dp_schedule(make_args(), make_tp(dp_size=4), [3, 4], 1, [0, 1]), "dp_size"),
    (lambda: build_dp_schedule(make_args(), {"cp_size": 1}, [3, 4], 1, [0, 1]), "dp_size"),
    (lambda: build_dp_schedule(make_args(), make_tp(cp_size=0), [3, 4], 1, [0, 1]), "cp_size"),
    (lambda: build_dp_schedule(make_args(), make_tp(), [3, 4], 1, [[0], [1]]), "rollout_indices[0]"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, names):
    with pytest.raises(ValueError, match=names.replace("[", r"\[").replace("]", r"\]")) as info:
        call()
    assert isinstance(info.value, AssertionError)  # what slime's own checks raise


def test_ranks_of_every_step_are_numbered_heaviest_first_as_slime_does():
    rng = random.Random(21)
    for balance_data in (False, True):
        args = make_args(use_dynamic_batch_size=True, max_tokens_per_gpu=256, balance_data=balance_data,
                         hidden_size=64, num_layers=2, num_attention_heads=4)
        lengths = [rng.randint(1, 256) for _ in range(48)]
        plan = plan_slime_schedule(args, make_tp(4), lengths, global_batch_size=16, rollout_indices=list(range(48)))
        schedule = plan.schedule
        for step in range(schedule.num_steps):
            loads = [sum(schedule.costs[i] for mb in schedule.rank_step_micro_batches(r, step) for i in mb)
                     for r in range(4)]
            assert loads == sorted(loads, reverse=True), (balance_data, step, loads)
        if balance_data:
            assert schedule.config.balance == "cost"
