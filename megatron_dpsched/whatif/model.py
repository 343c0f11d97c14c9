"""What the what-if tool balances and times: a model shape (Megatron's shape flags or ``--model-shape FILE``),
whose FLOPs it balances and times at ``--flops-per-gpu``, or the cost-model file ``megatron-dpsched calibrate``
writes (``--cost-model FILE``), whose measured costs it balances and whose step-time model it simulates."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from megatron_dpsched.core.cost import COST_MODEL_FILE_FORMAT, CostModel, CostModelFile
from megatron_dpsched.options import GIVEN, NOMINAL_FLOPS_PER_GPU
from megatron_dpsched.whatif.analysis import Simulation

DEFAULT_MODEL = CostModel(
    hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
    ffn_hidden_size=14336, vocab_size=128256, swiglu=True,
)
"""Used when no shape is given: the shape of Llama-3-8B."""

SHAPE_FLAGS = ("hidden_size", "num_layers", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
               "vocab_size", "swiglu")
"""``CostModel`` fields that have a Megatron flag of the same name (``--hidden-size``, ...)."""
SHAPE_NAMES = frozenset(field.name for field in fields(CostModel))


def _read_json(flag: str, path: str) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"{flag} {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"{flag} {path} is not JSON ({error})") from None


def read_model_shape(path: str) -> CostModel:
    """``--model-shape``: a JSON object of :class:`CostModel` fields, e.g. ``{"hidden_size": 4096, ...}``."""
    data = _read_json("--model-shape", path)
    if isinstance(data, dict) and data.get("format") == COST_MODEL_FILE_FORMAT:
        raise ValueError(f"--model-shape {path} is a cost-model file ('megatron-dpsched calibrate' writes it), "
                         f"not a model shape: pass it as --cost-model {path}")
    if not isinstance(data, dict) or not set(data) <= SHAPE_NAMES:
        unknown = sorted(set(data) - SHAPE_NAMES) if isinstance(data, dict) else "not an object"
        raise ValueError(f"--model-shape {path}: expected a JSON object of {', '.join(sorted(SHAPE_NAMES))}; "
                         f"got {unknown}")
    try:
        return CostModel(**data)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--model-shape {path}: {error}") from None


def read_cost_model_file(path: str) -> CostModelFile:
    """``--cost-model``: the file ``megatron-dpsched calibrate`` writes, read as ``--dp-schedule-cost-model``
    reads it (:meth:`CostModelFile.load`); a model shape given here is refused naming ``--model-shape``."""
    try:
        return CostModelFile.load(path)
    except ValueError as error:
        if _is_model_shape(path):
            raise ValueError(f"--cost-model {path} holds a model shape (CostModel fields), not a cost-model file "
                             f"from 'megatron-dpsched calibrate': pass it as --model-shape {path}") from None
        raise ValueError(f"--cost-model {error}") from None


def _is_model_shape(path: str) -> bool:
    try:
        data = _read_json("--cost-model", path)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data) and set(data) <= SHAPE_NAMES


def model_from_flags(args: Any) -> tuple[CostModel, str]:
    """The model shape the options name and where it came from (the flags, ``--model-shape`` or ``default``)."""
    given = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) not in (None, False)}
    if args.model_shape and given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"give --model-shape or the model-shape flags, not both (got --model-shape and {flags})")
    if args.model_shape:
        return read_model_shape(args.model_shape), args.model_shape
    if not given:
        return DEFAULT_MODEL, "default: Llama-3-8B shape"
    missing = [name for name in ("hidden_size", "num_layers", "num_attention_heads") if name not in given]
    if missing:
        raise ValueError("a model shape needs " + ", ".join("--" + n.replace("_", "-") for n in missing))
    try:
        return CostModel(**given), "model-shape flags"
    except ValueError as error:
        raise ValueError(f"model shape: {error}") from None


def simulation_from_flags(args: Any) -> tuple[Simulation, str]:
    """How the options balance and time samples, and where the model came from: ``--cost-model FILE``'s
    measured costs, else a model shape's FLOPs at ``--flops-per-gpu`` plus ``--microbatch-overhead-ms``."""
    common = {"tp_size": args.tp_size, "collate_format": args.collate_format}
    if not args.cost_model:
        model, source = model_from_flags(args)
        flops = NOMINAL_FLOPS_PER_GPU if args.flops_per_gpu is None else args.flops_per_gpu
        overhead = args.microbatch_overhead_ms / 1000.0
        return Simulation(cost_model=model, flops_per_gpu=flops, seconds_per_microbatch=overhead, **common), source
    extra = _combined_with_cost_model(args)
    if extra:
        raise ValueError(f"--cost-model cannot be combined with {', '.join(extra)}: the cost-model file's measured "
                         "step-time model sets the costs and the times (seconds per token, per sum(length^2) and "
                         "per micro-batch)")
    measured = read_cost_model_file(args.cost_model)
    simulation = Simulation(cost_model=measured.sample_cost(), step_time_model=measured.step_time,
                            flops_per_gpu=None, seconds_per_microbatch=measured.step_time.seconds_per_microbatch,
                            **common)
    return simulation, f"cost-model file {args.cost_model}"


def _combined_with_cost_model(args: Any) -> list[str]:
    """The model and timing flags given besides ``--cost-model``, whose file replaces them all."""
    flags = ["--model-shape"] if args.model_shape else []
    flags += ["--" + name.replace("_", "-") for name in SHAPE_FLAGS if getattr(args, name) not in (None, False)]
    return flags + [flag for flag, value in (("--flops-per-gpu", args.flops_per_gpu),
                                             ("--microbatch-overhead-ms", _overhead_given(args))) if value is not None]


def _overhead_given(args: Any) -> float | None:
    """``--microbatch-overhead-ms`` when given on the command line (the parser records the stems given)."""
    return args.microbatch_overhead_ms if "microbatch_overhead_ms" in getattr(args, GIVEN, ()) else None


def describe_model(model: CostModel) -> str:
    """``hidden 4096, 32 layers, 32 heads (8 query groups), FFN 14336, vocab 128256, SwiGLU``."""
    groups = f" ({model.num_query_groups} query groups)" if model.num_query_groups else ""
    ffn = model.ffn_hidden_size or 4 * model.hidden_size
    return (f"hidden {model.hidden_size}, {model.num_layers} layers, {model.num_attention_heads} heads{groups}, "
            f"FFN {ffn}, vocab {model.vocab_size}{', SwiGLU' if model.swiglu else ''}")
