"""Packing samples into micro-batches under a token cap (step 4 of the contract; step 5's global packing).

Items are sample ids; ``sizes[i]`` is sample ``i``'s planned size (its token count
rounded up to the pad multiple). A sample longer than the cap always sits alone in
its own micro-batch; every other micro-batch's collated size is at most ``cap``: the
sum of its sizes, or with ``padded_rows`` its sample count times its longest size
(:mod:`~megatron_dpsched.core.padding`), so a sample of size ``s`` joins a micro-batch of
``k`` samples whose longest is ``m`` only if ``(k + 1) * max(m, s) <= cap``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, pairwise

import numpy as np

from megatron_dpsched.core.fits import best_fit_owners, chunk_starts, decreasing_order, item_arrays
from megatron_dpsched.core.padding import bin_figures, collated_size, collated_sizes, micro_batch_arrays


def bin_lower_bound(sizes: Sequence[int], cap: int, *, padded_rows: bool = False) -> int:
    """Fewest micro-batches any packing can use (with ``padded_rows``: :func:`chunk_count`, exact).

    Oversize samples (> cap) sit alone. Among the rest, the tokens need
    ``ceil(total / cap)``, and no micro-batch holds ``k + 1`` samples longer than
    ``cap / (k + 1)``, so the ``n_k`` samples longer than that need ``ceil(n_k / k)``
    (``k = 1``: no two samples over half the cap share one; ``k = 2``: at most two
    over a third, ...). The bound is the oversize count plus the largest of these.
    """
    if padded_rows:
        return chunk_count(sizes, cap)
    array = np.asarray(sizes, dtype=np.int64)
    rest = np.sort(array[array <= cap])
    oversize = len(array) - len(rest)
    bound = max(math.ceil(int(rest.sum()) / cap), min(len(rest), 1))  # samples of 0 tokens still need one
    k = 1
    while math.ceil(len(rest) / k) > bound:
        longer = len(rest) - int(np.searchsorted(rest, cap // (k + 1), side="right"))  # size * (k + 1) > cap
        bound = max(bound, math.ceil(longer / k))
        k += 1
    return oversize + bound


def chunk_count(sizes: Sequence[int], cap: int) -> int:
    """Micro-batches of :func:`chunk_decreasing`: the fewest any padded-rows packing can use."""
    return len(chunk_starts(np.sort(np.asarray(sizes, dtype=np.int64))[::-1], cap))


def chunk_decreasing(items: Sequence[int], sizes: Sequence[int], cap: int) -> list[list[int]]:
    """Padded rows: samples in decreasing size, each micro-batch as many as its first (longest) allows.

    A micro-batch whose longest sample has size ``m`` holds at most ``cap // m`` rows, so taking the
    longest remaining sample with the next ``cap // m - 1`` longest uses the fewest micro-batches (an
    exchange argument: swapping a shorter sample into the longest's micro-batch never breaks a cap). Ties
    of size go by id; the chunks' starts come per distinct row count
    (:func:`~megatron_dpsched.core.fits.chunk_starts`).
    """
    ids, item_sizes = item_arrays(items, sizes)
    order = decreasing_order(item_sizes, ids)
    ordered, ordered_sizes = ids[order].tolist(), item_sizes[order]
    alone = int(np.count_nonzero(2 * ordered_sizes > cap))  # one row each: the first chunks
    starts = chunk_starts(ordered_sizes, cap)[alone:]
    chunks = [[item] for item in ordered[:alone]]
    return chunks + list(map(ordered.__getitem__, map(slice, starts, [*starts[1:], len(ordered)])))


def best_fit_decreasing(
    items: Sequence[int], sizes: Sequence[int], cap: int, *, padded_rows: bool = False
) -> list[list[int]]:
    """Pack ``items`` by best-fit decreasing (the 11/9 OPT + 6/9 bound of FFD); with ``padded_rows`` by
    :func:`chunk_decreasing` (the fewest micro-batches).

    Items go longest first (ties in the order given), each into the open micro-batch of least room that fits it
    (ties: the first opened), else into a new one; a micro-batch left without room, or holding a sample of at
    least ``cap``, closes. Items over half the cap open one each (NumPy); the rest go one size at a time
    (:func:`~megatron_dpsched.core.fits.best_fit_owners`): a micro-batch of room ``r`` takes ``r // size`` of
    them in a row (it stays the one of least room that fits), so the work is per size and per distinct room,
    not per item.
    """
    if padded_rows:
        return chunk_decreasing(items, sizes, cap)
    ids, item_sizes = item_arrays(items, sizes)
    if not len(ids):
        return []
    order = decreasing_order(item_sizes)
    ids, item_sizes = ids[order], item_sizes[order]
    owners, count = best_fit_owners(item_sizes, cap)
    return _gather_bins(ids, owners, count)


def first_fit(items: Sequence[int], sizes: Sequence[int], cap: int) -> list[list[int]]:
    """First fit in arrival order (O(n log n)); a sample over the cap gets its own micro-batch.

    The micro-batches' rooms sit in a max segment tree (:func:`_first_fit_into`)."""
    bins: list[list[int]] = []
    _first_fit_into(items, sizes, cap, bins=bins, tree=_room_tree(len(items)))
    return bins


