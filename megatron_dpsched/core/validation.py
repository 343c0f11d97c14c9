"""Argument checks shared by the planner: each raises ``ValueError`` naming the argument."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence, Set

import numpy as np

MAX_TOKENS = 2**31 - 1
"""Largest token count of a sample or a cap: Megatron's ``cu_seqlens`` are 32-bit integers."""


class ArgumentError(ValueError):
    """A bad planner argument; ``argument`` names it (``balance_growth``), so that a caller can name the flag
    or option of its own that set it without reading the message."""

    def __init__(self, message: str, *, argument: str) -> None:
        super().__init__(message)
        self.argument = argument


def is_int(value: object) -> bool:
    """True for Python and NumPy integers, False for bools and everything else."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def is_real(value: object) -> bool:
    """True for Python and NumPy real numbers (integers included), False for bools and everything else."""
    return type(value) is float or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def require_int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` as ``int`` or raise ``ValueError`` naming ``name``."""
    if not is_int(value) or value < minimum:
        raise ArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}", argument=name)
    if maximum is not None and value > maximum:
        raise ArgumentError(f"{name} must be at most {maximum}, got {value!r}", argument=name)
    return int(value)


def require_bool(name: str, value: object) -> bool:
    """Return ``value`` as ``bool`` (Python or NumPy booleans only) or raise ``ValueError`` naming ``name``."""
    kind = type(value)
    if isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        return bool(value)
    raise ArgumentError(f"{name} must be True or False, got {value!r}", argument=name)


def require_sequence(name: str, values: object) -> Sequence:
    """An ordered, indexable collection (list, tuple, array): not a string, mapping, set or iterator."""
    kind = type(values).__name__
    if isinstance(values, (str, bytes, Mapping, Set)) or not hasattr(values, "__len__") \
            or not hasattr(values, "__getitem__"):
        raise ValueError(f"{name} must be a sequence (list, tuple or array) in sample order, got {kind}")
    try:
        len(values)
    except TypeError:  # e.g. a 0-d NumPy array
        raise ValueError(f"{name} must be a sequence (list, tuple or array) in sample order, got an unsized "
                         f"{kind}") from None
    return values


def require_lengths(lengths: Sequence[int], *, name: str = "lengths") -> tuple[int, ...]:
    """Validate per-sample token counts: a non-empty sequence of integers in ``1..MAX_TOKENS``."""
    return checked_lengths(lengths, name=name)[0]


def checked_lengths(lengths: Sequence[int], *, name: str = "lengths") -> tuple[tuple[int, ...], np.ndarray | None]:
    """:func:`require_lengths`, with the lengths as an int64 array where they are all Python ints (else ``None``):
    the one conversion that checks their range also serves the planner."""
    require_sequence(name, lengths)
    if len(lengths) == 0:
        raise ArgumentError(f"{name} is empty: there is nothing to schedule", argument=name)
    values = tuple(lengths)
    if all_ints(values):  # the common case, at C speed
        try:
            array = np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:  # past int64: named below
            array = None
        if array is not None and 1 <= int(array.min()) and int(array.max()) <= MAX_TOKENS:
            return values, array
    return _one_by_one(lengths, name), None


def _one_by_one(lengths: Sequence[int], name: str) -> tuple[int, ...]:
    """The lengths checked one at a time, the first bad one named; NumPy integers made Python ints."""
    out = []
    for index, value in enumerate(lengths):
        if not is_int(value) or not 1 <= value <= MAX_TOKENS:
            raise ValueError(
                f"{name}[{index}] must be a positive integer token count (at most {MAX_TOKENS}), got {value!r}"
            )
        out.append(int(value))
    return tuple(out)


def all_ints(values: Sequence[object]) -> bool:
    """Every value is a Python ``int`` (not a bool or a NumPy integer), checked at C speed."""
    return set(map(type, values)) <= {int}


def valid_cost(value: object) -> bool:
    """A cost a cost model may return: a real number, finite, > 0."""
    return is_real(value) and _finite(value) and value > 0


def require_costs(costs: Sequence[float], count: int, *, checked: bool = False) -> tuple[float, ...]:
    """Validate per-sample costs returned by a cost model: real numbers, finite, > 0, with a finite sum.

    ``checked``: ``costs`` are Python floats already known to be valid one by one (only the sum is checked)."""
    if len(costs) != count:
        raise ValueError(f"cost_model returned {len(costs)} costs for {count} samples")
    if checked:
        out = tuple(costs)
    else:
        out = []
        for index, value in enumerate(costs):
            if not valid_cost(value):
                raise ValueError(
                    f"cost_model gave sample {index} the cost {value!r}; costs must be finite real numbers > 0"
                )
            out.append(float(value))
        out = tuple(out)
    if not math.isfinite(sum(out)):
        raise ValueError("cost_model's costs add up to infinity; scale the cost model down (e.g. seconds, not FLOPs)")
    return out


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False
