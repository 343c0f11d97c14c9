"""The hook functions Megatron's training loop calls for ``--dp-schedule``.

Both integrations call exactly these functions, so they behave the same:

* the monkey-patch (:func:`megatron_dpsched.megatron.patch.enable`) installs them
  in place of names in ``megatron.training.training`` (one row per name in the registry
  of :mod:`~megatron_dpsched.megatron.patch`);
* the source patch (``patches/megatron_training_dpsched.patch``; megatron-core 0.17 and 0.18: its
  ``_0.17`` / ``_0.18`` file; applied with ``scripts/apply_megatron_patch.sh``) calls them explicitly from
  ``megatron/training/training.py``; each call line is marked ``# megatron-dpsched``.

The hooks:

1. :func:`forward_backward_func` wraps the function returned by Megatron's
   ``get_forward_backward_func`` (in ``train()`` and ``evaluate()``). When the
   ``data_iterator`` it is called with is a scheduled chunk iterator (or a list
   of them, possibly inside Megatron's ``RerunDataIterator``), the wrapper
   starts the feed's next step, checks the step's micro-batch count against the
   interleaved schedule's rule *before* calling (a rejected call would already
   have entered ``no_sync``), checks that every rank of the job holds the same
   plan for the step (:mod:`~megatron_dpsched.megatron.agreement`: one
   two-integer all-reduce; on a resume, also that it is the plan the checkpoint
   expected: :mod:`~megatron_dpsched.megatron.job_checks`), and passes the planned ``num_microbatches``
   instead of the calculator's. When the rerun state machine replays a step
   (``RerunDataIterator.replaying``) the same step is run again, not the next.
   Other iterators pass through untouched, and with ``--dp-schedule`` off
   (``args.dp_schedule is False``) the function is returned unwrapped.
2. :func:`num_microbatches` replaces ``get_num_microbatches()``. During a
   scheduled training step (from the forward-backward call until Megatron next
   updates the micro-batch calculator) it answers
   ``step_num_samples / (micro_batch_size * data_parallel_size)``, so
   ``train_step``'s LR-scheduler increment and ``train()``'s
   ``consumed_train_samples`` grow by exactly the samples the step trained.
   Outside that window it is Megatron's calculator, so ``train()``'s
   "micro-batches never decrease" assert keeps seeing the constant count.
   It also feeds the step's real sample lengths to Megatron's
   ``update_seqlen_stats_from_cu_seqlens``, so the logged TFLOP/s count real tokens.
3. :func:`on_update_num_microbatches` closes that window; Megatron calls it
   right before ``update_num_microbatches``. The window (which step is in progress, of which
   feed) is kept in :mod:`~megatron_dpsched.megatron.accounting`, which the step recorder reads.
4. :func:`microbatches_run` is the scale of the auxiliary losses (MoE, MTP, DSA
   indexer) that ``training_log`` sums over a step's micro-batches: the micro-batches
   the step really ran, where Megatron divides by ``get_num_microbatches()``.
5. :func:`on_training_log` writes the plan's figures of the step just trained
   (TensorBoard / W&B under ``dp-schedule/``, and the text log), after ``training_log``.

Three more wrap a function of Megatron's and are here for both integrations to call, though they
live with what they check or record: :func:`with_job_checks` (``setup_model_and_optimizer``) and
:func:`with_state_file` (``save_checkpoint``) from :mod:`~megatron_dpsched.megatron.job_checks`, on
every job, with or without ``--dp-schedule``; :func:`with_step_stats` (``train_step``) from
:mod:`~megatron_dpsched.megatron.step_recorder`, which passes through unless a step recorder records.

No plan is computed here: the plan comes from the data iterator's feed
(:mod:`megatron_dpsched.megatron.feeds`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.megatron.accounting import accounting_count, active_feed, active_step, close_window, open_window
from megatron_dpsched.megatron.agreement import agree_on_step, log_first_step
from megatron_dpsched.megatron.arguments import GROUP_FLAG
from megatron_dpsched.megatron.feeds import StepBatches, StepFeed, find_step_feed, is_replaying
from megatron_dpsched.megatron.job_checks import check_resumed_step
from megatron_dpsched.megatron.job_checks import with_job_checks as with_job_checks
from megatron_dpsched.megatron.job_checks import with_state_file as with_state_file
from megatron_dpsched.megatron.step_recorder import with_step_stats as with_step_stats
from megatron_dpsched.runtime.megatron_state import megatron_args, megatron_timers

# --- the hooks -------------------------------------------------------------------------------


def forward_backward_func(func: Callable[..., Any]) -> Callable[..., Any]:
    """Hook 1: ``func`` (a Megatron schedule), wrapped so scheduled iterators set ``num_microbatches``."""
    if _dp_schedule_off():
        return func
    return scheduled_forward_backward(func)


def num_microbatches() -> int:
    """Hook 2: ``get_num_microbatches()``, or the active scheduled step's count in Megatron units."""
    step = active_step()
    if step is None:
        from megatron.core.num_microbatches_calculator import get_num_microbatches

        return get_num_microbatches()
    return accounting_count(step)


