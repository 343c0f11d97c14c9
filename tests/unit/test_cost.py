"""The FLOPs cost model against hand-computed counts, its Megatron flags, and the planner's use of costs.

Every expected number is written out from the shapes (arithmetic in the comments), not computed with
the model's own helpers, so dropping or changing any single term of the formula fails a test.
"""

from __future__ import annotations

import argparse

import pytest
from assertions import assert_invariants

from megatron_dpsched import DEFAULT_COST_MODEL, CostModel, GenericCostModel, build_dp_schedule
from megatron_dpsched.core import StepTimeModel
from megatron_dpsched.core.cost import DEFAULT_ATTENTION_LENGTH

# Llama-3-8B layer: h=4096, 32 heads of 128, 8 query groups, SwiGLU MLP of 14336.
LLAMA3_8B_LAYER = dict(hidden_size=4096, num_layers=1, num_attention_heads=32, num_query_groups=8,
                       ffn_hidden_size=14336, swiglu=True)
# Q:   2 * 4096 * (32*128)        =  33,554,432
# K,V: 2 * 4096 * (2 * 8*128)     =  16,777,216
# out: 2 * (32*128) * 4096        =  33,554,432
# MLP: 3 * 2 * 4096 * 14336       = 352,321,536   (gate, up, down)
LLAMA3_8B_LINEAR = 33_554_432 + 16_777_216 + 33_554_432 + 352_321_536  # = 436,207,616

# DeepSeek-V2-Lite-like MoE layer on plain multi-head attention: h=2048, 16 heads of 128, 64 routed
# experts of width 1408, top-6, shared experts of total width 2816 (2 x 1408), SwiGLU experts.
MOE_LAYER = dict(hidden_size=2048, num_layers=1, num_attention_heads=16, swiglu=True, num_experts=64,
                 moe_router_topk=6, moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=2816)
# attention: QKV 2 * 2048 * (3 * 2048) = 25,165,824 ; out 2 * 2048 * 2048 = 8,388,608
MOE_ATTENTION = 25_165_824 + 8_388_608  # = 33,554,432
# router: 2 * 2048 * 64 = 262,144 ; routed: 6 * 3 * 2 * 2048 * 1408 = 103,809,024 ;
# shared: 3 * 2 * 2048 * 2816 = 34,603,008
MOE_MLP = 262_144 + 103_809_024 + 34_603_008  # = 138,674,176

# DeepSeek-V2-Lite attention (MLA): h=2048, 16 heads, kv_lora_rank 512, qk_head_dim 128,
# qk_pos_emb_head_dim 64, v_head_dim 128, no query LoRA.
MLA_LAYER = dict(hidden_size=2048, num_layers=1, num_attention_heads=16, ffn_hidden_size=10944, swiglu=True,
                 multi_latent_attention=True, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                 v_head_dim=128)
# Q:       2 * 2048 * 16 * (128 + 64)     = 12,582,912
# KV down: 2 * 2048 * (512 + 64)          =  2,359,296
# KV up:   2 * 512 * 16 * (128 + 128)     =  4,194,304
# out:     2 * 16 * 128 * 2048            =  8,388,608
MLA_ATTENTION = 12_582_912 + 2_359_296 + 4_194_304 + 8_388_608  # = 27,525,120
DENSE_10944 = 3 * 2 * 2048 * 10944  # = 134,479,872: a dense SwiGLU MLP of 10944 at h=2048


def test_one_llama3_8b_layer_at_4096_tokens():
    model = CostModel(**LLAMA3_8B_LAYER)
    assert model.linear_flops_per_token == 436_207_616 == LLAMA3_8B_LINEAR
    # core attention per (query, key) pair: QK^T 2*32*128 + AV 2*32*128 = 16,384, halved (causal) = 8,192
    assert model.quadratic_flops_per_token_pair == 8_192
    assert model.attention_flops(4096) == 4096 * 4096 * 8_192 == 137_438_953_472
    # training = 3 * (4096 * 436,207,616 + 137,438,953,472) = 3 * 1,924,145,348,608
    assert model(4096) == 5_772_436_045_824
    assert CostModel(**{**LLAMA3_8B_LAYER, "causal": False}).attention_flops(4096) == 2 * 137_438_953_472


def test_logits_are_counted_once_not_per_layer():
    model = CostModel(**{**LLAMA3_8B_LAYER, "num_layers": 2, "vocab_size": 128256})
    # 2 layers * 436,207,616 + logits 2 * 4096 * 128256 = 872,415,232 + 1,050,673,152
    assert model.linear_flops_per_token == 1_923_088_384
    assert model.quadratic_flops_per_token_pair == 2 * 8_192


