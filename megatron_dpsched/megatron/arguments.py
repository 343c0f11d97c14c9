"""Command-line flags of the ``--dp-schedule`` data path and their validation.

``add_dp_schedule_args`` is a Megatron ``extra_args_provider``::

    pretrain(..., extra_args_provider=add_dp_schedule_args)

``validate_dp_schedule_args(args)`` runs after Megatron's own ``validate_args``
and before the model config is built (e.g. first thing in the model provider).
It fails fast with a ``ValueError`` naming the offending flag, turns on
``calculate_per_token_loss`` (every token weighs the same whatever the
micro-batch it lands in) and ``variable_seq_lengths`` (micro-batches differ in
shape; Megatron's ``validate_args`` always resets it to ``False``). With more than
one data-parallel rank and dropout (or MoE input jitter) it also turns on
``data_parallel_random_init``: ranks run different micro-batches, so they draw
different amounts of randomness and their RNG states part ways; Megatron then
checkpoints every data-parallel rank's RNG state (not only rank 0's), which is
what makes a resume exact. The weights are unchanged by it: data-parallel rank
0 keeps ``--seed`` and Megatron broadcasts its initial weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.cost import CostModel, CostModelFile
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import ArgumentError
from megatron_dpsched.megatron.collate import gemm_alignment_for, pad_multiple_for
from megatron_dpsched.options import (
    BY_STEM,
    NOMINAL_FLOPS_PER_GPU,
    OPTIONS,
    SWITCH_HELP,
    TRAINING_PREFIX,
    OptionError,
    Setting,
    add_options,
    check_setting,
    option_for_field,
    planned_padding,
    resolve_collate_format,
    without_switch,
)
from megatron_dpsched.options import counts_padding as counts_padding_rule
from megatron_dpsched.options import resolve_objective as objective_rule

__all__ = ["NOMINAL_FLOPS_PER_GPU", "OPTION_DEFAULTS", "DPScheduleOptions", "add_dp_schedule_args",
           "schedule_config_from_args", "schedule_kwargs_from_args", "validate_dp_schedule_args"]

_GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"

OPTION_DEFAULTS: dict[str, Any] = {option.attribute: option.default for option in OPTIONS}
"""What each ``--dp-schedule-*`` option means when it is not given (the parser's defaults are ``None``, so
a given option can be told from an unset one); from :data:`megatron_dpsched.options.OPTIONS`."""


def flag_of(attribute: str) -> str:
    """``dp_schedule_balance`` -> ``--dp-schedule-balance``."""
    return "--" + attribute.replace("_", "-")


def _from_args(cls: type, args: Any) -> Any:
    """Read the flags (unset ones take the table's default, :data:`OPTION_DEFAULTS`)."""
    given = {option: getattr(args, option.attribute, None) for option in OPTIONS}
    values = {option.name: option.default if value is None else value for option, value in given.items()}
    return cls(enabled=bool(getattr(args, "dp_schedule", False)), **values)


DPScheduleOptions = dataclasses.make_dataclass(
    "DPScheduleOptions",
    [("enabled", bool), *((option.name, option.kind | None) for option in OPTIONS)],
    frozen=True, kw_only=True, namespace={"from_args": classmethod(_from_args)},
    module=__name__,
)
DPScheduleOptions.__doc__ = """The ``--dp-schedule*`` flags, read from Megatron's ``args`` (``from_args``): ``enabled``
(``--dp-schedule``) and one attribute per row of :data:`megatron_dpsched.options.OPTIONS`, named after its
stem (``balance_growth``, ``cost_model``, ...; see ``docs/options.md``); unset ones hold the table's default."""


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
    """Add the ``--dp-schedule*`` flags; usable as Megatron's ``extra_args_provider`` (which Megatron
    calls after adding its own flags: their help texts are made printable, see :func:`escape_stray_percent`)."""
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


def validate_dp_schedule_args(args: Any) -> None:
    """Check the flags against the parallel layout and adjust ``args`` for the schedule.

    Without ``--dp-schedule`` it only refuses ``--dp-schedule-*`` options given without it.
    Every planner option that the flags determine is validated here, by building the
    :class:`~megatron_dpsched.core.config.ScheduleConfig` the feeds will plan with, so a bad
    value fails before any model is built. Raises ``ValueError`` naming the flag.
    """
    options = DPScheduleOptions.from_args(args)
    if not options.enabled:
        _refuse_options_without_dp_schedule(args)
        return
    _check_values(args)
    check_setting(setting_from_args(args))
    _check_token_cap(options, args)
    _check_pipeline_layout(args)
    _refuse_conflicts(args)
    _refuse_megatron_sft(args)
    _check_collate_format(options, args)
    cost_model_file_from_args(options)  # a bad file fails here, before any model is built
    schedule_config_from_args(args, data_parallel_size=getattr(args, "data_parallel_size", None) or 1)
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


def _check_values(args: Any) -> None:
    """Every given ``--dp-schedule-*`` value against its row's range or choices (:class:`OptionError`)."""
    for option in OPTIONS:
        value = getattr(args, option.attribute, None)
        if value is not None:
            option.check(value)


def setting_from_args(args: Any) -> Setting:
    """What decides whether each given option acts (:class:`~megatron_dpsched.options.Setting`), from Megatron's
    ``args``."""
    given = {option.stem: getattr(args, option.attribute) for option in OPTIONS
             if getattr(args, option.attribute, None) is not None}
    return Setting(given=frozenset(given), values={o.stem: given.get(o.stem, o.default) for o in OPTIONS},
                   pp_size=getattr(args, "pipeline_model_parallel_size", 1) or 1,
                   has_model=getattr(args, "hidden_size", None) is not None or "cost-model" in given)


def _refuse_options_without_dp_schedule(args: Any) -> None:
    given = [flag_of(attribute) for attribute in OPTION_DEFAULTS if getattr(args, attribute, None) is not None]
    if given:
        raise OptionError(without_switch(given), option=given[0])


def _check_token_cap(options: DPScheduleOptions, args: Any) -> None:
    cap = options.max_tokens_per_gpu
    if cap is None:
        return  # the options that need a cap are refused without one (check_setting)
    if args.micro_batch_size != 1:
        raise ValueError(
            "--dp-schedule-max-tokens-per-gpu plans micro-batches by tokens; --micro-batch-size "
            f"must stay 1 (it is the sample-accounting unit), got {args.micro_batch_size}"
        )


def default_collate_format(args: Any) -> str:
    """``thd`` where the attention backend takes packed sequences (Transformer Engine installed and
    ``--transformer-impl transformer_engine``), else ``bshd``: :func:`~megatron_dpsched.options.resolve_collate_format`,
    the rule the what-if tool follows too."""
    return resolve_collate_format(None, transformer_impl=getattr(args, "transformer_impl", "transformer_engine"))


def _check_collate_format(options: DPScheduleOptions, args: Any) -> None:
    """Resolve the default layout into ``args``; ``thd`` needs a backend that takes ``PackedSeqParams``."""
    args.dp_schedule_collate_format = collate_format_from_args(args)
    custom_spec = bool(getattr(args, "spec", None))
    if args.dp_schedule_collate_format == "thd" and getattr(args, "transformer_impl", None) == "local" \
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
            f"{_GROUP_FLAG}={group} is below --pipeline-model-parallel-size={pp}; the interleaved "
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
    ("hybrid_context_parallel", "--hybrid-context-parallel"),
    ("perform_rl_step", "--perform-rl-step"),
    ("rl_use_sequence_packing", "--rl-use-sequence-packing"),
    ("full_validation", "--full-validation"),
    ("moe_expert_rank_capacity_factor", "--moe-expert-rank-capacity-factor"),
)
"""Flags (off when falsy) whose batch handling contradicts a planned step."""


