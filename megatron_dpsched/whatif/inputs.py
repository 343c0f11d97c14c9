"""Sample lengths from the inputs ``megatron-dpsched plan`` takes.

* a length file: token counts separated by whitespace (one per line, or several on a line);
* a JSONL corpus (``*.jsonl``, ``{"tokens": [ids]}`` or ``{"input_ids": [ids]}`` per line, the rows training
  reads): a row of ``L`` ids is a sample of ``L - 1`` positions, as
  :class:`megatron_dpsched.data.TokenJsonlDataset` reads it (no torch needed here);
* a Megatron indexed dataset ``PREFIX`` (``PREFIX.bin`` and ``PREFIX.idx``; ``PREFIX.bin`` or
  ``PREFIX.idx`` name it too): lengths from the index, ``sequence_lengths - 1``, read and checked with numpy.

Every problem raises ``ValueError`` naming the file (and line), never a traceback-worthy error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron_dpsched.core.validation import MAX_TOKENS
from megatron_dpsched.data.rows import row_length


def read_lengths(path: str) -> list[int]:
    """Token counts of a length file: integers separated by whitespace; blank lines are skipped. A file of ASCII
    digits and whitespace whose counts are all in range is parsed by NumPy at once; any other file is read line
    by line, which names the first bad count's line."""
    lengths = _parsed_at_once(path)
    if lengths is not None:
        return lengths
    lengths = []
    for number, line in enumerate(_text_lines(path), 1):
        for word in line.split():
            lengths.append(_token_count(word, f"{path}:{number}"))
    if not lengths:
        raise ValueError(f"{path} holds no token counts (a length file has one positive integer per sample)")
    return lengths


PLAIN_TEXT = b"0123456789 \t\n\r\x0b\x0c"
"""The bytes of a length file that :func:`_parsed_at_once` parses (digits and ASCII whitespace)."""


def _parsed_at_once(path: str) -> list[int] | None:
    """The counts of a file of :data:`PLAIN_TEXT` bytes only, every count in ``1..MAX_TOKENS``, else ``None``
    (an error, or a file the line-by-line reader must judge)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if data.translate(None, PLAIN_TEXT):
        return None
    values = np.fromstring(data, dtype=np.int64, sep=" ")  # whitespace separates; a huge count saturates
    if values.size == 0 or values.min() < 1 or values.max() > MAX_TOKENS:
        return None
    return values.tolist()


def _token_count(word: str, where: str) -> int:
    try:
        value = int(word)
    except ValueError:
        raise ValueError(f"{where}: not an integer token count: {word!r}") from None
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"{where}: token count {value} is out of range (1..{MAX_TOKENS})")
    return value


def _text_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file") from None
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a file") from None


def read_jsonl_lengths(path: str) -> list[int]:
    """Sample lengths of a JSONL token corpus: one per non-blank line, each row checked as training reads it
    (:func:`megatron_dpsched.data.rows.row_length`: the same row shapes, and the same rows refused)."""
    lengths = []
    for number, line in enumerate(_text_lines(path), 1):
        if line.strip():
            lengths.append(_row_length(line, path=path, line_number=number))
    if not lengths:
        raise ValueError(f"{path} holds no samples (expected {{\"tokens\": [ids]}} per line)")
    return lengths


def _row_length(line: str, *, path: str, line_number: int) -> int:
    length = row_length(line, path=path, line_number=line_number)
    if length > MAX_TOKENS:
        raise ValueError(f"{path}:{line_number}: {length} positions is more than {MAX_TOKENS}")
    return length


def read_indexed_lengths(prefix: str) -> list[int]:
    """Sample lengths of a Megatron indexed dataset, read from its index (checked whole first, so a corrupt
    ``.idx`` is one line: :func:`megatron_dpsched.data.indexed_file.read_index_file`)."""
    from megatron_dpsched.data.indexed_file import read_index_file

    sizes = read_index_file(prefix + ".idx").lengths.tolist()
    if len(sizes) == 0:
        raise ValueError(f"{prefix} holds no sequences")
    if min(sizes) < 2:
        raise ValueError(f"{prefix}: every sequence needs at least 2 token ids")
    return [int(n) - 1 for n in sizes]


def indexed_prefix(path: str) -> str | None:
    """The prefix of an indexed dataset that ``path`` names (``PREFIX``, ``PREFIX.bin``, ``PREFIX.idx``), else None."""
    for suffix in (".bin", ".idx"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    found = all(Path(path + suffix).is_file() for suffix in (".bin", ".idx"))
    return path if found else None


def load_sample_lengths(path: str) -> tuple[list[int], str]:
    """Lengths of every sample of ``path`` and the kind of input (``length file``, ``JSONL``, ``indexed``)."""
    if path.endswith(".jsonl"):
        return read_jsonl_lengths(path), "JSONL corpus"
    prefix = indexed_prefix(path)
    if (prefix is not None and not Path(path).is_file()) or path.endswith((".bin", ".idx")):
        if prefix is None:
            raise ValueError(f"{path}: an indexed dataset needs both PREFIX.bin and PREFIX.idx")
        return read_indexed_lengths(prefix), "indexed dataset"
    return read_lengths(path), "length file"
