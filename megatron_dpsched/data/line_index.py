"""A length index of a JSONL file: byte offset, token length and trained positions of every sample, built once
and cached.

Reading a corpus never loads it whole: the index (numpy arrays, 36 bytes per sample) says where each
sample's line starts, how many positions it has and how many of them are trained (loss tokens: a row whose
labels are all ignored has 0), so the planner gets every length at start-up, the reader can count the samples
with no loss token without reading the file again, and a sample's line is read (``seek`` + ``readline``) only
when its micro-batch is collated.

The index is stored as ``<file>.dpsched-index.npz`` beside the file or, when ``DPSCHED_CACHE_DIR`` is
set, in that folder (named after a hash of the file's absolute path). It records the file's size,
modification time (ns), a CRC of its first and last MiB (a same-size copy with the mtime preserved is
another file) and a *kind* string (the reader and what its lengths depend on, e.g. the
tokenizer); a mismatch on any of them (the file was touched, appended to or rewritten, or read another
way) rebuilds it. Where the index cannot be written (read-only folder) it is built in memory each time,
with a warning. Several processes building it at once is safe (each writes its own temporary file and
renames it into place). Reading checks that each offset starts a line and (for token rows) that the row
has its indexed length and digest (a 64-bit blake2b of each line, recorded while indexing), so a file changed
under a running job fails naming its line instead of training the wrong rows.

The indexing pass also records each sample's largest id (checked against the padded vocabulary whenever the
file is opened, cached or not) and a checksum of every byte of the file, which the job identity takes as the
file's content checksum (:func:`stored_checksum`) instead of reading the file again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CACHE_DIR_ENV = "DPSCHED_CACHE_DIR"
"""Environment variable naming a folder for length indexes (default: beside each file)."""
INDEX_VERSION = 4
"""3: the index also stores each sample's trained positions (``trained``); 4: each sample's largest id
(``max_ids``), each line's digest (``digests``) and the whole file's checksum (``checksum``)."""
SUFFIX = ".dpsched-index.npz"

LineMeasure = Callable[[bytes, int], Sequence[int | tuple[int, ...]]]
"""``measure(line, line_number)``: the samples the line holds (validating it), each as its length, as
``(length, trained positions)`` (a bare length: every position is trained) or as ``(length, trained positions,
largest id)`` (the largest token or label id, checked against the padded vocabulary when the file is opened;
-1 where not measured)."""


@dataclass(frozen=True)
class LineIndex:
    """Where each sample of a JSONL file starts, which part of its line it is, and its length."""

    offsets: np.ndarray
    """int64 byte offset of the line holding each sample."""
    parts: np.ndarray
    """int32 index of the sample within its line (0 unless a line holds several, e.g. conversations)."""
    lengths: np.ndarray
    """int32 sample lengths (positions)."""
    trained: np.ndarray
    """int32 trained positions (loss tokens) of each sample, at most its length (0: no loss token)."""
    max_ids: np.ndarray
    """int64 largest token or label id of each sample (-1: not measured)."""
    digests: np.ndarray
    """uint64 :func:`line_digest` of the line holding each sample, as it was indexed."""
    checksum: str
    """blake2b of the file's size and every byte, as it was indexed (:func:`file_digest` of the whole file)."""
    rebuilt: bool = False
    """Whether this open built the index (``False``: read from the cache)."""

    def __len__(self) -> int:
        return int(self.lengths.size)


def index_path(path: Path) -> Path:
    """Where the index of ``path`` is cached."""
    folder = os.environ.get(CACHE_DIR_ENV)
    if not folder:
        return path.with_name(path.name + SUFFIX)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(folder) / f"{digest}-{path.name}{SUFFIX}"


CHECKED_BYTES = 1 << 20
"""The index also records a CRC of the file's first and last MiB, so that a same-size copy with its mtime
preserved (``cp -p``, ``rsync -a``) is not taken for the indexed file."""


def _head_tail_crc(path: Path, size: int) -> int:
    with open(path, "rb") as handle:
        crc = zlib.crc32(handle.read(CHECKED_BYTES))
        if size > CHECKED_BYTES:
            handle.seek(max(CHECKED_BYTES, size - CHECKED_BYTES))
            crc = zlib.crc32(handle.read(CHECKED_BYTES), crc)
    return crc


