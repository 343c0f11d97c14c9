"""Command-line flags of the ``--dp-schedule`` data path and their validation.

``add_dp_schedule_args`` is a Megatron ``extra_args_provider``::

    pretrain(..., extra_args_provider=add_dp_schedule_args)

``validate_dp_schedule_args(args)`` runs after Megatron's own ``validate_args``
and before the model config is built (e.g. first thing in the model provider).
It fails fast with a ``ValueError`` naming the offending flag, turns on
``calculate_per_token_loss`` (every token weighs the same whatever the
micro-batch it lands in) and ``variable_seq_lengths`` (micro-batches differ in
shape; Megatron's ``validate_args`` always resets it to ``False``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from megatron_dpsched.core.cost import CostModel

BALANCE_CHOICES = ("cost", "tokens", "none")
VERIFY_CHOICES = ("off", "check", "strict")
ORDER_CHOICES = ("auto", "pipeline", "none")
COLLATE_CHOICES = ("bshd", "thd")

_GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


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
    a precomputed plan is checked once, when its feed is built) or ``strict`` (also check that each
    model chunk consumed exactly the planned micro-batches)."""
    microbatch_order: str | None
    """``--dp-schedule-microbatch-order``; ``None`` for ``auto``."""
    collate_format: str
    """``--dp-schedule-collate-format``: micro-batches as padded rows (``bshd``) or packed sequences
    (``thd`` with ``cu_seqlens``; needs an attention backend that takes ``PackedSeqParams``)."""
    balance_growth: float
    """``--dp-schedule-balance-growth``: share of extra micro-batches the planner may spend to balance
    ranks when the token cap keeps them apart (0: never more than one global packing needs)."""

    @classmethod
    def from_args(cls, args: Any) -> DPScheduleOptions:
        """Read the flags (missing ones take their defaults)."""
        order = getattr(args, "dp_schedule_microbatch_order", "auto")
        return cls(
            enabled=bool(getattr(args, "dp_schedule", False)),
            max_tokens_per_gpu=getattr(args, "dp_schedule_max_tokens_per_gpu", None),
            balance=getattr(args, "dp_schedule_balance", "cost"),
            verify=getattr(args, "dp_schedule_verify", "off"),
            microbatch_order=None if order == "auto" else order,
            balance_growth=getattr(args, "dp_schedule_balance_growth", 0.0),
            collate_format=getattr(args, "dp_schedule_collate_format", "bshd"),
        )


def add_dp_schedule_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``--dp-schedule*`` flags; usable as Megatron's ``extra_args_provider``."""
    group = parser.add_argument_group(title="dp-schedule (global micro-batch scheduling)")
    group.add_argument("--dp-schedule", action="store_true",
                       help="Plan each step's micro-batches globally across data-parallel ranks "
                            "(variable micro-batch count per step, per-token loss).")
    group.add_argument("--dp-schedule-max-tokens-per-gpu", type=int, default=None,
                       help="Dynamic batching: at most this many tokens per micro-batch per GPU. "
                            "Unset: static batching with --micro-batch-size.")
    group.add_argument("--dp-schedule-balance", choices=BALANCE_CHOICES, default="cost",
                       help="Balance the cost model (default), raw token counts, or nothing.")
    group.add_argument("--dp-schedule-verify", choices=VERIFY_CHOICES, default="off",
                       help="check: run schedule.check() every step; strict: also verify every "
                            "model chunk consumed exactly the planned micro-batches.")
    group.add_argument("--dp-schedule-microbatch-order", choices=ORDER_CHOICES, default="auto",
                       help="Micro-batch order within a step; auto = pipeline when PP > 1.")
    group.add_argument("--dp-schedule-collate-format", choices=COLLATE_CHOICES, default="bshd",
                       help="Micro-batch layout: padded rows with a mask (bshd, any attention backend; rows "
                            "are padded to the micro-batch's longest sample, so the padded size can exceed "
                            "the token cap) or packed sequences with cu_seqlens (thd, e.g. Transformer Engine).")
    group.add_argument("--dp-schedule-balance-growth", type=float, default=0.0,
                       help="Share of extra micro-batches per step the planner may spend to balance "
                            "ranks when the token cap keeps them apart (heavy tails at high fill); "
                            "0 never exceeds the count of one global packing.")
    return parser


def validate_dp_schedule_args(args: Any) -> None:
    """Check the flags against the parallel layout and adjust ``args`` for the schedule.

    A no-op unless ``--dp-schedule`` is set. Raises ``ValueError`` naming the flag.
    """
    options = DPScheduleOptions.from_args(args)
    if not options.enabled:
        return
    _check_token_cap(options, args)
    _check_pipeline_layout(args)
    _refuse_conflicts(args)
    _check_collate_format(options, args)
    args.calculate_per_token_loss = True
    if args.pipeline_model_parallel_size > 1:
        args.variable_seq_lengths = True
        if getattr(args, "num_experts", None) is None:
            args.moe_token_dispatcher_type = "alltoall"


def _check_token_cap(options: DPScheduleOptions, args: Any) -> None:
    cap = options.max_tokens_per_gpu
    if cap is None:
        return
    if cap < 1:
        raise ValueError(f"--dp-schedule-max-tokens-per-gpu must be >= 1; got {cap}")
    if not 0.0 <= options.balance_growth <= 10.0:
        raise ValueError(f"--dp-schedule-balance-growth must be between 0 and 10; got {options.balance_growth}")
    if args.micro_batch_size != 1:
        raise ValueError(
            "--dp-schedule-max-tokens-per-gpu plans micro-batches by tokens; --micro-batch-size "
            f"must stay 1 (it is the sample-accounting unit), got {args.micro_batch_size}"
        )


def _check_collate_format(options: DPScheduleOptions, args: Any) -> None:
    if options.collate_format != "thd":
        return
    if getattr(args, "context_parallel_size", 1) > 1:
        raise ValueError("--dp-schedule-collate-format thd with --context-parallel-size > 1 is not supported "
                         "yet; use bshd")
    if getattr(args, "transformer_impl", "transformer_engine") == "local":
        raise ValueError("--dp-schedule-collate-format thd needs an attention backend that takes packed "
                         "sequences (Transformer Engine); --transformer-impl local does not")


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


def schedule_kwargs_from_args(args: Any, *, data_parallel_size: int) -> dict[str, Any]:
    """``build_dp_schedule`` keyword arguments (all but ``lengths``) for Megatron's ``args``."""
    options = DPScheduleOptions.from_args(args)
    static = options.max_tokens_per_gpu is None
    return {
        "dp_size": data_parallel_size,
        "global_batch_size": args.global_batch_size,
        "max_tokens_per_gpu": options.max_tokens_per_gpu,
        "micro_batch_size": args.micro_batch_size if static else None,
        "cp_size": getattr(args, "context_parallel_size", 1),
        "pp_size": args.pipeline_model_parallel_size,
        "vpp_size": getattr(args, "virtual_pipeline_model_parallel_size", None) or 1,
        "microbatch_group_size_per_vp_stage": getattr(args, "microbatch_group_size_per_vp_stage", None),
        "balance": options.balance,
        "cost_model": CostModel.from_megatron_args(args) if options.balance == "cost" else None,
        "microbatch_order": options.microbatch_order,
        "balance_growth": options.balance_growth,
    }
