"""From Megatron's ``args`` to what the ``--dp-schedule`` data path plans with.

``add_dp_schedule_args`` is a Megatron ``extra_args_provider``::

    pretrain(..., extra_args_provider=add_dp_schedule_args)

:func:`plan_setup_from_args` builds, once, the :class:`PlanSetup` every part plans with (the feeds, the over-cap
check, the job identity; evaluation replaces its ``global_batch_size``): the
:class:`~megatron_dpsched.core.config.ScheduleConfig` of :func:`schedule_config_from_args` and the cost model
balance ``cost`` balances. The flags are checked in :mod:`megatron_dpsched.megatron.checks`
(``validate_dp_schedule_args``), which then sets what a planned step needs (:func:`adjust_args_for_schedule`).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.cost import CostFunction, CostModel, CostModelFile
from megatron_dpsched.core.padding import gemm_alignment_for, pad_multiple_for
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import ArgumentError
from megatron_dpsched.options import (
    BY_NAME,
    NOMINAL_FLOPS_PER_GPU,
    SWITCH_HELP,
    TRAINING_PREFIX,
    DPScheduleOptions,
    OptionError,
    add_options,
    config_flags,
    one_line_parser_errors,
    resolve_collate_format,
)

__all__ = ["NOMINAL_FLOPS_PER_GPU", "DPScheduleOptions", "PlanSetup", "add_dp_schedule_args",
           "adjust_args_for_schedule", "plan_setup_from_args", "schedule_config_from_args"]

GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"
"""Megatron's flag for the interleaved schedule's group size."""


_STRAY_PERCENT = re.compile(r"(?<!%)%(?!\(\w+\)[a-zA-Z%]|%)")
"""A ``%`` that is not an argparse help specifier (``%(default)s``) nor already escaped (``%%``)."""


def escape_stray_percent(parser: argparse.ArgumentParser) -> None:
    """Escape ``%`` signs in help texts that are not format specifiers, so that ``--help`` formats.

    megatron-core 0.19's help of ``--moe-paged-stash-buffer-size-factor-cuda`` has a bare ``%``,
    which makes ``--help`` raise; only the parser's copy of the text changes, not Megatron's files.
    """
    for action in parser._actions:
        if isinstance(action.help, str) and "%" in action.help:
            action.help = _STRAY_PERCENT.sub("%%", action.help)


def add_dp_schedule_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``--dp-schedule*`` flags (one per :class:`DPScheduleOptions` field); usable as Megatron's
    ``extra_args_provider`` (which Megatron calls after adding its own flags: their help texts are made
    printable, see :func:`escape_stray_percent`; a bad flag is one line per job,
    :func:`~megatron_dpsched.options.one_line_parser_errors`). With ``DPSCHED_QUIET=1`` the process runs quiet from
    here (:mod:`~megatron_dpsched.megatron.quiet`: before Megatron prints its argument dump)."""
    from megatron_dpsched.megatron import quiet

    quiet.install_if_requested()
    one_line_parser_errors(parser, prog=Path(sys.argv[0]).name)
    escape_stray_percent(parser)
    group = parser.add_argument_group(title="dp-schedule (global micro-batch scheduling)")
    group.add_argument("--dp-schedule", action="store_true", help=SWITCH_HELP)
    add_options(group, prefix=TRAINING_PREFIX, unset_defaults=True)
    return parser


def cost_model_file_from_args(options: DPScheduleOptions) -> CostModelFile | None:
    """The ``--dp-schedule-cost-model`` file, validated; a ``ValueError`` names the flag and the bad field."""
    if options.cost_model is None:
        return None
    try:
        return CostModelFile.load(options.cost_model)
    except ValueError as error:
        raise OptionError(f"--dp-schedule-cost-model: {error}", option="--dp-schedule-cost-model") from None


