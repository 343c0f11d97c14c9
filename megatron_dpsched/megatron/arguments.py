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
from dataclasses import dataclass
from typing import Any

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.cost import CostModel, CostModelFile
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.megatron.collate import gemm_alignment_for, pad_multiple_for

BALANCE_CHOICES = ("cost", "tokens", "none")
VERIFY_CHOICES = ("off", "check", "strict")
ORDER_CHOICES = ("auto", "pipeline", "none")
COLLATE_CHOICES = ("bshd", "thd")
OBJECTIVE_CHOICES = ("step-time", "micro-batches")
CAP_COUNTS_CHOICES = ("padded", "tokens")
NOMINAL_FLOPS_PER_GPU = 4e14
"""Sustained FLOP/s of one GPU assumed by ``--dp-schedule-objective step-time``: with the cost model it turns
FLOPs into seconds; only its ratio to ``--dp-schedule-microbatch-overhead-ms`` changes the plan."""
PREFETCH_CHOICES = ("on", "off")

_GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


OPTION_DEFAULTS: dict[str, Any] = {
    "dp_schedule_max_tokens_per_gpu": None,
    "dp_schedule_balance": "cost",
    "dp_schedule_verify": "off",
    "dp_schedule_microbatch_order": "auto",
    "dp_schedule_collate_format": "bshd",
    "dp_schedule_balance_growth": 0.0,
    "dp_schedule_objective": None,
    "dp_schedule_microbatch_overhead_ms": 2.0,
    "dp_schedule_cost_model": None,
    "dp_schedule_prefetch": "on",
    "dp_schedule_cap_counts": "padded",
    "dp_schedule_allow_changed_resume": False,  # option-table: read by job_checks.check_resume, not a plan option
}
"""What each ``--dp-schedule-*`` option means when it is not given (the parser's defaults are ``None``, so
a given option can be told from an unset one)."""


