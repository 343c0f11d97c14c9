"""Order of micro-batches inside one rank's step.

With pipeline parallelism the first ``pp_size - 1`` micro-batches (warm-up)
and the last ones (cool-down) run while other stages idle, so the order
``"pipeline"`` puts the cheapest micro-batches at both ends and the dearest in
the middle: ascending cost dealt alternately to the front and the back.

With a step-time model (spec step 7) ``"pipeline"`` is the first of :data:`PIPELINE_ORDERS`, the orders
the objective times on each rank's micro-batches (:mod:`~megatron_dpsched.core.objective`): its cheapest
at both ends, verl's (cost descending, then ``[::2][::-1] + [1::2]``: the cheapest last), cost
descending and cost ascending.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from megatron_dpsched.core.validation import ArgumentError

MICROBATCH_ORDERS = ("pipeline", "none")
PIPELINE_ORDERS = ("pipeline", "verl", "descending", "ascending")
"""The orders the step-time objective chooses from for ``"pipeline"``; the first is step 6's."""


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
    """Return the micro-batches in run order (``"none"`` or one of :data:`PIPELINE_ORDERS`); each
    micro-batch's samples in index order."""
    if order == "none":  # by first sample (distinct), empty ones last
        batches = list(map(sorted, micro_batches))
        return sorted(filter(None, batches), key=itemgetter(0)) + [mb for mb in batches if not mb]
    batches, arranged = arrangements(micro_batches, costs, (order,))
    return [batches[b] for b in arranged[0]]


def arrangements(
    micro_batches: Sequence[Sequence[int]], costs: Sequence[float], orders: Sequence[str]
) -> tuple[list[list[int]], list[list[int]]]:
    """Each micro-batch's samples in index order, and for each of ``orders`` (of :data:`PIPELINE_ORDERS`)
    the positions of those micro-batches in its run order: one sort for all orders."""
    batches = list(map(sorted, micro_batches))
    keys = [(sum(map(costs.__getitem__, mb)), mb[:1]) for mb in batches]
    ascending = sorted(range(len(batches)), key=keys.__getitem__)
    return batches, [_arrange(ascending, order) for order in orders]


def _arrange(ascending: list[int], order: str) -> list[int]:
    """Positions sorted by ascending cost, in ``order``'s run order."""
    if order == "pipeline":
        return ascending[0::2] + ascending[1::2][::-1]
    if order == "ascending":
        return ascending
    descending = ascending[::-1]
    if order == "verl":
        return descending[0::2][::-1] + descending[1::2]
    assert order == "descending", f"unknown micro-batch order {order!r}"
    return descending


def arrange_rows(ascending: np.ndarray, order: str) -> np.ndarray:
    """:func:`arrangements`' positions for many ranks of one count at once: each row of ``ascending`` (a rank's
    micro-batches by ascending cost) in ``order``'s run order (of :data:`PIPELINE_ORDERS`)."""
    if order == "pipeline":
        return np.concatenate((ascending[:, 0::2], ascending[:, 1::2][:, ::-1]), axis=1)
    if order == "ascending":
        return ascending
    descending = ascending[:, ::-1]
    if order == "verl":
        return np.concatenate((descending[:, 0::2][:, ::-1], descending[:, 1::2]), axis=1)
    assert order == "descending", f"unknown micro-batch order {order!r}"
    return descending