def file_stamp(path: Path, kind: str) -> dict[str, object]:
    """What a cached index is valid for: the format version, the file's size, mtime, resolved path and head/tail
    CRC, and the reader's ``kind``."""
    stat = path.stat()
    return {"version": INDEX_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "kind": kind,
            "path": str(path.resolve()), "crc": _head_tail_crc(path, stat.st_size)}


ARRAYS = ("offsets", "parts", "lengths", "trained", "max_ids", "digests")
"""The arrays of a stored index (beside its ``meta`` stamp and ``checksum``)."""


def load_stored(cache: Path, stamp: dict[str, object], names: Sequence[str]) -> dict[str, np.ndarray] | None:
    """The arrays ``names`` (and ``checksum``) stored in ``cache`` under ``stamp``; ``None`` if absent or stale."""
    try:
        with np.load(cache, allow_pickle=False) as stored:
            if json.loads(str(stored["meta"])) != stamp:
                return None
            return {name: stored[name] for name in (*names, "checksum")}
    except (OSError, ValueError, KeyError):
        return None


def store(cache: Path, arrays: dict[str, np.ndarray], stamp: dict[str, object]) -> None:
    """Write ``arrays`` with ``stamp`` to ``cache`` atomically (a warning where the folder is not writable)."""
    temporary = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as out:
            np.savez(out, meta=np.array(json.dumps(stamp)), **arrays)
        os.replace(temporary, cache)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        warnings.warn(f"{cache}: cannot store the length index ({error}); it is rebuilt on every start. "
                      f"Set {CACHE_DIR_ENV} to a writable folder", stacklevel=3)



def _load(cache: Path, stamp: dict[str, object]) -> LineIndex | None:
    stored = load_stored(cache, stamp, ARRAYS)
    if stored is None:
        return None
    return LineIndex(**{name: stored[name] for name in ARRAYS}, checksum=str(stored["checksum"]))


def _save(cache: Path, index: LineIndex, stamp: dict[str, object]) -> None:
    arrays = {name: getattr(index, name) for name in ARRAYS}
    store(cache, {**arrays, "checksum": np.array(index.checksum)}, stamp)


def file_digest(size: int) -> Any:
    """The running blake2b of a file's checksum (the job identity's ``data content``), seeded with its ``size``:
    feed it every byte, in order."""
    return hashlib.blake2b(size.to_bytes(8, "little"), digest_size=8)