FIRST_FIT_PROBE = 256
"""Samples :func:`first_fit_below` places (by default) before it first asks whether first fit can still end below
its limit."""


def first_fit_below(
    items: Sequence[int], sizes: Sequence[int], cap: int, *, limit: int, probe: int = FIRST_FIT_PROBE
) -> list[list[int]] | None:
    """:func:`first_fit`'s micro-batches if there are fewer than ``limit`` of them, else ``None``, often known
    from a prefix.

    First fit never closes a micro-batch, and no two samples longer than half the cap share one: a later such
    sample joins one of a prefix's micro-batches only where that one's room is over half the cap, one each. So
    first fit ends with at least the prefix's micro-batches, plus the long samples still to come less the
    prefix's micro-batches with room over half the cap (:func:`_first_fit_floor`); the samples go in prefixes
    doubling from ``probe`` samples, and once that floor reaches ``limit`` the rest are not placed."""
    assert probe > 0, probe
    bins: list[list[int]] = []
    tree, half = _room_tree(len(items)), cap // 2  # a size s is long when 2 * s > cap, that is s > cap // 2
    long = item_arrays(items, sizes)[1] > half
    longs, done, stop = int(np.count_nonzero(long)), 0, probe  # longs: long samples still to place
    while done < len(items):
        _first_fit_into(items[done:stop], sizes, cap, bins=bins, tree=tree)
        longs -= int(np.count_nonzero(long[done:stop]))
        done, stop = min(stop, len(items)), 2 * stop
        if done < len(items) and _first_fit_floor(tree, len(bins), half=half, longs=longs) >= limit:
            return None
    return bins if len(bins) < limit else None


def _first_fit_floor(tree: list[int], opened: int, *, half: int, longs: int) -> int:
    """The fewest micro-batches first fit can end with, from its ``opened`` micro-batches' rooms (the leaves of
    ``tree``) and the count ``longs`` of samples over half the cap (``half``: ``cap // 2``) still to place."""
    width = len(tree) // 2
    roomy = int(np.count_nonzero(np.array(tree[width : width + opened]) > half))  # each takes one long sample
    return opened + max(0, longs - roomy)


def _room_tree(count: int) -> list[int]:
    """An empty max segment tree of rooms for up to ``count`` micro-batches (:func:`_first_fit_into`)."""
    return [-1] * (2 << max(0, count - 1).bit_length())


def _first_fit_into(items: Sequence[int], sizes: Sequence[int], cap: int, *, bins: list[list[int]],
                    tree: list[int]) -> None:
    """First fit of ``items`` after those already in ``bins``, in place.

    ``tree`` is a max segment tree of the micro-batches' rooms (a flat list, leaves from ``width``; ``-1`` for
    a micro-batch not yet opened or an oversize sample's, which stays full): the first with room for a sample
    is found from the root down, and a changed room is carried up while it changes a parent. Inlined: one
    loop."""
    width = len(tree) // 2
    for item in items:
        size = sizes[item]
        if tree[1] < size:  # fits nowhere (or over the cap): a new micro-batch
            bins.append([item])
            if size > cap:
                continue
            node, room = width + len(bins) - 1, cap - size
        else:
            node = 2
            while node < width:  # down to the left child if it has room, else the right one
                node = (node + (tree[node] < size)) << 1
            node += tree[node] < size
            bins[node - width].append(item)
            room = tree[node] - size
        tree[node] = room
        while node > 1:  # a parent's room: the larger of its children's
            sibling = tree[node ^ 1]
            if sibling > room:
                room = sibling
            node >>= 1
            if tree[node] == room:
                break  # nothing above changes either
            tree[node] = room


def worst_fit_decreasing(
    items: Sequence[int], sizes: Sequence[int], cap: int, num_bins: int
) -> list[list[int]] | None:
    """Spread ``items`` over exactly ``num_bins`` micro-batches, each to the lightest; ``None`` if one overflows.

    Balanced micro-batches shorten pipeline stalls, so this is tried before
    best-fit, which fills micro-batches unevenly.
    """
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    heap = [(0, b) for b in range(num_bins)]
    for item in sorted(items, key=sizes.__getitem__, reverse=True):  # stable: ties keep their order
        load, b = heapq.heappop(heap)
        size = sizes[item]
        if size > cap:
            if load:
                return None
            load = math.inf
        elif load + size > cap:
            return None
        else:
            load += size
        bins[b].append(item)
        heapq.heappush(heap, (load, b))
    return bins


