"""The sample contract: what every feed checks of each sample it reads or is handed, and of each collated
micro-batch before it reaches the model (numpy only; torch tensors are read through a thin adapter).

A *sample* is a mapping with

* ``tokens``: a 1-D integer array (not bool, not float) of the sample's planned length, every id in
  ``[0, vocab_size)``;
* ``labels``: a 1-D integer array of the same length, every entry in ``[0, vocab_size)`` or
  :data:`IGNORE_INDEX` (-100: not trained), already shifted: ``labels[i]`` is the token that follows
  ``tokens[i]``, the target the model predicts at position ``i`` (Megatron's convention). Hugging Face style
  labels (``labels[i]`` the target *at* token ``i``, so ``labels == tokens`` where every token is trained) are
  handed with a feed's ``label_convention="unshifted"`` (:data:`LABEL_CONVENTIONS`), which shifts them and the
  loss mask; handed as shifted, they train the model to copy its input (:func:`labels_copy_tokens` finds them);
* ``loss_mask`` (optional): a 1-D array of the same length (bool, integer or float dtype) holding only 0 and
  1. A loss mask says which positions are trained; it is not a loss weight: the per-token loss divides by
  the count of trained positions, so a 5 would count one token five times and a -1 would train against its
  target. Other keys are ignored.

Arrays are numpy arrays or torch tensors (any dtype, CPU; collate converts numpy arrays); a Python list, a
generator or a meta tensor (no data) is refused: collate builds its micro-batches from tensors.
``vocab_size`` is the *padded* vocabulary (Megatron's ``args.padded_vocab_size``, what its
``_vocab_size_with_padding`` gives): the embedding table's row count. ``None`` skips the upper bound only;
callers pass it only when the user asked for that.

A collated micro-batch must hold at most the token cap (``max_tokens_per_gpu * cp_size``), counted as collate
built it (``thd``: every sequence padded to its multiple, back to back; ``bshd``: rows x the longest padded
row), unless it is a single sample (which alone may exceed the cap: the plan's invariant 2).

Every violation raises :class:`SampleContractError` (a ``ValueError``) whose message names where the sample
was checked (:class:`Place`: file and line, or sample id, step and data-parallel rank) and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

IGNORE_INDEX = -100
"""Label value of a position that is not trained (Hugging Face's and Megatron's ``IGNORE_INDEX``)."""

SAMPLE_FIELDS = ("tokens", "labels", "loss_mask")
"""The fields of a sample the contract reads."""

LABEL_CONVENTIONS = ("shifted", "unshifted")
"""How a sample's ``labels`` line up with its ``tokens``: ``shifted`` (``labels[i]`` is the token after
``tokens[i]``, what the model is handed) or ``unshifted`` (Hugging Face style: ``labels[i]`` is the target at
token ``i``; the feed shifts labels and loss mask one position left, and the last position trains nothing)."""

COPY_MIN_POSITIONS = 2
"""Loss positions a sample needs before :func:`labels_copy_tokens` calls its labels a copy of its tokens."""


@dataclass(frozen=True, kw_only=True)
class Place:
    """Where a sample or micro-batch is checked, for messages."""

    sample_id: int | None = None
    """Global sample id (a feed's), or ``None``."""
    step: int | None = None
    """The plan step it belongs to, or ``None``."""
    rank: int | None = None
    """The data-parallel rank checking it, or ``None``."""
    source: str | None = None
    """Where it was read (``path:line``), or ``None``."""

    def prefix(self) -> str:
        """``dp-schedule step S, data-parallel rank R`` and/or the source, as known."""
        parts = [] if self.step is None else [f"dp-schedule step {self.step}"]
        parts += [] if self.rank is None else [f"data-parallel rank {self.rank}"]
        parts += [] if self.source is None else [self.source]
        return ", ".join(parts) or "dp-schedule"

    def sample(self) -> str:
        """``<prefix>: sample N`` (or just the prefix without a sample id)."""
        return self.prefix() if self.sample_id is None else f"{self.prefix()}: sample {self.sample_id}"


class SampleContractError(ValueError):
    """A sample or micro-batch that breaks the contract; ``place`` and ``field`` say where."""

    def __init__(self, message: str, *, place: Place, field: str) -> None:
        super().__init__(message)
        self.place = place
        self.field = field


def _fail(place: Place, field: str, problem: str) -> SampleContractError:
    return SampleContractError(f"{place.sample()}: '{field}' {problem}", place=place, field=field)


def as_array(value: object, *, field: str, place: Place) -> np.ndarray:
    """``value`` (a numpy array or a CPU torch tensor) as a numpy array; anything else is refused."""
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is None or not hasattr(value, "dtype"):
        raise _fail(place, field, f"must be a 1-D tensor or numpy array; got {type(value).__name__} "
                                  f"(hand torch.tensor(ids, dtype=torch.long))")
    if getattr(value, "is_meta", False):
        raise _fail(place, field, f"is a meta tensor (shape {tuple(value.shape)}, no data); hand the sample's ids "
                                  f"in a CPU tensor or numpy array")
    layout = str(getattr(value, "layout", "torch.strided"))
    if layout != "torch.strided":
        raise _fail(place, field, f"is a {layout} tensor; hand a dense CPU tensor or numpy array (.to_dense())")
    tensor = detach().cpu()
    try:
        return tensor.numpy()
    except TypeError:  # bfloat16 and other dtypes numpy lacks: floats
        pass
    try:
        return tensor.float().numpy()
    except (TypeError, RuntimeError, NotImplementedError) as error:  # a quantized or other tensor without floats
        raise _fail(place, field, f"cannot be read as an array (dtype {getattr(value, 'dtype', '?')}: "
                                  f"{' '.join(str(error).split())[:120]}); hand a CPU tensor or numpy array of "
                                  f"integer ids") from None


def _one_dimensional(array: np.ndarray, *, field: str, place: Place, kinds: str, what: str) -> None:
    if array.ndim != 1:
        raise _fail(place, field, f"must be 1-D; got shape {tuple(array.shape)}")
    if array.dtype.kind not in kinds:
        raise _fail(place, field, f"must hold {what}; got dtype {array.dtype}")


def check_ids(array: np.ndarray, *, field: str, vocab_size: int | None, place: Place,
              ignore_index: int | None = None) -> None:
    """Raise unless ``array`` is 1-D integer (not bool) with every entry in ``[0, vocab_size)`` (or
    ``ignore_index``); ``vocab_size=None`` skips the upper bound."""
    _one_dimensional(array, field=field, place=place, kinds="iu", what="integer ids (not bool, not float)")
    if not array.size:
        return
    low, high = int(array.min()), int(array.max())
    if low < 0:
        bad = array[(array < 0) & (array != ignore_index)] if ignore_index is not None else array[array < 0]
        if bad.size and ignore_index is None:
            raise _fail(place, field, f"holds a negative token id ({int(bad[0])})")
        if bad.size:
            raise _fail(place, field, f"holds {int(bad[0])}; a label is a token id or {ignore_index} (not trained)")
    if vocab_size is not None and high >= vocab_size:
        raise _fail(place, field, f"holds {high}, outside the padded vocabulary [0, {vocab_size}) (an embedding "
                                  f"row that does not exist)")


def check_loss_mask(array: np.ndarray, *, place: Place, field: str = "loss_mask") -> None:
    """Raise unless ``array`` is 1-D and holds only 0 and 1 (bool, integer or float dtype)."""
    _one_dimensional(array, field=field, place=place, kinds="biuf", what="0/1 values")
    if array.dtype.kind == "b" or not array.size:
        return
    if array.dtype.kind == "f":
        bad = array[(array != 0) & (array != 1)]
        if bad.size:
            raise _fail(place, field, f"holds values other than 0 and 1 ({bad[0]}); a loss mask is not a loss weight")
        return
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > 1:
        raise _fail(place, field, f"holds values other than 0 and 1 ({low if low < 0 else high}); a loss mask is "
                                  f"not a loss weight")


def validate_sample(sample: object, *, length: int, vocab_size: int | None, place: Place,
                    length_source: str = "the plan's lengths") -> None:
    """Raise :class:`SampleContractError` unless ``sample`` keeps the contract (module docstring) with
    ``length`` tokens; ``length_source`` names where the planned length came from."""
    if not isinstance(sample, Mapping):
        raise _fail(place, "sample", f"must be a mapping with 'tokens' and 'labels'; got {type(sample).__name__}")
    for field in ("tokens", "labels"):
        if sample.get(field) is None:
            raise _fail(place, field, f"is missing (the sample has {sorted(map(str, sample))})")
    tokens = as_array(sample["tokens"], field="tokens", place=place)
    check_ids(tokens, field="tokens", vocab_size=vocab_size, place=place)
    if tokens.size != length:
        raise SampleContractError(
            f"{place.sample()} has {tokens.size} tokens, but the plan was made with length {length} "
            f"({length_source}); the token cap and the balance hold only for the lengths planned with",
            place=place, field="tokens")
    labels = as_array(sample["labels"], field="labels", place=place)
    check_ids(labels, field="labels", vocab_size=vocab_size, place=place, ignore_index=IGNORE_INDEX)
    _same_length(labels, tokens, field="labels", place=place)
    if sample.get("loss_mask") is not None:
        mask = as_array(sample["loss_mask"], field="loss_mask", place=place)
        check_loss_mask(mask, place=place)
        _same_length(mask, tokens, field="loss_mask", place=place)


def labels_copy_tokens(sample: Mapping[str, Any], *, place: Place) -> bool:
    """Whether ``sample`` (one that keeps the contract) has ``labels`` equal to ``tokens`` at every loss position
    (label not :data:`IGNORE_INDEX`, loss mask 1), with at least :data:`COPY_MIN_POSITIONS` of them: the mark of
    unshifted (Hugging Face style) labels handed as shifted ones, which train the model to copy its input."""
    tokens = as_array(sample["tokens"], field="tokens", place=place)
    labels = as_array(sample["labels"], field="labels", place=place)
    trained = labels != IGNORE_INDEX
    if sample.get("loss_mask") is not None:
        trained &= as_array(sample["loss_mask"], field="loss_mask", place=place) != 0
    return int(np.count_nonzero(trained)) >= COPY_MIN_POSITIONS and bool(np.all(labels[trained] == tokens[trained]))


def _same_length(array: np.ndarray, tokens: np.ndarray, *, field: str, place: Place) -> None:
    if array.size != tokens.size:
        raise _fail(place, field, f"has {array.size} entries for {tokens.size} tokens")


def require_samples(samples: Any, *, needed: int, name: str) -> None:
    """A sized sample source (a list, a dataset) must hold at least ``needed`` samples (sample ids
    ``0..needed-1``); a callable or unsized source is checked sample by sample when read."""
    if callable(samples) and not hasattr(samples, "__len__"):
        return
    try:
        available = len(samples)
    except TypeError:
        return
    if available < needed:
        raise ValueError(f"{name} holds {available} samples, but the plan reads sample ids up to {needed - 1}; "
                         f"hand every sample the plan was made from")


@dataclass(frozen=True, kw_only=True)
class MicroBatchSize:
    """What a collated micro-batch holds, as the cap check reads it."""

    shape: tuple[int, ...]
    """Shape of its ``tokens`` tensor as collate built it (``[1, total]`` thd, ``[rows, longest]`` bshd)."""
    real_tokens: int
    """Tokens of its samples, padding left out."""
    sample_ids: tuple[int, ...]
    """Its samples' global ids (``()`` for a dummy)."""

    @property
    def collated_tokens(self) -> int:
        """Elements of the collated ``tokens`` tensor (padding included)."""
        return int(np.prod(self.shape)) if self.shape else 0


def require_within_cap(size: MicroBatchSize, *, cap: int | None, counts_padding: bool, place: Place) -> None:
    """Raise :class:`SampleContractError` if a micro-batch of more than one sample holds more than ``cap``
    tokens: the collated tokens (``counts_padding``), or the real ones; ``cap=None`` (static batching): none."""
    if cap is None or len(size.sample_ids) <= 1:
        return
    counted = size.collated_tokens if counts_padding else size.real_tokens
    if counted > cap:
        what = f"collates to {list(size.shape)} = {counted} tokens" if counts_padding else f"holds {counted} tokens"
        raise SampleContractError(
            f"{place.prefix()}: the micro-batch of samples {list(size.sample_ids)} {what}, over the token cap "
            f"{cap} (max_tokens_per_gpu x cp_size): 'tokens' would run past the memory the cap was sized for",
            place=place, field="tokens")


def json_depth(line: bytes | str) -> int:
    """Deepest nesting of ``[``/``{`` in a JSON text, strings left out (vectorised)."""
    text = line.encode() if isinstance(line, str) else line
    codes = np.frombuffer(text, dtype=np.uint8)
    in_string = _inside_strings(codes)
    steps = np.zeros(codes.size, dtype=np.int64)
    steps[(codes == ord("[")) | (codes == ord("{"))] = 1
    steps[(codes == ord("]")) | (codes == ord("}"))] = -1
    steps[in_string] = 0
    return int(np.cumsum(steps).max(initial=0))


def _inside_strings(codes: np.ndarray) -> np.ndarray:
    """True for the bytes inside JSON strings (quotes included), vectorised: a quote preceded by an odd run
    of backslashes is escaped."""
    quotes = np.flatnonzero(codes == ord('"'))
    if not quotes.size:
        return np.zeros(codes.size, dtype=bool)
    backslash = np.concatenate(([0], (codes == ord("\\")).astype(np.int64)))
    runs = np.cumsum(backslash)  # runs[i]: backslashes in codes[:i]
    last_other = np.maximum.accumulate(np.where(backslash[1:] == 0, np.arange(codes.size), -1))
    start = np.concatenate(([-1], last_other))[quotes]  # last non-backslash byte before the quote
    escaped = (runs[quotes] - runs[start + 1]) % 2 == 1
    real = quotes[~escaped]
    toggles = np.zeros(codes.size + 1, dtype=np.int64)
    toggles[real] = 1
    inside = np.cumsum(toggles[:-1]) % 2 == 1
    inside[real] = True
    return inside


def require_json_depth(line: bytes | str, *, limit: int, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` if the JSON text nests deeper than ``limit`` (checked before
    ``json.loads``, which would recurse into it)."""
    text = line.encode() if isinstance(line, str) else line
    if text.count(b"[") + text.count(b"{") <= limit:  # the depth is at most the count of openers
        return
    depth = json_depth(text)
    if depth > limit:
        raise ValueError(f"{where}: the row nests {depth} levels deep; at most {limit} are read")


def micro_batch_size(shape: Sequence[int], *, lengths: Sequence[int], sample_ids: Sequence[int]) -> MicroBatchSize:
    """The :class:`MicroBatchSize` of a collated ``tokens`` shape and its samples' real lengths."""
    return MicroBatchSize(shape=tuple(int(n) for n in shape), real_tokens=int(sum(lengths)),
                          sample_ids=tuple(int(i) for i in sample_ids))
