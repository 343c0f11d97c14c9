"""Per-sample compute estimates used to balance data-parallel ranks.

Balancing by tokens treats a 4k-token sample like four 1k-token samples, but
attention makes the long one dearer. :class:`CostModel` estimates the training
FLOPs (forward + backward) of one packed sequence of ``s`` tokens in a GPT-style
decoder (a multiply-add counts as 2 FLOPs)::

    training(s) = 3 * forward(s)                         (backward ~ 2x forward)
    forward(s)  = s * linear + s^2 * pair
    linear      = sum over layers l of (attention + mlp(l))  +  2*h*V   (output logits, once)
    pair        = c * L * core                           (c = 1/2 when causal, else 1)

    attention, standard (d = kv_channels, default h/n; g = n without GQA):
        2*h*(n*d + 2*g*d)  (Q, K, V projections)  +  2*n*d*h  (output projection)
        core = 4*n*d                                     (QK^T and AV)
    attention, MLA (r_q = q_lora_rank, r_kv = kv_lora_rank, d_q = qk_head_dim,
                    d_r = qk_pos_emb_head_dim, d_v = v_head_dim):
        Q:  2*h*n*(d_q + d_r); with r_q:  2*h*r_q + 2*r_q*n*(d_q + d_r)
        KV: 2*h*(r_kv + d_r)  +  2*r_kv*n*(d_q + d_v)    (down, then up projection)
        output projection: 2*n*d_v*h
        core = 2*n*(d_q + d_r) + 2*n*d_v                 (QK^T and AV)
    mlp(l), dense layer:  2*h*f*k                        (k = 3 with SwiGLU, else 2)
    mlp(l), MoE layer:    2*h*E  (router)  +  2*h*k*(topk*f_e + f_s)   (routed experts, shared expert)

with ``h`` the hidden size, ``L`` layers, ``n`` attention heads, ``g`` query
groups, ``f`` the dense MLP width (default ``4*h``), ``V`` the vocabulary,
``E`` routed experts of width ``f_e`` (default ``f``) of which each token
visits ``topk``, and ``f_s`` the shared experts' total width (0 without).
Layer ``l`` (from 0) is an MoE layer, as in Megatron, when ``num_experts`` is
set and ``moe_layer_freq`` is an int ``N`` with ``l % N == 0``, or a list whose
entry ``l`` is 1. Norms, activations, softmax, embedding lookups, MoE token
dispatch and multi-token-prediction layers are left out; an untied output
layer costs the same FLOPs as a tied one.

Samples are packed as separate sequences (THD with ``cu_seqlens``), so the
quadratic term is per sample and a micro-batch costs the sum of its samples.

Without a cost model the planner balances :data:`DEFAULT_COST_MODEL`, a
:class:`GenericCostModel`: ``s + s^2 / 49152``, proportional to :class:`CostModel`
of a dense GPT layer of width 4096 without logits (see :data:`DEFAULT_ATTENTION_LENGTH`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from megatron_dpsched.core.padding import ArrayTuple
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import (
    all_ints,
    is_int,
    is_real,
    require_bool,
    require_costs,
    require_int,
    valid_cost,
)

MAX_DIMENSION = 2**31 - 1
"""Upper bound on a model dimension (a guard on absurd sizes)."""

CostFunction = Callable[[int], float]
"""Any callable mapping a sample's token count to a positive cost."""