def test_classic_gpt_layer_and_the_library_default():
    model = CostModel(hidden_size=4096, num_layers=1, num_attention_heads=32)  # GPT-3 6.7B layer
    # QKV 2 * 4096 * 12288 = 100,663,296 ; out 33,554,432 ; MLP 2 * 2 * 4096 * 16384 = 268,435,456
    assert model.linear_flops_per_token == 402_653_184
    assert model.quadratic_flops_per_token_pair == 4 * 4096 / 2
    # the default: linear / pair = 402,653,184 / 8,192 = 49,152 = S0
    assert DEFAULT_ATTENTION_LENGTH == 49_152
    assert DEFAULT_COST_MODEL(4096) == pytest.approx(4096 + 4096 * 4096 / 49_152)  # 4437.33
    assert DEFAULT_COST_MODEL(49_152) == 2 * 49_152
    for length in (1, 1000, 4096, 65_536):
        assert DEFAULT_COST_MODEL(length) * 3 * 402_653_184 == pytest.approx(model(length))


def test_kv_channels_wider_than_hidden_over_heads():
    # Gemma-7B-like: h=3072, 16 heads of 256 (16 * 256 = 4096 != 3072), MHA, gated MLP of 24576
    model = CostModel(hidden_size=3072, num_layers=1, num_attention_heads=16, kv_channels=256,
                      ffn_hidden_size=24576, swiglu=True)
    # QKV 2 * 3072 * (3 * 4096) = 75,497,472 ; out 2 * 4096 * 3072 = 25,165,824 ;
    # MLP 3 * 2 * 3072 * 24576 = 452,984,832
    assert model.linear_flops_per_token == 75_497_472 + 25_165_824 + 452_984_832
    assert model.quadratic_flops_per_token_pair == 4 * 4096 / 2


def test_one_moe_layer_with_shared_experts():
    model = CostModel(**MOE_LAYER)
    assert model.linear_flops_per_token == MOE_ATTENTION + MOE_MLP == 172_228_608
    assert model.quadratic_flops_per_token_pair == 4 * 16 * 128 / 2  # 4,096
    assert model(1000) == 3 * (1000 * 172_228_608 + 1000**2 * 4_096)
    # without the shared expert: 34,603,008 less; plain MLP experts: routed and shared * 2/3
    unshared = CostModel(**{**MOE_LAYER, "moe_shared_expert_intermediate_size": None})
    assert unshared.linear_flops_per_token == 172_228_608 - 34_603_008
    plain = CostModel(**{**MOE_LAYER, "swiglu": False})
    assert plain.linear_flops_per_token == MOE_ATTENTION + 262_144 + 69_206_016 + 23_068_672


def test_moe_layer_freq_picks_the_moe_layers_as_megatron_does():
    shape = {**MOE_LAYER, "num_layers": 4, "ffn_hidden_size": 10944}
    every_other = CostModel(**shape, moe_layer_freq=2)  # layers 0 and 2 are MoE
    assert every_other.moe_layers == (True, False, True, False)
    assert every_other.linear_flops_per_token == 4 * MOE_ATTENTION + 2 * MOE_MLP + 2 * DENSE_10944
    first_dense = CostModel(**{**shape, "moe_layer_freq": [0, 1, 1, 1]})  # DeepSeek: first layer dense
    assert first_dense.moe_layer_freq == (0, 1, 1, 1)
    assert first_dense.linear_flops_per_token == 4 * 33_554_432 + 3 * 138_674_176 + 134_479_872  # 684,720,128
    assert first_dense.mlp_flops_per_token(0) == DENSE_10944
    assert first_dense.layer_flops_per_token(1) == MOE_ATTENTION + MOE_MLP


def test_one_mla_layer_of_deepseek_v2_lite():
    model = CostModel(**MLA_LAYER)
    assert model.attention_flops_per_token == MLA_ATTENTION == 27_525_120
    assert model.linear_flops_per_token == 27_525_120 + DENSE_10944
    # core per pair: QK^T 2 * 16 * (128 + 64) = 6,144 + AV 2 * 16 * 128 = 4,096, halved: 5,120
    assert model.quadratic_flops_per_token_pair == 5_120
    assert model.attention_flops(2048) == 2048 * 2048 * 5_120
    # with a query LoRA of rank 1536: Q = 2 * 2048 * 1536 + 2 * 1536 * 16 * 192 = 6,291,456 + 9,437,184
    lora = CostModel(**{**MLA_LAYER, "q_lora_rank": 1536})
    assert lora.attention_flops_per_token == 27_525_120 - 12_582_912 + 15_728_640


