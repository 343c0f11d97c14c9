"""Every check of the flags of a ``--dp-schedule`` run, in the order a run meets them.

1. **Before Megatron parses** (no torch): :func:`check_argv` and :func:`exit_on_bad_flags`, an entry point's
   first line: a bad ``--dp-schedule*`` flag in one line, before Megatron's argument dump. They are made from the
   option fields and run without torch, so they live in :mod:`megatron_dpsched.options` (which the torch-free
   what-if tool imports too) and are re-exported here, with :func:`one_line_parser_errors`, which makes Megatron's
   own parser report a bad flag (``--seq-length 16k``) the same way (``add_dp_schedule_args`` installs it). Each
   is reported once per job (rank 0 prints, torchrun's summary names it) and exits with status 2.
2. **After Megatron parses**: :func:`check_before_validate_args` refuses, as one line naming the flags, what
   Megatron's ``validate_args`` would assert on (a traceback per rank) and, with ``--dp-schedule``, Megatron's own
   packing and hybrid-CP flags (both flags named, and the choice); :func:`validate_dp_schedule_args`, after
   ``validate_args``, checks the ``--dp-schedule*`` flags against the layout and the flags they contradict, then
   sets what a planned step needs (:func:`~megatron_dpsched.megatron.arguments.adjust_args_for_schedule`);
   :func:`check_training_data`: the data flags give training samples when training runs.
3. **When the data is known** (``build_feed``, per dataset): :func:`dataset_lengths` (a dataset the planner can
   read), :func:`check_dataset_size` (one pass covers what Megatron reads), :func:`check_over_cap`
   (``--dp-schedule-over-cap``) and :func:`padded_vocab_size` (the bound every token id is checked against).

Each raises ``ValueError`` (an :class:`~megatron_dpsched.options.OptionError` where it names one option) whose
message names the flag. Values Megatron computes are read from ``args`` once it has computed them (the
data-parallel size after ``validate_args``, the padded vocabulary after its tokenizer is built).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.data.sampling import parse_split
from megatron_dpsched.megatron.arguments import (
    GROUP_FLAG,
    adjust_args_for_schedule,
    collate_format_from_args,
    cost_model_file_from_args,
    schedule_config_from_args,
)
from megatron_dpsched.options import (
    OPTIONS,
    DPScheduleOptions,
    OptionError,
    Setting,
    check_argv,
    check_setting,
    exit_on_bad_flags,
    one_line_parser_errors,
    without_switch,
)
from megatron_dpsched.runtime.over_cap import find_over_cap, over_cap_notice
from megatron_dpsched.runtime.ranks import print_rank_0

__all__ = ["check_argv", "check_before_validate_args", "check_dataset_size", "check_over_cap", "check_training_data",
           "dataset_lengths", "exit_on_bad_flags", "one_line_parser_errors", "padded_vocab_size",
           "validate_dp_schedule_args"]


# --- 1. before Megatron parses: check_argv, exit_on_bad_flags (megatron_dpsched.options) --------------------------


# --- 2. after Megatron parses ---------------------------------------------------------------------------------------


def check_before_validate_args(args: Any) -> None:
    """On the namespace Megatron's ``parse_args`` returns, before its ``validate_args`` (whose asserts would fire
    first, with a traceback per rank): the world size against the model-parallel sizes, and the global batch
    sizes against micro-batch size x data-parallel size, each refused in one line naming the flags and the
    nearest sizes that work. Runs whose sizes come from elsewhere (``--use-checkpoint-args``, ``--yaml-cfg``,
    weight-sharded tensor parallelism) and batch-size ramp-ups are left to Megatron. First, with ``--dp-schedule``,
    a flag of Megatron's own packing or hybrid context parallel is refused (:func:`_refuse_megatron_schedulers`)."""
    _refuse_megatron_schedulers(args)
    if getattr(args, "use_checkpoint_args", False) or getattr(args, "yaml_cfg", None) is not None \
            or (getattr(args, "tensor_parallel_num_weight_shards", None) or 1) != 1:
        return
    data_parallel = _data_parallel_size_before_validate_args(args)
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


def _data_parallel_size_before_validate_args(args: Any) -> int | None:
    """``WORLD_SIZE / (TP x PP x CP)``, as ``validate_args`` will compute it into ``args.data_parallel_size``:
    computed here because these checks must run before it (to beat its asserts); every later check reads
    Megatron's value. A ``ValueError`` where it does not divide; ``None`` when unknown."""
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


