"""One JSONL row of token ids, with an optional loss mask or ignore-index labels (numpy only, no torch).

Three row shapes are read (one JSON object per line):

* ``{"tokens": [id, ...]}``: every token after the first is a target;
* ``{"tokens": [id, ...], "loss_mask": [0/1, ...]}``: ``loss_mask[i]`` says whether token ``i`` is a
  target (trained on when predicted from the tokens before it); same length as ``tokens``;
* ``{"input_ids": [id, ...], "labels": [id or -100, ...]}`` (Hugging Face's convention, unshifted):
  ``labels[i]`` is the target at token ``i``, ``-100`` (:data:`IGNORE_INDEX`) where it is not trained.

A row of ``L`` ids is a sample of ``L - 1`` positions: position ``j`` reads ``tokens[j]`` and predicts
``targets[j + 1]``. Bad rows raise ``ValueError`` naming the file and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IGNORE_INDEX = -100
"""Label value of a token that is not trained on (Hugging Face's and Megatron's ``IGNORE_INDEX``)."""


@dataclass(frozen=True)
class TokenRow:
    """The token ids of one row and what each token is trained to be."""

    tokens: np.ndarray
    """1-D int64 token ids (at least 2)."""
    targets: np.ndarray | None
    """1-D int64, same length: the target at each token, ``IGNORE_INDEX`` where none; ``None``: the tokens."""

    @property
    def num_positions(self) -> int:
        """The sample's length (what the planner packs): one position per predicted token."""
        return int(self.tokens.size) - 1


def _where(path: Path | str, line_number: int) -> str:
    return f"{path}:{line_number}"


def _int_array(values: object, *, name: str, where: str) -> np.ndarray:
    array = np.asarray(values) if isinstance(values, list) else None
    if array is None or array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError(f"{where}: '{name}' must be a list of integers")
    return array.astype(np.int64, copy=False)


def _token_ids(row: dict, key: str, where: str) -> np.ndarray:
    tokens = _int_array(row[key], name=key, where=where)
    if tokens.size < 2:
        raise ValueError(f"{where}: '{key}' needs at least 2 token ids; got {tokens.size}")
    if int(tokens.min()) < 0:
        raise ValueError(f"{where}: '{key}' holds a negative token id ({int(tokens.min())})")
    return tokens


def _same_length(values: np.ndarray, tokens: np.ndarray, *, name: str, key: str, where: str) -> None:
    if values.size != tokens.size:
        raise ValueError(f"{where}: '{name}' has {values.size} entries for {tokens.size} '{key}'")


def _mask_targets(row: dict, tokens: np.ndarray, where: str) -> np.ndarray:
    raw = row["loss_mask"]
    mask = np.asarray(raw) if isinstance(raw, list) else None
    if mask is None or mask.ndim != 1 or (mask.size and mask.dtype.kind not in "biu"):
        raise ValueError(f"{where}: 'loss_mask' must be a list of 0/1")
    _same_length(mask, tokens, name="loss_mask", key="tokens", where=where)
    if mask.size and mask.dtype.kind != "b" and (int(mask.min()) < 0 or int(mask.max()) > 1):
        raise ValueError(f"{where}: 'loss_mask' holds values other than 0 and 1")
    return np.where(mask.astype(bool), tokens, IGNORE_INDEX)


def _label_targets(row: dict, tokens: np.ndarray, key: str, where: str) -> np.ndarray:
    labels = _int_array(row["labels"], name="labels", where=where)
    _same_length(labels, tokens, name="labels", key=key, where=where)
    bad = (labels < 0) & (labels != IGNORE_INDEX)
    if bad.any():
        raise ValueError(f"{where}: 'labels' holds {int(labels[bad][0])}; a label is a token id or "
                         f"{IGNORE_INDEX} (ignored)")
    return labels


def parse_row(line: str | bytes, *, path: Path | str, line_number: int) -> TokenRow:
    """The :class:`TokenRow` of one JSONL line (see the module docstring for the shapes)."""
    where = _where(path, line_number)
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: not a JSON object (truncated or corrupt line?): {error}") from None
    if not isinstance(row, dict) or not ("tokens" in row or "input_ids" in row):
        raise ValueError(f"{where}: a row needs \"tokens\" (optionally with \"loss_mask\") or \"input_ids\" "
                         f"(optionally with \"labels\")")
    key = "tokens" if "tokens" in row else "input_ids"
    tokens = _token_ids(row, key, where)
    if "loss_mask" in row and "labels" in row:
        raise ValueError(f"{where}: give 'loss_mask' or 'labels', not both")
    if "loss_mask" in row:
        return TokenRow(tokens, _mask_targets(row, tokens, where))
    if "labels" in row:
        return TokenRow(tokens, _label_targets(row, tokens, key, where))
    return TokenRow(tokens, None)


def row_length(line: str | bytes, *, path: Path | str, line_number: int) -> int:
    """The sample length of one JSONL line (validating it as :func:`parse_row` does)."""
    return parse_row(line, path=path, line_number=line_number).num_positions


def shifted(tokens: np.ndarray, targets: np.ndarray | None, *, pad_ids: tuple[int, ...] = ()
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(inputs, labels, loss_mask)`` of a row: inputs ``tokens[:-1]``, labels the targets ``[1:]``
    (ignored ones replaced by the next token, a valid id), ``loss_mask`` 0 where the target is ignored or
    one of ``pad_ids`` (``None`` when every position is trained)."""
    if targets is None:
        return tokens[:-1], tokens[1:], None
    following = targets[1:]
    mask = following != IGNORE_INDEX
    for pad in pad_ids:
        mask &= following != pad
    return tokens[:-1], np.where(following == IGNORE_INDEX, tokens[1:], following), mask
