"""Megatron's GPT forward step and loss (``pretrain_gpt.py``, megatron-core 0.19) for scheduled micro-batches.

:class:`ScheduledForwardStep` does what Megatron's ``forward_step`` does, on the
collated micro-batches of :mod:`.collate`:

1. Reads the next micro-batch inside Megatron's ``batch-generator`` timer and
   straggler detector (every stage reads it, middle pipeline stages too, which
   keeps all chunk iterators in step with the plan; ``--dp-schedule-verify
   strict`` checks it), keeps this context-parallel rank's chunks of every
   sequence, and moves it to the device (middle stages move only what they use).
2. Calls the model with ``labels``, ``loss_mask`` (multi-token prediction trains
   on the unmasked tokens only), ``packed_seq_params`` (``thd``) and, for MoE,
   ``padding_mask`` (routing and its statistics leave padding out). No dense
   attention mask: every micro-batch is causal per sequence.
3. With ``return_schedule_plan`` (``--overlap-moe-expert-parallel-comm``) it
   returns the model's schedule plan instead of its output.

The loss function returns ``(loss_sum, num_tokens, report)``: the *sum* of the
token losses of the micro-batch, the number of loss tokens, and ``{"lm loss":
[loss_sum, num_tokens]}``. With ``calculate_per_token_loss`` (turned on by
``validate_dp_schedule_args``) Megatron's ``finalize_model_grads`` divides the
gradients by the token count of the whole step over all data-parallel ranks, so
every token weighs the same whichever rank or micro-batch it was planned into.
It runs the rerun state machine's checks as Megatron's does
(``--check-for-nan-in-loss-and-grad``: NaN and Inf, fatal;
``--check-for-spiky-loss``: 10x the largest loss seen, not fatal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_dpsched.megatron.collate import slice_for_context_parallel

BatchHook = Callable[[Mapping[str, Any]], None]
SPIKY_LOSS_FACTOR = 10
"""A loss 10x the largest one observed is spiky (Megatron's ``pretrain_gpt`` factor)."""


def scheduled_loss_func(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor, model: Any = None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss: ``(sum of masked token losses, loss-token count, report)``, validated as Megatron does."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss_sum = torch.sum(losses * mask)
    num_tokens = mask.sum().detach().to(torch.int)
    report = torch.cat([loss_sum.detach().clone().view(1), num_tokens.detach().clone().float().view(1)])
    _validate_loss(loss_sum)
    return loss_sum, num_tokens, {"lm loss": report}


def _validate_loss(loss: torch.Tensor) -> None:
    """Megatron's NaN/Inf and spiky-loss checks through the rerun state machine (when its flags ask)."""
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.training.global_vars import get_args

    args, machine = get_args(), get_rerun_state_machine()
    if args.check_for_nan_in_loss_and_grad:
        for reject, name in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            machine.validate_result(result=loss, rejection_func=reject, tolerance=0.0, fatal=True,
                                    message=f"found {name} in local forward loss calculation")
    if args.check_for_spiky_loss:
        spiky = partial(machine.is_unexpectedly_large, threshold=SPIKY_LOSS_FACTOR, context="loss")
        machine.validate_result(result=loss, rejection_func=spiky, message="Spiky loss", tolerance=0.0, fatal=False)


def _to_device(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cuda(non_blocking=True)
    if isinstance(value, PackedSeqParams):
        changes = {f.name: _to_device(getattr(value, f.name)) for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), torch.Tensor)}
        return dataclasses.replace(value, **changes)
    return value


def batch_to_device(batch: Mapping[str, Any], *, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Move the tensors of a collated micro-batch (all, or only ``keys``; ``sample_ids`` stays on the host)."""
    return {key: value if key == "sample_ids" or (keys is not None and key not in keys) else _to_device(value)
            for key, value in batch.items()}


MIDDLE_STAGE_KEYS = ("packed_seq_params", "padding_mask")
"""What a pipeline stage that neither embeds nor computes the loss needs from a micro-batch."""


class ScheduledForwardStep:
    """Megatron ``forward_step_func`` for scheduled micro-batches (GPT-style model); see the module docstring.

    ``on_batch`` (optional) sees every micro-batch as read, e.g. to record ``sample_ids``.
    """

    def __init__(self, *, on_batch: BatchHook | None = None) -> None:
        self.on_batch = on_batch

    def __call__(self, data_iterator: Any, model: torch.nn.Module, return_schedule_plan: bool = False) -> Any:
        from megatron.core.utils import StragglerDetector
        from megatron.training.global_vars import get_args, get_timers

        args, timers, stimer = get_args(), get_timers(), StragglerDetector()
        timers("batch-generator", log_level=2).start()
        with stimer(bdata=True):
            batch = self.read_batch(data_iterator, model)
        timers("batch-generator").stop()
        inputs = (batch["tokens"], batch["position_ids"], batch.get("attention_mask"))
        options = {"labels": batch["labels"], "loss_mask": batch["loss_mask"],
                   "packed_seq_params": batch.get("packed_seq_params")}
        if args.num_experts is not None:
            options["padding_mask"] = batch["padding_mask"]
        with stimer:
            if return_schedule_plan:
                if not args.overlap_moe_expert_parallel_comm:
                    raise ValueError("return_schedule_plan needs --overlap-moe-expert-parallel-comm")
                output = model.build_schedule_plan(*inputs, **options)
            else:
                output = model(*inputs, **options)
        return output, partial(scheduled_loss_func, batch["loss_mask"], model=model)

    def read_batch(self, data_iterator: Any, model: Any) -> dict[str, Any]:
        """The next micro-batch: this CP rank's tokens, on the device (the stage's part of it)."""
        from megatron.core import parallel_state
        from megatron.core.utils import get_attr_wrapped_model
        from megatron.training.utils import is_first_or_last_pipeline_stage

        batch = next(data_iterator)
        if self.on_batch is not None:
            self.on_batch(batch)
        batch = slice_for_context_parallel(batch, cp_size=parallel_state.get_context_parallel_world_size(),
                                           cp_rank=parallel_state.get_context_parallel_rank())
        vp_stage = get_attr_wrapped_model(model, "vp_stage", allow_none=True)
        if is_first_or_last_pipeline_stage(vp_stage):
            return batch_to_device(batch)
        return batch_to_device(batch, keys=MIDDLE_STAGE_KEYS)
