"""Argument checks shared by the planner: each raises ``ValueError`` naming the argument."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence


def is_int(value: object) -> bool:
    """True for Python and NumPy integers, False for bools and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def require_int(name: str, value: object, *, minimum: int = 1) -> int:
    """Return ``value`` as ``int`` or raise ``ValueError`` naming ``name``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def require_lengths(lengths: Sequence[int]) -> tuple[int, ...]:
    """Validate per-sample token counts: a non-empty sequence of integers >= 1."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__len__"):
        raise ValueError(f"lengths must be a sequence of token counts, got {type(lengths).__name__}")
    if len(lengths) == 0:
        raise ValueError("lengths is empty: there is nothing to schedule")
    out = []
    for index, value in enumerate(lengths):
        if not is_int(value) or value < 1:
            raise ValueError(
                f"lengths[{index}] must be a positive integer token count, got {value!r}"
            )
        out.append(int(value))
    return tuple(out)


def require_costs(costs: Sequence[float], count: int) -> tuple[float, ...]:
    """Validate per-sample costs returned by a cost model: finite and > 0."""
    if len(costs) != count:
        raise ValueError(f"cost_model returned {len(costs)} costs for {count} samples")
    out = []
    for index, value in enumerate(costs):
        cost = float(value)
        if not math.isfinite(cost) or cost <= 0:
            raise ValueError(f"cost_model gave sample {index} the cost {value!r}; costs must be finite and > 0")
        out.append(cost)
    return tuple(out)
