"""The plan's own figures of each trained step, through Megatron's writers and its text log.

Every rank holds the whole step's plan, so the figures need no collective; the
rank that holds Megatron's TensorBoard writer (the last one) writes them, under
``dp-schedule/``, every ``--tensorboard-log-interval`` iterations (and to W&B
when Megatron has a W&B writer), and the last rank prints one line every
``--log-interval`` iterations:

* ``micro-batches``: micro-batches per rank (the same on every rank);
* ``tokens-per-rank-min`` / ``-mean`` / ``-max``: real (unpadded) tokens per rank;
* ``imbalance``: busiest rank's estimated cost / mean (what the planner balanced);
  ``token-imbalance``: the same in tokens;
* ``padding``: share of the collated positions that are padding (``bshd`` pads
  rows to the micro-batch's longest sample, ``thd`` each sample to the pad multiple);
* ``empty-micro-batches``: zero-weight dummies over all ranks;
* ``over-cap-samples`` / ``over-cap-longest``: with a token cap, the step's samples over the cap (each trains
  alone in a micro-batch over it; ``--dp-schedule-over-cap``) and the longest of them in tokens (0 if none);
* ``loss-tokens``: the step's loss tokens over all ranks, where the dataset gives each sample's
  (``trained_tokens``); a step with none is named on every iteration, whatever the interval
  (:data:`NO_LOSS_WARNING`: Megatron steps the optimizer with zero gradients and its lm loss is 0/0);
* ``plan-seconds``: this rank's wall time planning the step;
* ``tokens-per-second``: the step's real tokens over the wall time since the
  previous logged iteration's end (text log only).
"""

from __future__ import annotations

import math
import time
from typing import Any

from megatron_dpsched.megatron.collate import CollateConfig
from megatron_dpsched.megatron.feeds import StepBatches
from megatron_dpsched.runtime.over_cap import step_over_cap

SCALAR_PREFIX = "dp-schedule/"
"""The TensorBoard / W&B names of the plan's figures start with it."""
NO_LOSS_WARNING = ("WARNING: no loss token in this step (every target of its samples is ignored): the optimizer "
                   "steps with zero gradients, the learning rate advances, and Megatron's lm loss is 0/0, left out "
                   "of its log line (docs/data.md, 'Samples and steps with no loss token')")
"""What the log says of a step whose samples hold no loss token."""
_last_time: list[float] = []


def padded_positions(lengths: list[int], config: CollateConfig) -> int:
    """Positions a micro-batch of samples of ``lengths`` takes once collated (a dummy for ``[]``)."""
    multiple = config.pad_multiple
    lengths = lengths or [1]
    if config.format == "bshd":
        return len(lengths) * max(multiple, math.ceil(max(lengths) / multiple) * multiple)
    return sum(max(multiple, math.ceil(n / multiple) * multiple) for n in lengths)


def step_figures(step: StepBatches, collate: CollateConfig) -> dict[str, float]:
    """The figures of the module docstring for ``step`` (``{}`` without a plan)."""
    plan = step.plan
    if plan is None:
        return {}
    stats = plan.step_stats(step.plan_step)
    batches = [mb for rank in range(plan.dp_size) for mb in plan.rank_step_micro_batches(rank, step.plan_step)]
    positions = sum(padded_positions([plan.lengths[i] for i in mb], collate) for mb in batches)
    over = step_over_cap(plan.lengths, [i for mb in batches for i in mb], token_cap=plan.config.token_cap,
                         pad_multiple=plan.config.pad_multiple)
    over_cap = {} if over is None else {"over-cap-samples": over.count, "over-cap-longest": over.longest}
    loss_tokens = {} if step.loss_tokens is None else {"loss-tokens": step.loss_tokens}
    return {
        "micro-batches": stats.num_microbatches,
        "tokens-per-rank-min": min(stats.rank_tokens),
        "tokens-per-rank-mean": stats.tokens / plan.dp_size,
        "tokens-per-rank-max": max(stats.rank_tokens),
        "imbalance": stats.imbalance,
        "token-imbalance": stats.token_imbalance,
        "padding": 1.0 - stats.tokens / positions,
        "empty-micro-batches": stats.empty_microbatches,
        **over_cap,
        **loss_tokens,
        "plan-seconds": step.plan_seconds,
    }


def log_step(step: StepBatches, collate: CollateConfig, *, iteration: int) -> None:
    """Write ``step``'s figures where Megatron's flags ask for them at ``iteration``."""
    from megatron.training.global_vars import get_args, get_tensorboard_writer, get_wandb_writer

    args = get_args()
    now = time.perf_counter()
    seconds = now - _last_time[0] if _last_time else None
    _last_time[:] = [now]
    if step.loss_tokens == 0:
        _print_last(f" dp-schedule step {step.step}: {NO_LOSS_WARNING}")
    writer, wandb = get_tensorboard_writer(), get_wandb_writer()
    to_writers = (writer or wandb) and iteration % args.tensorboard_log_interval == 0
    to_text = iteration % args.log_interval == 0
    if not (to_writers or to_text):
        return
    figures = step_figures(step, collate)
    if to_writers:
        _write(figures, writer=writer, wandb=wandb, iteration=iteration)
    if to_text and figures:
        _print_last(_text(step, figures, seconds))


def _write(figures: dict[str, float], *, writer: Any, wandb: Any, iteration: int) -> None:
    for name, value in figures.items():
        if writer:
            writer.add_scalar(SCALAR_PREFIX + name, value, iteration)
    if wandb:
        wandb.log({SCALAR_PREFIX + name: value for name, value in figures.items()}, iteration)


def _text(step: StepBatches, figures: dict[str, float], seconds: float | None) -> str:
    tokens = figures["tokens-per-rank-mean"] * step.plan.dp_size
    rate = f" | tokens/s {tokens / seconds:,.0f}" if seconds else ""
    over = (f" | over cap {figures['over-cap-samples']} (longest {figures['over-cap-longest']})"
            if "over-cap-samples" in figures else "")
    loss = f" | loss tokens {figures['loss-tokens']}" if "loss-tokens" in figures else ""
    return (f" dp-schedule step {step.step}: micro-batches per rank {figures['micro-batches']} | "
            f"tokens per rank min/mean/max {figures['tokens-per-rank-min']}/{figures['tokens-per-rank-mean']:.0f}/"
            f"{figures['tokens-per-rank-max']} | imbalance {figures['imbalance']:.3f} | padding "
            f"{figures['padding']:.1%} | empty micro-batches {figures['empty-micro-batches']}{over}{loss} | plan "
            f"{figures['plan-seconds'] * 1e3:.1f} ms{rate}")


def _print_last(line: str) -> None:
    from megatron.training.utils import print_rank_last

    print_rank_last(line)