def validate_dp_schedule_args(args: Any) -> None:
    """After Megatron's ``validate_args``: check the ``--dp-schedule*`` flags against the parallel layout, then
    set what a planned step needs (:func:`~megatron_dpsched.megatron.arguments.adjust_args_for_schedule`).

    Without ``--dp-schedule`` it only refuses ``--dp-schedule-*`` options given without it. Every planner
    option that the flags determine is validated here, by building the
    :class:`~megatron_dpsched.core.config.ScheduleConfig` the feeds will plan with (for Megatron's
    ``args.data_parallel_size``), so a bad value fails before any model is built. Raises ``ValueError`` naming
    the flag.
    """
    options = DPScheduleOptions.from_args(args)
    if not options.enabled:
        _refuse_options_without_dp_schedule(args)
        return
    options.check()
    check_setting(Setting.from_args(args))
    _check_token_cap(options, args)
    _check_pipeline_layout(args)
    _refuse_conflicts(args)
    _refuse_megatron_sft(args)
    _check_collate_format(args)
    cost_model_file_from_args(options)  # a bad file fails here, before any model is built
    schedule_config_from_args(args, data_parallel_size=getattr(args, "data_parallel_size", None) or 1)
    adjust_args_for_schedule(args)


def _refuse_options_without_dp_schedule(args: Any) -> None:
    given = [option.flag for option in OPTIONS if getattr(args, option.attribute, None) is not None]
    if given:
        raise OptionError(without_switch(given), option=given[0])


def _check_token_cap(options: DPScheduleOptions, args: Any) -> None:
    if options.max_tokens_per_gpu is None:
        return  # the options that need a cap are refused without one (check_setting)
    if args.micro_batch_size != 1:
        raise ValueError(
            "--dp-schedule-max-tokens-per-gpu plans micro-batches by tokens; --micro-batch-size "
            f"must stay 1 (it is the sample-accounting unit), got {args.micro_batch_size}"
        )


def _check_collate_format(args: Any) -> None:
    """``thd`` (given or by default) needs a backend that takes ``PackedSeqParams``."""
    custom_spec = bool(getattr(args, "spec", None))
    if collate_format_from_args(args) == "thd" and getattr(args, "transformer_impl", None) == "local" \
            and not custom_spec:
        raise ValueError("--dp-schedule-collate-format thd needs an attention backend that takes packed "
                         "sequences: Transformer Engine, or a layer spec given with --spec; --transformer-impl "
                         "local's attention does not")


def _refuse_megatron_sft(args: Any) -> None:
    """Megatron's ``--sft`` path packs conversations before the planner sees them; refuse it."""
    if getattr(args, "sft", False):
        raise ValueError("--sft cannot be combined with --dp-schedule: Megatron's SFTDataset packs conversations "
                         "into --seq-length rows before planning (and --sft averages validation losses per "
                         "micro-batch, which a planned step changes). Give the planner one conversation per "
                         "sample instead: megatron_dpsched.data.ConversationJsonlDataset, which "
                         "scripts/pretrain_gpt_dpsched.py --sft reads")


def _check_pipeline_layout(args: Any) -> None:
    pp = args.pipeline_model_parallel_size
    if getattr(args, "virtual_pipeline_model_parallel_size", None) is None:
        return
    group = getattr(args, "microbatch_group_size_per_vp_stage", None)
    if group is not None and group < pp:
        raise ValueError(
            f"{GROUP_FLAG}={group} is below --pipeline-model-parallel-size={pp}; the interleaved "
            f"schedule needs a group of at least PP micro-batches"
        )
    if not getattr(args, "overlap_p2p_comm", True):
        raise ValueError(
            "--no-overlap-p2p-communication is not supported with --dp-schedule and a virtual "
            "pipeline: batched p2p with variable sequence lengths can deadlock"
        )


_CONFLICTS = (
    ("rampup_batch_size", "--rampup-batch-size"),
    ("step_batch_size_schedule", "--step-batch-size-schedule"),
    ("decrease_batch_size_if_needed", "--decrease-batch-size-if-needed"),
    ("iterations_to_skip", "--iterations-to-skip"),
    ("perform_rl_step", "--perform-rl-step"),
    ("full_validation", "--full-validation"),
    ("moe_expert_rank_capacity_factor", "--moe-expert-rank-capacity-factor"),
)
"""Flags (off when falsy) whose batch handling contradicts a planned step."""


_MEGATRON_SCHEDULERS = (
    ("hybrid_context_parallel", "--hybrid-context-parallel", "schedule the batch",
     "Megatron's hybrid context parallel regroups each step's sequences over the DP x CP ranks, PP 1 only"),
    ("dynamic_context_parallel", "--dynamic-context-parallel", "schedule the batch",
     "Megatron's dynamic context parallel packs each step over the DP x CP ranks"),
    ("sequence_packing_scheduler", "--sequence-packing-scheduler", "schedule the batch",
     "Megatron's packing scheduler packs each step; this planner can run as one of its schedulers, "
     "docs/megatron_packing_scheduler.md"),
    ("max_seqlen_per_dp_cp_rank", "--max-seqlen-per-dp-cp-rank", "cap a micro-batch's tokens",
     "Megatron's packing cap; --dp-schedule's is --dp-schedule-max-tokens-per-gpu"),
    ("rl_use_sequence_packing", "--rl-use-sequence-packing", "pack the batch",
     "Megatron's RL sequence packing bins each rollout batch itself"),
)
"""Megatron's own packing and hybrid-CP flags (whichever the release has; off when falsy): each does a job
``--dp-schedule`` does, so the pair is refused in one line naming both and what to choose."""