def flag_of(attribute: str) -> str:
    """``dp_schedule_balance`` -> ``--dp-schedule-balance``."""
    return "--" + attribute.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class DPScheduleOptions:
    """The ``--dp-schedule*`` flags, read from Megatron's ``args``."""

    enabled: bool
    """``--dp-schedule``: plan micro-batches globally."""
    max_tokens_per_gpu: int | None
    """``--dp-schedule-max-tokens-per-gpu``: dynamic batching cap; ``None``: static batching."""
    balance: str
    """``--dp-schedule-balance``: what the planner balances across DP ranks."""
    verify: str
    """``--dp-schedule-verify``: ``off``, ``check`` (run ``schedule.check()`` on every step's plan;
    a shipped plan is always checked once, when its feed is built) or ``strict`` (also check that each
    model chunk consumed exactly the planned micro-batches)."""
    microbatch_order: str | None
    """``--dp-schedule-microbatch-order``; ``None`` for ``auto``."""
    collate_format: str
    """``--dp-schedule-collate-format``: micro-batches as packed sequences (``thd`` with ``cu_seqlens``; needs an
    attention backend that takes ``PackedSeqParams``) or padded rows (``bshd``); validation resolves the
    default (:func:`default_collate_format`)."""
    balance_growth: float
    """``--dp-schedule-balance-growth``: share of extra micro-batches the planner may spend to balance
    ranks when the token cap keeps them apart (0: never more than one global packing needs)."""
    objective: str | None
    """``--dp-schedule-objective``: ``step-time`` (counts for the smallest simulated pipeline step time) or
    ``micro-batches`` (the fewest that balance); ``None``: ``step-time`` where it applies (PP > 1, a token cap,
    balance ``cost`` or ``tokens``, the model's dimensions in ``args``), see :func:`resolve_objective`."""
    microbatch_overhead_ms: float
    """``--dp-schedule-microbatch-overhead-ms``: fixed forward time of one micro-batch for the step-time model."""
    cost_model_file: str | None = None
    """``--dp-schedule-cost-model``: a cost-model file (``megatron-dpsched calibrate``); balance ``cost`` then
    balances its per-sample cost and the step-time objective uses its step-time model."""
    prefetch: bool = True
    """``--dp-schedule-prefetch``: plan and collate the next step in a background thread while the
    current one trains (at most one step ahead); ``off`` does both on the training thread."""
    cap_counts: str = "padded"
    """``--dp-schedule-cap-counts``: what the token cap bounds: ``padded`` (the collated micro-batch: every
    sequence padded to the layout's multiple, :func:`pad_multiple_from_args`, and with ``bshd`` rows x the
    longest row) or ``tokens`` (real tokens; the collated tensor may exceed the cap)."""

    @classmethod
    def from_args(cls, args: Any) -> DPScheduleOptions:
        """Read the flags (unset ones take :data:`OPTION_DEFAULTS`)."""

        def value(attribute: str) -> Any:
            given = getattr(args, attribute, None)
            return OPTION_DEFAULTS[attribute] if given is None else given

        order = value("dp_schedule_microbatch_order")
        return cls(
            enabled=bool(getattr(args, "dp_schedule", False)),
            max_tokens_per_gpu=value("dp_schedule_max_tokens_per_gpu"),
            balance=value("dp_schedule_balance"),
            verify=value("dp_schedule_verify"),
            microbatch_order=None if order == "auto" else order,
            balance_growth=value("dp_schedule_balance_growth"),
            collate_format=value("dp_schedule_collate_format"),
            objective=value("dp_schedule_objective"),
            microbatch_overhead_ms=value("dp_schedule_microbatch_overhead_ms"),
            cost_model_file=value("dp_schedule_cost_model"),
            prefetch=value("dp_schedule_prefetch") == "on",
            cap_counts=value("dp_schedule_cap_counts"),
        )


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
    group.add_argument("--dp-schedule", action="store_true",
                       help="Plan each step's micro-batches globally across data-parallel ranks "
                            "(variable micro-batch count per step, per-token loss). The other "
                            "--dp-schedule-* flags need it.")
    group.add_argument("--dp-schedule-max-tokens-per-gpu", type=int, default=None,
                       help="Dynamic batching: at most this many tokens per micro-batch per GPU. "
                            "Unset: static batching with --micro-batch-size.")
    group.add_argument("--dp-schedule-balance", choices=BALANCE_CHOICES, default=None,
                       help="Balance a FLOPs model of the configured GPT (default: cost; dense, GQA, SwiGLU, "
                            "MoE and MLA from the model flags), raw token counts, or nothing.")
    group.add_argument("--dp-schedule-verify", choices=VERIFY_CHOICES, default=None,
                       help="check: run schedule.check() every step; strict: also verify every "
                            "model chunk consumed exactly the planned micro-batches (default: off). "
                            "Sample lengths and the plan's agreement across ranks are always checked.")
    group.add_argument("--dp-schedule-microbatch-order", choices=ORDER_CHOICES, default=None,
                       help="Micro-batch order within a step (default: auto = pipeline when PP > 1).")
    group.add_argument("--dp-schedule-collate-format", choices=COLLATE_CHOICES, default=None,
                       help="Micro-batch layout: packed sequences with cu_seqlens (thd: no padding; needs an "
                            "attention backend that takes packed sequences: Transformer Engine, or a --spec "
                            "layer spec) or padded rows (bshd: any attention backend; rows are padded to the "
                            "micro-batch's longest sample, which the token cap counts: rows x longest, see "
                            "--dp-schedule-cap-counts). "
                            "Default: thd with --transformer-impl transformer_engine when Transformer Engine "
                            "is installed, else bshd.")
    group.add_argument("--dp-schedule-balance-growth", type=float, default=None,
                       help="With --dp-schedule-max-tokens-per-gpu: share (0 to 10) of extra micro-batches per "
                            "step the planner may spend to balance ranks when the token cap keeps them apart "
                            "(heavy tails at high fill); default 0, never more than one global packing needs. "
                            "With the step-time objective it caps the extra micro-batches that objective adds.")
    group.add_argument("--dp-schedule-objective", choices=OBJECTIVE_CHOICES, default=None,
                       help="step-time: per step, the micro-batch count (and packing) with the smallest "
                            "simulated step time of Megatron's pipeline schedule, from the cost model at a "
                            "nominal 400 TFLOP/s per GPU plus --dp-schedule-microbatch-overhead-ms per "
                            "micro-batch; needs --dp-schedule-max-tokens-per-gpu and balance cost or tokens. "
                            "micro-batches: the fewest micro-batches that balance the ranks. Default: "
                            "step-time with PP > 1 and a token cap (balance cost or tokens), else micro-batches.")
    group.add_argument("--dp-schedule-microbatch-overhead-ms", type=float, default=None,
                       help="Step-time objective: fixed forward milliseconds of every micro-batch over the whole "
                            "model (kernel launches, pipeline hand-offs); default 2.")
    group.add_argument("--dp-schedule-cost-model", default=None, metavar="FILE",
                       help="A cost-model file written by 'megatron-dpsched calibrate' (measured seconds per token, "
                            "per sum of squared lengths and per micro-batch): balance cost balances its per-sample "
                            "cost instead of the FLOPs model, and the step-time objective uses its step-time model "
                            "instead of the nominal FLOP/s and --dp-schedule-microbatch-overhead-ms.")
    group.add_argument("--dp-schedule-prefetch", choices=PREFETCH_CHOICES, default=None,
                       help="on (default): plan and collate the next step in one background thread while the "
                            "current step trains (at most one step ahead; errors are raised on the training "
                            "thread when their micro-batch is due); off: both on the training thread. "
                            "Results are the same either way.")
    group.add_argument("--dp-schedule-cap-counts", choices=CAP_COUNTS_CHOICES, default=None,
                       help="What --dp-schedule-max-tokens-per-gpu bounds. padded (default): the collated "
                            "micro-batch, what memory and compute see: every sequence rounded up to the multiple "
                            "the layout pads to (2 x CP, times TP with --sequence-parallel, and a multiple of 16 "
                            "with --fp8-format, 32 with --fp8-recipe mxfp8 or --fp4-format), and with the bshd "
                            "layout the row count times the longest row. tokens: real tokens only (the collated "
                            "tensor can exceed the cap; bshd by several times).")
    # option-table: --dp-schedule-allow-changed-resume (run-time; job_checks.check_resume reads it)
    group.add_argument("--dp-schedule-allow-changed-resume", action="store_true", default=None,
                       help="Resume a checkpoint whose data or --dp-schedule options differ from this job's "
                            "(logged); without it such a resume fails naming what changed.")
    return parser


