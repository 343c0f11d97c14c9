"""Shipped per-sample token counts (one integer per line)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIPPED = ("gsm8k_train",)


def lengths_path(name: str = "gsm8k_train") -> Path:
    """Path of the shipped distribution ``name``."""
    if name not in SHIPPED:
        raise ValueError(f"unknown length distribution {name!r}; shipped: {SHIPPED}")
    return HERE / f"{name}.txt"


def load_lengths(name: str = "gsm8k_train", *, limit: int | None = None) -> list[int]:
    """The first ``limit`` (all if ``None``) token counts of a shipped distribution, in file order."""
    values = [int(line) for line in lengths_path(name).read_text().split()]
    return values if limit is None else values[:limit]


def scale_lengths(lengths: Sequence[int], divisor: float, *, minimum: int = 2) -> list[int]:
    """Each length divided by ``divisor`` (rounded up, at least ``minimum``); the shape is kept."""
    if divisor <= 0:
        raise ValueError(f"divisor must be > 0; got {divisor}")
    return [max(minimum, math.ceil(n / divisor)) for n in lengths]
