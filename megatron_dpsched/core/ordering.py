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

from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter

import numpy as np

from megatron_dpsched.core import padding
from megatron_dpsched.core.packing import flat_lists
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
    if order == "none":
        return _by_first_sample(list(map(sorted, micro_batches)))
    batches, arranged = arrangements(micro_batches, costs, (order,))
    return [batches[b] for b in arranged[0]]


def arrangements(
    micro_batches: Sequence[Sequence[int]], costs: Sequence[float], orders: Sequence[str]
) -> tuple[list[list[int]], list[list[int]]]:
    """Each micro-batch's samples in index order, and for each of ``orders`` (of :data:`PIPELINE_ORDERS`)
    the positions of those micro-batches in its run order: one sort for all orders."""
    batches = list(map(sorted, micro_batches))
    keys = [(sum(map(costs.__getitem__, mb)), mb[0] if mb else -1) for mb in batches]  # an empty one first on ties
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
    ranks: list[list[list[int]]], costs: Sequence[float], order: str, *, run_sums: RunSums | None = None
) -> list[list[list[int]]]:
    """:func:`order_micro_batches` of every rank, each micro-batch (a list) sorted in place and kept (no list or
    number made again). ``"none"``: rank by rank on the first samples, ``ranks`` itself updated and returned.
    The pipeline orders: all ranks in one NumPy pass, costs summed by ``run_sums`` (without it, or with costs
    not all Python floats, :func:`order_micro_batches` rank by rank, on new lists)."""
    if order == "none":  # each rank's lists sorted and ordered while they are in cache, its old list let go
        for r, rank in enumerate(ranks):
            ranks[r] = _by_first_sample(_sorted_in_place(rank))
        return ranks
    if run_sums is None or not padding.all_floats(costs):
        return [order_micro_batches(rank, costs, order) for rank in ranks]
    per_rank, _, _, arranged = _arranged(ranks, costs, order, run_sums)
    batches = list(chain.from_iterable(ranks))
    run = list(map(batches.__getitem__, arranged.tolist()))
    ends = np.cumsum(per_rank).tolist()
    return [run[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def ordered_layout(
    ranks: list[list[list[int]]], costs: Sequence[float], order: str, *, run_sums: RunSums,
    layout: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`order_ranks`'s plan laid out in NumPy, its micro-batches not made again: each rank's micro-batch
    count, every micro-batch's sample count (rank after rank, in run order) and their samples end to end.
    ``ranks`` is read once, rank by rank, each rank let go once read (while in cache), and left empty;
    ``"none"`` and the pipeline orders are sorted in NumPy (the same keys as :func:`order_ranks`). ``layout``:
    the plan as each rank's micro-batch count, each micro-batch's sample count and all samples, in plan order,
    where known (then ``ranks`` is not read and the micro-batches are sorted in NumPy, :func:`sorted_runs`)."""
    if order != "none" and not padding.all_floats(costs):
        assert layout is None, "a layout comes with costs all Python floats"
        ordered = order_ranks(ranks, costs, order, run_sums=run_sums)
        counts, flat = flat_lists(list(chain.from_iterable(ordered)))
        return np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered)), counts, flat
    if layout is None:
        per_rank = np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))
        counts, flat = _laid_out(ranks, drain=True)
    else:
        per_rank, counts, flat = layout[0], layout[1], sorted_runs(*layout[1:])
    starts, firsts = _first_samples(counts, flat)
    filled = counts > 0
    rank_ids = np.repeat(np.arange(len(per_rank)), per_rank)
    if order == "none":  # by first sample, the empty ones last in their order: one sort of distinct keys
        width = 2 * len(flat) + len(counts) + 1  # first samples, then ``len(flat)`` + each empty one's position
        keys = np.where(filled, firsts, len(flat) + np.arange(len(counts)))
        keys += rank_ids * width
        run = np.argsort(keys)
    else:
        run = _arrange_ranks(np.lexsort((firsts, run_sums(costs, flat, counts), rank_ids)), per_rank, order)
    counts = counts[run]
    return per_rank, counts, padding.gather_runs(flat, starts[run], counts)


def _arranged(
    ranks: list[list[list[int]]], costs: Sequence[float], order: str, run_sums: RunSums
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pipeline orders of every rank in one NumPy pass: the ranks' micro-batch counts, the micro-batches'
    sample counts and samples as laid out (each sorted in place), and the micro-batches' run order."""
    counts, flat = _laid_out(ranks)
    per_rank = np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))
    _, firsts = _first_samples(counts, flat)
    ascending = np.lexsort((firsts, run_sums(costs, flat, counts), np.repeat(np.arange(len(ranks)), per_rank)))
    return per_rank, counts, flat, _arrange_ranks(ascending, per_rank, order)


def sorted_runs(counts: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """``flat`` (non-negative ids), each run of ``counts`` samples sorted: one sort of ``run * span + id``, which
    the runs leave nearly in order."""
    if not len(flat):
        return flat
    span = int(flat.max()) + 1
    assert span * len(counts) < 2**63, "keys fit in int64"
    offsets = np.repeat(np.arange(len(counts), dtype=np.int64) * span, counts)
    keyed = np.sort(offsets + flat)
    keyed -= offsets
    return keyed


def _first_samples(counts: np.ndarray, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each micro-batch laid out in ``flat`` starts, and its first sample (-1 for an empty one: its key
    ``[]`` comes before any ``[i]``)."""
    starts = np.cumsum(counts) - counts
    filled = counts > 0
    firsts = np.full(len(counts), -1)
    firsts[filled] = flat[starts[filled]]
    return starts, firsts


LAID_OUT_BLOCK = 2048
"""About this many micro-batches are read at a time by :func:`_laid_out` (whole ranks): few enough to stay in
cache, enough that NumPy's per-call cost does not count."""


def _laid_out(ranks: list[list[list[int]]], *, drain: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every micro-batch sorted in place, a block of ranks at a time (:data:`LAID_OUT_BLOCK`), and read while in
    cache: their sample counts and their samples, all laid end to end (``drain``: each block then let go,
    ``ranks`` left holding empty lists)."""
    counts, flat = [], []
    block = max(1, LAID_OUT_BLOCK * len(ranks) // max(1, sum(map(len, ranks))))
    for r in range(0, len(ranks), block):
        batches = list(chain.from_iterable(ranks[r : r + block]))
        counts.append(np.fromiter(map(len, _sorted_in_place(batches)), dtype=np.int64, count=len(batches)))
        flat.append(np.fromiter(chain.from_iterable(batches), dtype=np.int64, count=int(counts[-1].sum())))
        if drain:
            ranks[r : r + block] = [[] for _ in range(min(block, len(ranks) - r))]
    return np.concatenate(counts or [np.zeros(0, np.int64)]), np.concatenate(flat or [np.zeros(0, np.int64)])


def _sorted_in_place(rank: Sequence[list[int]]) -> Sequence[list[int]]:
    """``rank``, each of its micro-batches sorted in place."""
    deque(map(list.sort, rank), maxlen=0)
    return rank


def _by_first_sample(rank: Sequence[list[int]]) -> list[list[int]]:
    """Sorted micro-batches by first sample (distinct), empty ones last in their order: ``"none"``'s run order."""
    ordered = sorted(filter(None, rank), key=itemgetter(0))
    if len(ordered) < len(rank):
        ordered += [mb for mb in rank if not mb]
    return ordered


def _arrange_ranks(ascending: np.ndarray, per_rank: np.ndarray, order: str) -> np.ndarray:
    """``ascending`` (every rank's micro-batches by ascending cost, rank after rank) in ``order``'s run order:
    :func:`arrange_rows` for the ranks of each micro-batch count."""
    arranged, offsets = np.empty_like(ascending), np.cumsum(per_rank) - per_rank
    for count in np.unique(per_rank).tolist():
        slots = offsets[per_rank == count][:, None] + np.arange(count)
        arranged[slots] = arrange_rows(ascending[slots], order)
    return arranged