def split_to_count(
    bins: list[list[int]], sizes: Sequence[int], num_bins: int, *, padded_rows: bool = False,
    loads: Sequence[int] | None = None,
) -> list[list[int]]:
    """Split the fullest multi-sample bins in two until there are ``num_bins``; pad with empty bins.

    Fullest by collated size (``loads``: the bins' collated sizes when the caller has them); with
    ``padded_rows`` a bin splits into its longer and its shorter samples (less padding), else into two
    of near-equal tokens. Parts never exceed the whole.
    """
    return split_owned([list(b) for b in bins], sizes, num_bins, padded_rows=padded_rows, loads=loads)


SMALL_BINS = 64
"""Up to this many micro-batches :func:`split_owned` works in pure Python (NumPy's per-call cost dominates)."""


def split_owned(
    out: list[list[int]], sizes: Sequence[int], num_bins: int, *, padded_rows: bool = False,
    loads: Sequence[int] | None = None, replaced: list[int] | None = None,
) -> list[list[int]]:
    """:func:`split_to_count` on bins the caller hands over: ``out`` is extended and its entries replaced
    (never the bins themselves), and returned. ``replaced``, when given, receives the position of each bin given
    that a split replaced (a position once per split)."""
    given = len(out)
    assert len(out) <= num_bins, (len(out), num_bins)
    if len(out) == num_bins:
        return out
    if loads is None:
        loads = (collated_sizes(out, sizes, padded_rows=padded_rows) if len(out) > SMALL_BINS
                 else [collated_size(items, sizes, padded_rows=padded_rows) for items in out])
    assert len(loads) == len(out)
    heap = _fullest(out, loads, num_bins - len(out))
    halve = _split_rows if padded_rows else _halve
    pop, push = heapq.heappop, heapq.heappush
    while len(out) < num_bins and heap:
        _, i = pop(heap)
        first, second = halve(out[i], sizes)
        out[i] = first
        if replaced is not None and i < given:
            replaced.append(i)
        out.append(second)
        for j, items in ((i, first), (len(out) - 1, second)):
            if len(items) > 1:  # a padded-rows half is longest first: its collated size is its rows times the first
                push(heap, (-(len(items) * sizes[items[0]] if padded_rows else sum(map(sizes.__getitem__, items))), j))
    out.extend([] for _ in range(num_bins - len(out)))
    return out


def _fullest(bins: list[list[int]], loads: Sequence[int], splits: int) -> list[tuple[int, int]]:
    """The heap of ``(-load, bin)`` of :func:`split_owned`'s multi-sample bins, only the ``splits`` first in that
    order: each split pops one entry and the bins' own entries pop in their order, so ``splits`` splits never
    reach a later one. Up to :data:`SMALL_BINS` bins in pure Python (NumPy's per-call cost dominates there)."""
    if len(bins) <= SMALL_BINS:
        candidates = [i for i, items in enumerate(bins) if len(items) > 1]
        if len(candidates) > splits:
            candidates = sorted(candidates, key=lambda i: -loads[i])[:splits]
        heap = [(-int(loads[i]), i) for i in candidates]
        heapq.heapify(heap)
        return heap
    candidates = np.flatnonzero(np.fromiter(map(len, bins), dtype=np.int64, count=len(bins)) > 1)
    load_array = np.asarray(loads, dtype=np.int64)
    if len(candidates) > splits:
        candidates = candidates[np.argsort(-load_array[candidates], kind="stable")[:splits]]
    heap = list(zip((-load_array[candidates]).tolist(), candidates.tolist()))
    heapq.heapify(heap)
    return heap


def pack_into(
    items: Sequence[int], sizes: Sequence[int], cap: int, num_bins: int, *, padded_rows: bool = False
) -> list[list[int]] | None:
    """Pack ``items`` into exactly ``num_bins`` capped micro-batches, or ``None`` if they need more.

    :func:`worst_fit_decreasing` (even micro-batches), else :func:`best_fit_decreasing` and
    :func:`split_to_count` (the fullest split); with ``padded_rows`` the chunks of :func:`chunk_decreasing`
    (the fewest), split into their longer and shorter samples (each micro-batch then holds samples of
    similar length). Micro-batches are empty only when there are fewer items than ``num_bins``.
    """
    if padded_rows:
        bins = chunk_decreasing(items, sizes, cap)
        return None if len(bins) > num_bins else split_to_count(bins, sizes, num_bins, padded_rows=True)
    bins = worst_fit_decreasing(items, sizes, cap, num_bins)
    if bins is not None:
        return bins
    bins = best_fit_decreasing(items, sizes, cap)
    if len(bins) > num_bins:
        return None
    return split_to_count(bins, sizes, num_bins)


