"""The accounting window: the scheduled training step in progress, counted in Megatron's units.

From the forward-backward call of a scheduled training step until Megatron next updates its micro-batch
calculator, the step is *active*: :func:`~megatron_dpsched.megatron.hooks.num_microbatches` answers its sample
count in Megatron's units (:func:`accounting_count`), ``on_training_log`` logs its plan's figures
(:mod:`~megatron_dpsched.megatron.plan_log`) and the step recorder
(:mod:`~megatron_dpsched.megatron.step_recorder`) writes its fingerprint and data wait. The hooks open and close
the window (:func:`open_window`, :func:`close_window`); everything else only reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron_dpsched.megatron.feeds import StepBatches, StepFeed

_active_step: StepBatches | None = None
_active_feed: StepFeed | None = None


def active_step() -> StepBatches | None:
    """The scheduled training step whose sample count ``num_microbatches()`` reports, if any."""
    return _active_step


def active_feed() -> StepFeed | None:
    """The feed of :func:`active_step`, if any."""
    return _active_feed


def open_window(feed: StepFeed, step: StepBatches) -> None:
    """``step`` of ``feed`` is the active step (``ValueError`` first if Megatron cannot count its samples)."""
    global _active_step, _active_feed
    accounting_count(step)  # fail before training if the count is not expressible
    _active_step, _active_feed = step, feed


def close_window() -> None:
    """No step is active (Megatron is about to update its micro-batch calculator)."""
    global _active_step, _active_feed
    _active_step = _active_feed = None


def accounting_count(step: StepBatches) -> int:
    """``step``'s samples in Megatron's units: ``num_samples / (micro_batch_size x data-parallel size x
    gtp_weight_remat_size)``; ``ValueError`` when that is not a whole number."""
    from megatron.training.global_vars import get_args

    args = get_args()
    remat = getattr(args, "gtp_weight_remat_size", 1)
    per_microbatch = args.micro_batch_size * args.data_parallel_size * remat
    count, remainder = divmod(step.num_samples, per_microbatch)
    if remainder:
        raise ValueError(
            f"dp-schedule step {step.step} trains {step.num_samples} samples, not a multiple of "
            f"--micro-batch-size x data-parallel size = {per_microbatch}; Megatron cannot count it "
            f"(set --global-batch-size to a multiple, or drop the trailing partial step)"
        )
    return count