def cost_model_file_from_args(options: DPScheduleOptions) -> CostModelFile | None:
    """The ``--dp-schedule-cost-model`` file, validated; a ``ValueError`` names the flag and the bad field."""
    if options.cost_model_file is None:
        return None
    try:
        return CostModelFile.load(options.cost_model_file)
    except ValueError as error:
        raise ValueError(f"--dp-schedule-cost-model: {error}") from None


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


def _refuse_options_without_dp_schedule(args: Any) -> None:
    given = [flag_of(attribute) for attribute in OPTION_DEFAULTS if getattr(args, attribute, None) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} given without --dp-schedule, which they configure; add "
                         f"--dp-schedule or drop them")


def _check_token_cap(options: DPScheduleOptions, args: Any) -> None:
    growth = options.balance_growth
    if not 0.0 <= growth <= 10.0:
        raise ValueError(f"--dp-schedule-balance-growth must be between 0 and 10; got {growth}")
    cap = options.max_tokens_per_gpu
    if cap is None:
        if growth:
            raise ValueError("--dp-schedule-balance-growth needs --dp-schedule-max-tokens-per-gpu: static "
                             "batching (--micro-batch-size) has a fixed micro-batch count to grow from")
        return
    if cap < 1:
        raise ValueError(f"--dp-schedule-max-tokens-per-gpu must be >= 1; got {cap}")
    if args.micro_batch_size != 1:
        raise ValueError(
            "--dp-schedule-max-tokens-per-gpu plans micro-batches by tokens; --micro-batch-size "
            f"must stay 1 (it is the sample-accounting unit), got {args.micro_batch_size}"
        )


def default_collate_format(args: Any) -> str:
    """``thd`` where the attention backend takes packed sequences (Transformer Engine installed and
    ``--transformer-impl transformer_engine``), else ``bshd``."""
    import importlib.util

    engine = getattr(args, "transformer_impl", "transformer_engine") == "transformer_engine"
    return "thd" if engine and importlib.util.find_spec("transformer_engine") is not None else "bshd"


def _check_collate_format(options: DPScheduleOptions, args: Any) -> None:
    """Resolve the default layout into ``args``; ``thd`` needs a backend that takes ``PackedSeqParams``."""
    if getattr(args, "dp_schedule_collate_format", None) is None:
        args.dp_schedule_collate_format = default_collate_format(args)
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


