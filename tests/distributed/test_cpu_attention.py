"""The test-only packed attention against Megatron's own ``DotProductAttention``, one process.

``PackedCoreAttention`` on a ``thd`` pack must give, for every packed sequence, what
Megatron's ``DotProductAttention`` gives on that sequence alone (causal mask type, no mask
tensor), outputs and gradients; and on a ``bshd`` batch what ``DotProductAttention`` gives
on the batch. Context parallelism is checked in the multi-process scenarios.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

HEADS, GROUPS, HEAD_DIM = 4, 2, 8


@pytest.fixture(scope="module")
def megatron_world():
    """A one-rank gloo group with Megatron's model-parallel state, torn down afterwards."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from megatron_dpsched.testing import cpu_shim

    init = os.path.join(tempfile.mkdtemp(), "init")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    cpu_shim.install()
    with cpu_shim.pretend_one_device():
        parallel_state.initialize_model_parallel()
    cpu_shim.reset_rng_tracker(1234)
    yield
    parallel_state.destroy_model_parallel()
    cpu_shim.uninstall()
    dist.destroy_process_group()


def _config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                             num_query_groups=GROUPS, attention_dropout=0.0, hidden_dropout=0.0,
                             masked_softmax_fusion=False, use_cpu_initialization=True)


def _modules():
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_dpsched.testing.cpu_attention import PackedCoreAttention

    config = _config()
    kwargs = dict(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return PackedCoreAttention(**kwargs), DotProductAttention(**kwargs)


def _qkv(tokens: int, rows: int | None, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (tokens,) if rows is None else (tokens, rows)
    return [torch.randn(*shape, heads, HEAD_DIM, generator=gen, requires_grad=True)
            for heads in (HEADS, GROUPS, GROUPS)]


def test_packed_sequences_attend_as_megatron_does_each_alone(megatron_world) -> None:
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_dpsched.megatron.collate import packed_seq_params

    packed, reference = _modules()
    lengths, padded = [5, 6, 3], [6, 8, 4]
    q, k, v = _qkv(sum(padded), None, seed=0)
    out = packed(q, k, v, None, packed_seq_params=packed_seq_params(lengths, padded))
    assert out.shape == (sum(padded), HEADS * HEAD_DIM)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    start = 0
    for size in padded:
        piece = slice(start, start + size)
        qi, ki, vi = (t.detach()[piece].unsqueeze(1).requires_grad_() for t in (q, k, v))
        expected = reference(qi, ki, vi, None, attn_mask_type=AttnMaskType.causal)
        torch.testing.assert_close(out[piece], expected[:, 0], rtol=1e-5, atol=1e-6)
        (expected[:, 0] * weights[piece]).sum().backward()
        for mine, theirs in ((q, qi), (k, ki), (v, vi)):
            torch.testing.assert_close(mine.grad[piece], theirs.grad[:, 0], rtol=1e-5, atol=1e-6)
        start += size


def test_padded_rows_attend_as_megatron_does(megatron_world) -> None:
    from megatron.core.transformer.enums import AttnMaskType

    packed, reference = _modules()
    q, k, v = _qkv(7, 3, seed=2)
    expected = reference(q, k, v, None, attn_mask_type=AttnMaskType.causal)
    torch.testing.assert_close(packed(q, k, v, None), expected, rtol=1e-5, atol=1e-6)


def test_context_parallel_positions_are_megatrons_load_balanced_chunks() -> None:
    from megatron_dpsched.megatron.collate import context_parallel_positions

    assert context_parallel_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert context_parallel_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    held = sorted(torch.cat([context_parallel_positions(12, 3, r) for r in range(3)]).tolist())
    assert held == list(range(12))
    with pytest.raises(ValueError, match="multiple of 4"):
        context_parallel_positions(6, 2, 0)
