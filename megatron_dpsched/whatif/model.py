"""The model whose FLOPs the what-if tool balances and times: Megatron's shape flags or a JSON file."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from megatron_dpsched.core.cost import CostModel

DEFAULT_MODEL = CostModel(
    hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
    ffn_hidden_size=14336, vocab_size=128256, swiglu=True,
)
"""Used when no shape is given: the shape of Llama-3-8B."""

SHAPE_FLAGS = ("hidden_size", "num_layers", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
               "vocab_size", "swiglu")
"""``CostModel`` fields that have a Megatron flag of the same name (``--hidden-size``, ...)."""


def read_cost_model(path: str) -> CostModel:
    """A JSON object of :class:`CostModel` fields, e.g. ``{"hidden_size": 4096, "num_layers": 32, ...}``."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"--cost-model {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"--cost-model {path} is not JSON ({error})") from None
    names = {field.name for field in fields(CostModel)}
    if not isinstance(data, dict) or not set(data) <= names:
        unknown = sorted(set(data) - names) if isinstance(data, dict) else "not an object"
        raise ValueError(f"--cost-model {path}: expected a JSON object of {', '.join(sorted(names))}; "
                         f"got {unknown}")
    try:
        return CostModel(**data)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--cost-model {path}: {error}") from None


def model_from_flags(args: Any) -> tuple[CostModel, str]:
    """The cost model the options name and where it came from (``flags``, the file, or ``default``)."""
    given = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) not in (None, False)}
    if args.cost_model and given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"give --cost-model or the model-shape flags, not both (got --cost-model and {flags})")
    if args.cost_model:
        return read_cost_model(args.cost_model), args.cost_model
    if not given:
        return DEFAULT_MODEL, "default: Llama-3-8B shape"
    missing = [name for name in ("hidden_size", "num_layers", "num_attention_heads") if name not in given]
    if missing:
        raise ValueError("a model shape needs " + ", ".join("--" + n.replace("_", "-") for n in missing))
    try:
        return CostModel(**given), "model-shape flags"
    except ValueError as error:
        raise ValueError(f"model shape: {error}") from None


def describe_model(model: CostModel) -> str:
    """``hidden 4096, 32 layers, 32 heads (8 query groups), FFN 14336, vocab 128256, SwiGLU``."""
    groups = f" ({model.num_query_groups} query groups)" if model.num_query_groups else ""
    ffn = model.ffn_hidden_size or 4 * model.hidden_size
    return (f"hidden {model.hidden_size}, {model.num_layers} layers, {model.num_attention_heads} heads{groups}, "
            f"FFN {ffn}, vocab {model.vocab_size}{', SwiGLU' if model.swiglu else ''}")
