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

from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter

import numpy as np

from megatron_dpsched.core import padding
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


RunSums = Callable[[Sequence[float], np.ndarray, np.ndarray], np.ndarray]
"""Python's ``sum`` of each run of ``values`` laid end to end in ``flat`` (``counts``: the runs' lengths), bit
for bit: :func:`~megatron_dpsched.core.balancing.run_sums`."""


def order_ranks(
    ranks: Sequence[Sequence[Sequence[int]]], costs: Sequence[float], order: str, *, run_sums: RunSums | None = None
) -> list[list[list[int]]]:
    """:func:`order_micro_batches` of every rank at once, in NumPy (sample ids non-negative): the micro-batches'
    samples sorted in one pass, the ranks' run orders in one ``lexsort``. The pipeline orders sum their costs
    with ``run_sums``; without it, or with costs that are not all Python floats, rank by rank."""
    if order != "none" and (run_sums is None or not padding.all_floats(costs)):
        return [order_micro_batches(rank, costs, order) for rank in ranks]
    per_rank = np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))
    batches = list(chain.from_iterable(ranks))
    counts = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    flat = _sorted_runs(np.fromiter(chain.from_iterable(batches), dtype=np.int64, count=int(counts.sum())), counts)
    filled = counts > 0
    firsts = np.full(len(counts), -1 if order != "none" else np.iinfo(np.int64).max)  # empty: [] < [i]; "none": last
    firsts[filled] = flat[(np.cumsum(counts) - counts)[filled]]
    rank_of = np.repeat(np.arange(len(ranks)), per_rank)
    if order == "none":  # by first sample (distinct), empty ones last in their order
        run = np.lexsort((firsts, rank_of))
    else:
        run = _arrange_ranks(np.lexsort((firsts, run_sums(costs, flat, counts), rank_of)), per_rank, order)
    return _gather(flat, counts, run, per_rank)


def _sorted_runs(flat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each run of ``flat`` (non-negative ids; ``counts``: the runs' lengths) in ascending order."""
    span = int(flat.max(initial=0)) + 1
    keys = np.repeat(np.arange(len(counts), dtype=np.int64) * span, counts)
    return np.sort(keys + flat) - keys


def _arrange_ranks(ascending: np.ndarray, per_rank: np.ndarray, order: str) -> np.ndarray:
    """``ascending`` (every rank's micro-batches by ascending cost, rank after rank) in ``order``'s run order:
    :func:`arrange_rows` for the ranks of each micro-batch count."""
    arranged, offsets = np.empty_like(ascending), np.cumsum(per_rank) - per_rank
    for count in np.unique(per_rank).tolist():
        slots = offsets[per_rank == count][:, None] + np.arange(count)
        arranged[slots] = arrange_rows(ascending[slots], order)
    return arranged


def _gather(flat: np.ndarray, counts: np.ndarray, run: np.ndarray, per_rank: np.ndarray) -> list[list[list[int]]]:
    """The micro-batches of ``flat`` (``counts``: their lengths) in the order ``run``, as lists per rank."""
    run_counts = counts[run]
    ends = np.cumsum(run_counts)
    shift = np.repeat((np.cumsum(counts) - counts)[run] - (ends - run_counts), run_counts)
    items, bounds = flat[shift + np.arange(len(flat))].tolist(), ends.tolist()
    batches = [items[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]
    rank_ends = np.cumsum(per_rank).tolist()
    return [batches[a:b] for a, b in zip([0, *rank_ends[:-1]], rank_ends)]