def _refuse_megatron_schedulers(args: Any) -> None:
    """With ``--dp-schedule``, refuse a flag of Megatron's own packing or hybrid context parallel
    (:data:`_MEGATRON_SCHEDULERS`) in one line naming both flags and the choice; called before Megatron's
    ``validate_args`` (whose asserts on those flags would fire first) and again after it."""
    if not getattr(args, "dp_schedule", False):
        return
    for attr, flag, job, theirs in _MEGATRON_SCHEDULERS:
        if getattr(args, attr, None):
            raise ValueError(f"--dp-schedule and {flag} both {job}: choose one (--dp-schedule plans every step "
                             f"across the data-parallel ranks; {flag}: {theirs})")


def _refuse_conflicts(args: Any) -> None:
    _refuse_megatron_schedulers(args)
    for attr, flag in _CONFLICTS:
        if getattr(args, attr, None):
            raise ValueError(f"{flag} cannot be combined with --dp-schedule (the plan fixes every step)")
    if getattr(args, "cuda_graph_impl", "none") == "full_iteration":
        raise ValueError("--cuda-graph-impl full_iteration cannot be combined with --dp-schedule "
                         "(micro-batch shapes and counts change every step)")
    dispatcher = getattr(args, "moe_token_dispatcher_type", "allgather")
    moe = getattr(args, "num_experts", None) is not None
    if args.pipeline_model_parallel_size > 1 and moe and dispatcher == "allgather":
        raise ValueError("--moe-token-dispatcher-type allgather does not support variable sequence "
                         "lengths; use alltoall or flex with --dp-schedule and PP > 1")


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


# --- 3. when the data is known ----------------------------------------------------------------------------------


def dataset_lengths(dataset: Any, *, role: str | None = None) -> Sequence[int]:
    """The token count of every sample of ``dataset`` (its ``lengths``); a ``ValueError`` naming the dataset
    (``role``: train, valid or test, and its type) for one the planner cannot read (none, a wrong count,
    Megatron's packing ``SFTDataset``)."""
    if type(dataset).__name__ == "SFTDataset":
        raise ValueError("--dp-schedule cannot plan Megatron's SFTDataset: it packs conversations into "
                         "--seq-length rows; give one conversation per sample "
                         "(megatron_dpsched.data.ConversationJsonlDataset) and let the planner pack")
    lengths = getattr(dataset, "lengths", None)
    if lengths is None or len(lengths) != len(dataset):
        which = f"the {role} dataset ({type(dataset).__name__})" if role else type(dataset).__name__
        got = type(lengths).__name__ if lengths is None else f"{len(lengths)} lengths for {len(dataset)} samples"
        raise ValueError(
            f"--dp-schedule needs the token count of every sample: give {which} a "
            f"'lengths' sequence with one entry per sample (got {got})"
        )
    return lengths


def check_dataset_size(role: str, available: int, needed: int | None, *, args: Any) -> None:
    """One pass over the data (``--dataloader-type single``) must cover what Megatron will read."""
    if needed is None or available >= needed:
        return
    if role == "train":
        how = (f"--train-iters {args.train_iters} x --global-batch-size {args.global_batch_size} = {needed}"
               if not getattr(args, "train_samples", None) else f"--train-samples {needed}")
    else:
        how = f"{needed} (--eval-iters x --eval-global-batch-size x evaluations, as Megatron counts them)"
    raise ValueError(f"dp-schedule: the {role} dataset holds {available} samples, but training reads {how}; "
                     f"give more data or fewer iterations (or --dataloader-type cyclic to read it again)")


def check_over_cap(lengths: Sequence[int], *, config: ScheduleConfig, policy: str, role: str) -> None:
    """``--dp-schedule-over-cap``: before training, warn about (on rank 0) or refuse the samples over the plan's
    token cap among those training will read (:func:`~megatron_dpsched.runtime.over_cap.over_cap_notice`)."""
    if config.token_cap is None or policy == "allow":
        return
    over = find_over_cap(lengths, token_cap=config.token_cap, pad_multiple=config.pad_multiple)
    notice = over_cap_notice(over, policy=policy, dataset=role)
    if notice is not None:
        print_rank_0(notice)


def padded_vocab_size(args: Any) -> int:
    """Megatron's ``args.padded_vocab_size`` (set when Megatron builds its tokenizer: the vocabulary padded by
    ``_vocab_size_with_padding``), the bound every token id and label is checked against."""
    found = getattr(args, "padded_vocab_size", None)
    if found is None:
        raise ValueError("--dp-schedule checks every token id against Megatron's args.padded_vocab_size, which is "
                         "not set: initialize Megatron (it builds the tokenizer and pads the vocabulary) before "
                         "building the feed")
    return int(found)
