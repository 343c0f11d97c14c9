"""Forward step and per-token loss for scheduled micro-batches, in the spirit of Megatron's GPT ones.

The loss function returns ``(loss_sum, num_tokens, report)``: the *sum* of the
token losses of the micro-batch, the number of loss tokens, and
``{"lm loss": [loss_sum, num_tokens]}`` for logging. With
``calculate_per_token_loss`` (turned on by ``validate_dp_schedule_args``)
Megatron's ``finalize_model_grads`` divides the gradients by the token count of
the whole step over all data-parallel ranks, so every token weighs the same
whichever rank or micro-batch it was planned into. The reported loss is
``.detach().clone()``'d because the schedules divide the returned loss in place.

Every stage reads the data iterator once per micro-batch (also middle pipeline
stages), which keeps all chunk iterators in step with the plan
(``--dp-schedule-verify strict`` checks it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

BatchHook = Callable[[Mapping[str, Any]], None]


def scheduled_loss_func(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss: ``(sum of masked token losses, loss-token count, report)``."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss_sum = torch.sum(losses * mask)
    num_tokens = mask.sum().detach().to(torch.int)
    report = torch.cat([loss_sum.detach().clone().view(1), num_tokens.detach().clone().float().view(1)])
    return loss_sum, num_tokens, {"lm loss": report}


def _to_device(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cuda(non_blocking=True)
    if isinstance(value, PackedSeqParams):
        changes = {f.name: _to_device(getattr(value, f.name)) for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), torch.Tensor)}
        return dataclasses.replace(value, **changes)
    return value


def batch_to_device(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Move every tensor of a collated micro-batch (``sample_ids`` stays on the host)."""
    return {key: value if key == "sample_ids" else _to_device(value) for key, value in batch.items()}


def _slice_for_context_parallel(batch: dict[str, Any]) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    if parallel_state.get_context_parallel_world_size() == 1:
        return batch
    if batch.get("packed_seq_params") is not None:
        raise ValueError("packed (thd) micro-batches with context parallelism are not supported yet; "
                         "use the bshd layout")
    keys = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")
    sliced = get_batch_on_this_cp_rank({k: batch[k] for k in keys}, is_hybrid_cp=False,
                                       cp_group=parallel_state.get_context_parallel_group())
    return {**batch, **sliced}


class ScheduledForwardStep:
    """Megatron ``forward_step_func`` for scheduled micro-batches (GPT-style model).

    ``on_batch`` (optional) sees every micro-batch as read, e.g. to record ``sample_ids``.
    """

    def __init__(self, *, on_batch: BatchHook | None = None) -> None:
        self.on_batch = on_batch

    def __call__(self, data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        batch = next(data_iterator)
        if self.on_batch is not None:
            self.on_batch(batch)
        batch = _slice_for_context_parallel(batch_to_device(batch))
        output = model(
            batch["tokens"],
            batch["position_ids"],
            batch["attention_mask"],
            labels=batch["labels"],
            packed_seq_params=batch.get("packed_seq_params"),
        )
        return output, partial(scheduled_loss_func, batch["loss_mask"])
