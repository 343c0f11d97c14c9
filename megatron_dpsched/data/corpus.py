"""Variable-length token corpora: JSONL rows of token ids (optionally masked) or Megatron's indexed dataset.

Every dataset here is map-style: ``len(ds)``, ``ds[i] -> {"tokens", "labels"[, "loss_mask"]}`` (1-D
tensors of the sample's length; ``loss_mask`` only where some position is not trained), ``ds.lengths``
(a ``Sequence[int]``, the sample lengths the planner packs: positions, masked ones included) and
``ds.trained_tokens`` (the loss tokens of each sample, ``None`` where not known without reading every sample:
an indexed dataset with a sidecar mask); ``ds.no_loss_notice()`` words the warning about the samples with no
loss token (:mod:`.no_loss`), ``None`` if there is none.

* :class:`TokenJsonlDataset`: one row per line (``{"tokens"}``, ``{"tokens", "loss_mask"}`` or
  ``{"input_ids", "labels"}``, see :mod:`.rows`), read by byte offset through a cached length index
  (:mod:`.line_index`); never loaded whole.
* :class:`IndexedTokenDataset`: Megatron's indexed dataset, with an optional *sidecar mask*
  ``PREFIX_mask.bin``/``PREFIX_mask.idx``: an indexed dataset of 0/1 values (any integer dtype) holding one
  sequence per token sequence, of the same length; value ``i`` says whether token ``i`` is a target (as
  ``loss_mask`` of a JSONL row). Its sequence lengths are checked against the main index at start-up.

Both validate every row when they are opened, before any training step, given ``vocab_size`` (the padded
vocabulary): ids in ``[0, vocab_size)`` (labels may be -100), masks 0/1, naming ``file:line`` or
``file.bin sequence N``; an indexed dataset's ``.bin`` must hold what its ``.idx`` points at. The indexing
pass records a digest of every row, which each read compares, so a row changed in place under a running job
fails naming it instead of training other ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from megatron_dpsched.data.indexed_file import (
    IndexFile,
    Scan,
    check_bin_size,
    read_index_file,
    scan_sequences,
    sequence_digest,
)
from megatron_dpsched.data.line_index import (
    IntArrayView,
    LineIndex,
    LineReader,
    line_digest,
    line_number_at,
    line_numbers_at,
    open_index,
)
from megatron_dpsched.data.no_loss import no_loss_notice
from megatron_dpsched.data.rows import IGNORE_INDEX, parse_row, row_measure, shifted, vocabulary_excess

MASK_SUFFIX = "_mask"
"""``PREFIX`` + this is the sidecar mask of the indexed dataset ``PREFIX``."""


def sample_tensors(tokens: np.ndarray, targets: np.ndarray | None, *, pad_ids: tuple[int, ...] = ()
                   ) -> dict[str, torch.Tensor]:
    """The training sample of a token row (see :func:`.rows.shifted`)."""
    inputs, labels, mask = shifted(tokens, targets, pad_ids=pad_ids)
    sample = {"tokens": torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.int64)),
              "labels": torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))}
    if mask is not None:
        sample["loss_mask"] = torch.from_numpy(mask.astype(np.float32))
    return sample


def indexed_line_names(path: Path, index: LineIndex, ids: Sequence[int]) -> list[str]:
    """``file:line`` of samples ``ids`` (ascending) of a JSONL file's index, ``file:line (conversation k)`` for
    the k-th (from 1) of several samples of one line."""
    numbers = line_numbers_at(path, [int(index.offsets[i]) for i in ids])
    return [f"{path}:{number}" + (f" (conversation {int(index.parts[i]) + 1})" if index.parts[i] else "")
            for i, number in zip(ids, numbers)]


class TokenJsonlDataset:
    """Map-style dataset of the rows of a JSONL file, read lazily by byte offset.

    A row with ``L`` token ids is a sample of ``L - 1`` positions (input ``tokens[:-1]``, labels the
    targets ``[1:]``, ``loss_mask`` 0 where the target is ignored); :attr:`lengths` holds those lengths,
    from the length index (built on first open and cached: see :mod:`.line_index`). Every row is
    validated when the index is built, so a bad row fails at start-up with the file and line number;
    ``vocab_size`` (the padded vocabulary, optional) bounds the ids of every row when the file is opened
    (from the largest id of each row the index records), naming the first line past it (the feeds check
    every sample against it again, naming the sample). A read compares the row with its indexed length and
    digest, naming the line of a row changed since.
    """

    INDEX_KIND = "token-rows-v1"

    def __init__(self, path: str | Path, *, vocab_size: int | None = None) -> None:
        self.path = Path(path)
        self.vocab_size = vocab_size
        if not self.path.is_file():
            raise ValueError(f"--data-path {self.path} does not exist")
        self.index = open_index(self.path, kind=self.INDEX_KIND, measure=self._measure)
        if len(self.index) == 0:
            raise ValueError(f"--data-path {self.path} holds no samples")
        self._reader = LineReader(self.path)
        self.check_vocabulary(vocab_size)
        self.lengths = IntArrayView(self.index.lengths)
        self.trained_tokens = IntArrayView(self.index.trained)
        """The loss tokens of each sample (from the length index)."""

    def _measure(self, line: bytes, number: int) -> tuple[tuple[int, int, int]]:
        return (row_measure(line, path=self.path, line_number=number),)

    def check_vocabulary(self, vocab_size: int | None) -> None:
        """Bound every id by ``vocab_size`` (the padded vocabulary, once known; ``None``: no bound) from the largest
        id of each row the index recorded: the first row past it raises naming its line (parsed again)."""
        self.vocab_size = vocab_size
        first = vocabulary_excess(self.index.max_ids, vocab_size)
        if first is not None:
            self.read_row(first)  # raises naming the line and the field
            raise AssertionError(f"{self.path}: sample {first} holds an id past {self.vocab_size}, its row none")

    def no_loss_notice(self) -> str | None:
        """The warning about the rows with no loss token (count, first ``file:line``), ``None`` if none."""
        return no_loss_notice(self.index.trained, source=str(self.path),
                              name=lambda ids: indexed_line_names(self.path, self.index, ids))

    def __len__(self) -> int:
        return len(self.index)

    def read_row(self, index: int) -> object:
        """The parsed row of sample ``index`` (a bad line raises ``ValueError`` with its line number; so does a
        row whose length or digest differs from what its index recorded: the file changed since)."""
        offset = int(self.index.offsets[index])
        line = self._reader.read(offset)
        try:
            row = parse_row(line, path=self.path, line_number=0, vocab_size=self.vocab_size)
        except ValueError:
            row = parse_row(line, path=self.path, line_number=line_number_at(self.path, offset),
                            vocab_size=self.vocab_size)
        if row.num_positions != int(self.index.lengths[index]):
            raise ValueError(f"{self.path}:{line_number_at(self.path, offset)}: the row has {row.num_positions} "
                             f"positions, its length index says {int(self.index.lengths[index])}: the file changed "
                             f"after the index was built; restart the job to rebuild it")
        if line_digest(line) != int(self.index.digests[index]):
            raise ValueError(f"{self.path}:{line_number_at(self.path, offset)}: the row changed after the file was "
                             f"indexed at start-up (same length, other content): the file was edited in place under "
                             f"this job; restore it, or restart the job to index the new content")
        return row

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.read_row(index)
        return sample_tensors(row.tokens, row.targets)

    def sample_digest(self, index: int) -> int:
        """64-bit blake2b of sample ``index``'s line as indexed (what ``--dp-schedule`` folds into each step's
        fingerprint, every rank for every sample of the step; each read compares the line with it)."""
        return int(self.index.digests[index])


class IndexedTokenDataset:
    """Megatron's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), one sample per stored sequence.

    Same items as :class:`TokenJsonlDataset`; :attr:`lengths` comes from the index
    (``sequence_lengths - 1``), so planning reads no token data. With a sidecar mask
    ``PREFIX_mask.bin``/``.idx`` (see the module docstring; ``mask=False`` ignores it) samples carry its
    ``loss_mask``. Opening it reads every ``.bin`` once (cached while unchanged, :mod:`.indexed_file`): ids
    not negative and, given ``vocab_size``, below it; mask values 0/1; a digest of every sequence, which each
    read compares.
    """

    def __init__(self, path_prefix: str | Path, *, mask: bool = True, vocab_size: int | None = None) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.path = Path(path_prefix)
        self.vocab_size = vocab_size
        for suffix in (".bin", ".idx"):
            if not self.path.with_name(self.path.name + suffix).is_file():
                raise ValueError(f"--data-path {self.path}: no {self.path.name}{suffix} beside it")
        self.bin_path = self.path.with_name(self.path.name + ".bin")
        index = _validated_index(self.path)
        if not index.lengths.size or int(index.lengths.min()) < 2:
            raise ValueError(f"--data-path {self.path}: every sequence needs at least 2 token ids")
        self._scan = scan_sequences(self.bin_path, index, kind="tokens")
        self.check_vocabulary(vocab_size)
        self._data = IndexedDataset(str(self.path))
        self.lengths = [int(n) - 1 for n in index.lengths]
        self.mask_path = self.path.with_name(self.path.name + MASK_SUFFIX)
        self._mask, self._mask_scan = _open_sidecar_mask(self.mask_path, index.lengths) if mask else (None, None)
        self.trained_tokens = self.lengths if self._mask is None else None
        """The loss tokens of each sample: every position without a sidecar mask; ``None`` with one (counting
        them would read the whole mask)."""

    def check_vocabulary(self, vocab_size: int | None) -> None:
        """Bound every token id by ``vocab_size`` (the padded vocabulary, once known; ``None``: no bound) from the
        largest id of each sequence the scan recorded, naming the first sequence past it."""
        self.vocab_size = vocab_size
        first = vocabulary_excess(self._scan.extremes, vocab_size)
        if first is not None:
            raise ValueError(f"--data-path {self.bin_path} sequence {first}: holds token id "
                             f"{int(self._scan.extremes[first])}, outside the padded vocabulary [0, {vocab_size})")

    def no_loss_notice(self) -> str | None:
        """``None``: without a sidecar mask every sample is trained; with one, samples are not counted."""
        return None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = _unchanged(self._data[index], self._scan, path=self.bin_path, index=index)
        if self._mask is None:
            return sample_tensors(tokens.astype(np.int64), None)
        mask_bin = self.mask_path.with_name(self.mask_path.name + ".bin")
        mask = _unchanged(self._mask[index], self._mask_scan, path=mask_bin, index=index)
        tokens = tokens.astype(np.int64)
        return sample_tensors(tokens, np.where(mask.astype(bool), tokens, IGNORE_INDEX))

    def sample_digest(self, index: int) -> int:
        """64-bit blake2b of sample ``index``'s sequence as indexed (with its mask's, where there is one)."""
        digest = int(self._scan.digests[index])
        return digest if self._mask_scan is None else digest ^ int(self._mask_scan.digests[index])


def _validated_index(prefix: Path) -> IndexFile:
    """The ``.idx`` of ``prefix`` read and checked against its ``.bin`` (one ``ValueError`` line naming them)."""
    try:
        index = read_index_file(prefix.with_name(prefix.name + ".idx"))
    except ValueError as error:
        raise ValueError(f"--data-path {prefix}: {error}") from None
    check_bin_size(prefix.with_name(prefix.name + ".bin"), index)
    return index


def _unchanged(values: np.ndarray, scan: Scan, *, path: Path, index: int) -> np.ndarray:
    """``values`` (sequence ``index`` as read) if its digest is the one indexed at start-up, else ``ValueError``."""
    if sequence_digest(np.ascontiguousarray(values)) != int(scan.digests[index]):
        raise ValueError(f"{path} sequence {index}: the sequence changed after the file was indexed at start-up "
                         f"(edited in place under this job); restore it, or restart the job to index the new content")
    return values


def _open_sidecar_mask(prefix: Path, lengths: np.ndarray) -> tuple[object, Scan] | tuple[None, None]:
    """The sidecar mask's indexed dataset and its scan, if both its files exist; it must match the main index."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    present = [prefix.with_name(prefix.name + suffix).is_file() for suffix in (".bin", ".idx")]
    if not any(present):
        return None, None
    if not all(present):
        raise ValueError(f"--data-path: the sidecar mask {prefix} needs both {prefix.name}.bin and .idx")
    index = _validated_index(prefix)
    mask_lengths = index.lengths
    if len(mask_lengths) != len(lengths):
        raise ValueError(f"--data-path: the sidecar mask {prefix} holds {len(mask_lengths)} sequences, "
                         f"the token index {len(lengths)}")
    differ = np.flatnonzero(np.asarray(mask_lengths) != np.asarray(lengths))
    if differ.size:
        first = int(differ[0])
        raise ValueError(f"--data-path: sequence {first} of the sidecar mask {prefix} has "
                         f"{int(mask_lengths[first])} values for {int(lengths[first])} tokens")
    scan = scan_sequences(prefix.with_name(prefix.name + ".bin"), index, kind="mask")
    return IndexedDataset(str(prefix)), scan


