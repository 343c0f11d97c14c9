"""The NumPy and :mod:`bisect` work of the decreasing packers of :mod:`~megatron_dpsched.core.packing`:
the items and their sizes as arrays, their order by decreasing size (a radix sort where the sizes allow),
best-fit decreasing's placements (:func:`best_fit_owners`) and the chunks of padded rows
(:func:`chunk_starts`). Rooms and sizes are integers, so the open micro-batches sit in sorted lists searched
at C speed, and the work is per distinct size and room, not per item.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

import numpy as np


class BestFitRuns:
    """Best fit of items in decreasing size, one size at a time: the open micro-batches' ids by room (each
    room's ids ascending, every room above 0), the rooms ascending, and the placements as runs (a micro-batch
    and how many items in a row it takes)."""

    def __init__(self, cap: int, *, rooms: list[int], by_room: dict[int, list[int]], count: int) -> None:
        self.cap, self.count = cap, count
        self.rooms, self.by_room = rooms, by_room
        self.run_bins: list[int] = []
        self.run_lengths: list[int] = []

    def _add(self, room: int, bins: list[int]) -> None:
        """Open micro-batches ``bins`` (ascending) now have ``room`` (closed at 0)."""
        if room <= 0:
            return
        held = self.by_room.get(room)
        if held is None:
            insort(self.rooms, room)
            self.by_room[room] = bins
        elif held[-1] < bins[0]:
            held += bins
        else:  # two ascending runs: Timsort merges them in one pass
            held += bins
            held.sort()

    def _take(self, room: int, count: int, at: int) -> list[int]:
        """The first ``count`` micro-batches of ``room`` (at ``at`` in the rooms), no longer there."""
        held = self.by_room[room]
        if count < len(held):
            taken = held[:count]
            del held[:count]
            return taken
        del self.by_room[room]
        del self.rooms[at]
        return held

    def place(self, size: int, count: int) -> None:
        """Place ``count`` items of one ``size`` (``0 < size < cap``) as one-by-one best fit would: a
        micro-batch of room ``r``, the least that fits, takes ``r // size`` in a row (it stays the least that
        fits until it no longer fits), the rest go to new micro-batches of ``cap // size`` each."""
        rooms, run_bins, run_lengths = self.rooms, self.run_bins, self.run_lengths
        at = bisect_left(rooms, size)
        while count and at < len(rooms):
            room = rooms[at]
            each = room // size
            if each > count:  # the first of this room takes the rest
                (last,) = self._take(room, 1, at)
                run_bins.append(last)
                run_lengths.append(count)
                self._add(room - count * size, [last])
                return
            full = self._take(room, count // each, at)
            run_bins += full
            run_lengths += [each] * len(full)
            count -= len(full) * each
            self._add(room - each * size, full)
            at = bisect_left(rooms, room)
        if count:
            self._open(size, count)

    def _open(self, size: int, count: int) -> None:
        """``count`` items of ``size`` into new micro-batches, ``cap // size`` each (the last the rest)."""
        each = self.cap // size
        fresh = -(-count // each)
        first, rest = self.count, count - (fresh - 1) * each
        self.run_bins += range(first, first + fresh)
        self.run_lengths += [each] * (fresh - 1)
        self.run_lengths.append(rest)
        self.count += fresh
        if fresh > 1:
            self._add(self.cap - each * size, list(range(first, first + fresh - 1)))
        self._add(self.cap - rest * size, [first + fresh - 1])

    def place_runs(self, sizes: list[int], counts: list[int]) -> None:
        """Place runs of ``counts[k]`` items of ``sizes[k]`` (decreasing): a long run by :meth:`place`, a short
        one item by item (one bisect, one insort: most sizes of a short step come once or twice)."""
        rooms, by_room, run_bins, run_lengths = self.rooms, self.by_room, self.run_bins, self.run_lengths
        for size, count in zip(sizes, counts):
            if not size:
                self.place_zeros(count)
            elif count > 3:
                self.place(size, count)
            else:
                for _ in range(count):
                    at = bisect_left(rooms, size)
                    if at < len(rooms):
                        room = rooms[at]
                        held = by_room[room]
                        target = held[0]
                        if len(held) == 1:
                            del by_room[room], rooms[at]
                        else:
                            del held[0]
                    else:
                        room, target = self.cap, self.count
                        self.count += 1
                    run_bins.append(target)
                    run_lengths.append(1)
                    room -= size
                    if room > 0:
                        held = by_room.get(room)
                        if held is None:
                            insort(rooms, room)
                            by_room[room] = [target]
                        else:
                            insort(held, target)

    def place_zeros(self, count: int) -> None:
        """Items of size 0 all go to the open micro-batch of least room (the first opened of those), else to a
        new one (which stays open with the whole cap)."""
        if self.rooms:
            target = self.by_room[self.rooms[0]][0]
        else:
            target = self.count
            self.count += 1
            self._add(self.cap, [target])
        self.run_bins.append(target)
        self.run_lengths.append(count)

    def owners(self) -> np.ndarray:
        """Each placed item's micro-batch, in placing order."""
        return np.repeat(np.array(self.run_bins, dtype=np.int64), np.array(self.run_lengths, dtype=np.int64))


def best_fit_owners(ordered_sizes: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing of sizes already in decreasing order: each item's micro-batch (ids in opening order)
    and how many were opened.

    No item over half the cap (or of at least the cap) fits with an earlier one, so those open one each at
    once, with NumPy; the rest go one size at a time (:class:`BestFitRuns`)."""
    alone = int(np.count_nonzero((2 * ordered_sizes > cap) | (ordered_sizes >= cap)))
    rooms = cap - ordered_sizes[:alone]
    first = int(np.searchsorted(rooms, 1))  # rooms rise along the prefix; those at 0 or below are closed
    values, firsts, counts = np.unique(rooms[first:], return_index=True, return_counts=True)
    firsts += first
    by_room = dict(zip(values.tolist(), map(list, map(range, firsts.tolist(), (firsts + counts).tolist()))))
    runs = BestFitRuns(cap, rooms=values.tolist(), by_room=by_room, count=alone)
    rest = ordered_sizes[alone:]
    starts = np.flatnonzero(np.diff(rest, prepend=-1))  # where each size's run begins
    runs.place_runs(rest[starts].tolist(), np.diff(starts, append=len(rest)).tolist())
    owners = np.concatenate([np.arange(alone, dtype=np.int64), runs.owners()])
    return owners, runs.count


def item_arrays(items: Sequence[int], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``items`` and their sizes as int64 arrays (a slice of ``sizes`` for a range of ids)."""
    if isinstance(items, range) and items.step == 1 and 0 <= items.start and items.stop <= len(sizes):
        ids = np.arange(items.start, max(items.start, items.stop), dtype=np.int64)
        return ids, np.asarray(sizes[items.start : items.start + len(ids)], dtype=np.int64)
    if isinstance(items, np.ndarray):
        ids = items.astype(np.int64)
        items = ids.tolist()
    else:
        ids = np.fromiter(items, dtype=np.int64)
    return ids, np.fromiter(map(sizes.__getitem__, items), dtype=np.int64, count=len(ids))


def decreasing_order(sizes: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """The stable order of ``sizes`` by decreasing size (ties: by ``ids``, then as given); a radix sort when
    the sizes span fewer than 2**16 values."""
    first = None
    if ids is not None and len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        first = np.argsort(ids, kind="stable")
        sizes = sizes[first]
    top = int(sizes.max(initial=0))
    if top - int(sizes.min(initial=top)) < 2**16:
        order = np.argsort((top - sizes).astype(np.uint16), kind="stable")
    else:
        order = np.argsort(-sizes, kind="stable")
    return order if first is None else first[order]


def chunk_starts(ordered_sizes: np.ndarray, cap: int) -> list[int]:
    """Where each chunk of sizes in decreasing order starts when a chunk whose first size is ``m`` takes
    ``max(1, cap // m)`` (a size of 0 counts as 1). That count only grows along the sizes, so the starts in
    each run of one count are a range with that step: one :class:`range` per distinct count."""
    rows = np.maximum(1, cap // np.maximum(ordered_sizes, 1))
    runs = np.flatnonzero(np.diff(rows, prepend=0))
    starts: list[int] = []
    position = 0
    for end, step in zip([*runs[1:].tolist(), len(rows)], rows[runs].tolist()):
        if position < end:
            chunk = range(position, end, step)
            starts += chunk
            position = chunk[-1] + step
    return starts