def megatron_args(**overrides: object) -> argparse.Namespace:
    """What Megatron's parse_args + validate_args leave for a Llama-3-8B (names and defaults as in
    megatron-core 0.19.2's megatron/training/arguments.py; kv_channels and ffn_hidden_size resolved)."""
    values = dict(
        hidden_size=4096, num_layers=32, num_attention_heads=32, group_query_attention=True, num_query_groups=8,
        kv_channels=128, ffn_hidden_size=14336, swiglu=True, padded_vocab_size=128256, vocab_size=None,
        untie_embeddings_and_output_weights=True, num_experts=None, moe_router_topk=2, moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None, moe_layer_freq=1, multi_latent_attention=False,
        q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
    )
    return argparse.Namespace(**{**values, **overrides})


def test_from_megatron_args_honours_swiglu_and_gqa():
    logits = 2 * 4096 * 128256
    model = CostModel.from_megatron_args(megatron_args())
    assert model.linear_flops_per_token == 32 * LLAMA3_8B_LINEAR + logits
    assert CostModel.from_megatron_args(megatron_args(untie_embeddings_and_output_weights=False)) == model
    plain = CostModel.from_megatron_args(megatron_args(swiglu=False))  # MLP 2 * 2 * 4096 * 14336 = 234,881,024
    assert plain.linear_flops_per_token == 32 * (LLAMA3_8B_LINEAR - 352_321_536 + 234_881_024) + logits
    # without --group-query-attention, --num-query-groups is ignored: K,V 2 * 4096 * 8192 = 67,108,864
    mha = CostModel.from_megatron_args(megatron_args(group_query_attention=False))
    assert mha.linear_flops_per_token == 32 * (LLAMA3_8B_LINEAR - 16_777_216 + 67_108_864) + logits
    no_padded = CostModel.from_megatron_args(megatron_args(padded_vocab_size=None, vocab_size=1000))
    assert no_padded.vocab_size == 1000
    wide = CostModel.from_megatron_args(megatron_args(kv_channels=256))  # 32 heads of 256, 8 groups
    assert wide.linear_flops_per_token == 32 * (2 * 4096 * (8192 + 4096) + 2 * 8192 * 4096 + 352_321_536) + logits


def test_from_megatron_args_honours_moe_and_mla_flags():
    moe_args = megatron_args(hidden_size=2048, num_layers=4, num_attention_heads=16, group_query_attention=False,
                             kv_channels=128, ffn_hidden_size=10944, padded_vocab_size=0, num_experts=64,
                             moe_router_topk=6, moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=2816,
                             moe_layer_freq=[0, 1, 1, 1])
    moe = CostModel.from_megatron_args(moe_args)
    assert moe.linear_flops_per_token == 4 * MOE_ATTENTION + 3 * MOE_MLP + DENSE_10944
    assert CostModel.from_megatron_args(megatron_args(num_experts=0)) == CostModel.from_megatron_args(megatron_args())
    mla_args = megatron_args(hidden_size=2048, num_layers=1, num_attention_heads=16, group_query_attention=False,
                             kv_channels=128, ffn_hidden_size=10944, padded_vocab_size=0,
                             multi_latent_attention=True, kv_lora_rank=512)
    mla = CostModel.from_megatron_args(mla_args)
    assert mla.linear_flops_per_token == MLA_ATTENTION + DENSE_10944
    assert mla.quadratic_flops_per_token_pair == 5_120


def test_step_time_model_takes_the_linear_and_quadratic_terms():
    for shape in (LLAMA3_8B_LAYER, MOE_LAYER, MLA_LAYER):
        cost = CostModel(**shape)
        model = StepTimeModel.from_cost_model(cost, flops_per_second=1e12)
        assert model.seconds_per_token == cost.linear_flops_per_token / 1e12
        assert model.seconds_per_token_pair == cost.quadratic_flops_per_token_pair / 1e12
        assert model.forward_time([1000]) == pytest.approx(cost(1000) / 3 / 1e12)


