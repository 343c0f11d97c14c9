"""The verl-style helper: one mini-batch planned on the driver, per-rank micro-batch index lists.

What a verl worker relies on (``rearrange_micro_batches`` / ``restore_dynamic_batch``): its
micro-batch index lists cover its local batch exactly once, none is empty, each holds at most
``max_token_len`` tokens, every rank runs the same count (``same_micro_num_in_dp``), and the count is a
multiple of ``num_batches_divided_by``.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from megatron_dpsched import CostModel
from megatron_dpsched.compat.verl import (
    VERL_CONTRACT,
    calculate_workload,
    ceildiv,
    get_group_balanced_partitions,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    local_micro_batch_count,
    log_seqlen_unbalance,
    plan_micro_batches,
    plan_mini_batch,
    roundup_divisible,
)


def assert_verl_contract(plan, seqlen_list, *, dp_size, max_token_len, divided_by=1):
    assert len(plan.rank_indices) == len(plan.micro_batch_indices) == dp_size
    dispatched = [i for rank in plan.rank_indices for i in rank]
    assert sorted(dispatched) == list(range(len(seqlen_list)))  # every sample to exactly one rank
    assert plan.num_micro_batches % divided_by == 0
    for rank, (local, micro_batches) in enumerate(zip(plan.rank_indices, plan.micro_batch_indices, strict=True)):
        assert len(micro_batches) == plan.num_micro_batches, f"rank {rank}"
        assert sorted(i for mb in micro_batches for i in mb) == list(range(len(local)))
        for mb, global_mb in zip(micro_batches, plan.global_micro_batches(rank), strict=True):
            assert mb, f"rank {rank}: empty micro-batch"
            assert tuple(local[i] for i in mb) == global_mb
            tokens = sum(seqlen_list[local[i]] for i in mb)
            assert tokens <= max_token_len or len(mb) == 1


def test_contract_source_is_recorded():
    assert VERL_CONTRACT.startswith("volcengine/verl@") and VERL_CONTRACT.endswith("seqlen_balancing.py")


def test_one_mini_batch_for_two_ranks():
    seqlens = [100, 30, 20, 400, 50, 60, 70, 10]
    plan = plan_mini_batch(seqlens, dp_size=2, max_token_len=256)
    assert_verl_contract(plan, seqlens, dp_size=2, max_token_len=256)
    assert plan.num_micro_batches == 2 and plan.max_token_len == 256
    assert plan.schedule.num_steps == 1 and plan.schedule.step_num_samples == (8,)


def test_count_is_a_multiple_of_num_batches_divided_by():
    seqlens = [40] * 24
    plan = plan_mini_batch(seqlens, dp_size=2, max_token_len=400, num_batches_divided_by=4)
    assert_verl_contract(plan, seqlens, dp_size=2, max_token_len=400, divided_by=4)
    assert plan.num_micro_batches == 4


def test_balances_across_ranks_better_than_equal_chunks():
    rng = random.Random(5)
    seqlens = sorted((rng.randint(10, 2000) for _ in range(64)), reverse=True)
    plan = plan_mini_batch(seqlens, dp_size=4, max_token_len=4096)
    loads = [sum(seqlens[i] for i in rank) for rank in plan.rank_indices]
    chunks = [sum(seqlens[r * 16:(r + 1) * 16]) for r in range(4)]  # what data.chunk(dp_size) would give
    assert max(loads) / min(loads) < 1.05 < max(chunks) / min(chunks)


def test_ordering_and_cost_model_options():
    seqlens = [300, 20, 280, 40, 260, 60, 240, 80]
    flat = plan_mini_batch(seqlens, dp_size=1, max_token_len=320, use_dynamic_bsz_balance=False)
    ends = plan_mini_batch(seqlens, dp_size=1, max_token_len=320, cost_model=CostModel(
        hidden_size=64, num_layers=2, num_attention_heads=4))
    assert flat.schedule.config.microbatch_order == "none" and ends.schedule.config.microbatch_order == "pipeline"
    assert ends.schedule.config.balance == "cost"
    for plan in (flat, ends):
        assert_verl_contract(plan, seqlens, dp_size=1, max_token_len=320)


def test_random_mini_batches_keep_the_contract():
    rng = random.Random(8)
    for _ in range(300):
        dp, divided_by = rng.choice([1, 2, 4, 8]), rng.choice([None, 1, 2, 4])
        seqlens = [rng.randint(1, 3000) for _ in range(rng.randint(dp, 96))]
        cap = rng.choice([512, 2048, 8192])
        try:
            plan = plan_mini_batch(seqlens, dp_size=dp, max_token_len=cap, num_batches_divided_by=divided_by)
        except ValueError as error:
            assert str(error).startswith("seqlen_list: step 0 has"), error  # fewer samples than micro-batches
            continue
        assert_verl_contract(plan, seqlens, dp_size=dp, max_token_len=cap, divided_by=divided_by or 1)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"seqlen_list": [5, 0], "dp_size": 1, "max_token_len": 8}, r"seqlen_list\[1\]"),
    ({"seqlen_list": [], "dp_size": 1, "max_token_len": 8}, "seqlen_list"),
    ({"seqlen_list": [5, 6], "dp_size": 0, "max_token_len": 8}, "dp_size"),
    ({"seqlen_list": [5, 6], "dp_size": 3, "max_token_len": 8}, "dp_size"),
    ({"seqlen_list": [5, 6], "dp_size": 1, "max_token_len": 0}, "max_token_len"),
    ({"seqlen_list": [5, 6], "dp_size": 1, "max_token_len": 8, "num_batches_divided_by": 0}, "num_batches_divided_by"),
    ({"seqlen_list": [5, 6], "dp_size": 1, "max_token_len": 8, "num_batches_divided_by": 4}, "seqlen_list"),
    ({"seqlen_list": [5, 6], "dp_size": 1, "max_token_len": 8, "use_dynamic_bsz_balance": 1}, "use_dynamic_bsz"),
    ({"seqlen_list": [5, 6], "dp_size": 1, "max_token_len": 8, "cost_model": 3}, "cost_model"),
])
def test_bad_input_raises_value_error_naming_the_argument(kwargs, name):
    seqlens = kwargs.pop("seqlen_list")
    with pytest.raises(ValueError, match=name):
        plan_mini_batch(seqlens, **kwargs)


def test_compat_imports_without_torch_or_megatron():
    code = ("import sys, megatron_dpsched.compat.slime, megatron_dpsched.compat.verl; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# Level 1: verl's per-rank API (the pure half; the tensor half is tests/distributed/test_compat_verl_tensors.py).

def ideal_partition_reference(weights, k):
    """Exhaustive best max-load over all assignments (tiny inputs only): what a balanced split approaches."""
    import itertools
    best = math.inf
    for owners in itertools.product(range(k), repeat=len(weights)):
        if len(set(owners)) == k:
            loads = [0.0] * k
            for w, o in zip(weights, owners, strict=True):
                loads[o] += w
            best = min(best, max(loads))
    return best


def test_small_helpers_match_their_definitions():
    for a in range(0, 40):
        for b in range(1, 9):
            assert ceildiv(a, b) == math.ceil(a / b)
            assert roundup_divisible(a, b) % b == 0 and 0 <= roundup_divisible(a, b) - a < b
    assert calculate_workload(100) == 24576 * 100 + 100 * 100
    perm = [3, 0, 4, 1, 2]
    reverse = get_reverse_idx(perm)
    assert [perm[reverse[j]] for j in range(5)] == list(range(5))
    with pytest.raises(ValueError, match="idx_map"):
        get_reverse_idx([0, 0, 1])


def test_micro_batches_hold_the_cap_and_cover_the_rank_once():
    rng = random.Random(18)
    for _ in range(400):
        cap = rng.choice([64, 300, 1000])
        seqlens = [rng.randint(0, cap) for _ in range(rng.randint(1, 40))]
        minimum = rng.choice([None, 1, 2, 5])
        try:
            count = local_micro_batch_count(seqlens, max_token_len=cap, min_num_micro_batch=minimum)
        except ValueError as error:
            assert minimum is not None and minimum > len(seqlens) and "min_num_micro_batch" in str(error)
            continue
        verl_count = min(len(seqlens), math.ceil(sum(seqlens) / cap))
        assert max(verl_count, minimum or 1) <= count <= len(seqlens)
        for extra in (0, rng.randint(0, len(seqlens) - count)):  # the DP MAX / rounding may raise the count
            mbs = plan_micro_batches(seqlens, max_token_len=cap, num_micro_batches=count + extra,
                                     use_dynamic_bsz_balance=rng.random() < 0.5)
            assert len(mbs) == count + extra and all(mbs)
            assert sorted(i for mb in mbs for i in mb) == list(range(len(seqlens)))
            assert all(sum(seqlens[i] for i in mb) <= cap for mb in mbs)


def test_the_count_is_verls_where_the_cap_allows():
    seqlens = [100] * 9 + [50] * 2  # 1000 tokens: verl's ceil(1000 / 300) = 4, and 4 bins of 300 hold them
    assert local_micro_batch_count(seqlens, max_token_len=300) == 4
    assert local_micro_batch_count(seqlens, max_token_len=300, min_num_micro_batch=6) == 6
    tight = [160] * 4  # 640 tokens: verl asks for ceil(640 / 300) = 3, but no two samples share 300
    assert local_micro_batch_count(tight, max_token_len=300) == 4


def test_a_sample_over_the_cap_or_too_many_micro_batches_raise_naming_the_argument():
    with pytest.raises(AssertionError, match="max_token_len"):  # verl asserts; also a ValueError here
        local_micro_batch_count([10, 400], max_token_len=300)
    with pytest.raises(ValueError, match="num_micro_batches"):
        plan_micro_batches([10, 20], max_token_len=300, num_micro_batches=3)
    with pytest.raises(ValueError, match="num_micro_batches"):
        plan_micro_batches([200, 200, 200], max_token_len=300, num_micro_batches=2)


def test_use_dynamic_bsz_balance_puts_light_micro_batches_at_both_ends():
    seqlens = [290, 10, 250, 50, 200, 100, 150, 120]
    mbs = plan_micro_batches(seqlens, max_token_len=300, num_micro_batches=6, use_dynamic_bsz_balance=True)
    loads = [sum(calculate_workload(seqlens[i]) for i in mb) for mb in mbs]
    peak = loads.index(max(loads))
    assert 0 < peak < len(mbs) - 1  # the heaviest sits inside, not at an end
    assert loads[:peak + 1] == sorted(loads[:peak + 1]) and loads[peak:] == sorted(loads[peak:], reverse=True)


def test_balanced_partitions_keep_verls_contract_and_balance():
    rng = random.Random(3)
    for _ in range(60):
        k = rng.randint(1, 4)
        weights = [rng.randint(0, 50) for _ in range(k * rng.randint(1, 3))]
        for equal_size in (True, False):
            parts = get_seqlen_balanced_partitions(weights, k, equal_size)
            assert len(parts) == k and all(parts) and all(p == sorted(p) for p in parts)
            assert sorted(i for p in parts for i in p) == list(range(len(weights)))
            if equal_size:
                assert {len(p) for p in parts} == {len(weights) // k}
            loads = [sum(weights[i] for i in p) for p in parts]
            assert loads == sorted(loads, reverse=True)  # heaviest first, as verl's sets come out
            if not equal_size and len(weights) <= 7:
                assert max(loads) <= ideal_partition_reference(weights, k) + max(weights)
    with pytest.raises(AssertionError, match="k_partitions"):
        get_seqlen_balanced_partitions([1, 2], 3, False)
    with pytest.raises(ValueError, match="equal_size"):
        get_seqlen_balanced_partitions([1, 2, 3], 2, True)


def test_group_partitions_keep_uid_runs_together():
    seqlens = [100, 100, 200, 200, 150, 150, 50, 50, 300, 300, 250, 250]
    uids = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e", "f", "f"]
    parts = get_group_balanced_partitions(seqlens, uids, 3)
    assert sorted(i for p in parts for i in p) == list(range(12))
    for p in parts:
        assert len(p) == 4 and all(uids[i] == uids[i ^ 1] and (i ^ 1) in p for i in p)
    with pytest.raises(ValueError, match="uid groups"):
        get_group_balanced_partitions(seqlens, uids, 7)


def test_log_seqlen_unbalance_reports_chunks_and_partitions():
    seqlens = [10, 20, 30, 40]
    metrics = log_seqlen_unbalance(seqlens, [[0, 3], [1, 2]], "g")
    assert metrics == {"g/min": 30, "g/max": 70, "g/minmax_diff": 40, "g/balanced_min": 50, "g/balanced_max": 50,
                       "g/mean": 50.0}
