"""One JSONL row of token ids, with an optional loss mask or ignore-index labels (numpy only, no torch).

Three row shapes are read (one JSON object per line):

* ``{"tokens": [id, ...]}``: every token after the first is a target;
* ``{"tokens": [id, ...], "loss_mask": [0/1, ...]}``: ``loss_mask[i]`` says whether token ``i`` is a
  target (trained on when predicted from the tokens before it); same length as ``tokens``;
* ``{"input_ids": [id, ...], "labels": [id or -100, ...]}`` (Hugging Face's convention, unshifted):
  ``labels[i]`` is the target at token ``i``, ``-100`` (:data:`IGNORE_INDEX`) where it is not trained.

A row of ``L`` ids is a sample of ``L - 1`` positions: position ``j`` reads ``tokens[j]`` and predicts
``targets[j + 1]``. Bad rows raise ``ValueError`` naming the file and the line: ids that are not integers
(JSON ``true``/``false`` are not ids, nor are floats), negative ids (and, given ``vocab_size``, ids outside
the padded vocabulary), a row with both ``tokens`` and ``input_ids``, or one nested deeper than
:data:`MAX_JSON_DEPTH` (refused before ``json.loads`` recurses into it). The value checks are the sample
contract's (:mod:`.contract`), which every feed applies again to what it hands the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megatron_dpsched.data.contract import IGNORE_INDEX, Place, check_ids, check_loss_mask, require_json_depth

__all__ = ["IGNORE_INDEX", "MAX_JSON_DEPTH", "TokenRow", "parse_row", "row_length", "row_measure", "shifted",
           "trained_positions", "vocabulary_excess"]

MAX_JSON_DEPTH = 16
"""Deepest nesting of a row read (a token row nests 2 deep)."""
TOKEN_KEYS = ("tokens", "input_ids")


@dataclass(frozen=True)
class TokenRow:
    """The token ids of one row and what each token is trained to be."""

    tokens: np.ndarray
    """1-D int64 token ids (at least 2)."""
    targets: np.ndarray | None
    """1-D int64, same length: the target at each token, ``IGNORE_INDEX`` where none; ``None``: the tokens."""

    @property
    def max_id(self) -> int:
        """The largest token or label id of the row (what the padded vocabulary must exceed)."""
        largest = int(self.tokens.max())
        return largest if self.targets is None else max(largest, int(self.targets.max()))

    @property
    def num_positions(self) -> int:
        """The sample's length (what the planner packs): one position per predicted token."""
        return int(self.tokens.size) - 1


def _where(path: Path | str, line_number: int) -> str:
    return f"{path}:{line_number}"


def _int_array(values: object, *, name: str, where: str, has_bools: bool) -> np.ndarray:
    if not isinstance(values, list) or (has_bools and any(type(v) is bool for v in values)):
        raise ValueError(f"{where}: '{name}' must be a list of integers (true/false are not ids)")
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError(f"{where}: '{name}' must be a list of integers")
    return array.astype(np.int64, copy=False)


def _token_ids(row: dict, key: str, *, where: str, has_bools: bool, vocab_size: int | None) -> np.ndarray:
    tokens = _int_array(row[key], name=key, where=where, has_bools=has_bools)
    if tokens.size < 2:
        raise ValueError(f"{where}: '{key}' needs at least 2 token ids; got {tokens.size}")
    check_ids(tokens, field=key, vocab_size=vocab_size, place=Place(source=where))
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
    check_loss_mask(mask, place=Place(source=where))
    return np.where(mask.astype(bool), tokens, IGNORE_INDEX)


def _label_targets(row: dict, tokens: np.ndarray, key: str, *, where: str, has_bools: bool,
                   vocab_size: int | None) -> np.ndarray:
    labels = _int_array(row["labels"], name="labels", where=where, has_bools=has_bools)
    _same_length(labels, tokens, name="labels", key=key, where=where)
    check_ids(labels, field="labels", vocab_size=vocab_size, place=Place(source=where), ignore_index=IGNORE_INDEX)
    return labels


def _load(line: str | bytes, where: str) -> dict:
    require_json_depth(line, limit=MAX_JSON_DEPTH, where=where)
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: not a JSON object (truncated or corrupt line?): {error}") from None
    present = [key for key in TOKEN_KEYS if isinstance(row, dict) and key in row]
    if not present:
        raise ValueError(f"{where}: a row needs \"tokens\" (optionally with \"loss_mask\") or \"input_ids\" "
                         f"(optionally with \"labels\")")
    if len(present) > 1:
        raise ValueError(f"{where}: the row has both 'tokens' and 'input_ids'; give one")
    if "loss_mask" in row and "labels" in row:
        raise ValueError(f"{where}: give 'loss_mask' or 'labels', not both")
    return row


def parse_row(line: str | bytes, *, path: Path | str, line_number: int, vocab_size: int | None = None) -> TokenRow:
    """The :class:`TokenRow` of one JSONL line (see the module docstring for the shapes); ``vocab_size``: the
    padded vocabulary the ids must fall in (``None``: only non-negative)."""
    where = _where(path, line_number)
    row = _load(line, where)
    has_bools = b"true" in line or b"false" in line if isinstance(line, bytes) else "true" in line or "false" in line
    key = "tokens" if "tokens" in row else "input_ids"
    tokens = _token_ids(row, key, where=where, has_bools=has_bools, vocab_size=vocab_size)
    if "loss_mask" in row:
        return TokenRow(tokens, _mask_targets(row, tokens, where))
    if "labels" in row:
        return TokenRow(tokens, _label_targets(row, tokens, key, where=where, has_bools=has_bools,
                                               vocab_size=vocab_size))
    return TokenRow(tokens, None)


def row_length(line: str | bytes, *, path: Path | str, line_number: int) -> int:
    """The sample length of one JSONL line (validating it as :func:`parse_row` does)."""
    return parse_row(line, path=path, line_number=line_number).num_positions


def row_measure(line: str | bytes, *, path: Path | str, line_number: int) -> tuple[int, int, int]:
    """``(length, trained positions, largest id)`` of one JSONL line (validating it as :func:`parse_row` does;
    the largest token or label id is what the padded vocabulary must exceed)."""
    row = parse_row(line, path=path, line_number=line_number)
    return row.num_positions, trained_positions(row.tokens, row.targets), row.max_id


def vocabulary_excess(max_ids: np.ndarray, vocab_size: int | None) -> int | None:
    """The first sample whose largest id (``max_ids``) is outside the padded vocabulary, ``None`` if none."""
    if vocab_size is None or not max_ids.size:
        return None
    outside = np.flatnonzero(max_ids >= vocab_size)
    return int(outside[0]) if outside.size else None


def trained_positions(tokens: np.ndarray, targets: np.ndarray | None, *, pad_ids: tuple[int, ...] = ()) -> int:
    """The loss tokens of a row: positions whose target is trained (the ``loss_mask`` of :func:`shifted`)."""
    mask = shifted(tokens, targets, pad_ids=pad_ids)[2]
    return int(tokens.size) - 1 if mask is None else int(np.count_nonzero(mask))


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