def _refuse_conflicts(args: Any) -> None:
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


_MEGATRON_FLAGS = {
    "micro_batch_size": "--micro-batch-size",
    "microbatch_group_size_per_vp_stage": _GROUP_FLAG,
    "global_batch_size": "--global-batch-size",
    "vpp_size": "--num-layers-per-virtual-pipeline-stage (virtual pipeline size)",
    "pp_size": "--pipeline-model-parallel-size",
    "cp_size": "--context-parallel-size",
    "dp_size": "data-parallel size (world size / (TP x PP x CP))",
}
"""Planner arguments that Megatron's own flags set (the ``--dp-schedule-*`` ones come from the option table)."""


def flag_for_argument(argument: str) -> str:
    """The flag behind a planner argument (:attr:`ArgumentError.argument`): a ``--dp-schedule-*`` option of the
    table, a Megatron flag, or ``--dp-schedule`` itself."""
    option = option_for_field(argument)
    return option.flag if option is not None else _MEGATRON_FLAGS.get(argument, "--dp-schedule")


def schedule_config_from_args(args: Any, *, data_parallel_size: int) -> ScheduleConfig:
    """The planner options Megatron's ``args`` give; a ``ValueError`` names the flag behind a bad one."""
    options = DPScheduleOptions.from_args(args)
    static = options.max_tokens_per_gpu is None
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None) or 1
    step_time_model, padding = step_time_model_from_args(args, options), padding_from_args(args, options)
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