@pytest.mark.parametrize(("override", "match"), [
    ({"num_experts": 8}, "moe_router_topk is required with num_experts"),
    ({"num_experts": 8, "moe_router_topk": 9}, "moe_router_topk=9 must be at most num_experts=8"),
    ({"num_experts": 8, "moe_router_topk": 0}, "moe_router_topk must be an integer >= 1"),
    ({"moe_ffn_hidden_size": 64}, "moe_ffn_hidden_size needs num_experts"),
    ({"moe_router_topk": 2}, "moe_router_topk needs num_experts"),
    ({"num_experts": 8, "moe_router_topk": 2, "moe_layer_freq": 0}, "moe_layer_freq must be an integer >= 1"),
    ({"num_experts": 8, "moe_router_topk": 2, "moe_layer_freq": [1, 0, 1]}, "moe_layer_freq must list one 0 or 1"),
    ({"num_experts": 8, "moe_router_topk": 2, "moe_layer_freq": [1, 2]}, "moe_layer_freq must list one 0 or 1"),
    ({"moe_layer_freq": "1"}, "moe_layer_freq must be an integer"),
    ({"kv_channels": 0}, "kv_channels must be an integer >= 1"),
    ({"q_lora_rank": 16}, "q_lora_rank needs multi_latent_attention=True"),
    ({"multi_latent_attention": True, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
     "kv_lora_rank is required with multi_latent_attention"),
    ({"multi_latent_attention": "yes"}, "multi_latent_attention must be True or False"),
    ({"multi_latent_attention": True, "kv_lora_rank": 8, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4,
      "v_head_dim": 8, "num_query_groups": 2}, "num_query_groups does not apply to multi_latent_attention"),
])
def test_bad_moe_and_mla_fields(override, match):
    with pytest.raises(ValueError, match=match):
        CostModel(**{"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, **override})


@pytest.mark.parametrize("value", [0.5, -1.0, float("nan"), float("inf"), "49152", True])
def test_bad_generic_attention_length(value):
    with pytest.raises(ValueError, match="attention_length"):
        GenericCostModel(attention_length=value)


def plan(lengths, **kwargs):
    schedule = build_dp_schedule(lengths, **kwargs)
    assert_invariants(schedule, lengths)
    return schedule


def rank_loads(schedule, cost):
    return sorted(sum(cost(schedule.lengths[i]) for i in part) for part in schedule.partitions)


def test_static_batching_assigns_samples_to_ranks_by_cost():
    # dp=2, micro_batch_size=2, 8 samples: one micro-batch count of 2, four samples per rank.
    lengths = [6, 6, 6, 2, 10, 6, 6, 2]
    square = lambda n: float(n * n)  # noqa: E731   costs 36 36 36 4 100 36 36 4: 288, 144 per rank
    schedule = plan(lengths, dp_size=2, global_batch_size=8, micro_batch_size=2, cost_model=square)
    # the only split into 4 + 4 at 144 each: {10, 6, 2, 2} = 100 + 36 + 4 + 4 and {6, 6, 6, 6} = 4 * 36
    assert sorted(sorted(lengths[i] for i in part) for part in schedule.partitions) == [[2, 2, 6, 10], [6, 6, 6, 6]]
    assert rank_loads(schedule, square) == [144.0, 144.0]  # imbalance 1.0
    # cost-blind assignments are off by 22-44%: contiguous halves {6, 6, 6, 2} | {10, 6, 6, 2} give
    # 112 | 176 (176 / 144 = 1.22); every other sample {6, 6, 10, 6} | {6, 2, 6, 2} gives 208 | 80 (1.44);
    # by tokens (22 a rank cannot be reached with 4 samples) the planner takes {10, 6, 6, 2} = 176 (1.22)
    tokens = plan(lengths, dp_size=2, global_batch_size=8, micro_batch_size=2, balance="tokens")
    assert rank_loads(tokens, square) == [112.0, 176.0]


def test_the_default_cost_is_quadratic_aware():
    # the lengths above times 16384: cost(s) = s + s^2 / 49152 with k = 16384
    # 2k = 32768 -> 32768 + 21845.33 = 54613.33 ; 6k = 98304 -> 98304 + 196608 = 294912 ;
    # 10k = 163840 -> 163840 + 546133.33 = 709973.33 ; total 2,293,760, mean 1,146,880 per rank
    k = 16384
    lengths = [6 * k, 6 * k, 6 * k, 2 * k, 10 * k, 6 * k, 6 * k, 2 * k]
    schedule = plan(lengths, dp_size=2, global_batch_size=8, micro_batch_size=2)
    assert schedule.costs[3] == pytest.approx(32768 + 32768**2 / 49152)
    assert schedule.costs[4] == pytest.approx(163840 + 163840**2 / 49152)
    # {10k, 6k, 2k, 2k} = 709973.33 + 294912 + 2 * 54613.33 = 1,114,112 ; {6k x 4} = 1,179,648 (1.0286)
    assert rank_loads(schedule, DEFAULT_COST_MODEL) == pytest.approx([1_114_112, 1_179_648])
    # token counts would take {10k, 6k, 6k, 2k} = 1,354,410.67 against a mean of 1,146,880 (1.18)
    tokens = plan(lengths, dp_size=2, global_batch_size=8, micro_batch_size=2, balance="tokens")
    assert rank_loads(tokens, DEFAULT_COST_MODEL) == pytest.approx([939_349.33, 1_354_410.67])
    assert tokens.costs == tuple(float(n) for n in lengths)
