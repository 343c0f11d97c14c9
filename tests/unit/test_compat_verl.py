"""The verl-style helper: one mini-batch planned on the driver, per-rank micro-batch index lists.

What a verl worker relies on (``rearrange_micro_batches`` / ``restore_dynamic_batch``): its
micro-batch index lists cover its local batch exactly once, none is empty, each holds at most
``max_token_len`` tokens, every rank runs the same count (``same_micro_num_in_dp``), and the count is a
multiple of ``num_batches_divided_by``.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from megatron_dpsched import CostModel
from megatron_dpsched.compat.verl import VERL_CONTRACT, plan_mini_batch


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
