"""Collate one planned micro-batch of variable-length samples for Megatron's GPT model.

A sample is a mapping with ``tokens`` and ``labels`` (1-D integer tensors of
the sample's length) and optionally ``loss_mask`` (1-D, same length, 0/1 or
bool; default all ones). Labels equal to ``IGNORE_INDEX`` (-100, Hugging Face's
convention) are not trained either: their ``loss_mask`` is 0 and the label
handed to the model is the padding id (a valid index). Masked positions still
run through the model (the planner counts them); only the loss leaves them out,
so the per-token loss divides by the unmasked tokens. Two layouts:

* ``thd`` (packed): one row holding every sample back to back, ``position_ids``
  restarting per sample and a :class:`~megatron.core.packed_seq_params.PackedSeqParams`
  with ``cu_seqlens`` (real lengths) and ``cu_seqlens_*_padded`` (each sample
  padded to ``pad_multiple``, what context / sequence parallelism need);
* ``bshd`` (padded): one row per sample, right-padded to the longest sample
  rounded up to ``pad_multiple``. No attention mask: causal attention with right
  padding never lets a real token see a padding token, so Megatron's causal mask
  type is enough (no ``[b, 1, s, s]`` tensor per micro-batch).

Labels are shifted (``labels[i]`` is the token after ``tokens[i]``, Megatron's convention); numpy arrays are
converted to tensors (:func:`sample_tensors`); :func:`shift_unshifted` turns Hugging Face style labels
(``labels == tokens`` where trained) into shifted ones, the loss mask with them.

Padding tokens get ``loss_mask`` 0 and ``padding_mask`` True (what MoE routing
excludes). An empty micro-batch (a rank with fewer samples than the step's
micro-batch count) becomes a one-token dummy (padded to ``pad_multiple``) with
zero loss weight, so it adds nothing to the loss, the token count or the
gradients. Every batch carries ``sample_ids`` (the global sample ids, empty for
a dummy).

Context parallelism: :func:`slice_for_context_parallel` keeps, of every sequence
(a ``bshd`` row, or a ``thd`` segment of ``cu_seqlens_padded``), the two chunks
of ``2 * CP`` that Megatron's load balancing gives a CP rank (``r`` and
``2 * CP - 1 - r``); sequences are padded to a multiple of ``2 * CP``
(:func:`pad_multiple_for`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_dpsched.core.padding import gemm_alignment_for, pad_multiple_for  # noqa: F401 - re-exported
from megatron_dpsched.data.contract import IGNORE_INDEX, SAMPLE_FIELDS
from megatron_dpsched.options import COLLATE_FORMATS

FORMATS = COLLATE_FORMATS
"""The collate layouts (the ``--dp-schedule-collate-format`` option's choices)."""


@dataclass(frozen=True, kw_only=True)
class CollateConfig:
    """How micro-batches are laid out."""

    format: str = "bshd"
    """``"thd"`` (packed, needs an attention backend that takes ``PackedSeqParams``) or ``"bshd"``."""
    pad_multiple: int = 1
    """Pad each sequence (thd) or the sequence dimension (bshd) to a multiple of this."""
    pad_token_id: int = 0
    """Token and label id used for padding."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}; got {self.format!r}")
        if self.pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1; got {self.pad_multiple}")


def require_padding_agreement(
    *, pad_multiple: int, padded_rows: bool, collate: CollateConfig, counts_padding: bool
) -> None:
    """Raise ``ValueError`` unless the plan counts the padding collate adds (``counts_padding``: the same
    multiple, and padded rows exactly for ``bshd``) or, with ``--dp-schedule-cap-counts tokens``, none; the
    message gives the fix."""
    expected = (collate.pad_multiple, collate.format == "bshd") if counts_padding else (1, False)
    if (pad_multiple, padded_rows) == expected:
        return
    fix = (f"plan with pad_multiple={expected[0]}, padded_rows={expected[1]} (build_dp_schedule(..., "
           f"pad_multiple={expected[0]}, padded_rows={expected[1]}); --dp-schedule-cap-counts "
           f"{'padded' if counts_padding else 'tokens'} does this from Megatron's arguments)")
    if counts_padding and collate.format == "bshd" and not padded_rows and pad_multiple == collate.pad_multiple:
        fix += f", or collate as thd (CollateConfig(format='thd', pad_multiple={pad_multiple}))"
    raise ValueError(
        f"the plan counts pad_multiple={pad_multiple}, padded_rows={padded_rows} but collate pads every sequence to "
        f"a multiple of {collate.pad_multiple} in {collate.format}"
        f"{', one row per sample as long as the longest' if collate.format == 'bshd' else ''}: the token cap would "
        f"not bound what is collated; {fix}"
    )


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def _loss_mask(sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The sample's ``loss_mask`` (ones if absent) as float, 0 where the label is ``IGNORE_INDEX``."""
    length = sample["tokens"].numel()
    mask = sample.get("loss_mask")
    if mask is None:
        mask = torch.ones(length, dtype=torch.float)
    elif mask.numel() != length:
        raise ValueError(f"a sample has {length} tokens but {mask.numel()} loss_mask entries")
    else:
        mask = mask.reshape(-1).float()
    ignored = sample["labels"].reshape(-1) == IGNORE_INDEX
    return mask.masked_fill(ignored, 0.0) if bool(ignored.any()) else mask


def _labels(sample: Mapping[str, torch.Tensor], pad_token_id: int) -> torch.Tensor:
    labels = sample["labels"].reshape(-1).long()
    return labels.masked_fill(labels == IGNORE_INDEX, pad_token_id)


def sample_tensors(sample: Mapping[str, object]) -> dict[str, object]:
    """``sample`` with its numpy ``tokens``, ``labels`` and ``loss_mask`` as torch tensors (ids as int64, a mask
    as float32; copies, so a read-only array such as a memory map is fine); tensors and other keys as given."""
    converted = dict(sample)
    for key in SAMPLE_FIELDS:
        value = sample.get(key)
        if isinstance(value, np.ndarray):
            dtype = np.float32 if key == "loss_mask" else np.int64
            converted[key] = torch.from_numpy(np.array(value, dtype=dtype))
    return converted


def shift_unshifted(sample: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A sample with Hugging Face style labels (``labels[i]`` the target at token ``i``, ``loss_mask[i]`` whether
    it is trained) in the shifted convention: ``labels[i]`` the target after token ``i``, i.e. ``labels[1:]``
    and ``loss_mask[1:]``; the last position has no next token and trains nothing (-100, mask 0). The length
    stays the planned one."""
    labels = sample["labels"].reshape(-1).long()
    shifted = {**sample, "labels": torch.cat([labels[1:], labels.new_full((1,), IGNORE_INDEX)])}
    mask = sample.get("loss_mask")
    if mask is not None:
        mask = mask.reshape(-1)
        shifted["loss_mask"] = torch.cat([mask[1:], mask.new_zeros(1)])
    return shifted


def dummy_sample(length: int, *, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A ``length``-token sample of padding with zero loss weight."""
    pad = torch.full((length,), pad_token_id, dtype=torch.long)
    return {"tokens": pad, "labels": pad.clone(), "loss_mask": torch.zeros(length)}


def collate_micro_batch(
    samples: Sequence[Mapping[str, torch.Tensor]],
    sample_ids: Sequence[int],
    config: CollateConfig,
) -> dict[str, object]:
    """Collate ``samples`` (one planned micro-batch); ``[]`` gives the zero-weight dummy."""
    assert len(samples) == len(sample_ids), "one id per sample"
    samples = [sample_tensors(sample) for sample in samples] or [dummy_sample(1, pad_token_id=config.pad_token_id)]
    batch = collate_thd(samples, config) if config.format == "thd" else collate_bshd(samples, config)
    batch["sample_ids"] = torch.tensor(list(sample_ids), dtype=torch.long)
    return batch


def collate_bshd(samples: Sequence[Mapping[str, torch.Tensor]], config: CollateConfig) -> dict[str, object]:
    """One right-padded row per sample; causal attention needs no mask."""
    lengths = [s["tokens"].numel() for s in samples]
    seq = _round_up(max(lengths), config.pad_multiple)
    rows = [_pad_sample(s, seq, config.pad_token_id) for s in samples]
    return {
        "tokens": torch.stack([r["tokens"] for r in rows]),
        "labels": torch.stack([r["labels"] for r in rows]),
        "loss_mask": torch.stack([r["loss_mask"] for r in rows]),
        "padding_mask": torch.arange(seq)[None, :] >= torch.tensor(lengths)[:, None],
        "position_ids": torch.arange(seq).expand(len(samples), seq).clone(),
        "attention_mask": None,
    }


def _pad_sample(
    sample: Mapping[str, torch.Tensor], length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    extra = length - sample["tokens"].numel()
    pad = dummy_sample(extra, pad_token_id=pad_token_id)
    return {
        "tokens": torch.cat([sample["tokens"].long(), pad["tokens"]]),
        "labels": torch.cat([_labels(sample, pad_token_id), pad["labels"]]),
        "loss_mask": torch.cat([_loss_mask(sample), pad["loss_mask"]]),
    }


def collate_thd(samples: Sequence[Mapping[str, torch.Tensor]], config: CollateConfig) -> dict[str, object]:
    """All samples packed in one row, each padded to ``pad_multiple``, with ``PackedSeqParams``."""
    lengths = [s["tokens"].numel() for s in samples]
    padded = [_round_up(n, config.pad_multiple) for n in lengths]
    rows = [_pad_sample(s, p, config.pad_token_id) for s, p in zip(samples, padded, strict=True)]
    positions = torch.cat([torch.arange(p) for p in padded])
    return {
        "tokens": torch.cat([r["tokens"] for r in rows])[None],
        "labels": torch.cat([r["labels"] for r in rows])[None],
        "loss_mask": torch.cat([r["loss_mask"] for r in rows])[None],
        "padding_mask": torch.cat([torch.arange(p) >= n for n, p in zip(lengths, padded, strict=True)])[None],
        "position_ids": positions[None],
        "attention_mask": None,
        "packed_seq_params": packed_seq_params(lengths, padded),
    }


def _cumulative(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(values).cumsum(0).tolist()], dtype=torch.int32)


def packed_seq_params(lengths: Sequence[int], padded_lengths: Sequence[int]) -> PackedSeqParams:
    """``PackedSeqParams`` for sequences of ``lengths`` stored with ``padded_lengths``."""
    cu_seqlens = _cumulative(lengths)
    cu_padded = _cumulative(padded_lengths)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded,
        max_seqlen_q=max(padded_lengths),
        max_seqlen_kv=max(padded_lengths),
    )


SEQUENCE_KEYS = ("tokens", "labels", "loss_mask", "padding_mask", "position_ids")
"""The per-token tensors of a collated micro-batch (``[rows, tokens]``)."""


def context_parallel_positions(length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions of a ``length``-token sequence (a multiple of ``2 * cp_size``) that CP rank ``cp_rank`` holds:
    chunks ``cp_rank`` and ``2 * cp_size - 1 - cp_rank`` of ``2 * cp_size``."""
    if length % (2 * cp_size):
        raise ValueError(f"a sequence of {length} tokens cannot be split in 2 x {cp_size} chunks; "
                         f"collate must pad it to a multiple of {2 * cp_size}")
    chunk = length // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)
    return torch.cat([first, second])


def slice_for_context_parallel(batch: Mapping[str, object], *, cp_size: int, cp_rank: int) -> dict[str, object]:
    """This CP rank's tokens of a collated micro-batch (``PackedSeqParams`` keep the whole sequences)."""
    if cp_size == 1:
        return dict(batch)
    params = batch.get("packed_seq_params")
    if params is None:
        index = context_parallel_positions(batch["tokens"].size(1), cp_size, cp_rank)
    else:
        bounds = params.cu_seqlens_q_padded.tolist()
        index = torch.cat([start + context_parallel_positions(stop - start, cp_size, cp_rank)
                           for start, stop in zip(bounds[:-1], bounds[1:])])
    sliced = {key: batch[key].index_select(1, index) for key in SEQUENCE_KEYS if batch.get(key) is not None}
    return {**batch, **sliced}
