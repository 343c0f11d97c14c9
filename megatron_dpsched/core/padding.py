"""Planned sizes: what collate makes of a sample and of a micro-batch (spec, "Planned sizes").

A sample's planned size is its length rounded up to ``pad_multiple`` (the multiple collate pads
every sequence to). A micro-batch's collated size is the sum of its samples' planned sizes
(packed ``thd``), or with ``padded_rows`` (``bshd``: one row per sample, every row as long as the
longest) its sample count times its longest planned size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from itertools import chain

import numpy as np


def planned_sizes(lengths: Sequence[int], *, pad_multiple: int) -> tuple[int, ...]:
    """Every length rounded up to a multiple of ``pad_multiple`` (the lengths themselves for 1)."""
    if pad_multiple == 1:
        return tuple(lengths)
    return tuple(-(-length // pad_multiple) * pad_multiple for length in lengths)


class ArrayTuple(tuple):
    """A tuple of Python numbers with the NumPy array of the same values: ``np.asarray`` (and ``np.array``)
    read the array instead of converting the tuple again (a copy for ``np.array``, another dtype converted).
    The array is read-only; the tuple's items stay the Python numbers given (Python sums and keys of them
    are unchanged)."""

    values: np.ndarray

    def __new__(cls, items: Sequence[float], values: np.ndarray) -> ArrayTuple:
        made = super().__new__(cls, items)
        assert len(made) == len(values), (len(made), len(values))
        values = values.view()
        values.flags.writeable = False
        made.values = values
        return made

    def __reduce__(self) -> tuple[type[ArrayTuple], tuple[tuple[float, ...], np.ndarray]]:
        return ArrayTuple, (tuple(self), self.values)

    @cached_property
    def floats(self) -> bool:
        """Whether every item is a Python ``float`` (checked once)."""
        return not set(map(type, self)) - {float}

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        values = self.values
        if dtype is not None and values.dtype != np.dtype(dtype):
            return values.astype(dtype)
        return values.copy() if copy else values


def all_floats(values: Sequence[object]) -> bool:
    """Whether every value is a Python ``float`` (an :class:`ArrayTuple` answers from its check, made once)."""
    return values.floats if isinstance(values, ArrayTuple) else not set(map(type, values)) - {float}


def array_tuple(values: Sequence[float], dtype: type) -> ArrayTuple:
    """``values`` as an :class:`ArrayTuple` of that NumPy ``dtype`` (themselves if they are one)."""
    if isinstance(values, ArrayTuple) and values.values.dtype == np.dtype(dtype):
        return values
    return ArrayTuple(values, np.fromiter(values, dtype=dtype, count=len(values)))


def array_slice(values: Sequence[float], start: int, stop: int) -> Sequence[float]:
    """``values[start:stop]``; of an :class:`ArrayTuple` an :class:`ArrayTuple` with its array's slice (no
    conversion)."""
    if isinstance(values, ArrayTuple):
        return ArrayTuple(values[start:stop], values.values[start:stop])
    return values[start:stop]


def step_sizes(lengths: Sequence[int], *, pad_multiple: int) -> ArrayTuple:
    """:func:`planned_sizes` of a step as an :class:`ArrayTuple` (int64 values); one conversion of ``lengths``
    (none when they are an :class:`ArrayTuple` and ``pad_multiple`` is 1)."""
    if pad_multiple == 1:
        return array_tuple(lengths, np.int64)
    values = -(-np.asarray(array_tuple(lengths, np.int64)) // pad_multiple) * pad_multiple
    return ArrayTuple(shared_ints(values), values)


def shared_ints(values: np.ndarray) -> list[int]:
    """``values.tolist()`` (non-negative int64), one Python int per distinct value shared by its entries where the
    values span at most ``4 * len(values) + 65536`` integers (a million planned sizes then take a few MiB, not
    one object each)."""
    high = int(values.max(initial=0))
    if not len(values) or int(values.min()) < 0 or high > 4 * len(values) + 65536:
        return values.tolist()
    return np.arange(high + 1).astype(object)[values].tolist()


def collated_size(items: Sequence[int], sizes: Sequence[int], *, padded_rows: bool) -> int:
    """Tokens of the collated micro-batch ``items`` (planned ``sizes``); 0 for an empty one."""
    if not items:
        return 0
    if padded_rows:
        return len(items) * max(sizes[i] for i in items)
    return sum(map(sizes.__getitem__, items))


def room(*, count: int, fill: int, longest: int, cap: int, padded_rows: bool) -> int:
    """The largest planned size that may still join a micro-batch of ``count`` samples, ``fill`` planned tokens
    and longest planned size ``longest`` under ``cap`` (an empty one: 0, 0, 0); 0 or less when none may.

    Padded rows: one more row fits iff ``(count + 1) * max(longest, size) <= cap``, that is iff
    ``(count + 1) * longest <= cap`` and ``size <= cap // (count + 1)``.
    """
    if padded_rows:
        rows = count + 1
        return cap // rows if rows * longest <= cap else 0
    return cap - fill


def pad_multiple_for(
    *, tensor_parallel_size: int, context_parallel_size: int, sequence_parallel: bool, gemm_alignment: int = 1
) -> int:
    """The sequence-length multiple Megatron needs: ``2 * CP`` chunks, times TP with sequence parallelism
    (megatron-core 0.19's rule, ``models/multimodal/context_parallel.get_padding``), and a multiple of
    ``gemm_alignment`` (the FP8/FP4 GEMM alignment, :func:`gemm_alignment_for`; their least common multiple:
    megatron-core's rule pads for FP8 only without CP and SP, this never pads less)."""
    multiple = 2 * context_parallel_size if context_parallel_size > 1 else 1
    if sequence_parallel:
        multiple *= tensor_parallel_size
    return math.lcm(multiple, gemm_alignment)


def gemm_alignment_for(*, fp8: str | None = None, fp8_recipe: str | None = None, fp4: str | None = None) -> int:
    """Token multiple of megatron-core 0.19's low-precision GEMMs: ``--fp8-format`` 16 (32 with
    ``--fp8-recipe mxfp8``, ``fp8_utils.get_fp8_align_size``), ``--fp4-format`` 32
    (``fp4_utils.get_fp4_align_size``); 1 in higher precision."""
    if fp8:
        return 32 if fp8_recipe == "mxfp8" else 16
    return 32 if fp4 else 1


def rooms(*, counts: np.ndarray, fills: np.ndarray, longest: np.ndarray, cap: int, padded_rows: bool) -> np.ndarray:
    """:func:`room` of many micro-batches at once (NumPy arrays of their sample counts, fills and longest sizes)."""
    if padded_rows:
        rows = counts + 1
        return np.where(rows * longest <= cap, cap // rows, 0)
    return cap - fills


def widest_rooms(rooms: np.ndarray, first: Sequence[int]) -> np.ndarray:
    """Each rank's widest room, the largest of ``rooms`` over its micro-batches (rank ``r``'s from ``first[r]`` to
    ``first[r + 1]``), 0 where none is left or the rank has none: one NumPy pass."""
    first = np.asarray(first, dtype=np.int64)
    widest = np.zeros(len(first) - 1, dtype=np.int64)
    some = first[1:] > first[:-1]  # ranks with micro-batches: their runs of ``rooms`` start at ``first``
    if some.any():
        widest[some] = np.maximum.reduceat(rooms, first[:-1][some])
    return np.maximum(widest, 0)


def collated_sizes(bins: Sequence[Sequence[int]], sizes: Sequence[int], *, padded_rows: bool) -> list[int]:
    """:func:`collated_size` of every micro-batch of ``bins``, with NumPy (the samples' sizes read from an array of
    all sizes where the bins hold at least a quarter of the samples)."""
    counts = np.fromiter(map(len, bins), dtype=np.int64, count=len(bins))
    total = int(counts.sum())
    if isinstance(sizes, np.ndarray) or 4 * total >= len(sizes):
        flat = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=total)
        flat_sizes = np.asarray(sizes, dtype=np.int64)[flat]
    else:
        flat_sizes = np.fromiter(map(sizes.__getitem__, chain.from_iterable(bins)), dtype=np.int64, count=total)
    return collated_of(counts, flat_sizes, padded_rows=padded_rows).tolist()


def collated_of(counts: np.ndarray, flat_sizes: np.ndarray, *, padded_rows: bool) -> np.ndarray:
    """:func:`collated_size` of micro-batches laid end to end: their sample counts and their samples' sizes."""
    fills, longest = bin_figures(counts, flat_sizes)
    return longest * counts if padded_rows else fills


def bin_figures(counts: np.ndarray, flat_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each micro-batch's planned tokens and longest planned size (0 for an empty one), from the micro-batches'
    sample counts and their samples' planned sizes laid end to end."""
    fills, longest = np.zeros(len(counts), dtype=np.int64), np.zeros(len(counts), dtype=np.int64)
    filled = counts > 0
    if len(flat_sizes):  # a filled micro-batch's samples run to the next filled one's start
        starts = (np.cumsum(counts) - counts)[filled]
        fills[filled] = np.add.reduceat(flat_sizes, starts)
        longest[filled] = np.maximum.reduceat(flat_sizes, starts)
    return fills, longest


def micro_batch_arrays(bins: Sequence[Sequence[int]], sizes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each micro-batch's sample count, its samples (all micro-batches' in a row), planned tokens and longest
    planned size (0 for an empty one), from one pass over ``bins`` (``sizes``: every sample's, as an array)."""
    counts = np.fromiter(map(len, bins), dtype=np.int64, count=len(bins))
    flat = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=int(counts.sum()))
    return counts, flat, *bin_figures(counts, sizes[flat])


def gather_runs(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The runs ``values[start : start + count]``, in the order given, laid end to end (a plan's micro-batches
    reordered from where their samples lie)."""
    ends = np.cumsum(counts)
    index = np.repeat(starts - (ends - counts), counts)
    index += np.arange(len(index))
    return values[index]