Refits = dict[int, "BinArrays"]
"""Per rank that does not fit: its best-fit decreasing micro-batches (padded rows: :func:`chunk_decreasing`'s)
with their collated sizes, as arrays."""


def pack_ranks(
    ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int, num_bins: int, *, padded_rows: bool = False,
    refits: Refits | None = None,
) -> list[list[list[int]] | None]:
    """:func:`pack_into` of every rank's items (the same micro-batches); the worst-fit pass runs on all ranks at
    once with NumPy when there are at least :data:`VECTOR_RANKS` ranks (:func:`_worst_fit_packed`), then the
    best-fit pass on all ranks where worst fit overflowed (:func:`best_fit_ranks`). ``refits``, when given,
    receives the best-fit (or chunked) micro-batches of the ranks that do not fit, where this pass made them.
    A rank's items may be a NumPy array (:func:`~megatron_dpsched.core.balancing.lpt_ranks`)."""
    return pack_rank_arrays(ranks, sizes, cap, num_bins, padded_rows=padded_rows, refits=refits).lists()


def pack_rank_arrays(
    ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int, num_bins: int, *, padded_rows: bool = False,
    refits: Refits | None = None,
) -> PackedRanks:
    """:func:`pack_ranks` as :class:`PackedRanks`: the micro-batches of worst fit, and those of best fit (or the
    padded-rows chunks) still to split, made lists only when asked."""
    total, width = sum(len(items) for items in ranks), max((len(items) for items in ranks), default=0)
    if padded_rows:
        packed = PackedRanks([None] * len(ranks))
        packed.defer(enumerate(_chunk_ranks(ranks, sizes, cap)), sizes, num_bins, padded_rows=True, refits=refits)
        return packed
    if len(ranks) < VECTOR_RANKS or width * len(ranks) > 4 * total + 65536:
        return PackedRanks([pack_into(items.tolist() if isinstance(items, np.ndarray) else items, sizes, cap,
                                      num_bins) for items in ranks])
    layout = _rank_grid(ranks, sizes)
    packed = _worst_fit_packed(ranks, sizes, cap, num_bins, layout=layout)
    overflowed = np.flatnonzero(~packed.worst).tolist()  # pack_into's worst fit fails there too
    if 4 * len(overflowed) >= 3 * len(ranks):  # most: best fit on every rank (each its own), no subset copied
        best_fits = _best_fit_arrays(ranks, sizes, cap, layout=layout)
        packed.defer(((r, best_fits[r]) for r in overflowed), sizes, num_bins, padded_rows=False, refits=refits)
    elif overflowed:
        subset = _grid_subset(layout, ~packed.worst)
        best_fits = _best_fit_arrays([ranks[r] for r in overflowed], sizes, cap, layout=subset)
        packed.defer(zip(overflowed, best_fits, strict=True), sizes, num_bins, padded_rows=False, refits=refits)
    return packed