_MEGATRON_FLAGS = {
    "micro_batch_size": "--micro-batch-size",
    "microbatch_group_size_per_vp_stage": GROUP_FLAG,
    "global_batch_size": "--global-batch-size",
    "vpp_size": "--num-layers-per-virtual-pipeline-stage (virtual pipeline size)",
    "pp_size": "--pipeline-model-parallel-size",
    "cp_size": "--context-parallel-size",
    "dp_size": "data-parallel size (world size / (TP x PP x CP))",
}
"""Planner arguments that Megatron's own flags set."""
ARGUMENT_FLAGS = {**config_flags(prefix=TRAINING_PREFIX), **_MEGATRON_FLAGS}
"""Planner argument (:attr:`ArgumentError.argument`, a ``ScheduleConfig`` field) -> the training flag that sets
it: a ``--dp-schedule-*`` option (from the fields' metadata) or a Megatron flag."""


def flag_for_argument(argument: str) -> str:
    """The flag behind a planner argument (:data:`ARGUMENT_FLAGS`), else ``--dp-schedule`` itself."""
    return ARGUMENT_FLAGS.get(argument, "--dp-schedule")


def schedule_config_from_args(args: Any, *, data_parallel_size: int) -> ScheduleConfig:
    """The planner options Megatron's ``args`` give; a ``ValueError`` names the flag behind a bad one."""
    options = DPScheduleOptions.from_args(args)
    static = options.max_tokens_per_gpu is None
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None) or 1
    step_time_model = step_time_model_from_args(args, options)
    padding = options.planned_padding(pad_multiple=pad_multiple_from_args(args),
                                      collate_format=collate_format_from_args(args))
    try:
        return ScheduleConfig(
            dp_size=data_parallel_size,
            global_batch_size=args.global_batch_size,
            max_tokens_per_gpu=options.max_tokens_per_gpu,
            micro_batch_size=args.micro_batch_size if static else None,
            cp_size=getattr(args, "context_parallel_size", 1),
            pp_size=args.pipeline_model_parallel_size,
            vpp_size=vpp,
            microbatch_group_size_per_vp_stage=getattr(args, "microbatch_group_size_per_vp_stage", None)
            if vpp > 1 else None,
            balance=options.balance,
            microbatch_order=options.microbatch_order,
            balance_growth=options.balance_growth,
            step_time_model=step_time_model,
            **padding,
        )
    except ArgumentError as error:
        flag = flag_for_argument(error.argument)
        raise OptionError(f"{flag}: {error}", option=flag) from None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanSetup:
    """What the planner plans with, built once from the options and Megatron's ``args``
    (:func:`plan_setup_from_args`) and passed whole."""

    config: ScheduleConfig
    """The planner's options."""
    cost_model: CostFunction | None
    """What balance ``cost`` balances per sample (the ``--dp-schedule-cost-model`` file's cost, else the FLOPs
    model of the GPT in ``args``); ``None`` with the other balances."""


def plan_setup_from_args(args: Any, *, data_parallel_size: int) -> PlanSetup:
    """The :class:`PlanSetup` of Megatron's ``args`` for ``data_parallel_size`` ranks (Megatron's
    ``args.data_parallel_size``, or its data-parallel group's size)."""
    config = schedule_config_from_args(args, data_parallel_size=data_parallel_size)
    if config.balance != "cost":
        return PlanSetup(config=config, cost_model=None)
    measured = cost_model_file_from_args(DPScheduleOptions.from_args(args))
    cost_model = CostModel.from_megatron_args(args) if measured is None else measured.sample_cost()
    return PlanSetup(config=config, cost_model=cost_model)


def pad_multiple_from_args(args: Any) -> int:
    """The multiple collate pads every sequence to for this layout: :func:`~.collate.pad_multiple_for` of
    TP, CP, ``--sequence-parallel`` and the FP8/FP4 GEMM alignment (``--fp8-format``, ``--fp8-recipe``,
    ``--fp4-format``)."""
    alignment = gemm_alignment_for(fp8=getattr(args, "fp8", None), fp8_recipe=getattr(args, "fp8_recipe", None),
                                   fp4=getattr(args, "fp4", None))
    return pad_multiple_for(tensor_parallel_size=getattr(args, "tensor_model_parallel_size", 1) or 1,
                            context_parallel_size=getattr(args, "context_parallel_size", 1) or 1,
                            sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
                            gemm_alignment=alignment)


