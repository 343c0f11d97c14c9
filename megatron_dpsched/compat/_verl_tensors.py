"""The tensor half of the verl drop-in: verl's per-rank dynamic batching on a batch of tensors.

torch is imported inside the functions, so importing :mod:`megatron_dpsched.compat.verl` stays
torch-free. A batch is verl's ``TensorDict`` (or any mapping of tensors with ``"input_ids"`` and, unless
``input_ids`` is a jagged nested tensor, ``"attention_mask"``); a ``DataProto`` is duck-typed
(``.batch``, ``.non_tensor_batch``, ``.meta_info``, ``type(data).from_dict``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from itertools import chain
from typing import Any

from megatron_dpsched.compat._verl_partitions import (
    VerlBalancingError,
    get_reverse_idx,
    local_micro_batch_count,
    plan_micro_batches,
    roundup_divisible,
)
from megatron_dpsched.core.validation import is_int


def rearrange_micro_batches(  # noqa: PLR0913 - verl's signature, positional order kept
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """Split ``batch`` into micro-batches of at most ``max_token_len`` tokens (verl's contract).

    Returns the micro-batches (rows of ``batch``) and, for each, its row indices into ``batch``. The
    count is verl's (see :mod:`megatron_dpsched.compat.verl`), raised where the cap needs more, then
    agreed over ``dp_group`` (MAX, when ``torch.distributed`` is initialised and ``same_micro_num_in_dp``)
    and rounded up to a multiple of ``num_batches_divided_by``.
    """
    lengths, width = _sample_lengths(batch)
    if width > max_token_len:
        raise VerlBalancingError(f"max_token_len must be at least the sequence length: max_token_len="
                                 f"{max_token_len}, the batch holds sequences of {width} tokens")
    count = local_micro_batch_count(lengths, max_token_len=max_token_len, min_num_micro_batch=min_num_micro_batch)
    if same_micro_num_in_dp:
        count = _max_over_group(count, dp_group)
    if num_batches_divided_by is not None:
        if not is_int(num_batches_divided_by) or num_batches_divided_by < 1:
            raise VerlBalancingError(f"num_batches_divided_by must be an integer >= 1, got {num_batches_divided_by!r}")
        count = roundup_divisible(count, num_batches_divided_by)
    indices = plan_micro_batches(lengths, max_token_len=max_token_len, num_micro_batches=count,
                                 use_dynamic_bsz_balance=use_dynamic_bsz_balance)
    return [select_rows(batch, rows) for rows in indices], indices


def prepare_dynamic_batch(  # noqa: PLR0913 - verl's signature, positional order kept
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """:func:`rearrange_micro_batches` on a ``DataProto``: one ``DataProto`` per micro-batch (tensors,
    non-tensor fields and a copy of ``meta_info``) and the index lists."""
    batches, indices = rearrange_micro_batches(
        data.batch, max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp, min_num_micro_batch,
        use_dynamic_bsz_balance,
    )
    micro_batches = []
    for micro_batch, rows in zip(batches, indices, strict=True):
        non_tensors = {key: value[rows] for key, value in data.non_tensor_batch.items()}
        micro_batches.append(type(data).from_dict(dict(micro_batch), non_tensors,
                                                  meta_info=copy.deepcopy(data.meta_info)))
    return micro_batches, indices


def restore_dynamic_batch(data: Any, batch_idx_list: Sequence[Sequence[int]]) -> Any:
    """Rows of ``data`` (micro-batch outputs concatenated in run order) put back in the batch's order."""
    import torch

    indices = list(chain.from_iterable(batch_idx_list))
    if len(indices) != data.shape[0]:
        raise VerlBalancingError(f"batch_idx_list holds {len(indices)} indices for {data.shape[0]} rows of data")
    order = get_reverse_idx(indices)
    if data.is_nested:
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in order], layout=torch.jagged)
    return data[torch.tensor(order, dtype=torch.long, device=data.device)]


def select_rows(batch: Any, rows: Sequence[int]) -> Any:
    """Rows ``rows`` of every field of ``batch`` (nested tensors rebuilt, per-batch non-tensors kept whole)."""
    import torch

    index = torch.tensor(list(rows), dtype=torch.long)
    selected = {key: _rows_of(value, index) for key, value in batch.items()}
    if isinstance(batch, dict):
        return selected
    return type(batch)(selected, batch_size=[len(index)], device=getattr(batch, "device", None))


def _rows_of(value: Any, index: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_nested:
        rows = value.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in index.tolist()], layout=torch.jagged)
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)]
    return value[index] if getattr(value, "shape", None) else value  # NonTensorStack, or NonTensorData


def _sample_lengths(batch: Any) -> tuple[list[int], int]:
    """Tokens of every row (a jagged ``input_ids``'s row lengths, else ``attention_mask`` sums) and the
    longest row the batch can hold (the padded width, as verl checks it)."""
    input_ids = batch["input_ids"]
    if input_ids.is_nested:
        lengths = input_ids.offsets().diff().tolist()
        return lengths, max(lengths, default=0)
    mask = batch["attention_mask"]
    return mask.sum(dim=1).long().tolist(), mask.shape[-1]  # a 0/1 mask of any dtype


def _max_over_group(count: int, group: Any) -> int:
    """The MAX of ``count`` over ``group`` (the default group for ``None``); ``count`` without a group."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return count
    backend = str(dist.get_backend(group))
    if backend == "gloo":
        device = torch.device("cpu")
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.accelerator.current_accelerator() or torch.device("cpu")
    value = torch.tensor([count], dtype=torch.long, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return int(value.item())
