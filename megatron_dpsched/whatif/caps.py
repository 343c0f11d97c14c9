"""The figures of a cap sweep and the cap it recommends (pure Python): what :mod:`.sweep` prints and
:mod:`.plots` draws."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TIE_TOLERANCE = 0.01
"""Caps whose simulated total is within this share of the fastest count as equally fast."""

RULE = (f"recommended: the fastest simulated total; of caps within {TIE_TOLERANCE:.0%} of it, the smallest "
        "(less memory per micro-batch)")


@dataclass(frozen=True, kw_only=True)
class CapFigures:
    """One strategy's figures over all steps at one cap."""

    seconds: float
    """Simulated forward-backward time summed over steps."""
    median_step_seconds: float
    """The median step's simulated time."""
    median_micro_batches: float
    """Micro-batches per DP rank in the median step."""
    micro_batches: int
    """Micro-batches per DP rank summed over steps."""
    token_fill: float
    """Real tokens that fit the cap / total capacity (micro-batches x DP x cap), over all steps."""
    padding_share: float
    """Padding / computed tokens, over all steps."""
    largest_microbatch: int
    """Tokens of the largest collated micro-batch, padding included."""


@dataclass(frozen=True, kw_only=True)
class CapResult:
    """dp-schedule and Megatron fixed at one cap."""

    cap: int
    """``max_tokens_per_gpu``."""
    ours: CapFigures
    """dp-schedule's figures."""
    fixed: CapFigures
    """Megatron fixed's figures."""
    fixed_micro_batch_size: int
    """The micro-batch size Megatron fixed uses at this cap."""
    over_cap: int
    """Samples longer than the cap (each runs alone in a micro-batch over it)."""

    @property
    def speedup(self) -> float:
        """Megatron fixed's simulated total / dp-schedule's."""
        return self.fixed.seconds / self.ours.seconds


def recommend(results: Sequence[CapResult], *, tolerance: float = TIE_TOLERANCE) -> int:
    """The cap to train with: the smallest of those within ``tolerance`` of the fastest simulated total."""
    fastest = min(result.ours.seconds for result in results)
    return min(result.cap for result in results if result.ours.seconds <= fastest * (1.0 + tolerance))


__all__ = ["RULE", "TIE_TOLERANCE", "CapFigures", "CapResult", "recommend"]