_PLANNER_FLAGS = {
    "step_time_model": "--dp-schedule-objective",
    "max_tokens_per_gpu": "--dp-schedule-max-tokens-per-gpu",
    "micro_batch_size": "--micro-batch-size",
    "balance_growth": "--dp-schedule-balance-growth",
    "microbatch_group_size_per_vp_stage": _GROUP_FLAG,
    "microbatch_order": "--dp-schedule-microbatch-order",
    "global_batch_size": "--global-batch-size",
    "balance": "--dp-schedule-balance",
    "vpp_size": "--num-layers-per-virtual-pipeline-stage (virtual pipeline size)",
    "pp_size": "--pipeline-model-parallel-size",
    "cp_size": "--context-parallel-size",
    "dp_size": "data-parallel size (world size / (TP x PP x CP))",
}
"""Planner keyword -> the Megatron flag that sets it (most specific names first)."""


def schedule_config_from_args(args: Any, *, data_parallel_size: int) -> ScheduleConfig:
    """The planner options Megatron's ``args`` give; a ``ValueError`` names the flag behind a bad one."""
    options = DPScheduleOptions.from_args(args)
    static = options.max_tokens_per_gpu is None
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None) or 1
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
            step_time_model=step_time_model_from_args(args, options),
            **padding_from_args(args, options),
        )
    except ValueError as error:
        flag = next((f for name, f in _PLANNER_FLAGS.items() if name in str(error)), "--dp-schedule")
        raise ValueError(f"{flag}: {error}") from None


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
    return options.max_tokens_per_gpu is not None and options.cap_counts == "padded"


def padding_from_args(args: Any, options: DPScheduleOptions) -> dict[str, Any]:
    """``pad_multiple`` and ``padded_rows`` of the plan: collate's multiple, and padded rows with ``bshd``,
    when the cap counts padding; else ``1`` and ``False`` (real tokens; static batching has no cap)."""
    if options.cap_counts not in CAP_COUNTS_CHOICES:
        raise ValueError(f"--dp-schedule-cap-counts must be one of {', '.join(CAP_COUNTS_CHOICES)}; "
                         f"got {options.cap_counts!r}")
    if not counts_padding(options):
        return {"pad_multiple": 1, "padded_rows": False}
    return {"pad_multiple": pad_multiple_from_args(args), "padded_rows": options.collate_format == "bshd"}


def resolve_objective(options: DPScheduleOptions, args: Any) -> str:
    """The objective ``--dp-schedule-objective`` names, or by default ``step-time`` with PP > 1, a token cap
    and balance ``cost`` or ``tokens`` (where more micro-batches can shrink pipeline bubbles)."""
    if options.objective is not None:
        return options.objective
    pipelined = getattr(args, "pipeline_model_parallel_size", 1) > 1
    capped = options.max_tokens_per_gpu is not None and options.balance != "none"
    sized = getattr(args, "hidden_size", None) is not None or options.cost_model_file is not None  # a model
    return "step-time" if pipelined and capped and sized else "micro-batches"


def step_time_model_from_args(args: Any, options: DPScheduleOptions) -> StepTimeModel | None:
    """The step-time model of the step-time objective: the cost model's forward FLOPs over TP x CP GPUs at
    :data:`NOMINAL_FLOPS_PER_GPU`, plus the per-micro-batch overhead; ``None`` for ``micro-batches``."""
    if resolve_objective(options, args) != "step-time":
        return None
    overhead = options.microbatch_overhead_ms
    if not 0.0 <= overhead <= 1e6:
        raise ValueError(f"--dp-schedule-microbatch-overhead-ms must be between 0 and 1e6; got {overhead}")
    measured = cost_model_file_from_args(options)
    if measured is not None:
        if getattr(args, "dp_schedule_microbatch_overhead_ms", None) is not None:
            raise ValueError("--dp-schedule-microbatch-overhead-ms cannot be combined with --dp-schedule-cost-model, "
                             "whose step-time model has its own measured seconds per micro-batch")
        return measured.step_time_model()
    if getattr(args, "hidden_size", None) is None:
        raise ValueError("step_time_model needs the model's --hidden-size, --num-layers and "
                         "--num-attention-heads for its cost model")
    gpus = getattr(args, "tensor_model_parallel_size", 1) * getattr(args, "context_parallel_size", 1)
    return StepTimeModel.from_cost_model(
        CostModel.from_megatron_args(args), flops_per_second=NOMINAL_FLOPS_PER_GPU * gpus,
        seconds_per_microbatch=overhead / 1000.0,
    )


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