class PackedRanks:
    """Every rank's micro-batches from :func:`pack_rank_arrays`: ``packed`` per rank its micro-batches as lists
    (``None``: it does not fit, or they are still arrays); the others made lists by :meth:`lists`. The ranks worst
    fit packed (``worst``): their samples bin by bin (``members``), each of their ranks' ``num_bins``
    micro-batches' sample count (``bin_counts``, ranks in order). The ranks with fewer best-fit (or chunked)
    micro-batches than the count (``pending``): those, to split (:func:`split_owned`) as ``split_by`` says (the
    sizes, the count, ``padded_rows``)."""

    __slots__ = ("packed", "worst", "members", "bin_counts", "pending", "split_by")

    def __init__(self, packed: list[list[list[int]] | None], *, worst: np.ndarray | None = None,
                 members: np.ndarray | None = None, bin_counts: np.ndarray | None = None) -> None:
        self.packed = packed
        self.worst = np.zeros(len(packed), dtype=bool) if worst is None else worst
        self.members = np.zeros(0, dtype=np.int64) if members is None else members
        self.bin_counts = np.zeros(0, dtype=np.int64) if bin_counts is None else bin_counts
        self.pending: dict[int, BinArrays] = {}
        self.split_by: tuple[Sequence[int], int, bool] = ((), 0, False)

    def defer(self, fitted: Iterable[tuple[int, BinArrays]], sizes: Sequence[int], num_bins: int, *,
              padded_rows: bool, refits: Refits | None) -> None:
        """Ranks' best-fit (padded rows: chunked) micro-batches: pending where they are at most ``num_bins``, else
        the rank does not fit (and they go to ``refits``, when given)."""
        self.split_by = (sizes, num_bins, padded_rows)
        for rank, bins in fitted:
            if len(bins.counts) <= num_bins:
                self.pending[rank] = bins
            elif refits is not None:
                refits[rank] = bins

    def failing(self) -> list[int]:
        """The ranks that do not fit, in order."""
        return [r for r, bins in enumerate(self.packed)
                if bins is None and not self.worst[r] and r not in self.pending]

    def lists(self) -> list[list[list[int]] | None]:
        """Every rank's micro-batches as lists (``None`` where it does not fit); the arrays are let go."""
        sizes, num_bins, padded_rows = self.split_by
        for r, bins in self.pending.items():
            self.packed[r] = split_owned(bins.bins(), sizes, num_bins, padded_rows=padded_rows,
                                         loads=bins.loads.tolist())
        self.pending = {}
        if self.worst.any():
            bins, per_rank = runs_of(self.members.tolist(), self.bin_counts), len(self.bin_counts) // len(self.worst)
            for r in np.flatnonzero(self.worst).tolist():
                self.packed[r] = bins[r * per_rank : (r + 1) * per_rank]
            self.worst = np.zeros(len(self.packed), dtype=bool)
            self.members, self.bin_counts = self.members[:0], self.bin_counts[:0]
        return self.packed

    def figures(self, size_array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each micro-batch's sample count, planned tokens and longest planned size, over every rank that fits, in
        no particular order: the lists', the worst-fit ranks' arrays, and the pending ranks' (:meth:`_pending`)."""
        fitting = list(chain.from_iterable(bins for bins in self.packed if bins is not None))
        parts = [micro_batch_arrays(fitting, size_array)]
        if self.worst.any():
            worst_counts = self.bin_counts.reshape(len(self.worst), -1)[self.worst].ravel()
            parts.append((worst_counts, None, *bin_figures(worst_counts, size_array[self.members])))
        if self.pending:
            parts.extend(self._pending(size_array))
        return tuple(np.concatenate([part[k] for part in parts]) for k in (0, 2, 3))

    def _pending(self, size_array: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        """The pending ranks' micro-batches once split, as :func:`micro_batch_arrays` of the split ones (only the
        bins a split may reach are made lists: a rank's ``num_bins - len`` fullest with two samples or more, in
        their order, split by :func:`split_owned` as it splits them among all) and the figures of the others."""
        sizes, num_bins, padded_rows = self.split_by
        pending = list(self.pending.values())
        counts = np.concatenate([bins.counts for bins in pending])
        fills, longest = bin_figures(counts, size_array[np.concatenate([bins.members for bins in pending])])
        kept, split, offset = np.ones(len(counts), dtype=bool), [], 0
        for bins in pending:
            splits, starts = num_bins - len(bins.counts), np.cumsum(bins.counts) - bins.counts
            multi = np.flatnonzero(bins.counts > 1)
            chosen = np.sort(multi[np.argsort(-bins.loads[multi], kind="stable")[:splits]]).tolist()
            kept[[offset + b for b in chosen]] = False
            members = [bins.members[starts[b] : starts[b] + bins.counts[b]].tolist() for b in chosen]
            split += split_owned(members, sizes, len(chosen) + splits, padded_rows=padded_rows,
                                 loads=bins.loads[chosen].tolist())
            offset += len(bins.counts)
        return [(counts[kept], None, fills[kept], longest[kept]), micro_batch_arrays(split, size_array)]


def chunk_ranks(ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int) -> list[BinArrays]:
    """Each rank's :func:`chunk_decreasing` micro-batches with their collated sizes: the half of
    :func:`pack_ranks` with ``padded_rows`` that does not depend on the count (:func:`split_chunks` does the rest)."""
    return _chunk_ranks(ranks, sizes, cap)


def split_chunks(chunks: Sequence[BinArrays], sizes: Sequence[int], num_bins: int) -> list[list[list[int]] | None]:
    """:func:`pack_ranks` with ``padded_rows`` at ``num_bins`` of the ranks whose :func:`chunk_ranks` are given."""
    packed = PackedRanks([None] * len(chunks))
    packed.defer(enumerate(chunks), sizes, num_bins, padded_rows=True, refits=None)
    return packed.lists()


def _chunk_ranks(ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int) -> list[BinArrays]:
    """:func:`chunk_decreasing` of every rank's items, with each chunk's collated size (its row count times its
    first, longest size), all ranks at once: step ``t`` cuts every rank's ``t``-th chunk."""
    counts, flat = flat_lists(ranks)
    flat_sizes = np.asarray(sizes, dtype=np.int64)[flat]
    order = _by_rank_longest(np.repeat(np.arange(len(ranks)), counts), flat_sizes, flat)
    ordered, ordered_sizes = flat[order], flat_sizes[order]
    ends = np.cumsum(counts)
    position, starts = ends - counts, []
    live = np.flatnonzero(position < ends)
    while len(live):
        starts.append(position[live])
        position[live] += np.maximum(1, cap // ordered_sizes[position[live]])
        live = live[position[live] < ends[live]]
    first = np.sort(np.concatenate(starts)) if starts else np.zeros(0, dtype=np.int64)
    per_rank = _chunks_per(first, ends)
    rows = np.minimum(first + np.maximum(1, cap // ordered_sizes[first]), np.repeat(ends, per_rank)) - first
    loads, spans = rows * ordered_sizes[first], np.cumsum(per_rank).tolist()
    return [BinArrays(members=ordered[e - c : e], counts=rows[a:b], loads=loads[a:b])
            for a, b, c, e in zip([0, *spans[:-1]], spans, counts.tolist(), ends.tolist())]


def flat_lists(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each list's item count and all lists' items laid end to end (lists given as NumPy arrays: joined); the
    lists are a rank's items or micro-batches."""
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    if lists and all(isinstance(items, np.ndarray) for items in lists):
        return counts, np.concatenate(lists).astype(np.int64, copy=False)
    return counts, np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=int(counts.sum()))


def _by_rank_longest(owner: np.ndarray, item_sizes: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``np.lexsort((ids, -item_sizes, owner))`` for distinct non-negative ``ids``: one sort of a key that packs
    the three into an int64 where their bits fit (distinct keys: any sort gives that order)."""
    if not len(ids):
        return np.zeros(0, dtype=np.int64)
    longest = int(item_sizes.max())
    id_bits, size_bits = int(ids.max()).bit_length(), longest.bit_length()
    if id_bits + size_bits + int(owner.max()).bit_length() > 62:
        return np.lexsort((ids, -item_sizes, owner))
    return np.argsort((owner << (size_bits + id_bits)) | ((longest - item_sizes) << id_bits) | ids)


def _chunks_per(first: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the chunk starts ``first`` (ascending) lie in each rank, the ranks ending at ``ends``."""
    return np.diff(np.searchsorted(first, ends, side="left"), prepend=0)


VECTOR_RANKS = 16
""":func:`pack_ranks` runs worst fit on all ranks at once from this many ranks."""


def _worst_fit_packed(
    ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int, num_bins: int, *, layout: Grid | None = None
) -> PackedRanks:
    """:func:`worst_fit_decreasing` of every rank (the ranks that fit as :class:`PackedRanks`' arrays, the others
    ``None``): step ``t`` hands every rank its ``t``-th longest item (ties in the rank's order), each to its
    lightest micro-batch (the first of equals), so the choices are the heap's (``layout``: :func:`_rank_grid` of
    the ranks, if known). Ranks that failed leave the step's arrays once they are a quarter of those still there."""
    flat_items, item_sizes, owner, column, grid = layout or _rank_grid(ranks, sizes)
    width, full = grid.shape[0], 1 << 62  # an oversize sample's micro-batch: full
    loads = np.zeros((len(ranks), num_bins), dtype=np.int64)  # the live ranks' micro-batches' loads
    failed = np.zeros(len(ranks), dtype=bool)
    chosen = np.zeros((width, len(ranks)), dtype=np.int64)  # step t's micro-batch (of its rank) per rank
    oversize = bool(np.any(item_sizes > cap))
    lead = min(width, num_bins) if int(item_sizes.min(initial=1)) > 0 else 0
    if lead:  # the first ``num_bins`` steps fill the empty micro-batches in order (bin ``t`` the first empty one)
        firsts = grid[:lead].T
        loads[:, :lead] = np.where(firsts > cap, full, firsts)
        chosen[:lead] = np.arange(lead)[:, None]
    live, dead = np.arange(len(ranks)), 0  # ranks still packed; how many of them have failed since
    for t in range(lead, width):
        size, rows = grid[t, live], np.arange(len(live))
        at = loads.argmin(axis=1)
        load = loads[rows, at] + size  # no item (0) adds nothing
        if oversize:
            over = size > cap
            fails = (size > 0) & np.where(over, load > size, load > cap)
            load[over] = full
        else:
            fails = load > cap
        loads[rows, at] = load
        chosen[t, live] = at
        fresh = fails & ~failed[live]
        if fresh.any():
            failed[live[fresh]] = True
            dead += int(np.count_nonzero(fresh))
        if 4 * dead >= len(live):  # drop the failed ranks: their micro-batches are never read
            keep = ~failed[live]
            live, loads, dead = live[keep], loads[keep], 0
            if not len(live):
                break
    if failed.all():
        return PackedRanks([None] * len(ranks))
    key = owner * num_bins + chosen[column, owner]
    if failed.any():  # a failed rank's bins are never read
        keep = ~failed[owner]
        flat_items, key = flat_items[keep], key[keep]
    key = key.astype(small_int(len(ranks) * num_bins))
    return PackedRanks([None] * len(ranks), worst=~failed, members=flat_items[np.argsort(key, kind="stable")],
                       bin_counts=np.bincount(key, minlength=len(ranks) * num_bins))


Grid = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
""":func:`_rank_grid`'s items, sizes, owning ranks, positions in their rank and step grid."""


def _rank_grid(ranks: Sequence[Sequence[int]], sizes: Sequence[int]) -> Grid:
    """All ranks' items by rank, then longest first (ties in the rank's order), with their sizes, ranks and
    positions in their rank, and the grid whose row ``t`` holds every rank's ``t``-th size (0: none)."""
    counts, flat_items = flat_lists(ranks)
    owner = np.repeat(np.arange(len(ranks)), counts)
    item_sizes = np.asarray(sizes, dtype=np.int64)[flat_items]
    longest = int(item_sizes.max(initial=0))
    order = np.argsort(owner * (longest + 1) + (longest - item_sizes), kind="stable")  # by rank, then longest
    flat_items, item_sizes = flat_items[order], item_sizes[order]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    column = np.arange(len(flat_items)) - np.repeat(starts, counts)
    grid = np.zeros((int(counts.max(initial=0)), len(ranks)), dtype=np.int64)
    grid[column, owner] = item_sizes
    return flat_items, item_sizes, owner, column, grid


def _grid_subset(layout: Grid, chosen: np.ndarray) -> Grid:
    """The :func:`_rank_grid` of the ranks where ``chosen`` is true, in order, from that of all ranks."""
    flat_items, item_sizes, owner, column, grid = layout
    keep = chosen[owner]
    renumber = np.cumsum(chosen) - 1
    width = int(column[keep].max(initial=-1)) + 1
    return flat_items[keep], item_sizes[keep], renumber[owner[keep]], column[keep], grid[:width, chosen]


def _gather_bins(flat_items: np.ndarray, key: np.ndarray, count: int) -> list[list[int]]:
    """The items of each of ``count`` bins (``key``: each item's bin), in ``flat_items``' order."""
    key = key.astype(small_int(count))
    members = flat_items[np.argsort(key, kind="stable")].tolist()
    return runs_of(members, np.bincount(key, minlength=count))


def runs_of(members: list[int], counts: np.ndarray) -> list[list[int]]:
    """``members`` cut into consecutive runs of ``counts`` items (the bounds made one at a time, not as a list)."""
    return [members[a:b] for a, b in pairwise(accumulate(counts.tolist(), initial=0))]


def best_fit_ranks(
    ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int, *, layout: Grid | None = None
) -> list[tuple[list[list[int]], list[int]]]:
    """:func:`best_fit_decreasing` of every rank, with its bins' token loads; all ranks at once with NumPy
    from :data:`VECTOR_RANKS` ranks: step ``t`` puts every rank's ``t``-th longest item in its open bin of
    least room that fits it (the first of equals), else a new bin, so the choices are the sorted list's
    (``layout``: :func:`_rank_grid` of the ranks, if known)."""
    if len(ranks) < VECTOR_RANKS:
        return [(bins, [sum(sizes[i] for i in b) for b in bins])
                for bins in (best_fit_decreasing(items, sizes, cap) for items in ranks)]
    return [(bins.bins(), bins.loads.tolist()) for bins in _best_fit_arrays(ranks, sizes, cap, layout=layout)]


def _best_fit_arrays(
    ranks: Sequence[Sequence[int]], sizes: Sequence[int], cap: int, *, layout: Grid | None = None
) -> list[BinArrays]:
    """:func:`best_fit_ranks` of at least :data:`VECTOR_RANKS` ranks, each rank's bins as :class:`BinArrays`."""
    flat_items, item_sizes, owner, column, grid = layout or _rank_grid(ranks, sizes)
    rows, counts = np.arange(len(ranks)), np.bincount(owner, minlength=len(ranks))
    kind = small_int(cap + 2)  # sizes over the cap count as cap + 1: they only ever open a bin
    unsigned = np.dtype(kind).str.replace("i", "u")  # room - size as unsigned: a bin too small wraps past the cap
    room = np.full((len(ranks), 16), -1, dtype=kind)  # a bin's room; -1: full, oversize or not opened
    opened, chosen, widest = np.zeros(len(ranks), dtype=np.int64), np.zeros(grid.shape, dtype=np.int64), 0
    clipped = np.minimum(grid, cap + 1).astype(kind)
    # a rank's rooms are at most the cap less its previous (no smaller) item: none fits where the two exceed it
    apart, done = np.ones(len(grid), dtype=bool), np.arange(1, len(grid))[:, None] >= counts  # done: no item
    apart[1:] = ((clipped[1:].astype(np.int64) + clipped[:-1] > cap) | done).all(axis=1)
    for t, size in enumerate(clipped):
        if widest and not apart[t]:  # the least room that fits is the least room left after the item, as unsigned
            gap = (room[:, :widest] - size[:, None]).view(unsigned)
            at = gap.argmin(axis=1)
            left = gap[rows, at].astype(kind)  # negative: no bin fits
            found = (left >= 0) & (size < cap)
        else:
            at, left, found = opened, np.zeros_like(size), np.zeros(len(ranks), dtype=bool)
        new = (counts > t) & ~found
        at = np.where(new, opened, at)
        opened += new
        widest = int(opened.max())
        if widest > room.shape[1]:
            room = np.concatenate((room, np.full_like(room, -1)), axis=1)
        left = np.where(found, left, cap - size)
        left[(left == 0) | (size >= cap)] = -1
        room[rows, at] = left  # a rank past its last item has no use for its rooms
        chosen[t] = at
    key = (owner * widest + chosen[column, owner]).astype(small_int(len(ranks) * widest))
    members = flat_items[np.argsort(key, kind="stable")]
    bin_counts = np.bincount(key, minlength=len(ranks) * widest)
    loads = np.bincount(key, weights=item_sizes, minlength=len(ranks) * widest).astype(np.int64)
    ends = np.cumsum(counts)
    return [BinArrays(members=members[e - c : e], counts=bin_counts[r * widest : r * widest + n],
                      loads=loads[r * widest : r * widest + n])
            for r, (n, c, e) in enumerate(zip(opened.tolist(), counts.tolist(), ends.tolist()))]


class BinArrays:
    """Micro-batches as arrays: their samples micro-batch by micro-batch (``members``), each one's sample count
    (``counts``) and collated size (``loads``); :meth:`bins` as lists."""

    __slots__ = ("members", "counts", "loads")

    def __init__(self, *, members: np.ndarray, counts: np.ndarray, loads: np.ndarray) -> None:
        self.members, self.counts, self.loads = members, counts, loads

    @classmethod
    def of(cls, bins: Sequence[Sequence[int]], loads: Sequence[int]) -> BinArrays:
        """The arrays of micro-batches given as lists, with their collated sizes."""
        counts = np.fromiter(map(len, bins), dtype=np.int64, count=len(bins))
        members = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=int(counts.sum()))
        return cls(members=members, counts=counts, loads=np.asarray(loads, dtype=np.int64))

    def bins(self) -> list[list[int]]:
        """The micro-batches as lists of sample ids."""
        return runs_of(self.members.tolist(), self.counts)


def small_int(count: int) -> type:
    """The smallest NumPy integer type that holds ``0 .. count - 1`` (a stable sort of it is a radix sort)."""
    return np.int16 if count <= 2**15 else np.int32 if count <= 2**31 else np.int64


def _split_rows(items: Sequence[int], sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """Split a padded-rows bin into its longest samples and the rest, at the cut with the smaller
    larger part (``j`` rows of the longest size vs. the rest's rows of theirs; the first such cut)."""
    ordered = sorted(items)
    ordered.sort(key=sizes.__getitem__, reverse=True)  # stable: longest first, ties by id
    if len(ordered) == 2:
        return ordered[:1], ordered[1:]
    lengths = list(map(sizes.__getitem__, ordered))
    count, longest = len(ordered), lengths[0]
    cut, best = 1, None
    for j in range(1, count):
        first, rest = j * longest, (count - j) * lengths[j]
        part = first if first > rest else rest
        if best is None or part < best:
            cut, best = j, part
    return ordered[:cut], ordered[cut:]


def _halve(items: Sequence[int], sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """Split a bin into two of near-equal tokens (greedy on sizes, largest first)."""
    first: list[int] = []
    second: list[int] = []
    load_first = load_second = 0
    for item in sorted(items, key=sizes.__getitem__, reverse=True):  # stable: ties keep their order
        if load_first <= load_second:
            first.append(item)
            load_first += sizes[item]
        else:
            second.append(item)
            load_second += sizes[item]
    return first, second


def target_bin(fills: Sequence[int], room: Sequence[int], size: int) -> int:
    """Where a sample of ``size`` tokens joins a rank's micro-batches: the first empty one (empties are
    only for ranks short of samples), else the first with ``room`` for it."""
    empty = next((b for b, fill in enumerate(fills) if fill == 0), None)
    return empty if empty is not None else next(b for b, r in enumerate(room) if r >= size)

