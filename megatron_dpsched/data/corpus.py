"""Variable-length token corpora: JSONL (``{"tokens": [id, ...]}`` per line) or Megatron's indexed dataset."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch


class TokenJsonlDataset:
    """Map-style dataset of variable-length samples: ``{"tokens", "labels"}`` 1-D long tensors.

    A line with ``L`` token ids is a sample of ``L - 1`` positions (input ``tokens[:-1]``,
    labels ``tokens[1:]``); :attr:`lengths` holds those sample lengths.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._rows = [_parse_line(self.path, number, line)
                      for number, line in enumerate(self.path.read_text().splitlines(), start=1)
                      if line.strip()]
        if not self._rows:
            raise ValueError(f"--data-path {self.path} holds no samples")
        self.lengths = [row.numel() - 1 for row in self._rows]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self._rows[index]
        return {"tokens": row[:-1], "labels": row[1:]}


def _parse_line(path: Path, number: int, line: str) -> torch.Tensor:
    try:
        tokens = json.loads(line)["tokens"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"--data-path {path}:{number}: expected {{\"tokens\": [ids]}} ({error})") from None
    if len(tokens) < 2 or not all(isinstance(t, int) and t >= 0 for t in tokens):
        raise ValueError(f"--data-path {path}:{number}: need at least 2 non-negative integer token ids")
    return torch.tensor(tokens, dtype=torch.long)


class IndexedTokenDataset:
    """Megatron's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), one sample per stored sequence.

    Same items as :class:`TokenJsonlDataset`; :attr:`lengths` comes from the index
    (``sequence_lengths - 1``), so planning reads no token data.
    """

    def __init__(self, path_prefix: str | Path) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.path = Path(path_prefix)
        for suffix in (".bin", ".idx"):
            if not self.path.with_name(self.path.name + suffix).is_file():
                raise ValueError(f"--data-path {self.path}: no {self.path.name}{suffix} beside it")
        self._data = IndexedDataset(str(self.path))
        lengths = self._data.sequence_lengths
        if len(lengths) == 0 or int(lengths.min()) < 2:
            raise ValueError(f"--data-path {self.path}: every sequence needs at least 2 token ids")
        self.lengths = [int(n) - 1 for n in lengths]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = torch.from_numpy(self._data[index].astype("int64"))
        return {"tokens": row[:-1], "labels": row[1:]}


def open_corpus(path: str | Path) -> TokenJsonlDataset | IndexedTokenDataset:
    """``*.jsonl``: a JSONL corpus; otherwise the prefix of a Megatron indexed dataset."""
    if str(path).endswith(".jsonl"):
        return TokenJsonlDataset(path)
    return IndexedTokenDataset(path)


class PaddedSampleDataset:
    """``TokenJsonlDataset`` samples right-padded to ``seq_length`` (Megatron's fixed shape).

    Items: ``tokens``, ``labels``, ``loss_mask`` (0 on padding), ``padding_mask`` (True on padding)
    and ``position_ids``;
    causal attention needs no mask (right padding never precedes a real token).
    """

    def __init__(
        self, samples: TokenJsonlDataset | IndexedTokenDataset, *, seq_length: int, pad_token_id: int = 0
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
        return {
            "tokens": torch.cat([sample["tokens"], filler]),
            "labels": torch.cat([sample["labels"], filler]),
            "loss_mask": torch.cat([torch.ones(length), torch.zeros(pad)]),
            "padding_mask": torch.arange(self.seq_length) >= length,
            "position_ids": torch.arange(self.seq_length),
        }


def write_token_jsonl(path: str | Path, rows: Iterable[Sequence[int]]) -> Path:
    """Write ``{"tokens": row}`` per line; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"tokens": list(map(int, row))}) + "\n" for row in rows))
    return path


def write_token_indexed(path_prefix: str | Path, rows: Iterable[Sequence[int]]) -> Path:
    """Write rows as a Megatron indexed dataset (``PREFIX.bin``/``PREFIX.idx``); returns the prefix."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = Path(path_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.int32)
    for row in rows:
        builder.add_document(torch.tensor(list(row), dtype=torch.int32), [len(row)])
    builder.finalize(f"{prefix}.idx")
    return prefix
