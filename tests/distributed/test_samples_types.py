"""Sample types through a shipped-plan feed (single process, torch): numpy arrays are a documented sample type
and collate as the same tensors do; a list as a sample, a generator or iterator as ``samples``, a meta tensor
and a sparse tensor are refused in one ``ValueError`` line naming the sample (or the argument) and what is
wrong, never a raw ``AttributeError`` / ``NotImplementedError``; the step's content digest takes numpy arrays
by their bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import harness
import numpy as np
import pytest
import torch

from megatron_dpsched import DPSchedule, build_dp_schedule
from megatron_dpsched.data.contract import SampleContractError
from megatron_dpsched.megatron import ScheduledDataIterator
from megatron_dpsched.megatron.feeds import sample_digest

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

VOCAB = harness.VOCAB
LENGTHS = harness.LENGTHS[:16]
BAD_ID = 5


def shipped_plan() -> DPSchedule:
    """A plan for two ranks, shipped as JSON, for the default bshd collate."""
    plan = build_dp_schedule(LENGTHS, dp_size=2, global_batch_size=8, max_tokens_per_gpu=40, padded_rows=True)
    return DPSchedule.from_dict(json.loads(json.dumps(plan.to_dict())))


def with_mask(sample_id: int) -> dict[str, torch.Tensor]:
    """The harness sample with a loss mask that leaves its first position out."""
    sample = harness.make_sample(sample_id)
    mask = torch.ones(sample["tokens"].numel(), dtype=torch.long)
    mask[0] = 0
    return {**sample, "loss_mask": mask}


def as_numpy(sample: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The sample in numpy, in the narrow dtypes a tokenized corpus keeps (read-only, as a memory map is)."""
    arrays = {"tokens": sample["tokens"].numpy().astype(np.uint16), "labels": sample["labels"].numpy().astype(np.int32),
              "loss_mask": sample["loss_mask"].numpy().astype(np.uint8)}
    for array in arrays.values():
        array.flags.writeable = False
    return arrays


def batches(feed: ScheduledDataIterator) -> list[dict[str, Any]]:
    """Every micro-batch of every step, as the model chunk reads them."""
    read = []
    while True:
        try:
            planned = feed.begin_step()
        except StopIteration:
            return read
        read += [next(feed.chunks[0]) for _ in planned.micro_batches]
        feed.end_step()


@pytest.mark.parametrize("rank", [0, 1])
def test_numpy_samples_collate_as_the_same_tensors_do(rank: int) -> None:
    plan = shipped_plan()
    tensors = [with_mask(i) for i in range(len(LENGTHS))]
    arrays = [as_numpy(sample) for sample in tensors]
    from_tensors = batches(ScheduledDataIterator(plan, rank=rank, samples=tensors, vocab_size=VOCAB))
    from_arrays = batches(ScheduledDataIterator(plan, rank=rank, samples=arrays, vocab_size=VOCAB))
    assert len(from_arrays) == len(from_tensors) == sum(plan.num_microbatches[:plan.num_steps])
    for got, expected in zip(from_arrays, from_tensors, strict=True):
        for key in ("tokens", "labels", "loss_mask", "padding_mask", "position_ids", "sample_ids"):
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key


def test_numpy_content_is_digested_by_its_bytes() -> None:
    """Two long numpy samples that differ in one id in the middle digest differently (a ``repr`` would print both
    as ``[1 1 1 ... 1 1 1]``); an int64 array digests as the int64 tensor of its ids."""
    tokens = np.ones(4096, dtype=np.int64)
    other = tokens.copy()
    other[2048] = 2
    assert sample_digest({"tokens": tokens, "labels": tokens}) != sample_digest({"tokens": other, "labels": tokens})
    assert sample_digest({"tokens": tokens, "labels": other}) == \
        sample_digest({"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(other)})

    def boxed() -> dict[str, np.ndarray]:  # Python ints in an object array (refused when collated), made anew
        return {"tokens": np.array([int(str(10**12 + i)) for i in range(3)], dtype=object), "labels": tokens}

    assert sample_digest(boxed()) == sample_digest(boxed())  # their values, not the pointers to them


def _meta(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**sample, "tokens": torch.empty(sample["tokens"].shape, dtype=torch.long, device="meta")}


def _sparse(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**sample, "labels": sample["labels"].to_sparse()}


BAD_SAMPLES: dict[str, tuple[Callable[[dict[str, torch.Tensor]], Any], str, str]] = {
    # a sample made bad -> (the field named, what the message says)
    "a list of ids as the sample": (lambda s: s["tokens"].tolist(), "sample",
                                    "must be a mapping with 'tokens' and 'labels'; got list"),
    "a meta tensor": (_meta, "tokens", "is a meta tensor (shape ("),
    "a sparse tensor": (_sparse, "labels", "is a torch.sparse_coo tensor; hand a dense CPU tensor"),
    "a generator as tokens": (lambda s: {**s, "tokens": (int(i) for i in s["tokens"])}, "tokens",
                              "must be a 1-D tensor or numpy array; got generator"),
}


@pytest.mark.parametrize("case", sorted(BAD_SAMPLES))
def test_a_bad_sample_type_is_one_line_naming_the_sample(case: str) -> None:
    change, field, says = BAD_SAMPLES[case]
    plan = shipped_plan()
    rank = next(r for r in range(2) for s in range(plan.num_steps)
                if any(BAD_ID in mb for mb in plan.rank_step_micro_batches(r, s)))
    samples: list[Any] = [harness.make_sample(i) for i in range(len(LENGTHS))]
    samples[BAD_ID] = change(samples[BAD_ID])
    with pytest.raises(SampleContractError) as raised:
        batches(ScheduledDataIterator(plan, rank=rank, samples=samples, vocab_size=VOCAB))
    message = str(raised.value)
    assert "\n" not in message and raised.value.field == field, message
    assert f"data-parallel rank {rank}: sample {BAD_ID}: '{field}' {says}" in message, message
    other = ScheduledDataIterator(plan, rank=1 - rank, samples=samples, vocab_size=VOCAB)
    assert batches(other), "the other rank digests the bad sample and trains its own"


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return (harness.make_sample(i) for i in range(len(LENGTHS)))


@pytest.mark.parametrize("kind", ["generator", "iterator", "IterableDataset"])
def test_samples_that_cannot_be_read_by_id_are_refused_when_the_feed_is_built(kind: str) -> None:
    made = {"generator": lambda: (harness.make_sample(i) for i in range(len(LENGTHS))),
            "iterator": lambda: iter([harness.make_sample(i) for i in range(len(LENGTHS))]),
            "IterableDataset": _Stream}[kind]
    source = made()
    with pytest.raises(ValueError) as raised:
        ScheduledDataIterator(shipped_plan(), rank=0, samples=source, vocab_size=VOCAB)
    message = str(raised.value)
    assert message == (f"samples is a {type(source).__name__}, which cannot be read by sample id (the plan reads "
                       f"samples in its own order); hand a sequence (e.g. list(...)), a mapping from sample id, or a "
                       f"callable sample_id -> sample"), message
    by_id = {i: harness.make_sample(i) for i in range(len(LENGTHS))}  # a mapping from sample id is read
    assert batches(ScheduledDataIterator(shipped_plan(), rank=0, samples=by_id, vocab_size=VOCAB))