def counts_padding(options: DPScheduleOptions) -> bool:
    """Whether the plan counts collate's padding against the cap (a token cap and ``--dp-schedule-cap-counts
    padded``)."""
    return counts_padding_rule(cap_counts=options.cap_counts, token_cap=options.max_tokens_per_gpu is not None)


def padding_from_args(args: Any, options: DPScheduleOptions) -> dict[str, Any]:
    """``pad_multiple`` and ``padded_rows`` of the plan (:func:`~megatron_dpsched.options.planned_padding`, the
    what-if tool's rule too): collate's multiple, and padded rows with ``bshd``, when the cap counts padding;
    else ``1`` and ``False`` (real tokens; static batching has no cap)."""
    return planned_padding(cap_counts=options.cap_counts, token_cap=options.max_tokens_per_gpu is not None,
                           pad_multiple=pad_multiple_from_args(args), collate_format=collate_format_from_args(args))


def collate_format_from_args(args: Any) -> str:
    """``--dp-schedule-collate-format``, or its default for this run (:func:`default_collate_format`)."""
    given = getattr(args, "dp_schedule_collate_format", None)
    return default_collate_format(args) if given is None else given


def resolve_objective(options: DPScheduleOptions, args: Any) -> str:
    """The objective ``--dp-schedule-objective`` names, or by default ``step-time`` with PP > 1, a token cap
    and balance ``cost`` or ``tokens`` (where more micro-batches can shrink pipeline bubbles)."""
    sized = getattr(args, "hidden_size", None) is not None or options.cost_model is not None  # a model to time
    return objective_rule(options.objective, pp_size=getattr(args, "pipeline_model_parallel_size", 1),
                          token_cap=options.max_tokens_per_gpu is not None, balance=options.balance,
                          has_model=sized)


def step_time_model_from_args(args: Any, options: DPScheduleOptions) -> StepTimeModel | None:
    """The step-time model of the step-time objective: the cost model's forward FLOPs over TP x CP GPUs at
    :data:`NOMINAL_FLOPS_PER_GPU`, plus the per-micro-batch overhead; ``None`` for ``micro-batches``."""
    if resolve_objective(options, args) != "step-time":
        return None
    overhead = BY_STEM["microbatch-overhead-ms"].check(options.microbatch_overhead_ms)
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


def schedule_kwargs_from_args(args: Any, *, data_parallel_size: int) -> dict[str, Any]:
    """``build_dp_schedule`` keyword arguments (all but ``lengths``) for Megatron's ``args``."""
    config = schedule_config_from_args(args, data_parallel_size=data_parallel_size)
    kwargs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "drop_last"}
    kwargs["cost_model"] = cost_model_from_args(args) if config.balance == "cost" else None
    return kwargs


def cost_model_from_args(args: Any) -> Any:
    """What balance ``cost`` balances: the ``--dp-schedule-cost-model`` file's per-sample cost, else the FLOPs
    model of the GPT in ``args``."""
    measured = cost_model_file_from_args(DPScheduleOptions.from_args(args))
    return CostModel.from_megatron_args(args) if measured is None else measured.sample_cost()
