"""Megatron's indexed dataset files (``PREFIX.idx`` + ``PREFIX.bin``) read and validated with numpy alone.

:func:`read_index_file` reads an ``.idx`` as megatron-core writes it (header ``MMIDIDX``, version 1, dtype
code, sequence and document counts, then the sequence lengths, byte pointers and document indices) and refuses
anything else in one line naming the file, before megatron-core (whose reader asserts, and whose ``__del__``
then raises again) sees it. :func:`check_bin_size` compares the ``.bin`` size with what the index says it holds.

:func:`scan_sequences` reads a ``.bin`` once, in order: for every sequence its largest value and a 64-bit
blake2b of its bytes (what a read compares, so a sequence changed under a running job is named), with the
values checked (token ids not negative; a sidecar mask only 0 and 1), and a checksum of every byte of the file
(the job identity's content checksum). The result is cached beside the ``.bin`` (or in ``DPSCHED_CACHE_DIR``)
as a length index is (:mod:`.line_index`), so a later start reads only the arrays.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from megatron_dpsched.data.line_index import file_digest, file_stamp, index_path, load_stored, store

HEADER = b"MMIDIDX\x00\x00"
"""The first bytes of a megatron-core ``.idx``."""
HEADER_BYTES = 34
"""Header, version (8), dtype code (1), sequence count (8), document count (8)."""
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
"""megatron-core's dtype codes."""
BATCH_BYTES = 8 << 20
"""Bytes of sequences checked per numpy call while scanning."""
SCAN_VERSION = 1
ScanKind = Literal["tokens", "mask"]


@dataclass(frozen=True, kw_only=True, slots=True)
class IndexFile:
    """What an ``.idx`` says of its ``.bin``."""

    path: Path
    """The ``.idx`` file."""
    dtype: np.dtype
    """The dtype of the values in the ``.bin``."""
    lengths: np.ndarray
    """int32 length (values) of each sequence."""
    pointers: np.ndarray
    """int64 byte offset of each sequence in the ``.bin``."""

    @property
    def bin_bytes(self) -> int:
        """The bytes the ``.bin`` must hold (the end of its furthest sequence)."""
        if not self.lengths.size:
            return 0
        return int((self.pointers + self.lengths.astype(np.int64) * self.dtype.itemsize).max())


def read_index_file(idx_path: str | Path) -> IndexFile:
    """The ``.idx`` at ``idx_path``; ``ValueError`` naming it if it is not one megatron-core wrote whole."""
    path = Path(idx_path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:9] != HEADER or int.from_bytes(head[9:17], "little") != 1:
        raise ValueError(f"{path} is not a Megatron index (no MMIDIDX version-1 header; truncated or another file)")
    code = head[17]
    if code not in DTYPES:
        raise ValueError(f"{path}: unknown dtype code {code} (megatron-core knows {sorted(DTYPES)})")
    sequences, documents = int.from_bytes(head[18:26], "little"), int.from_bytes(head[26:34], "little")
    needed = HEADER_BYTES + 12 * sequences + 8 * documents
    if size < needed:
        raise ValueError(f"{path} holds {size} bytes; its header promises {sequences} sequences and {documents} "
                         f"documents ({needed} bytes): truncated or corrupt")
    lengths = np.fromfile(path, dtype=np.int32, count=sequences, offset=HEADER_BYTES)
    pointers = np.fromfile(path, dtype=np.int64, count=sequences, offset=HEADER_BYTES + 4 * sequences)
    if sequences and (int(lengths.min()) < 0 or int(pointers.min()) < 0):
        raise ValueError(f"{path} holds negative sequence lengths or pointers: corrupt")
    return IndexFile(path=path, dtype=np.dtype(DTYPES[code]), lengths=lengths, pointers=pointers)


def check_bin_size(bin_path: Path, index: IndexFile) -> None:
    """Raise unless ``bin_path`` holds every byte ``index`` points at."""
    size = bin_path.stat().st_size
    if size < index.bin_bytes:
        raise ValueError(f"{bin_path} holds {size} bytes; {index.path.name} says its {index.lengths.size} sequences "
                         f"end at byte {index.bin_bytes}: the .bin is truncated or belongs to another index")


@dataclass(frozen=True, kw_only=True, slots=True)
class Scan:
    """What one pass over a ``.bin`` found."""

    extremes: np.ndarray
    """int64 largest value of each sequence."""
    digests: np.ndarray
    """uint64 :func:`sequence_digest` of each sequence as stored."""
    checksum: str
    """The job identity's checksum of every byte of the ``.bin`` (size included)."""
    rebuilt: bool
    """Whether this open read the ``.bin`` (``False``: from the cache)."""


def sequence_digest(values: np.ndarray | memoryview) -> int:
    """64-bit blake2b of a sequence's bytes as stored."""
    return int.from_bytes(hashlib.blake2b(values, digest_size=8).digest(), "little")