_MOE_FIELDS = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
_MLA_REQUIRED = _MLA_FIELDS[1:]


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Linear-plus-quadratic FLOPs estimate of training one sample of a GPT model (module docstring)."""

    hidden_size: int
    """Model width ``h`` (Megatron ``--hidden-size``)."""
    num_layers: int
    """Transformer layers ``L`` (``--num-layers``)."""
    num_attention_heads: int
    """Attention heads ``n`` (``--num-attention-heads``)."""
    num_query_groups: int | None = None
    """Key/value heads ``g`` for GQA (``--num-query-groups``); ``None`` means multi-head attention."""
    kv_channels: int | None = None
    """Width ``d`` of one attention head (``--kv-channels``); ``None`` means ``hidden_size / num_attention_heads``."""
    ffn_hidden_size: int | None = None
    """Dense MLP width ``f`` (``--ffn-hidden-size``); ``None`` means ``4 * hidden_size``."""
    vocab_size: int = 0
    """Vocabulary size ``V`` for the logits layer (``--padded-vocab-size``); 0 leaves it out."""
    swiglu: bool = False
    """Gated MLP, dense and expert (``--swiglu``): three weight matrices instead of two."""
    causal: bool = True
    """Causal attention computes half of the score matrix."""
    num_experts: int | None = None
    """Routed experts ``E`` of an MoE layer (``--num-experts``); ``None``: every layer is dense."""
    moe_router_topk: int | None = None
    """Experts each token is routed to (``--moe-router-topk``); required with ``num_experts``."""
    moe_ffn_hidden_size: int | None = None
    """Width ``f_e`` of one routed expert (``--moe-ffn-hidden-size``); ``None`` means ``ffn_hidden_size``."""
    moe_shared_expert_intermediate_size: int | None = None
    """Total width ``f_s`` of the shared experts (``--moe-shared-expert-intermediate-size``); ``None``: none."""
    moe_layer_freq: int | tuple[int, ...] = 1
    """Which layers are MoE (``--moe-layer-freq``): every ``N``-th layer from layer 0, or one 0/1 per layer."""
    multi_latent_attention: bool = False
    """Multi-latent attention (``--multi-latent-attention``) instead of standard attention."""
    q_lora_rank: int | None = None
    """MLA query down-projection rank ``r_q`` (``--q-lora-rank``); ``None``: queries are projected directly."""
    kv_lora_rank: int | None = None
    """MLA key/value compression rank ``r_kv`` (``--kv-lora-rank``); required with MLA."""
    qk_head_dim: int | None = None
    """MLA per-head query/key width without RoPE ``d_q`` (``--qk-head-dim``); required with MLA."""
    qk_pos_emb_head_dim: int | None = None
    """MLA per-head RoPE query/key width ``d_r`` (``--qk-pos-emb-head-dim``); required with MLA."""
    v_head_dim: int | None = None
    """MLA per-head value width ``d_v`` (``--v-head-dim``); required with MLA."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_attention_heads"):
            require_int(name, getattr(self, name), maximum=MAX_DIMENSION)
        for name in ("num_query_groups", "kv_channels", "ffn_hidden_size", "num_experts", *_MOE_FIELDS,
                     *_MLA_FIELDS):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name), maximum=MAX_DIMENSION)
        require_int("vocab_size", self.vocab_size, minimum=0, maximum=MAX_DIMENSION)
        groups = self.num_query_groups
        if groups is not None and self.num_attention_heads % groups:
            raise ValueError(f"num_query_groups={groups} must divide num_attention_heads={self.num_attention_heads}")
        for name in ("swiglu", "causal", "multi_latent_attention"):
            require_bool(name, getattr(self, name))
        self._validate_moe()
        self._validate_mla()

    def _validate_moe(self) -> None:
        if self.num_experts is None:
            given = [name for name in _MOE_FIELDS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given[0]} needs num_experts (the model has no MoE layers without it)")
        elif self.moe_router_topk is None:
            raise ValueError("moe_router_topk is required with num_experts")
        elif self.moe_router_topk > self.num_experts:
            raise ValueError(f"moe_router_topk={self.moe_router_topk} must be at most num_experts={self.num_experts}")
        object.__setattr__(self, "moe_layer_freq", _layer_freq(self.moe_layer_freq, self.num_layers))

    def _validate_mla(self) -> None:
        if not self.multi_latent_attention:
            given = [name for name in _MLA_FIELDS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given[0]} needs multi_latent_attention=True")
            return
        missing = [name for name in _MLA_REQUIRED if getattr(self, name) is None]
        if missing:
            raise ValueError(f"{missing[0]} is required with multi_latent_attention")
        for name in ("num_query_groups", "kv_channels"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} does not apply to multi_latent_attention (leave it None)")

    @cached_property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer: whether its MLP is an MoE layer."""
        freq = self.moe_layer_freq
        if self.num_experts is None:
            return (False,) * self.num_layers
        if isinstance(freq, int):
            return tuple(layer % freq == 0 for layer in range(self.num_layers))
        return tuple(bool(flag) for flag in freq)

    @property
    def attention_flops_per_token(self) -> float:
        """Forward FLOPs per token of one layer's attention projections (Q, K, V and output)."""
        h, n = self.hidden_size, self.num_attention_heads
        if self.multi_latent_attention:
            return _mla_projection_flops(self)
        d = self.kv_channels or h / n
        g = self.num_query_groups or n
        return 2 * h * (n * d + 2 * g * d) + 2 * n * d * h

    def mlp_flops_per_token(self, layer: int) -> float:
        """Forward FLOPs per token of layer ``layer``'s MLP (dense, or router plus experts)."""
        h, k = self.hidden_size, 3 if self.swiglu else 2
        ffn = self.ffn_hidden_size or 4 * h
        if not self.moe_layers[layer]:
            return 2 * h * ffn * k
        expert = self.moe_ffn_hidden_size or ffn
        shared = self.moe_shared_expert_intermediate_size or 0
        return 2 * h * self.num_experts + 2 * h * k * (self.moe_router_topk * expert + shared)

    def layer_flops_per_token(self, layer: int) -> float:
        """Forward FLOPs per token of layer ``layer`` that do not depend on the sequence length."""
        return self.attention_flops_per_token + self.mlp_flops_per_token(layer)

    @cached_property
    def linear_flops_per_token(self) -> float:
        """Forward FLOPs per token that do not depend on the sequence length (all layers and the logits)."""
        layers = sum(self.mlp_flops_per_token(layer) for layer in range(self.num_layers))
        return self.num_layers * self.attention_flops_per_token + layers + 2 * self.hidden_size * self.vocab_size

    @property
    def core_flops_per_token_pair(self) -> float:
        """Forward FLOPs of one layer's QK^T and AV per (query, key) pair, before the causal half."""
        n = self.num_attention_heads
        if self.multi_latent_attention:
            return 2 * n * (self.qk_head_dim + self.qk_pos_emb_head_dim) + 2 * n * self.v_head_dim
        return 4 * n * (self.kv_channels or self.hidden_size / n)

    @property
    def quadratic_flops_per_token_pair(self) -> float:
        """Forward FLOPs per (query, key) pair over all layers: multiply by ``s**2``."""
        return self.num_layers * self.core_flops_per_token_pair * (0.5 if self.causal else 1.0)

    def attention_flops(self, length: int) -> float:
        """Forward FLOPs of one sample's core attention (the term quadratic in its ``length``)."""
        return float(length) ** 2 * self.quadratic_flops_per_token_pair

    def __call__(self, length: int) -> float:
        """Training FLOPs (forward + backward) for one sample of ``length`` tokens."""
        return 3.0 * (float(length) * self.linear_flops_per_token + self.attention_flops(length))

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (``moe_layer_freq`` a list when it is a per-layer pattern)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(self.moe_layer_freq, tuple):
            data["moe_layer_freq"] = list(self.moe_layer_freq)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str = "cost_model") -> CostModel:
        """The model :meth:`to_dict` gave; a ``ValueError`` names ``name``'s bad or unknown field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{name} must be an object of CostModel fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{name}.{unknown[0]} is not a CostModel field (known: {', '.join(sorted(known))})")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{name}: {error}") from None

    @classmethod
    def from_megatron_args(cls, args: Any) -> CostModel:
        """Build from a Megatron ``args`` namespace (read by attribute, no Megatron import)."""
        return cls(**_dense_fields(args), **_moe_fields(args), **_mla_fields(args))


def _layer_freq(freq: object, num_layers: int) -> int | tuple[int, ...]:
    """``moe_layer_freq`` as an int >= 1 or a tuple of one 0/1 per layer."""
    if not isinstance(freq, (int, str, bytes)) and hasattr(freq, "__len__") and hasattr(freq, "__getitem__"):
        pattern = tuple(freq)
        if len(pattern) != num_layers or not all(is_int(flag) and flag in (0, 1) for flag in pattern):
            raise ValueError(f"moe_layer_freq must list one 0 or 1 per layer ({num_layers}), got {freq!r}")
        return tuple(int(flag) for flag in pattern)
    return require_int("moe_layer_freq", freq)


def _mla_projection_flops(model: CostModel) -> float:
    h, n = model.hidden_size, model.num_attention_heads
    qk, rope, v, rank = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim, model.kv_lora_rank
    if model.q_lora_rank is None:
        query = 2 * h * n * (qk + rope)
    else:
        query = 2 * h * model.q_lora_rank + 2 * model.q_lora_rank * n * (qk + rope)
    key_value = 2 * h * (rank + rope) + 2 * rank * n * (qk + v)
    return query + key_value + 2 * n * v * h


def _dense_fields(args: Any) -> dict[str, Any]:
    h, heads = args.hidden_size, args.num_attention_heads
    mla = bool(getattr(args, "multi_latent_attention", False))
    gqa = bool(getattr(args, "group_query_attention", False)) and not mla
    kv_channels = None if mla else getattr(args, "kv_channels", None)
    if kv_channels is not None and kv_channels * heads == h:
        kv_channels = None  # Megatron's default, h / heads
    return {
        "hidden_size": h,
        "num_layers": args.num_layers,
        "num_attention_heads": heads,
        "num_query_groups": getattr(args, "num_query_groups", None) if gqa else None,
        "kv_channels": kv_channels,
        "ffn_hidden_size": getattr(args, "ffn_hidden_size", None),
        "vocab_size": getattr(args, "padded_vocab_size", None) or getattr(args, "vocab_size", None) or 0,
        "swiglu": bool(getattr(args, "swiglu", False)),
    }


def _moe_fields(args: Any) -> dict[str, Any]:
    if not getattr(args, "num_experts", None):  # Megatron reads --num-experts 0 as no experts
        return {}
    return {"num_experts": args.num_experts, "moe_layer_freq": getattr(args, "moe_layer_freq", 1),
            **{name: getattr(args, name, None) for name in _MOE_FIELDS}}


def _mla_fields(args: Any) -> dict[str, Any]:
    if not getattr(args, "multi_latent_attention", False):
        return {}
    return {"multi_latent_attention": True, **{name: getattr(args, name, None) for name in _MLA_FIELDS}}


DEFAULT_ATTENTION_LENGTH = 49152
"""``S0`` of :data:`DEFAULT_COST_MODEL`: the length at which a sample's attention costs as much as the
rest of its layers, ``12 * h`` for a dense GPT layer (multi-head attention, ``4*h`` MLP without SwiGLU)
of width ``h = 4096`` (GPT-3 6.7B, Llama-2-7B's width); Llama-2-7B gives 49,408, Llama-3-8B 53,248,
Llama-3.2-1B 29,696."""


@dataclass(frozen=True, kw_only=True)
class GenericCostModel:
    """``cost(s) = s + s^2 / attention_length``: tokens plus attention, in units of one token's linear work.

    This is :class:`CostModel` of any dense GPT whose layers give ``linear / pair = attention_length``,
    scaled so that one token costs about 1 (logits left out).
    """

    attention_length: float = DEFAULT_ATTENTION_LENGTH
    """``S0``: the sample length at which the quadratic term equals the linear one."""

    def __post_init__(self) -> None:
        value = self.attention_length
        if not is_real(value) or not 1.0 <= value <= 1e12:
            raise ValueError(f"attention_length must be a number between 1 and 1e12, got {value!r}")

    def __call__(self, length: int) -> float:
        """Cost of one sample of ``length`` tokens."""
        s = float(length)
        return s + s * s / self.attention_length


DEFAULT_COST_MODEL = GenericCostModel()
"""What ``balance="cost"`` balances when no ``cost_model`` is given: ``s + s^2 / 49152``."""


def require_cost_model(cost_model: object) -> None:
    """``None`` or a callable length -> cost, else ``ValueError``."""
    if cost_model is not None and not callable(cost_model):
        raise ValueError(
            f"cost_model must be a CostModel or a callable length -> cost, got {type(cost_model).__name__}"
        )


def sample_costs(
    lengths: Sequence[int], cost_model: CostFunction | None, *, array: np.ndarray | None = None
) -> tuple[float, ...]:
    """Cost of every sample: its token count when ``cost_model`` is ``None``.

    ``cost_model`` is called once per distinct length, in order of first appearance; the costs are checked
    once per distinct length too (:func:`~megatron_dpsched.core.validation.require_costs` names the first bad
    sample), and then come as an :class:`~megatron_dpsched.core.padding.ArrayTuple` (their float64 array made
    from the distinct ones). ``array``: the lengths as int64, where the caller has them (they are then known to be
    Python ints, :func:`~megatron_dpsched.core.validation.checked_lengths`)."""
    if cost_model is None:
        return tuple(float(length) for length in lengths)
    require_cost_model(cost_model)
    if array is None:
        if not lengths or not all_ints(lengths):
            return _sample_costs_one_by_one(lengths, cost_model)
        try:
            array = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
        except OverflowError:
            return _sample_costs_one_by_one(lengths, cost_model)
    distinct, first, inverse = distinct_values(array)
    values: list[object] = [None] * len(distinct)
    for j in np.argsort(first).tolist():
        values[j] = cost_model(int(distinct[j]))
    if not all(valid_cost(value) for value in values):
        return _sample_costs_one_by_one(lengths, cost_model)  # the error names the first bad sample
    shared = np.empty(len(values), dtype=object)  # one float object per distinct length, shared by its samples
    shared[:] = [float(value) for value in values]
    costs = require_costs(shared[inverse], len(lengths), checked=True)
    return ArrayTuple(costs, shared.astype(np.float64)[inverse])


def distinct_values(array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(array, return_index=True, return_inverse=True)`` of an int64 array; without a sort when its
    values span at most ``4 * len(array) + 65536`` integers (a table of the values present)."""
    if len(array) == 0:
        return np.unique(array, return_index=True, return_inverse=True)
    low, high = int(array.min()), int(array.max())
    if high - low > 4 * len(array) + 65536:
        return np.unique(array, return_index=True, return_inverse=True)
    shifted = array - low
    present = np.zeros(high - low + 1, dtype=bool)
    present[shifted] = True
    inverse = (np.cumsum(present) - 1)[shifted]
    distinct = np.flatnonzero(present) + low
    first = np.full(len(distinct), len(array), dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(len(array), dtype=np.int64))
    return distinct, first, inverse


def _sample_costs_one_by_one(lengths: Sequence[int], cost_model: CostFunction) -> tuple[float, ...]:
    cache: dict[int, float] = {}
    costs = []
    for length in lengths:
        cost = cache.get(length)
        if cost is None:
            cost = cache[length] = cost_model(length)
        costs.append(cost)
    return require_costs(costs, len(lengths))


COST_MODEL_FILE_FORMAT = "megatron-dpsched-cost-model"
"""The ``format`` field of a cost-model file (what ``megatron-dpsched calibrate`` writes)."""
COST_MODEL_FILE_VERSION = 1
"""The ``version`` field this code writes and reads."""
STEP_TIME_FIELDS = tuple(f.name for f in fields(StepTimeModel))
"""The step-time coefficients a cost-model file holds: the fields of ``StepTimeModel``."""
REQUIRED_STEP_TIME_FIELDS = STEP_TIME_FIELDS[:3]
"""The coefficients a file must give (``backward_factor`` defaults to ``StepTimeModel``'s)."""
FILE_FIELDS = ("format", "version", "step_time_model", "cost_model", "fit")
"""The keys of a cost-model file's JSON object."""


@dataclass(frozen=True, kw_only=True)
class CostModelFile:
    """A cost-model file: a measured :class:`StepTimeModel` (rule 1 of ``core/steptime.py``), optionally the
    FLOPs model of the GPT it was measured on, and the fit that produced it.

    As JSON::

        {"format": "megatron-dpsched-cost-model", "version": 1,
         "step_time_model": {"seconds_per_token": a, "seconds_per_token_pair": b,
                             "seconds_per_microbatch": c, "backward_factor": k},
         "cost_model": {CostModel fields} or null, "fit": {...} or null}
    """

    step_time: StepTimeModel
    """The measured coefficients (the file's ``step_time_model``): seconds per token, per unit of
    ``sum(length ** 2)`` and per micro-batch of one rank's forward, and the backward factor."""
    cost_model: CostModel | None = None
    """The FLOPs model of the measured GPT, kept for reference; the planner balances :meth:`sample_cost`."""
    fit: Mapping[str, Any] | None = None
    """How the coefficients were obtained (``megatron-dpsched calibrate``'s report); not read by the planner."""

    def __post_init__(self) -> None:
        if not isinstance(self.step_time, StepTimeModel):
            raise ValueError(f"step_time must be a StepTimeModel, got {type(self.step_time).__name__}")
        if self.step_time.seconds_per_token <= 0 and self.step_time.seconds_per_token_pair <= 0:
            raise ValueError("step_time_model.seconds_per_token and seconds_per_token_pair are both 0: a sample "
                             "would cost nothing")
        if self.cost_model is not None and not isinstance(self.cost_model, CostModel):
            raise ValueError(f"cost_model must be a CostModel or None, got {type(self.cost_model).__name__}")
        if self.fit is not None and not isinstance(self.fit, Mapping):
            raise ValueError(f"fit must be an object or null, got {type(self.fit).__name__}")

    def sample_cost(self) -> GenericCostModel:
        """What the planner balances: ``a*s + b*s^2`` up to a factor, as ``s + s^2 / (a / b)`` (``a / b``
        kept within :class:`GenericCostModel`'s range 1..1e12)."""
        a, b = self.step_time.seconds_per_token, self.step_time.seconds_per_token_pair
        ratio = 1e12 if b <= 0 else min(max(a / b, 1.0), 1e12)
        return GenericCostModel(attention_length=ratio)

    def step_time_model(self) -> StepTimeModel:
        """The step-time objective's model: :attr:`step_time` (what ``--dp-schedule-cost-model`` reads)."""
        return self.step_time

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the class docstring."""
        return {"format": COST_MODEL_FILE_FORMAT, "version": COST_MODEL_FILE_VERSION,
                "step_time_model": {name: float(getattr(self.step_time, name)) for name in STEP_TIME_FIELDS},
                "cost_model": None if self.cost_model is None else self.cost_model.to_dict(),
                "fit": None if self.fit is None else dict(self.fit)}

    @classmethod
    def from_dict(cls, data: object) -> CostModelFile:
        """The file :meth:`to_dict` gave; a ``ValueError`` names the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a cost-model file is a JSON object, got {type(data).__name__}")
        if data.get("format") != COST_MODEL_FILE_FORMAT:
            raise ValueError(f"format must be {COST_MODEL_FILE_FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != COST_MODEL_FILE_VERSION:
            raise ValueError(f"version must be {COST_MODEL_FILE_VERSION}, got {data.get('version')!r}")
        unknown = sorted(set(data) - set(FILE_FIELDS))
        if unknown:
            raise ValueError(f"{unknown[0]} is not a field of a cost-model file")
        return cls(step_time=_step_time_model(data.get("step_time_model")),
                   cost_model=None if data.get("cost_model") is None else CostModel.from_dict(data["cost_model"]),
                   fit=data.get("fit"))

    def save(self, path: str | Path) -> Path:
        """Write the file as indented JSON; returns its path."""
        target = Path(path)
        target.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return target

    @classmethod
    def load(cls, path: str | Path) -> CostModelFile:
        """Read and validate a file :meth:`save` wrote; every problem is a one-line ``ValueError``."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ValueError(f"{path}: no such file") from None
        except (UnicodeDecodeError, IsADirectoryError):
            raise ValueError(f"{path} is not a text file") from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            where = f" ({error.msg} at line {error.lineno} column {error.colno})" \
                if isinstance(error, json.JSONDecodeError) else " (nested too deeply)"
            raise ValueError(f"{path} is not JSON{where}") from None
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None


def _step_time_model(data: object) -> StepTimeModel:
    """The file's ``step_time_model`` object as a :class:`StepTimeModel`; errors name ``step_time_model.X``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"step_time_model must be an object of {', '.join(STEP_TIME_FIELDS)}, "
                         f"got {type(data).__name__}")
    unknown = sorted(set(data) - set(STEP_TIME_FIELDS))
    if unknown:
        raise ValueError(f"step_time_model.{unknown[0]} is not a step-time coefficient "
                         f"(known: {', '.join(STEP_TIME_FIELDS)})")
    missing = [name for name in REQUIRED_STEP_TIME_FIELDS if name not in data]
    if missing:
        raise ValueError(f"step_time_model.{missing[0]} is missing")
    huge = [name for name, value in data.items() if is_int(value) and abs(value) > sys.float_info.max]
    if huge:  # JSON integers have no bound; as seconds they would overflow a float
        raise ValueError(f"step_time_model.{huge[0]} must be a finite number of seconds, got an integer of "
                         f"{len(str(abs(data[huge[0]])))} digits")
    try:
        return StepTimeModel(**data)
    except ValueError as error:
        raise ValueError(f"step_time_model.{error}") from None