def stored_checksum(path: str | Path) -> str | None:
    """The whole-file checksum an index of ``path`` recorded when it was built (any reader's: the kind is not
    compared), if that index is fresh (same size, mtime and head/tail CRC); ``None`` otherwise."""
    path = Path(path)
    cache = index_path(path)
    if not cache.is_file():
        return None
    try:
        with np.load(cache, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            if not isinstance(meta, dict):
                return None
            fresh = meta == file_stamp(path, meta.get("kind"))
            return str(stored["checksum"]) if fresh else None
    except (OSError, ValueError, KeyError):
        return None


def line_digest(line: bytes) -> int:
    """64-bit blake2b of a line as stored (what a read compares with the index, and what ``--dp-schedule``
    folds into each step's fingerprint)."""
    return int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little")


def iterate_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """``(line_number, byte_offset, line)`` for every line of ``path`` (1-based numbers, blank lines too)."""
    offset = 0
    with open(path, "rb") as source:
        for number, line in enumerate(source, start=1):
            yield number, offset, line
            offset += len(line)


def build_index(path: Path, measure: LineMeasure) -> LineIndex:
    """Read ``path`` once, measuring every non-blank line, digesting each line and the whole file."""
    offsets, parts, lengths, trained = array("q"), array("i"), array("i"), array("i")
    max_ids, digests = array("q"), array("Q")
    checksum = file_digest(path.stat().st_size)
    for number, offset, line in iterate_lines(path):
        checksum.update(line)
        if not line.strip():
            continue
        digest = line_digest(line)
        for part, measured in enumerate(measure(line, number)):
            length, positions, largest = _measured(measured)
            assert 0 <= positions <= length, (path, number, measured)
            offsets.append(offset)
            parts.append(part)
            lengths.append(length)
            trained.append(positions)
            max_ids.append(largest)
            digests.append(digest)
    as_array = np.frombuffer
    return LineIndex(as_array(offsets, dtype=np.int64), as_array(parts, dtype=np.int32),
                     as_array(lengths, dtype=np.int32), as_array(trained, dtype=np.int32),
                     as_array(max_ids, dtype=np.int64), as_array(digests, dtype=np.uint64),
                     checksum=checksum.hexdigest(), rebuilt=True)


def _measured(measured: int | tuple[int, ...]) -> tuple[int, int, int]:
    """``(length, trained positions, largest id)`` of what a measure gave for one sample."""
    if not isinstance(measured, tuple):
        return measured, measured, -1
    return (*measured, -1) if len(measured) == 2 else measured


def open_index(path: str | Path, *, kind: str, measure: LineMeasure) -> LineIndex:
    """The cached index of ``path`` if it is fresh (same size, mtime and ``kind``), else a new one, stored."""
    path = Path(path)
    stamp = file_stamp(path, kind)
    cache = index_path(path)
    index = _load(cache, stamp)
    if index is not None:
        return index
    index = build_index(path, measure)
    if file_stamp(path, kind) == stamp:  # not changed while it was read
        _save(cache, index, stamp)
    return index


def line_number_at(path: Path, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` (for error messages only: reads the file)."""
    return line_numbers_at(path, [offset])[0]


def line_numbers_at(path: Path, offsets: Sequence[int]) -> list[int]:
    """The 1-based line numbers of the lines starting at ``offsets`` (ascending), reading the file once up to the
    last of them (for messages only)."""
    numbers, count, done = [], 1, 0
    with open(path, "rb") as source:
        for offset in offsets:
            assert offset >= done, "offsets must ascend"
            while done < offset:
                chunk = source.read(min(1 << 20, offset - done))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                done += len(chunk)
            numbers.append(count)
    return numbers


class LineReader:
    """Reads the line at a byte offset with positional reads (``os.pread``: threads that share the reader, e.g.
    the prefetch threads of a train and a validation split of one file, never move each other's position);
    reopens the file in a forked process (e.g. a loader worker)."""

    BLOCK = 1 << 16

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self._pid = -1

    def read(self, offset: int) -> bytes:
        if self._fd < 0 or self._pid != os.getpid():
            try:
                self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
            except OSError as error:  # indexed at start-up, gone by its first read
                raise ValueError(f"{self.path} cannot be read ({error.strerror}): it was moved or deleted after "
                                 f"start-up, when its length index was built; restore it and restart the job") \
                    from None
        if offset > 0 and os.pread(self._fd, 1, offset - 1) != b"\n":  # indexed offsets start lines
            raise ValueError(f"{self.path} changed after its length index was built (byte {offset} does not "
                             f"start a line); restart the job to rebuild the index")
        parts = []
        while True:
            block = os.pread(self._fd, self.BLOCK, offset)
            end = block.find(b"\n")
            if end >= 0 or not block:
                parts.append(block if end < 0 else block[: end + 1])
                return b"".join(parts)
            parts.append(block)
            offset += len(block)

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "_fd": -1, "_pid": -1}


class IntArrayView(Sequence[int]):
    """A read-only ``Sequence[int]`` over a 1-D integer numpy array (items are Python ints, as the planner's
    checks want); iterating converts it in chunks, never as one list."""

    CHUNK = 1 << 16

    def __init__(self, values: np.ndarray) -> None:
        self.array = values

    def __len__(self) -> int:
        return int(self.array.size)

    def __getitem__(self, index: int | slice) -> int | list[int]:  # type: ignore[override]
        if isinstance(index, slice):
            return self.array[index].tolist()
        return int(self.array[index])

    def __iter__(self) -> Iterator[int]:
        for start in range(0, self.array.size, self.CHUNK):
            yield from self.array[start:start + self.CHUNK].tolist()
