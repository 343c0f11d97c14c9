"""Checks of the parsed flags that run before Megatron's ``validate_args``, whose asserts would fire first.

Megatron asserts, with a traceback per rank, that a step's samples divide into micro-batches on every
data-parallel rank; these checks refuse the same cases first, with one line naming the flags and the
nearest sizes that work. They read the namespace Megatron's ``parse_args`` returns (nothing validated or
derived yet: the data-parallel size is ``WORLD_SIZE / (TP x PP x CP)``, as ``validate_args`` computes it)
and leave runs whose sizes come from elsewhere (``--use-checkpoint-args``, ``--yaml-cfg``, a batch-size
ramp-up, weight-sharded tensor parallelism) to Megatron. :func:`check_training_data` runs after validation:
the data flags must give training samples when training runs.
"""

from __future__ import annotations

import os
from typing import Any

from megatron_dpsched.data.sampling import parse_split
from megatron_dpsched.megatron.ranks import print_rank_0


def check_before_megatron(args: Any) -> None:
    """Refuse what Megatron's ``validate_args`` would assert on: the world size against the model-parallel
    sizes, and the global batch sizes against micro-batch size x data-parallel size."""
    if getattr(args, "use_checkpoint_args", False) or getattr(args, "yaml_cfg", None) is not None \
            or (getattr(args, "tensor_parallel_num_weight_shards", None) or 1) != 1:
        return
    data_parallel = data_parallel_size(args)
    if data_parallel is None:
        return
    micro = getattr(args, "micro_batch_size", None)
    if micro is None:
        raise ValueError("give --micro-batch-size (1 with --dp-schedule-max-tokens-per-gpu, where the token cap "
                         "sizes the micro-batches)")
    train = getattr(args, "global_batch_size", None)
    if train is not None and getattr(args, "rampup_batch_size", None) is None \
            and not getattr(args, "decrease_batch_size_if_needed", False):
        _check_divides(train, micro, data_parallel, flag="--global-batch-size", micro_flag="--micro-batch-size")
    evaluation = getattr(args, "eval_global_batch_size", None)
    eval_micro = getattr(args, "eval_micro_batch_size", None)
    if evaluation is None and train is not None:
        _check_divides(train, eval_micro or micro, data_parallel, micro_flag=_eval_micro_flag(eval_micro),
                       flag="--eval-global-batch-size (default: --global-batch-size)")
    elif evaluation is not None:
        _check_divides(evaluation, eval_micro or micro, data_parallel, flag="--eval-global-batch-size",
                       micro_flag=_eval_micro_flag(eval_micro))


def data_parallel_size(args: Any) -> int | None:
    """``WORLD_SIZE / (TP x PP x CP)``; a ``ValueError`` where it does not divide; ``None`` when unknown."""
    world = getattr(args, "world_size", None)
    sizes = {flag: getattr(args, name, None) or 1 for flag, name in (
        ("--tensor-model-parallel-size", "tensor_model_parallel_size"),
        ("--pipeline-model-parallel-size", "pipeline_model_parallel_size"),
        ("--context-parallel-size", "context_parallel_size"))}
    if not isinstance(world, int) or world < 1 or not all(isinstance(s, int) and s >= 1 for s in sizes.values()):
        return None
    model = sizes["--tensor-model-parallel-size"] * sizes["--pipeline-model-parallel-size"] \
        * sizes["--context-parallel-size"]
    if world % model:
        given = " x ".join(f"{flag} {size}" for flag, size in sizes.items())
        raise ValueError(f"the job's {world} processes (WORLD_SIZE) do not divide into model-parallel groups of "
                         f"{given} = {model}; start a multiple of {model} processes or change those sizes")
    return world // model


def _eval_micro_flag(eval_micro: int | None) -> str:
    return "--micro-batch-size" if eval_micro is None else "--eval-micro-batch-size"


def _check_divides(batch: int, micro: int, data_parallel: int, *, flag: str, micro_flag: str) -> None:
    """``batch`` is a positive multiple of ``micro x data_parallel`` (Megatron's sample-accounting unit)."""
    unit = micro * data_parallel
    if batch >= unit and batch % unit == 0:
        return
    nearest = sorted({max(unit, batch // unit * unit), (batch // unit + 1) * unit} - {batch})
    raise ValueError(f"{flag} {batch} is not a multiple of {micro_flag} {micro} x data-parallel size "
                     f"{data_parallel} = {unit} (Megatron counts a step in micro-batches of that many samples over the "
                     f"data-parallel ranks); use {' or '.join(map(str, nearest))}")


def check_training_data(args: Any) -> None:
    """Training (``--train-iters`` or ``--train-samples`` without ``--skip-train``) needs a training split:
    ``--train-data-path``, or ``--data-path`` with a train share in ``--split``."""
    trains = bool(getattr(args, "train_iters", None) or getattr(args, "train_samples", None)) \
        and not getattr(args, "skip_train", False)
    if not trains:
        return
    how = f"--train-iters {args.train_iters}" if getattr(args, "train_iters", None) \
        else f"--train-samples {args.train_samples}"
    if getattr(args, "data_path", None):
        if parse_split(args.split)[0] == 0:
            raise ValueError(f"--split {args.split} gives training no samples, but {how} trains: give the train "
                             f"split a share (e.g. --split 98,2,0), or pass --skip-train to only evaluate")
    elif not getattr(args, "train_data_path", None):
        raise ValueError(f"no training data (--train-data-path), but {how} trains: give --train-data-path or "
                         f"--data-path, or pass --skip-train to only evaluate")


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
    saved = _saved_argument(args, "data_parallel_random_init")
    if saved is False:
        args.data_parallel_random_init = False
        print_rank_0(f"dp-schedule: --load {args.load} was saved without per-rank RNG states "
                      f"(--data-parallel-random-init off, e.g. a run without --dp-schedule): this run keeps it off, "
                      f"so Megatron can load it; its ranks resume from one RNG state and save one")


def _saved_argument(args: Any, name: str) -> object:
    """The value of ``name`` in the arguments the ``--load`` checkpoint was saved with (Megatron's own reader of
    the rank-0 state: the common part of a ``torch_dist`` checkpoint); ``None`` without a readable one."""
    from megatron.training import checkpointing

    if not os.path.isfile(checkpointing.get_checkpoint_tracker_filename(args.load)):
        return None
    try:
        state_dict = checkpointing._load_base_checkpoint(args.load, args, rank0=True)[0]
    except (OSError, RuntimeError, KeyError, ValueError):  # Megatron's load reports an unreadable checkpoint
        return None
    return getattr((state_dict or {}).get("args"), name, None)


