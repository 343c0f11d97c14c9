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
        ([10, 10**400, 5, 5], r"lengths\[1\] must be a positive integer token count \(at most 2147483647\)"),
        ([10, 2**31, 5, 5], r"lengths\[1\]"),
        ({0: 10, 1: 20, 2: 30, 3: 40}, "lengths must be a sequence .* got dict"),
        ({10, 20, 30, 40}, "lengths must be a sequence .* got set"),
        (iter([10, 20, 30, 40]), "lengths must be a sequence"),
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
        ({"groups": iter([1, 2, 3, 4])}, "groups must be a sequence"),
        ({"groups": "abcd"}, "groups must be a sequence"),
        ({"groups": {1, 2, 3, 4}}, "groups must be a sequence"),
        ({"drop_last": "no"}, "drop_last must be True or False"),
        ({"drop_last": 1}, "drop_last must be True or False"),
        ({"dp_size": 10**7}, "dp_size=10000000 is larger than the 4 samples of the largest step"),
        ({"dp_size": 5}, "dp_size=5 is larger than the 4 samples"),
        ({"pp_size": 10**7}, "pp_size must be at most 65536"),
        ({"pp_size": 2, "vpp_size": 2, "microbatch_group_size_per_vp_stage": 10**9},
         "microbatch_group_size_per_vp_stage must be at most 65536"),
        ({"max_tokens_per_gpu": 10**400}, "max_tokens_per_gpu must be at most"),
        ({"pp_size": 65536, "vpp_size": 2}, "need at least 65536 micro-batches per rank and step"),
        ({"cost_model": lambda n: None}, "cost_model gave sample 0 the cost None"),
        ({"cost_model": lambda n: 1 + 2j}, "cost_model gave sample 0"),
        ({"cost_model": lambda n: "1.5"}, "cost_model gave sample 0 the cost '1.5'"),
        ({"cost_model": lambda n: True}, "cost_model gave sample 0 the cost True"),
        ({"cost_model": lambda n: 1e308}, "add up to infinity"),
        ({"cost_model": lambda n: 10**400}, "cost_model gave sample 0"),
        ({"cost_model": 5, "balance": "tokens"}, "cost_model must be a CostModel"),
        ({"microbatch_order": ["none", "x"]}, "microbatch_order must be one of"),
        ({"balance": ["cost"]}, "balance must be one of"),
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


def test_a_vpp_group_without_vpp_is_ignored_as_megatron_ignores_it():
    schedule = build_dp_schedule([10, 20, 30, 40], dp_size=2, global_batch_size=4, max_tokens_per_gpu=100,
                                 pp_size=2, microbatch_group_size_per_vp_stage=1)
    schedule.check()
    assert schedule.num_microbatches == (1,)


def test_numpy_lengths_and_booleans_are_accepted():
    np = pytest.importorskip("numpy")
    schedule = build_dp_schedule(np.array([10, 20, 30, 40]), dp_size=2, global_batch_size=4,
                                 max_tokens_per_gpu=100, drop_last=np.bool_(False))
    schedule.check()
    assert schedule.lengths == (10, 20, 30, 40) and schedule.config.drop_last is False


def test_more_bad_arguments_from_adversarial_tries():
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="lengths must be a sequence .* unsized"):
        build_dp_schedule(np.array(5), **GOOD)
    with pytest.raises(ValueError, match="microbatch_order must be one of"):
        build_dp_schedule([10, 20, 30, 40], **GOOD, microbatch_order=np.array(["none", "x"]))
    schedule = build_dp_schedule([10, 20, 30, 40], **GOOD, balance_growth=np.float32(0.5))
    assert schedule.config.balance_growth == 0.5
    assert build_dp_schedule([10, 20, 30, 40], **GOOD, balance_growth=-0.0).config.balance_growth == 0.0


@pytest.mark.parametrize(("override", "match"), [
    ({"hidden_size": 10**400}, "hidden_size must be at most"),
    ({"num_query_groups": 10**400}, "num_query_groups must be at most"),
    ({"num_query_groups": 3}, "num_query_groups=3 must divide num_attention_heads=4"),
    ({"swiglu": "no"}, "swiglu must be True or False"),
    ({"causal": "False"}, "causal must be True or False"),
])
def test_bad_cost_model_fields(override, match):
    with pytest.raises(ValueError, match=match):
        CostModel(**{"hidden_size": 8, "num_layers": 2, "num_attention_heads": 4, **override})
