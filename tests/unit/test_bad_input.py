"""Malformed or impossible input raises ValueError naming the argument, before any planning."""

from __future__ import annotations

import pytest

from megatron_dpsched import CostModel, build_dp_schedule

GOOD = {"dp_size": 2, "global_batch_size": 4, "max_tokens_per_gpu": 100}


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        ([10, -1, 5, 5], r"lengths\[1\]"),
        ([10, 0, 5, 5], r"lengths\[1\]"),
        ([10, 2.5, 5, 5], r"lengths\[1\]"),
        ([10, True, 5, 5], r"lengths\[1\]"),
        ([10, "7", 5, 5], r"lengths\[1\]"),
        ([], "lengths is empty"),
        ("1234", "lengths must be a sequence"),
        (None, "lengths must be a sequence"),
    ],
)
def test_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        build_dp_schedule(lengths, **GOOD)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"max_tokens_per_gpu": 0}, "max_tokens_per_gpu"),
        ({"max_tokens_per_gpu": -5}, "max_tokens_per_gpu"),
        ({"max_tokens_per_gpu": 10.5}, "max_tokens_per_gpu"),
        ({"dp_size": 0}, "dp_size"),
        ({"global_batch_size": 0}, "global_batch_size"),
        ({"pp_size": 0}, "pp_size"),
        ({"vpp_size": 0}, "vpp_size"),
        ({"cp_size": 0}, "cp_size"),
        ({"micro_batch_size": 2}, "exactly one of max_tokens_per_gpu"),
        ({"max_tokens_per_gpu": None}, "exactly one of max_tokens_per_gpu"),
        ({"pp_size": 4, "vpp_size": 2, "microbatch_group_size_per_vp_stage": 2},
         "microbatch_group_size_per_vp_stage=2 is below pp_size=4"),
        ({"microbatch_group_size_per_vp_stage": 0}, "microbatch_group_size_per_vp_stage"),
        ({"vpp_size": 2}, "vpp_size=2 needs pp_size >= 2"),
        ({"groups": [1, 2, 3]}, "groups must hold one id per sample"),
        ({"groups": [[1], [2], [3], [4]]}, r"groups\[0\]"),
        ({"balance": "fair"}, "balance must be one of"),
        ({"balance_growth": "0.5"}, "balance_growth must be a number"),
        ({"groups": iter([1, 2, 3, 4])}, "groups must hold one id per sample"),
        ({"microbatch_order": "random"}, "microbatch_order must be one of"),
        ({"cost_model": 3}, "cost_model must be a CostModel"),
        ({"cost_model": lambda n: -1.0}, "cost_model gave sample 0"),
        ({"cost_model": lambda n: float("nan")}, "cost_model gave sample 0"),
        ({"drop_last": True, "global_batch_size": 8}, "fewer than one global_batch_size"),
    ],
)
def test_bad_arguments(override, match):
    with pytest.raises(ValueError, match=match):
        build_dp_schedule([10, 20, 30, 40], **{**GOOD, **override})


def test_static_layout_needs_whole_micro_batches_per_rank():
    with pytest.raises(ValueError, match="global_batch_size=6 must be a multiple of micro_batch_size"):
        build_dp_schedule([5] * 12, dp_size=2, global_batch_size=6, micro_batch_size=2)


def test_static_layout_needs_enough_samples_per_step():
    with pytest.raises(ValueError, match="global_batch_size=2 must be a multiple of micro_batch_size"):
        build_dp_schedule([5] * 12, dp_size=4, global_batch_size=2, micro_batch_size=1)


def test_bad_cost_model_dimensions():
    with pytest.raises(ValueError, match="hidden_size"):
        CostModel(hidden_size=0, num_layers=2, num_attention_heads=2)
    with pytest.raises(ValueError, match="num_query_groups"):
        CostModel(hidden_size=8, num_layers=2, num_attention_heads=2, num_query_groups=0)
