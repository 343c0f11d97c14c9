"""Test-only core attention that takes packed sequences and context parallelism on CPU.

**Never imported by the product path** (like :mod:`megatron_dpsched.testing.cpu_shim`). On GPUs, packed
(``thd``) micro-batches and context parallelism run on Transformer Engine's
attention; Megatron's own ``DotProductAttention`` refuses both. So that the
tests (and the CPU demo) can run the real ``GPTModel`` (RoPE included) on
packed micro-batches and under context parallelism, this module attends the
way those kernels do, in plain torch:

1. Every query attends causally within its own sequence only: a row of a
   ``bshd`` batch, or one ``cu_seqlens_padded`` segment of a ``thd`` pack
   (padding after a sequence's real tokens is never seen by them: causality).
2. Under context parallelism each rank holds, of every sequence, the two chunks
   Megatron's load balancing gives it (chunk ``r`` and ``2 * CP - 1 - r`` of
   ``2 * CP``); keys and values are all-gathered over the CP group
   (differentiably) and reassembled, and the causal mask compares global
   positions.
3. Scaling, GQA, softmax precision and dropout follow ``DotProductAttention``.

Select it with Megatron's ``--spec megatron_dpsched.testing.cpu_attention gpt_layer_spec``
(the local layer spec with this core attention).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

from megatron_dpsched.megatron.collate import context_parallel_positions


class PackedCoreAttention(MegatronModule):
    """Causal core attention per sequence (``bshd`` rows or ``thd`` segments), with CP; see the module docstring."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        tp = parallel_state.get_tensor_model_parallel_world_size() if pg_collection is None else pg_collection.tp.size()
        self.cp_group = parallel_state.get_context_parallel_group() if pg_collection is None else pg_collection.cp
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        head_size = divide(config.kv_channels * config.num_attention_heads, config.num_attention_heads)
        self.softmax_scale = 1.0 / math.sqrt(head_size) if softmax_scale is None else softmax_scale
        if config.apply_query_key_layer_scaling:
            self.softmax_scale /= max(1, layer_number)
        self.dropout = torch.nn.Dropout(config.attention_dropout if attention_dropout is None else attention_dropout)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        """``bshd``: ``[s, b, heads, d]`` -> ``[s, b, heads * d]``; ``thd``: ``[t, heads, d]`` -> ``[t, heads * d]``."""
        assert attention_mask is None, "causal attention per sequence needs no mask"
        assert attention_bias is None, "attention bias is not supported"
        cp_size, cp_rank = self.cp_group.size(), self.cp_group.rank()
        keys, values = self._gather(key, cp_size), self._gather(value, cp_size)
        if packed_seq_params is None:
            return torch.stack([self._rows(query[:, b], [k[:, b] for k in keys], [v[:, b] for v in values],
                                           cp_size=cp_size, cp_rank=cp_rank) for b in range(query.size(1))], dim=1)
        bounds = packed_seq_params.cu_seqlens_q_padded
        if bounds is None:
            bounds = packed_seq_params.cu_seqlens_q
        outputs, start = [], 0
        for full in (bounds[1:] - bounds[:-1]).tolist():
            local = full // cp_size
            piece = slice(start, start + local)
            outputs.append(self._rows(query[piece], [k[piece] for k in keys], [v[piece] for v in values],
                                      cp_size=cp_size, cp_rank=cp_rank))
            start += local
        return torch.cat(outputs, dim=0)

    def _gather(self, tensor: torch.Tensor, cp_size: int) -> list[torch.Tensor]:
        """Every CP rank's part of ``tensor`` (gradients flow back to their owners)."""
        if cp_size == 1:
            return [tensor]
        return list(_AllGather.apply(tensor.contiguous(), self.cp_group))

    def _rows(self, query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], *, cp_size: int,
              cp_rank: int) -> torch.Tensor:
        """One sequence: local queries ``[n, heads, d]``, every CP rank's keys/values; ``[n, heads * d]`` out."""
        length = query.size(0) * cp_size
        q_pos = context_parallel_positions(length, cp_size, cp_rank) if cp_size > 1 else torch.arange(length)
        k_pos = torch.cat([context_parallel_positions(length, cp_size, r) for r in range(cp_size)]) \
            if cp_size > 1 else q_pos
        key, value = torch.cat(keys, dim=0), torch.cat(values, dim=0)
        repeat = self.heads // self.groups
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query, key) * self.softmax_scale
        if self.config.attention_softmax_in_fp32:
            scores = scores.float()
        hidden = (k_pos[None, :] > q_pos[:, None]).to(scores.device)
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).to(query.dtype)
        if self.config.sequence_parallel:
            probs = self.dropout(probs)
        else:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.dropout(probs)
        context = torch.einsum("hqk,khd->qhd", probs, value)
        return context.reshape(context.size(0), -1)


class _AllGather(torch.autograd.Function):
    """Differentiable all-gather over a sub-group (each rank's gradient is the sum over the group's ranks)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        parts = [torch.empty_like(tensor) for _ in range(group.size())]
        torch.distributed.all_gather(parts, tensor, group=group)
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        like = next(g for g in grads if g is not None)
        stacked = torch.stack([torch.zeros_like(like) if g is None else g for g in grads])
        torch.distributed.all_reduce(stacked, group=ctx.group)
        return stacked[ctx.group.rank()], None


class SequenceParallelNorm:
    """Torch ``LayerNorm`` / ``RMSNorm`` that works under sequence parallelism (test-only stand-in).

    Megatron's torch norm refuses ``--sequence-parallel`` (Transformer Engine's and Apex's norms
    take it); this one marks its parameters ``sequence_parallel`` so that Megatron all-reduces their
    gradients over the tensor-parallel group, as it does for those norms.
    """

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
        if config.normalization not in norms:
            raise ValueError(f"--normalization {config.normalization}: the CPU stand-in has {sorted(norms)}")
        norm = norms[config.normalization](normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def _replace_norms(submodules: Any, norm: type, names: tuple[str, ...]) -> Any:
    """``submodules`` with Megatron's torch norm replaced by ``norm`` in the fields ``names``."""
    import dataclasses

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return dataclasses.replace(submodules, **{name: norm for name in names
                                               if getattr(submodules, name) is WrappedTorchNorm})


def gpt_layer_spec(config: Any = None, vp_stage: int | None = None) -> Any:
    """Megatron's local GPT layer spec (``--num-experts``, ``--qk-layernorm`` ... from the args) with
    :class:`PackedCoreAttention` as core attention and :class:`SequenceParallelNorm` norms; for ``--spec``.

    Given the model's ``config`` (and ``vp_stage``), the spec of this stage's whole block, so that the
    final norm is the stand-in norm too (needed with ``--sequence-parallel``).
    """
    import dataclasses

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.training.global_vars import get_args

    args = get_args()
    spec = get_gpt_layer_local_spec(num_experts=args.num_experts, moe_grouped_gemm=args.moe_grouped_gemm,
                                    qk_layernorm=args.qk_layernorm, normalization=args.normalization)
    attention = spec.submodules.self_attention
    inner = _replace_norms(attention.submodules, SequenceParallelNorm, ("q_layernorm", "k_layernorm"))
    inner = dataclasses.replace(inner, core_attention=PackedCoreAttention)
    attention = dataclasses.replace(attention, submodules=inner)
    layer = _replace_norms(spec.submodules, SequenceParallelNorm, ("input_layernorm", "pre_mlp_layernorm"))
    spec = dataclasses.replace(spec, submodules=dataclasses.replace(layer, self_attention=attention))
    if config is None:
        return spec
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=SequenceParallelNorm)