def on_update_num_microbatches() -> None:
    """Hook 3: the scheduled step is over (Megatron is about to update its micro-batch calculator)."""
    close_window()


def microbatches_run() -> int:
    """Hook 4: micro-batches this rank ran in the active scheduled step (``get_num_microbatches()``
    outside one); the scale of the MoE/MTP/indexer losses Megatron sums over a step's micro-batches."""
    step = active_step()
    if step is None:
        from megatron.core.num_microbatches_calculator import get_num_microbatches

        return get_num_microbatches()
    return step.num_microbatches


def on_training_log(iteration: int) -> None:
    """Hook 5: after Megatron's ``training_log`` for ``iteration``, the plan's figures of the step just
    trained (:mod:`~megatron_dpsched.megatron.plan_log`)."""
    step, feed = active_step(), active_feed()
    if step is not None and feed is not None:
        from megatron_dpsched.megatron.plan_log import log_step

        log_step(step, feed.collate, iteration=iteration)


# --- 1. the forward-backward wrapper ---------------------------------------------------------


def _dp_schedule_off() -> bool:
    return getattr(megatron_args(), "dp_schedule", None) is False


def scheduled_forward_backward(forward_backward_func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Megatron forward-backward function so scheduled iterators set ``num_microbatches``."""

    @functools.wraps(forward_backward_func)
    def run(*args: Any, **kwargs: Any) -> Any:
        feed = None if args else find_step_feed(kwargs.get("data_iterator"))
        if feed is None:
            return forward_backward_func(*args, **kwargs)
        check_data_parallel_size(feed)
        replay = is_replaying(kwargs["data_iterator"])
        step = feed.current if replay else begin_step_timed(feed)
        assert step is not None, "a rerun replays a step that has started"
        if not replay:
            agree_on_step(feed, step)
            log_first_step(feed, step)
            check_resumed_step(feed, step)
        check_interleaved_count(step.num_microbatches, kwargs["model"])
        if not kwargs.get("forward_only", False):
            _open_step(feed, step, count_tokens=not replay)
        result = forward_backward_func(**{**kwargs, "num_microbatches": step.num_microbatches})
        if not replay:
            feed.end_step()
        return result

    run.dp_schedule_wrapped = forward_backward_func  # type: ignore[attr-defined]
    return run


def begin_step_timed(feed: StepFeed) -> StepBatches:
    """``feed.begin_step()`` inside Megatron's ``batch-generator`` timer (the wait for the step's plan, which
    the forward step's reads do not see; with prefetching only what the background thread has not done)."""
    timers = megatron_timers()
    if timers is None:
        return feed.begin_step()
    timer = timers("batch-generator", log_level=2)
    timer.start()
    try:
        return feed.begin_step()
    finally:
        timer.stop()


def check_data_parallel_size(feed: StepFeed) -> None:
    """Raise ``ValueError`` if the feed's plan was made for another data-parallel size."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return  # no data-parallel group to compare with (a custom loop outside Megatron)
    actual = parallel_state.get_data_parallel_world_size()
    if feed.dp_size != actual:
        raise ValueError(
            f"dp-schedule: the plan was made for dp_size={feed.dp_size}, but this job runs {actual} "
            f"data-parallel ranks; plan again with dp_size={actual}"
        )


def check_interleaved_count(num_microbatches: int, model: Any) -> None:
    """Raise ``ValueError`` if Megatron's interleaved schedule would reject this count."""
    if not isinstance(model, list) or len(model) == 1:
        return
    from megatron.core import parallel_state
    from megatron.core.utils import get_model_config

    pp = parallel_state.get_pipeline_model_parallel_world_size()
    group = get_model_config(model[0]).microbatch_group_size_per_vp_stage
    layout = PipelineLayout(pp_size=pp, vpp_size=len(model), microbatch_group_size_per_vp_stage=group)
    if group < pp or not layout.is_legal(num_microbatches):
        raise ValueError(
            f"dp-schedule planned {num_microbatches} micro-batches, which the interleaved schedule "
            f"rejects with {GROUP_FLAG}={group} and PP={pp}; the plan and the model config disagree"
        )


# --- 2./3. the accounting window -------------------------------------------------------------


def _open_step(feed: StepFeed, step: StepBatches, *, count_tokens: bool) -> None:
    open_window(feed, step)
    if count_tokens:
        count_real_tokens(feed, step)


def count_real_tokens(feed: StepFeed, step: StepBatches) -> None:
    """Feed this rank's real sample lengths to Megatron's per-iteration sequence statistics, so its
    TFLOP/s count the real tokens (``sum L`` and ``sum L**2``), not ``global batch x --seq-length``."""
    import torch

    from megatron_dpsched.megatron.releases import compat_0_18_update_seqlen_stats

    lengths = [feed.planned_length(i) for mb in step.micro_batches for i in mb] or [0]
    # every rank calls it, a rank without samples too: Megatron then all-reduces the sums over the job
    compat_0_18_update_seqlen_stats(torch.tensor([0, *itertools.accumulate(lengths)]))
