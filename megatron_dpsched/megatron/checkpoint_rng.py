"""The RNG-state layout of a resumed checkpoint: a run resumes what its checkpoint saved.

With ``--dp-schedule``, more than one data-parallel rank and dropout, ``validate_dp_schedule_args`` turns on
``data_parallel_random_init`` (every data-parallel rank saves its own RNG state). A checkpoint saved with it off
(a run without ``--dp-schedule``, or one with DP 1 or no dropout) holds one RNG state, and Megatron's
``load_checkpoint`` asserts that the checkpoint's value equals the run's: :func:`keep_checkpoint_rng_layout`
keeps it off for such a resume.
"""

from __future__ import annotations

from typing import Any

from megatron_dpsched.runtime.megatron_state import checkpoint_saved_args
from megatron_dpsched.runtime.ranks import print_rank_0


def keep_checkpoint_rng_layout(args: Any) -> None:
    """Resuming a checkpoint saved without per-rank RNG states (``data_parallel_random_init`` off: a run without
    ``--dp-schedule``, or one with DP 1 or no dropout): keep it off for this run, and say so.

    ``validate_dp_schedule_args`` turns it on with DP > 1 and dropout, and Megatron's ``load_checkpoint``
    asserts that the checkpoint's value equals the run's, ``--no-load-rng`` or not. Kept off, the ranks
    resume from the checkpoint's one RNG state and save one, as plain Megatron does: data, plans and losses
    without dropout resume exactly, the dropout masks of ranks other than 0 do not."""
    if not getattr(args, "data_parallel_random_init", False) or not getattr(args, "load", None) \
            or getattr(args, "finetune", False):
        return
    saved = getattr(checkpoint_saved_args(args), "data_parallel_random_init", None)
    if saved is False:
        args.data_parallel_random_init = False
        print_rank_0(f"dp-schedule: --load {args.load} was saved without per-rank RNG states "
                      f"(--data-parallel-random-init off, e.g. a run without --dp-schedule): this run keeps it off, "
                      f"so Megatron can load it; its ranks resume from one RNG state and save one")

