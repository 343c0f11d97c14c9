"""NeMo-RL's sequence packing: modified first-fit decreasing over the global batch, bins round-robin.

Read at NVIDIA-NeMo/RL commit 7ea279abfbeb698b092856d0dab61e7cf39bc909:

- ``nemo_rl/data/packing/algorithms.py``, ``ModifiedFirstFitDecreasingPacker._pack_implementation``
  (the recommended packer; Johnson & Garey): large items (> C/2) open one bin each, in
  descending order; each large bin takes the first (largest) medium item (> C/3) that fits;
  walking the large bins backwards, a bin without a medium item takes the smallest small item
  (> C/6) and the largest small item that fits beside it; each large bin is then filled greedily
  with the largest remaining items that fit; what is left goes, largest first, into the least
  filled leftover bin if it fits there, else into a new one (the "O(n log n)" phase 5 keeps the
  bins sorted by fill, so this is worst-fit decreasing).
- ``SequencePacker._adjust_bin_count`` with ``min_bin_count = bin_count_multiple = dp``: new empty
  bins are filled by popping the last sequence of the bins with the most sequences.
- ``nemo_rl/distributed/batched_data_dict.py``, ``BatchedDataDict.shard_by_batch_size``: each
  global batch is packed on its own and rank ``r`` takes bins ``r, r + dp, ...`` in packer order.

Not modelled: the per-sequence padding to ``sequence_length_pad_multiple`` and, with pipeline
parallelism, the padding of every packed micro-batch to the longest (both cost NeMo-RL more
than this plan shows). Where NeMo-RL raises (a sample longer than the cap; fewer samples than
``dp``) this plan puts the long sample alone in a bin and pads with empty bins. NeMo-RL does not
align the count to Megatron's VPP rule; where it is not legal, ranks run empty micro-batches
at the end.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from megatron_dpsched.baselines.partition import pad_to_legal, round_up
from megatron_dpsched.core.config import RankPlan, ScheduleConfig

Item = tuple[int, int]
"""(position in the step, length)."""


def nemo_rl_plan(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """MFFD, bin count adjusted to a multiple of ``dp``, bins dealt round-robin (module docstring)."""
    dp = config.dp_size
    bins = modified_first_fit_decreasing([sizes[i] for i in step], config.token_cap)
    bins = adjust_bin_count(bins, dp)
    ranks = [[[step[p] for p in b] for b in bins[r::dp]] for r in range(dp)]
    return pad_to_legal(ranks, config.layout)


def modified_first_fit_decreasing(lengths: Sequence[int], cap: int) -> list[list[int]]:
    """Bins of positions into ``lengths``, in packer order: the large-item bins, then the leftover bins."""
    items = list(enumerate(lengths))
    large = sorted((it for it in items if it[1] > cap / 2), key=lambda it: -it[1])
    medium = sorted((it for it in items if cap / 3 < it[1] <= cap / 2), key=lambda it: -it[1])
    small = sorted((it for it in items if cap / 6 < it[1] <= cap / 3), key=lambda it: it[1])
    tiny = sorted((it for it in items if it[1] <= cap / 6), key=lambda it: it[1])
    bins: list[list[Item]] = [[it] for it in large]
    _add_one_medium(bins, medium, cap)
    _add_small_pairs(bins, small, cap)
    rest = sorted(medium + small + tiny, key=lambda it: -it[1])
    _fill_greedily(bins, rest, cap)
    bins.extend(_worst_fit_decreasing(rest, cap))
    return [[p for p, _ in b] for b in bins if b]


def _room(bin_items: list[Item], cap: int) -> int:
    return cap - sum(size for _, size in bin_items)


def _add_one_medium(bins: list[list[Item]], medium: list[Item], cap: int) -> None:
    for b in bins:
        pick = _first_fitting(medium, _room(b, cap))
        if pick is not None:
            b.append(medium.pop(pick))


def _first_fitting(descending: list[Item], room: int) -> int | None:
    """Position of the first (largest) item of a list sorted by size descending that fits ``room``."""
    low, high = 0, len(descending)
    while low < high:
        middle = (low + high) // 2
        if descending[middle][1] <= room:
            high = middle
        else:
            low = middle + 1
    return low if low < len(descending) else None


def _add_small_pairs(bins: list[list[Item]], small: list[Item], cap: int) -> None:
    """Backwards over the bins: one without a medium item takes the smallest small item and the
    largest small item that fits beside it."""
    for b in reversed(bins):
        if len(small) < 2 or any(cap / 3 < size <= cap / 2 for _, size in b):
            continue
        room = _room(b, cap)
        if small[0][1] + small[1][1] > room:
            continue
        first = small.pop(0)
        second = max(k for k, (_, size) in enumerate(small) if size <= room - first[1])
        b.extend([first, small.pop(second)])


def _fill_greedily(bins: list[list[Item]], rest: list[Item], cap: int) -> None:
    """Each bin in turn takes the largest remaining item that fits until none does."""
    for b in bins:
        room = _room(b, cap)
        pick = _first_fitting(rest, room)
        while pick is not None:
            item = rest.pop(pick)
            b.append(item)
            room -= item[1]
            pick = _first_fitting(rest, room)


def _worst_fit_decreasing(rest: list[Item], cap: int) -> list[list[Item]]:
    """Largest first into the least-filled bin if it fits there, else a new bin; bins kept by fill."""
    bins: list[list[Item]] = [[]]
    fills = [0]
    for item in sorted(rest, key=lambda it: -it[1]):
        if item[1] <= cap - fills[0]:
            target, fill = bins.pop(0), fills.pop(0)
        else:
            target, fill = [], 0
        target.append(item)
        at = bisect_right(fills, fill + item[1])
        bins.insert(at, target)
        fills.insert(at, fill + item[1])
    return bins


def adjust_bin_count(bins: list[list[int]], multiple: int) -> list[list[int]]:
    """At least ``multiple`` bins and a multiple of it: each new bin gets the last sequence of the
    bin with the most sequences that still has two; empty when no bin has two."""
    target = round_up(len(bins), multiple)
    out = [list(b) for b in bins]
    donors = sorted(((len(b), i) for i, b in enumerate(bins)), reverse=True)
    position = 0
    for _ in range(target - len(bins)):
        while position < len(donors) and len(out[donors[position][1]]) < 2:
            position += 1
        out.append([out[donors[position][1]].pop()] if position < len(donors) else [])
    return out
