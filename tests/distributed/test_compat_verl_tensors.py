"""The verl drop-in's tensor functions on real torch tensors, and the DP agreement over real gloo processes.

verl's contract (``verl/utils/seqlen_balancing.py`` at b178a3c): ``rearrange_micro_batches(batch,
max_token_len, ...)`` returns the micro-batches (rows of ``batch``) and their row indices; the index
lists cover the batch once; ``restore_dynamic_batch`` puts rows computed in micro-batch order back in
batch order; with ``same_micro_num_in_dp`` every rank of the group gets the same count. Here also: no
micro-batch holds more than ``max_token_len`` tokens. The checks below compute tokens from the masks
and inverse orders with ``argsort``, not with the code under test.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from megatron_dpsched.compat.verl import prepare_dynamic_batch, rearrange_micro_batches, restore_dynamic_batch

pytestmark = pytest.mark.distributed


def padded_batch(seed: int, rows: int, width: int = 100) -> dict[str, torch.Tensor]:
    """Left- and right-padded rows of 30-95% valid tokens, as verl's rollouts look."""
    gen = torch.Generator().manual_seed(seed)
    valid = torch.randint(int(0.3 * width), int(0.95 * width) + 1, (rows,), generator=gen)
    left = torch.randint(0, width // 20 + 1, (rows,), generator=gen)
    cols = torch.arange(width)
    mask = ((cols >= left[:, None]) & (cols < (left + valid)[:, None])).long()
    return {"input_ids": torch.randint(0, 1000, (rows, width), generator=gen), "attention_mask": mask}


def check_micro_batches(batch, micro_batches, indices, *, max_token_len, count=None):
    tokens = batch["attention_mask"].sum(dim=1)
    rows = [i for mb in indices for i in mb]
    assert sorted(rows) == list(range(len(tokens)))
    assert all(indices) and (count is None or len(indices) == count)
    for mb, idx in zip(micro_batches, indices, strict=True):
        assert int(tokens[idx].sum()) <= max_token_len
        for key, value in batch.items():
            assert torch.equal(mb[key], value[idx])
    per_row = torch.cat([mb["input_ids"] for mb in micro_batches]) * 3  # an output computed in run order
    restored = restore_dynamic_batch(per_row, indices)
    assert torch.equal(restored, batch["input_ids"] * 3)
    assert torch.equal(restored, per_row[torch.argsort(torch.tensor(rows))])


@pytest.mark.parametrize("seed", range(6))
def test_padded_batch_micro_batches_hold_the_cap_and_restore(seed):
    batch = padded_batch(seed, rows=20 + seed)
    for cap, divided_by in ((300, None), (300, 4), (1000, 2), (100, None)):
        micro_batches, indices = rearrange_micro_batches(batch, max_token_len=cap,
                                                         num_batches_divided_by=divided_by)
        check_micro_batches(batch, micro_batches, indices, max_token_len=cap)
        assert divided_by is None or len(indices) % divided_by == 0
        tokens = int(batch["attention_mask"].sum())
        assert len(indices) >= min(len(batch["input_ids"]), -(-tokens // cap))  # at least verl's count


def test_nested_input_ids_are_counted_by_row_and_restored():
    rows = [torch.arange(n) for n in (70, 20, 90, 35, 60, 10, 80)]
    batch = {"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}
    micro_batches, indices = rearrange_micro_batches(batch, max_token_len=120, min_num_micro_batch=4)
    assert len(indices) >= 4
    for mb, idx in zip(micro_batches, indices, strict=True):
        assert sum(len(rows[i]) for i in idx) <= 120
        assert [t.tolist() for t in mb["input_ids"].unbind()] == [rows[i].tolist() for i in idx]
    outputs = torch.nested.as_nested_tensor([rows[i] * 2 for mb in indices for i in mb], layout=torch.jagged)
    restored = restore_dynamic_batch(outputs, indices)
    assert [t.tolist() for t in restored.unbind()] == [(r * 2).tolist() for r in rows]


class Proto:
    """The part of verl's ``DataProto`` that ``prepare_dynamic_batch`` uses (fields and ``from_dict``)."""

    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

    @classmethod
    def from_dict(cls, tensors, non_tensors=None, meta_info=None):
        return cls(tensors, non_tensors or {}, meta_info or {})


def test_prepare_dynamic_batch_slices_non_tensors_and_copies_meta_info():
    batch = padded_batch(7, rows=12)
    data = Proto(batch, {"uid": np.array([f"u{i}" for i in range(12)], dtype=object)}, {"temperature": [1.0]})
    micro_batches, indices = prepare_dynamic_batch(data, max_token_len=250)
    check_micro_batches(batch, [m.batch for m in micro_batches], indices, max_token_len=250)
    for micro, idx in zip(micro_batches, indices, strict=True):
        assert list(micro.non_tensor_batch["uid"]) == [f"u{i}" for i in idx]
        assert micro.meta_info == data.meta_info and micro.meta_info is not data.meta_info
    original = copy.deepcopy(data.meta_info)
    micro_batches[0].meta_info["temperature"].append(2.0)
    assert data.meta_info == original


def test_oversized_rows_and_impossible_counts_raise_like_verl():
    batch = padded_batch(1, rows=4, width=100)
    with pytest.raises(AssertionError, match="max_token_len"):
        rearrange_micro_batches(batch, max_token_len=99)
    with pytest.raises(AssertionError, match="num_micro_batches|min_num_micro_batch"):
        rearrange_micro_batches(batch, max_token_len=1000, min_num_micro_batch=5)


def _agree(rank: int, world_size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    # rank 0: 12 samples of 160 tokens under a cap of 300 need 12 micro-batches (verl would ask for 7);
    # rank 1: 30 small samples need 4
    if rank == 0:
        batch = {"input_ids": torch.zeros(12, 160, dtype=torch.long), "attention_mask": torch.ones(12, 160)}
    else:
        batch = padded_batch(11, rows=30, width=60)
    results = {}
    for same, group in ((True, None), (True, dist.new_group([0, 1])), (False, None)):
        _, indices = rearrange_micro_batches(batch, max_token_len=300, dp_group=group, same_micro_num_in_dp=same,
                                             num_batches_divided_by=2)
        tokens = batch["attention_mask"].sum(dim=1)
        assert all(float(tokens[mb].sum()) <= 300 for mb in indices)
        results[str(same) + str(group is None)] = len(indices)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_ranks_agree_on_the_largest_count_over_gloo(tmp_path):
    init = tmp_path / "init"
    mp.spawn(_agree, args=(2, str(init), str(tmp_path)), nprocs=2, join=True)
    counts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert counts[0]["TrueTrue"] == counts[1]["TrueTrue"] == 12  # the MAX, already a multiple of 2
    assert counts[0]["TrueFalse"] == counts[1]["TrueFalse"] == 12  # over an explicit group
    assert counts[0]["FalseTrue"] == 12 and counts[1]["FalseTrue"] < 12  # each its own
    assert counts[1]["FalseTrue"] % 2 == 0