def open_corpus(path: str | Path, *, vocab_size: int | None = None) -> TokenJsonlDataset | IndexedTokenDataset:
    """``*.jsonl``: a JSONL corpus; otherwise the prefix of a Megatron indexed dataset. ``vocab_size``: the padded
    vocabulary every id is checked against when the corpus is opened (``None``: only non-negative)."""
    if str(path).endswith(".jsonl"):
        return TokenJsonlDataset(path, vocab_size=vocab_size)
    return IndexedTokenDataset(path, vocab_size=vocab_size)


class PaddedSampleDataset:
    """Samples of any dataset here right-padded to ``seq_length`` (Megatron's fixed shape).

    Items: ``tokens``, ``labels``, ``loss_mask`` (the sample's own, 0 on padding), ``padding_mask``
    (True on padding) and ``position_ids``;
    causal attention needs no mask (right padding never precedes a real token).
    """

    def __init__(
        self, samples: object, *, seq_length: int, pad_token_id: int = 0
    ) -> None:
        longest = max(samples.lengths)
        if longest > seq_length:
            raise ValueError(f"--seq-length {seq_length} is shorter than the longest sample "
                             f"({longest} tokens) of --data-path {samples.path}")
        self.samples = samples
        self.seq_length = seq_length
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.samples[index]
        length = sample["tokens"].numel()
        pad = self.seq_length - length
        filler = torch.full((pad,), self.pad_token_id, dtype=torch.long)
        mask = sample.get("loss_mask")
        mask = torch.ones(length) if mask is None else mask.float()
        return {
            "tokens": torch.cat([sample["tokens"], filler]),
            "labels": torch.cat([sample["labels"], filler]),
            "loss_mask": torch.cat([mask, torch.zeros(pad)]),
            "padding_mask": torch.arange(self.seq_length) >= length,
            "position_ids": torch.arange(self.seq_length),
        }