def collate_format_from_args(args: Any) -> str:
    """``--dp-schedule-collate-format``, or its default for this run: ``thd`` where the attention backend takes
    packed sequences (Transformer Engine installed and ``--transformer-impl transformer_engine``), else ``bshd``
    (:func:`~megatron_dpsched.options.resolve_collate_format`, the rule the what-if tool follows too)."""
    return resolve_collate_format(getattr(args, "dp_schedule_collate_format", None),
                                  transformer_impl=getattr(args, "transformer_impl", "transformer_engine"))


def objective_from_args(args: Any, options: DPScheduleOptions) -> str:
    """The objective of the run (:meth:`~megatron_dpsched.options.DPScheduleOptions.resolve_objective`): there
    is a model to time with ``--hidden-size`` or a cost-model file."""
    sized = getattr(args, "hidden_size", None) is not None or options.cost_model is not None
    return options.resolve_objective(pp_size=getattr(args, "pipeline_model_parallel_size", 1), has_model=sized)


def step_time_model_from_args(args: Any, options: DPScheduleOptions) -> StepTimeModel | None:
    """The step-time model of the step-time objective: the cost model's forward FLOPs over TP x CP GPUs at
    :data:`NOMINAL_FLOPS_PER_GPU`, plus the per-micro-batch overhead; ``None`` for ``micro-batches``."""
    if objective_from_args(args, options) != "step-time":
        return None
    overhead = BY_NAME["microbatch_overhead_ms"].check(options.microbatch_overhead_ms)
    measured = cost_model_file_from_args(options)
    if measured is not None:  # with --dp-schedule-microbatch-overhead-ms given: refused by check_setting
        return measured.step_time_model()
    if getattr(args, "hidden_size", None) is None:
        raise OptionError("--dp-schedule-objective: step-time needs the model's --hidden-size, --num-layers and "
                          "--num-attention-heads for its cost model", option="--dp-schedule-objective")
    gpus = getattr(args, "tensor_model_parallel_size", 1) * getattr(args, "context_parallel_size", 1)
    try:
        return StepTimeModel.from_cost_model(
            CostModel.from_megatron_args(args), flops_per_second=NOMINAL_FLOPS_PER_GPU * gpus,
            seconds_per_microbatch=overhead / 1000.0,
        )
    except ValueError as error:  # figures the model flags make too large or small to time
        raise OptionError(f"--dp-schedule-objective step-time: {error}", option="--dp-schedule-objective") from None


def adjust_args_for_schedule(args: Any) -> None:
    """What a planned step needs of Megatron, set in ``args`` once the flags are checked: the resolved
    ``--dp-schedule-collate-format``; per-token loss (every token weighs the same whatever the micro-batch it
    lands in); with more than one data-parallel rank and dropout (or MoE input jitter),
    ``data_parallel_random_init``: ranks run different micro-batches, so they draw different amounts of
    randomness and their RNG states part ways; Megatron then checkpoints every data-parallel rank's RNG state
    (not only rank 0's), which is what makes a resume exact (the weights are unchanged by it: data-parallel rank
    0 keeps ``--seed`` and Megatron broadcasts its initial weights). Under PP, variable sequence lengths
    (micro-batches differ in shape; Megatron's ``validate_args`` always resets it to ``False``) and, without
    experts, the alltoall token dispatcher."""
    args.dp_schedule_collate_format = collate_format_from_args(args)
    args.calculate_per_token_loss = True
    if getattr(args, "data_parallel_size", 1) > 1 and _draws_random_numbers(args):
        args.data_parallel_random_init = True  # ranks' micro-batches differ, so do their RNG states: save each
    if args.pipeline_model_parallel_size > 1:
        args.variable_seq_lengths = True
        if getattr(args, "num_experts", None) is None:
            args.moe_token_dispatcher_type = "alltoall"


def _draws_random_numbers(args: Any) -> bool:
    """Whether training draws random numbers (dropout, MoE input jitter) whose state a checkpoint must keep."""
    return bool(getattr(args, "hidden_dropout", 0) or getattr(args, "attention_dropout", 0)
                or getattr(args, "moe_input_jitter_eps", None))