def scan_sequences(bin_path: Path, index: IndexFile, *, kind: ScanKind) -> Scan:
    """The :class:`Scan` of ``bin_path`` (cached while the ``.bin`` and ``.idx`` are unchanged); a bad value raises
    ``ValueError`` naming the file and the sequence."""
    if index.dtype.kind == "f":
        raise ValueError(f"{bin_path}: {index.path.name} says it holds {index.dtype} values, not integer "
                         f"{'token ids' if kind == 'tokens' else '0/1 mask values'}")
    idx = index.path.stat()
    stamp = file_stamp(bin_path, f"indexed-{kind}-v{SCAN_VERSION}:{idx.st_size}:{idx.st_mtime_ns}")
    cache = index_path(bin_path)
    stored = load_stored(cache, stamp, ("extremes", "digests"))
    if stored is not None:
        return Scan(extremes=stored["extremes"], digests=stored["digests"], checksum=str(stored["checksum"]),
                    rebuilt=False)
    scan = _read_bin(bin_path, index, kind=kind)
    if file_stamp(bin_path, stamp["kind"]) == stamp:  # not changed while it was read
        store(cache, {"extremes": scan.extremes, "digests": scan.digests, "checksum": np.array(scan.checksum)},
              stamp)
    return scan


def _read_bin(bin_path: Path, index: IndexFile, *, kind: ScanKind) -> Scan:
    """One pass over ``bin_path`` in byte order, a batch of sequences (about :data:`BATCH_BYTES`) at a time."""
    size = bin_path.stat().st_size
    checksum = file_digest(size)
    count = index.lengths.size
    extremes, digests = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.uint64)
    done = 0  # bytes of the file folded into the checksum
    with open(bin_path, "rb") as handle:
        for batch in _batches(index, np.argsort(index.pointers, kind="stable")):
            low = int(index.pointers[batch].min())
            high = int((index.pointers[batch] + index.lengths[batch].astype(np.int64) * index.dtype.itemsize).max())
            if low > done:  # bytes no sequence points at
                checksum.update(os.pread(handle.fileno(), low - done, done))
                done = low
            block = os.pread(handle.fileno(), high - low, low)
            checksum.update(memoryview(block)[done - low:])
            done = max(done, high)
            extremes[batch], digests[batch] = _check_batch(memoryview(block), low, index, batch, kind=kind,
                                                           where=bin_path)
        handle.seek(done)  # bytes after the last sequence
        for chunk in iter(lambda: handle.read(BATCH_BYTES), b""):
            checksum.update(chunk)
    return Scan(extremes=extremes, digests=digests, checksum=checksum.hexdigest(), rebuilt=True)


def _batches(index: IndexFile, order: np.ndarray) -> list[np.ndarray]:
    """Sequences in byte order, cut into batches of about :data:`BATCH_BYTES`."""
    nbytes = np.cumsum(index.lengths[order].astype(np.int64) * index.dtype.itemsize)
    cuts = np.searchsorted(nbytes, np.arange(BATCH_BYTES, int(nbytes[-1]) if nbytes.size else 0, BATCH_BYTES))
    return [part for part in np.split(order, np.unique(cuts)) if part.size]


def _check_batch(view: memoryview, base: int, index: IndexFile, batch: np.ndarray, *, kind: ScanKind,
                 where: Path) -> tuple[np.ndarray, list[int]]:
    """The largest value and the digest of each sequence of ``batch`` (ascending byte order; ``view`` holds the
    file's bytes from ``base`` to the batch's end), values checked."""
    itemsize = index.dtype.itemsize
    starts, counts = index.pointers[batch] - base, index.lengths[batch].astype(np.int64)
    ends = starts + counts * itemsize
    digests = [sequence_digest(view[begin:end]) for begin, end in zip(starts.tolist(), ends.tolist())]
    if not (np.all(starts[1:] == ends[:-1]) and np.all(counts > 0)):  # gaps, overlaps or empty sequences
        extremes = [_extreme(np.frombuffer(view[begin:end], dtype=index.dtype), where=where, sequence=sequence,
                             kind=kind) for begin, end, sequence in zip(starts.tolist(), ends.tolist(), batch.tolist())]
        return np.asarray(extremes, dtype=np.int64), digests
    values = np.frombuffer(view[int(starts[0]):int(ends[-1])], dtype=index.dtype)
    offsets = (starts - starts[0]) // itemsize
    highest, lowest = np.maximum.reduceat(values, offsets), np.minimum.reduceat(values, offsets)
    bad = np.flatnonzero(lowest < 0) if kind == "tokens" else np.flatnonzero((lowest < 0) | (highest > 1))
    if bad.size:
        first = int(bad[0])
        _extreme(values[offsets[first]:offsets[first] + counts[first]], where=where, sequence=int(batch[first]),
                 kind=kind)
    return highest.astype(np.int64), digests


def _extreme(values: np.ndarray, *, where: Path, sequence: int, kind: ScanKind) -> int:
    """The largest of one sequence's ``values``, after checking them (``ValueError`` naming the sequence)."""
    if kind == "tokens" and int(values.min()) < 0:
        raise ValueError(f"{where} sequence {sequence}: holds a negative token id ({int(values.min())})")
    if kind == "mask" and not np.isin(values, (0, 1)).all():
        bad = values[(values != 0) & (values != 1)]
        raise ValueError(f"{where} sequence {sequence}: the sidecar mask holds {int(bad[0])}; a loss mask holds "
                         f"only 0 and 1")
    return int(values.max()) if values.size else -1