def write_token_jsonl(path: str | Path, rows: Iterable[Sequence[int] | Mapping[str, Sequence[int]]]) -> Path:
    """Write one JSONL row per item: a sequence of ids as ``{"tokens": row}``, a mapping (``tokens`` +
    ``loss_mask``, ``input_ids`` + ``labels``) as it is; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for row in rows:
            fields = {k: list(map(int, v)) for k, v in row.items()} if isinstance(row, Mapping) \
                else {"tokens": list(map(int, row))}
            out.write(json.dumps(fields) + "\n")
    return path


def write_token_indexed(path_prefix: str | Path, rows: Iterable[Sequence[int]], *,
                        masks: Iterable[Sequence[int]] | None = None) -> Path:
    """Write rows as a Megatron indexed dataset (``PREFIX.bin``/``PREFIX.idx``) and, with ``masks`` (0/1 per
    token, one sequence per row), its sidecar mask ``PREFIX_mask.bin``/``.idx``; returns the prefix."""
    prefix = Path(path_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _write_indexed(prefix, rows, dtype=np.int32)
    if masks is not None:
        _write_indexed(prefix.with_name(prefix.name + MASK_SUFFIX), masks, dtype=np.uint8)
    return prefix


def _write_indexed(prefix: Path, rows: Iterable[Sequence[int]], *, dtype: type) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for row in rows:
        builder.add_document(torch.from_numpy(np.asarray(list(row), dtype=dtype)), [len(row)])
    builder.finalize(f"{prefix}.idx")
