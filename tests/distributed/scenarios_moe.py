"""MoE and multi-token prediction (MTP) scenarios.

* ``moe_*`` layouts train Megatron's real ``train()`` with routed experts (dropless top-2 of 4,
  no load-balancing loss, so the maths does not depend on how tokens are grouped into
  micro-batches) and are compared in ``test_moe_mtp.py`` with the one-process whole-batch
  reference ``moe_reference`` (:func:`train_checks.assert_trained_like_reference`).
* ``*_own_path`` scenarios compare a scheduled run with **Megatron's own path on the same
  micro-batches**, where the whole-batch reference cannot express the maths: the MoE
  load-balancing loss and the MTP loss are computed per micro-batch. Each step of the scheduled
  run (``patch.enable()``, the feed's plan) is replayed by Megatron without the dp-schedule hooks,
  configured so that ``get_num_microbatches()`` is the step's micro-batch count ``M``
  (``--global-batch-size M x DP``, ``--micro-batch-size 1``), from the same weights, fed the very
  micro-batches the scheduled step ran through a plain iterator, with a forward step of its own
  whose ``loss_mask`` and ``padding_mask`` come from the samples' real lengths
  (:func:`masks_from_lengths`), not from the project's collate or forward step. Recorded per
  step and rank: the reduced gradients, the grad norm, and what ``training_log`` adds to its
  ``total_loss_dict`` for ``load_balancing_loss`` / ``mtp_1 loss`` (the values it writes to
  TensorBoard / W&B).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import harness
import torch
from harness import GLOBAL_BATCH, LENGTHS, TRAIN_ITERS, Layout
from registry import scenario
from scenarios import FeedCase, _GradRecorder, _loader, run_training

EXPERTS = ("--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16", "--disable-bias-linear")
"""Routed experts (dropless); no linear biases: Megatron's ``SequentialMLP`` adds an expert's bias in place
on the output of a custom autograd function, which autograd refuses (``megatron/core/transformer/mlp.py``)."""
NO_AUX_LOSS = ("--moe-aux-loss-coeff", "0", "--moe-router-load-balancing-type", "none")
AUX_LOSS = ("--moe-aux-loss-coeff", "0.01", "--moe-router-load-balancing-type", "aux_loss")
ALLTOALL = (*EXPERTS, *NO_AUX_LOSS, "--moe-token-dispatcher-type", "alltoall")
ALLGATHER = (*EXPERTS, *NO_AUX_LOSS, "--moe-token-dispatcher-type", "allgather")
AUX_ALLTOALL = (*EXPERTS, *AUX_LOSS, "--moe-token-dispatcher-type", "alltoall")
MTP = ("--mtp-num-layers", "1", "--position-embedding-type", "rope", "--no-rope-fusion")
"""Megatron's MTP needs rotary (or no) position embeddings."""

LOGGED = ("load_balancing_loss", "mtp_1 loss")
"""The ``total_loss_dict`` keys of the logged MoE and MTP losses."""

MOE_LAYOUTS: dict[str, Layout] = {
    "moe_dp2_alltoall": Layout(extra=ALLTOALL),
    "moe_dp2_allgather": Layout(extra=ALLGATHER),
    "moe_pp2_alltoall": Layout(pp=2, extra=ALLTOALL),
    "moe_dp2_ep2": Layout(ep=2, extra=ALLTOALL),
}
OWN_PATH_LAYOUTS: dict[str, Layout] = {
    "moe_aux_dp2_own_path": Layout(extra=AUX_ALLTOALL),
    "moe_aux_pp2_own_path": Layout(pp=2, extra=AUX_ALLTOALL),
    "mtp_dp2_own_path": Layout(extra=MTP),
}


class _LoggedLosses:
    """Wraps ``training_log``: per call, what it adds to ``total_loss_dict`` for :data:`LOGGED`, and the grad norm."""

    def __init__(self, module: Any) -> None:
        self.steps: list[dict[str, float]] = []
        self.grad_norms: list[float] = []
        self._module, self._inner = module, module.training_log
        module.training_log = self

    def __call__(self, loss_dict: Any, total_loss_dict: dict, *args: Any, **kwargs: Any) -> Any:
        before = {key: total_loss_dict.pop(key) for key in LOGGED if key in total_loss_dict}
        result = self._inner(loss_dict, total_loss_dict, *args, **kwargs)
        self.steps.append({key: float(total_loss_dict[key]) for key in LOGGED if key in total_loss_dict})
        for key, value in before.items():
            total_loss_dict[key] = total_loss_dict.get(key, 0) + value
        self.grad_norms.append(float(args[5]))  # after lr, iteration, loss_scale, report_memory_flag, skipped_iter
        return result

    def remove(self) -> None:
        self._module.training_log = self._inner


def _batch_recorder(batches: dict[int, list[dict[str, Any]]]) -> Callable:
    """The scheduled forward step, keeping a copy of every micro-batch it reads, by step."""
    from megatron_dpsched.megatron.forward_step import ScheduledForwardStep

    class _Recording(ScheduledForwardStep):
        def __call__(self, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
            step = getattr(data_iterator, "iterable", data_iterator).feed.current.step
            item = next(data_iterator)
            batches[step].append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in item.items()})
            return super().__call__(iter([item]), model, return_schedule_plan)

    return _Recording()


