"""Order of micro-batches inside one rank's step.

With pipeline parallelism the first ``pp_size - 1`` micro-batches (warm-up)
and the last ones (cool-down) run while other stages idle, so the order
``"pipeline"`` puts the cheapest micro-batches at both ends and the dearest in
the middle: ascending cost dealt alternately to the front and the back.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_dpsched.core.validation import ArgumentError

MICROBATCH_ORDERS = ("pipeline", "none")


def resolve_order(microbatch_order: str | None, pp_size: int) -> str:
    """``None`` or ``"auto"`` means ``"pipeline"`` when ``pp_size > 1``, else ``"none"``."""
    if microbatch_order is not None and not isinstance(microbatch_order, str):
        raise ArgumentError(f"microbatch_order must be one of auto, {', '.join(MICROBATCH_ORDERS)}; "
                            f"got {microbatch_order!r}", argument="microbatch_order")
    if microbatch_order in (None, "auto"):
        return "pipeline" if pp_size > 1 else "none"
    if microbatch_order not in MICROBATCH_ORDERS:
        raise ArgumentError(
            f"microbatch_order must be one of auto, {', '.join(MICROBATCH_ORDERS)}; got {microbatch_order!r}",
            argument="microbatch_order",
        )
    return microbatch_order


def order_micro_batches(
    micro_batches: Sequence[Sequence[int]], costs: Sequence[float], order: str
) -> list[list[int]]:
    """Return the micro-batches in run order; each micro-batch's samples in index order."""
    batches = [sorted(mb) for mb in micro_batches]
    if order == "none":
        return sorted(batches, key=lambda mb: (not mb, mb[:1]))
    weight = [sum(costs[i] for i in mb) for mb in batches]
    ascending = sorted(range(len(batches)), key=lambda b: (weight[b], batches[b][:1]))
    front = ascending[0::2]
    back = ascending[1::2][::-1]
    return [batches[b] for b in front + back]
