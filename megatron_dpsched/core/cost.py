"""Per-sample compute estimates used to balance data-parallel ranks.

Balancing by tokens treats a 4k-token sample like four 1k-token samples, but
attention makes the long one dearer. :class:`CostModel` estimates the training
FLOPs (forward + backward) of one packed sequence of ``s`` tokens in a GPT-style
decoder::

    per layer, per token:  2*h*(h + 2*h_kv)  (QKV)  + 2*h*h (proj) + 2*h*f*k (MLP, k=3 for SwiGLU else 2)
    per layer, per sample: 4*h*s^2 * c       (QK^T and AV; c = 1/2 when causal)
    per token:             2*h*V             (output logits)
    total = 3 * (forward)                    (backward ~ 2x forward)

Samples are packed as separate sequences (THD with ``cu_seqlens``), so the
quadratic term is per sample and a micro-batch costs the sum of its samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from megatron_dpsched.core.validation import require_bool, require_costs, require_int

MAX_DIMENSION = 2**31 - 1
"""Upper bound on a model dimension (a guard on absurd sizes)."""

CostFunction = Callable[[int], float]
"""Any callable mapping a sample's token count to a positive cost."""


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Linear-plus-quadratic FLOPs estimate of training one sample of a GPT model."""

    hidden_size: int
    """Model width ``h`` (Megatron ``--hidden-size``)."""
    num_layers: int
    """Transformer layers (``--num-layers``)."""
    num_attention_heads: int
    """Attention heads (``--num-attention-heads``)."""
    num_query_groups: int | None = None
    """Key/value heads for GQA (``--num-query-groups``); ``None`` means multi-head attention."""
    ffn_hidden_size: int | None = None
    """MLP width (``--ffn-hidden-size``); ``None`` means ``4 * hidden_size``."""
    vocab_size: int = 0
    """Vocabulary size for the logits layer; 0 leaves it out."""
    swiglu: bool = False
    """Gated MLP (three weight matrices instead of two)."""
    causal: bool = True
    """Causal attention computes half of the score matrix."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_attention_heads"):
            require_int(name, getattr(self, name), maximum=MAX_DIMENSION)
        for name in ("num_query_groups", "ffn_hidden_size"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name), maximum=MAX_DIMENSION)
        require_int("vocab_size", self.vocab_size, minimum=0, maximum=MAX_DIMENSION)
        groups = self.num_query_groups
        if groups is not None and self.num_attention_heads % groups:
            raise ValueError(f"num_query_groups={groups} must divide num_attention_heads={self.num_attention_heads}")
        require_bool("swiglu", self.swiglu)
        require_bool("causal", self.causal)

    @property
    def linear_flops_per_token(self) -> float:
        """Forward FLOPs per token that do not depend on the sequence length."""
        h = self.hidden_size
        groups = self.num_query_groups or self.num_attention_heads
        kv = h * groups / self.num_attention_heads
        ffn = self.ffn_hidden_size or 4 * h
        per_layer = 2 * h * (h + 2 * kv) + 2 * h * h + 2 * h * ffn * (3 if self.swiglu else 2)
        return self.num_layers * per_layer + 2 * h * self.vocab_size

    @property
    def quadratic_flops_per_token_pair(self) -> float:
        """Forward FLOPs per (query, key) pair: multiply by ``s**2``."""
        return self.num_layers * 4 * self.hidden_size * (0.5 if self.causal else 1.0)

    def __call__(self, length: int) -> float:
        """Training FLOPs (forward + backward) for one sample of ``length`` tokens."""
        s = float(length)
        return 3.0 * (s * self.linear_flops_per_token + s * s * self.quadratic_flops_per_token_pair)

    @classmethod
    def from_megatron_args(cls, args: Any) -> CostModel:
        """Build from a Megatron ``args`` namespace (read by attribute, no Megatron import)."""
        return cls(
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_attention_heads=args.num_attention_heads,
            num_query_groups=getattr(args, "num_query_groups", None)
            if getattr(args, "group_query_attention", False)
            else None,
            ffn_hidden_size=getattr(args, "ffn_hidden_size", None),
            vocab_size=getattr(args, "padded_vocab_size", None) or 0,
            swiglu=bool(getattr(args, "swiglu", False)),
        )


def require_cost_model(cost_model: object) -> None:
    """``None`` or a callable length -> cost, else ``ValueError``."""
    if cost_model is not None and not callable(cost_model):
        raise ValueError(
            f"cost_model must be a CostModel or a callable length -> cost, got {type(cost_model).__name__}"
        )


def sample_costs(
    lengths: Sequence[int], cost_model: CostFunction | None
) -> tuple[float, ...]:
    """Cost of every sample: its token count when ``cost_model`` is ``None``."""
    if cost_model is None:
        return tuple(float(length) for length in lengths)
    require_cost_model(cost_model)
    cache: dict[int, float] = {}
    costs = []
    for length in lengths:
        cost = cache.get(length)
        if cost is None:
            cost = cache[length] = cost_model(length)
        costs.append(cost)
    return require_costs(costs, len(lengths))