def masks_from_lengths(sample_ids: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_mask, padding_mask)`` of a right-padded ``[rows, seq]`` micro-batch from the real lengths
    (``LENGTHS``); a row without a sample (the zero-weight dummy) is all padding."""
    rows, seq = shape
    lengths = torch.tensor([LENGTHS[i] for i in sample_ids.tolist()] + [0] * (rows - sample_ids.numel()))
    real = torch.arange(seq)[None, :] < lengths[:, None]
    return real.float(), ~real


def _own_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``pretrain_gpt``'s loss with ``--calculate-per-token-loss``: (sum, token count, report)."""
    loss = torch.sum(output_tensor.view(-1).float() * loss_mask.view(-1))
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.float().view(1)])}


def own_forward_step(data_iterator: Any, model: Any) -> Any:
    """A GPT forward step written apart from the project's: masks from the real lengths, every stage reads."""
    from megatron.training.global_vars import get_args

    batch = next(data_iterator)
    loss_mask, padding_mask = masks_from_lengths(batch["sample_ids"], batch["tokens"].shape)
    options = {"labels": batch["labels"], "loss_mask": loss_mask}
    if get_args().num_experts is not None:
        options["padding_mask"] = padding_mask
    output = model(batch["tokens"], batch["position_ids"], None, **options)
    return output, partial(_own_loss, loss_mask)


def _train(argv: list[str], forward_step: Callable, make_iterator: Callable[[Any], Any], *,
           hooks: bool, weights: dict[str, torch.Tensor] | None = None, keep_groups: bool = False) -> dict[str, Any]:
    """Megatron's real ``train()`` with the gradients and logged losses recorded (``weights``: start from them;
    ``keep_groups``: the caller tears Megatron down)."""
    import megatron.training.training as training
    from megatron.core.utils import get_model_config

    args = harness.parse_megatron_args(argv)
    harness.initialize(args)
    if hooks:
        harness.install_hooks()
    logged = _LoggedLosses(training)
    try:
        model, optimizer, scheduler = harness.build_model_and_optimizer()
        params = harness.global_named_parameters(model)
        if weights is not None:
            _load(params, weights, optimizer)
        recorder = _GradRecorder(optimizer, params)
        training.train(forward_step, model, optimizer, scheduler, make_iterator(args), None, None,
                       get_model_config(model[0]), {}, None)
        return {"grads": recorder.steps, "weights_before_step": recorder.weights, "logged": logged.steps,
                "grad_norms": logged.grad_norms}
    finally:
        logged.remove()
        harness.remove_hooks()
        _reset_loss_trackers()
        if not keep_groups:
            harness.teardown()


def _load(params: dict[str, torch.nn.Parameter], weights: dict[str, torch.Tensor], optimizer: Any) -> None:
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(harness.local_shard(weights[name], param))
    if hasattr(optimizer, "reload_model_params"):
        optimizer.reload_model_params()


def _reset_loss_trackers() -> None:
    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    destroy_moe_metrics_tracker()
    MTPLossLoggingHelper.tracker.clear()


def _plain_iterator(batches: list[dict[str, Any]]) -> Any:
    """The micro-batches as Megatron's own data path hands them to ``train()`` (rerun-wrapped iterator)."""
    from megatron.core.rerun_state_machine import RerunDataIterator

    return RerunDataIterator(iter(batches))


@scenario(world_size=2, launch="moe_own_path2", cases=OWN_PATH_LAYOUTS, tags={"own_path"})
def scheduled_vs_own_path(layout: Layout) -> dict[str, Any]:
    """The scheduled run, then each of its steps replayed on Megatron's own path (module docstring)."""
    from megatron.core import parallel_state

    batches: dict[int, list[dict[str, Any]]] = defaultdict(list)
    argv = harness.base_argv() + layout.argv()
    scheduled = _train(argv, _batch_recorder(batches), lambda args: _loader(args, num_chunks=1).megatron_iterators(),
                       hooks=True, keep_groups=True)
    dp, pp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_pipeline_model_parallel_rank()
    harness.teardown()
    own = []
    for step in range(TRAIN_ITERS):
        count = len(batches[step])
        step_argv = [*harness.base_argv(train_iters=1), *layout.argv(), "--global-batch-size", str(count * dp)]
        own.append(_train(step_argv, own_forward_step, lambda args, s=step: _plain_iterator(batches[s]), hooks=False,
                          weights=scheduled["weights_before_step"][step]))
    return {
        "scheduled": scheduled,
        "own": own,
        "micro_batches": [[tuple(b["sample_ids"].tolist()) for b in batches[s]] for s in range(TRAIN_ITERS)],
        "accounting_count": GLOBAL_BATCH // dp,
        "global_rank": torch.distributed.get_rank(),
        "pp_rank": pp_rank,
    }


@scenario(world_size=2, launch="moe2", cases=MOE_LAYOUTS, tags={"moe"})
def train_moe(layout: Layout) -> dict[str, Any]:
    """Tag ``moe``: compared with ``moe_reference``."""
    return run_training(FeedCase(layout=layout))


@scenario(world_size=1, launch="moe_references")
def moe_reference() -> dict[str, Any]:
    """One process, every step one micro-batch of all its samples, dropless top-2 of 4 experts."""
    return run_training(FeedCase(layout=Layout(extra=ALLTOALL), feed="whole_batch"))
